"""The one planner entry point: every caller that loads a model asks here.

`run`, `serve` (each model the server loads), the API's per-request options
(`num_ctx`, `num_gpu`, `num_thread`, ...) and `simulate` describe what they want as a
`LoadRequest`; `plan_load(facts, machine, request)` returns the preflight-checked
`Plan`, whose `params()` is the `LlamaParams` record the engine loads. Served models
are therefore offloaded, split and degraded exactly as `run` and `simulate` would do it.

Contract:
- The context never exceeds the model's training context unless `rope_scaling` is
  asked for; a cap is recorded as a `Change` (the plan line shows it).
- `prompt_tokens` not smaller than the context is refused (`PlanRefused`) with both
  numbers: a prompt that cannot fit is not "feasible".
- `gpu_layers` and `backend` override the planner; each override is recorded as a
  `Change` that says what the planner would have done.
- `mmproj` (a projector file or its facts) adds the projector's weights and encoder
  compute buffer on the device its encoder runs on (`Plan.projector`, plan/projector.py):
  an accelerator with room after the text model, else the CPU, where the text model is
  re-planned within the RAM the projector leaves. `image_tokens` count against the
  context like prompt tokens.
- `lora` (LoRA adapter files, read for their headers only) adds each adapter tensor's
  bytes on the device of the layer it adapts (plan/adapters.py; `MemoryEstimate.adapters`,
  counted in `by_device`). When that overfills a device, the text model is re-planned
  within what the adapters leave there; `PlanRefused` when they do not fit at all.
- Raises `PlanRefused` (an InferenceOSError) when nothing fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from inferenceos.errors import UsageError
from inferenceos.hardware.cpu_load import CpuLoad
from inferenceos.model.projector import ProjectorFacts, load_projector
from inferenceos.plan import draft_choice
from inferenceos.plan.adapters import adapter_bytes_by_device, load_adapter_facts
from inferenceos.plan.calibration_load import machine_calibration
from inferenceos.plan.devices import Machine, Overrides, apply_overrides, with_workers
from inferenceos.plan.flash_attn import off_by_default, prefer_without
from inferenceos.plan.forced import force_gpu_layers
from inferenceos.plan.memory import ContextSettings, MemoryEstimate, with_adapters
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.optimize import Objective
from inferenceos.plan.perf import Calibration
from inferenceos.plan.plan import Change, Plan
from inferenceos.plan.policy import POLICIES
from inferenceos.plan.preflight import Leeway, PlanRefused, make_plan
from inferenceos.plan.projector import place_projector, with_projector
from inferenceos.plan.thread_choice import choose_threads
from inferenceos.units import format_bytes as fb

DEFAULT_CTX = 4096
MAX_THREADS = 1024


@dataclass(frozen=True)
class LoadRequest:
    """What a caller asks for; zero / None fields are the planner's to choose.

    `n_ctx` is the context of ONE sequence; the plan holds `n_seq` of them.
    """

    n_ctx: int = 0
    n_seq: int = 1
    threads: int = 0
    n_batch: int = 0
    type_k: str | None = None
    type_v: str | None = None
    flash_attn: bool | None = None  # None: the planner's choice (plan/flash_attn.py)
    # prompts mostly arrive as a few new tokens after a history the KV cache holds
    # (`serve` with its tiered cache): on the CPU alone that plans without flash attention
    cached_turns: bool = False
    gpu_layers: int | None = None  # force llama.cpp's n_gpu_layers (Ollama's num_gpu)
    backend: str | None = None  # "auto", "cpu", or an accelerator (CUDA0, GPU0, Metal...)
    need_tokens: int = 0  # prompt + output the context should hold (one sequence)
    prompt_tokens: int = 0  # a prompt that must fit (longer: refused)
    swa_full: bool = False
    rope_scaling: bool = False  # allow a context beyond the training context
    use_mmap: bool = True
    policy: str = "balanced"  # the objective: latency, throughput, capacity, balanced, adaptive
    # workers (`inferenceos worker`) whose devices join the machine, "host:port" each;
    # asked at every plan, so a lost worker is planned without and a returning one used
    rpc: tuple[str, ...] = ()
    ram: int | None = None  # budget caps (bytes): leave room for other programs
    gpu_memory: tuple[int, ...] | None = None
    # what other programs take from the CPUs (hardware.cpu_load.sample_cpu_load()):
    # with it and `threads` 0, the plan takes only the free cores (plan/threads.py)
    cpu_load: CpuLoad | None = None
    # a multimodal projector (mmproj GGUF path, or its facts) loaded beside the model
    mmproj: str | Path | ProjectorFacts | None = None
    image_tokens: int = 0  # media tokens the context must hold besides the prompt's
    # the lowest KV precision the plan may lower to (f16, q8_0, q4_0; None: the config's
    # `plan.kv_quality`, else q4_0) and whether to keep the rejected alternatives
    kv_quality: str | None = None
    explain: bool = False
    # speculative decoding (plan/draft_choice.py): None decodes plainly, "auto" lets the
    # plan choose (ngram or self), anything else (ngram, self, a draft .gguf) is kept
    # and priced beside them
    draft: str | None = None
    # LoRA adapter GGUFs the model will apply (`--lora`, a preset's ADAPTER): priced
    # where their layers live (plan/adapters.py)
    lora: tuple[str, ...] = ()

    def validate(self) -> None:
        """UsageError for values no plan can honour (negative, absurd)."""
        if min(self.n_ctx, self.n_batch, self.need_tokens, self.image_tokens) < 0:
            raise UsageError("context, batch and token counts must not be negative")
        if self.n_seq < 1:
            raise UsageError("at least one sequence slot is needed")
        if not 0 <= self.threads <= MAX_THREADS:
            raise UsageError(f"threads must be between 1 and {MAX_THREADS} (0: auto)")
        if self.gpu_layers is not None and self.gpu_layers < -1:
            raise UsageError("gpu layers must be >= 0 (-1: all)")
        if self.policy.strip().lower() not in POLICIES:
            raise UsageError(f"unknown policy {self.policy!r} (one of {', '.join(POLICIES)})")


def _machine_for(machine: Machine, backend: str | None) -> tuple[Machine, list[Change]]:
    """The machine restricted to `backend` (the CPU always stays)."""
    want = (backend or "").strip().lower()
    if want in ("", "auto"):  # the planner's choice
        return machine, []
    if want == "cpu":
        kept: tuple = ()
    else:
        kept = tuple(
            d for d in machine.accelerators
            if want in (d.name.lower(), (d.llama_name or "").lower(), d.kind.lower())
            or d.name.lower().startswith(want)
        )
        if not kept:
            names = ", ".join(d.name for d in machine.accelerators) or "none"
            raise UsageError(f"no device matches --backend {backend!r} (devices: CPU, {names})")
    ch = Change(f"backend {backend}", "asked for: other devices left out")
    return replace(machine, devices=(machine.cpu, *kept)), [ch]


def _with_request_devices(machine: Machine, req: LoadRequest) -> Machine:
    """`machine` with the request's budget caps and its RPC workers' devices."""
    if req.ram is not None or req.gpu_memory is not None:
        machine = apply_overrides(machine, Overrides(ram=req.ram, gpu_memory=req.gpu_memory))
    return with_workers(machine, req.rpc) if req.rpc else machine


def _context(facts: ModelFacts, req: LoadRequest) -> tuple[int, bool, list[Change]]:
    """(n_ctx per sequence, pinned, changes): the asked context capped at training."""
    train = facts.spec.context_length or 0
    if req.n_ctx:
        n, pinned = req.n_ctx, True
    else:
        n = max(DEFAULT_CTX, req.need_tokens + req.image_tokens)
        n, pinned = (min(n, train) if train else n), False
    changes = []
    if train and n > train and not req.rope_scaling:
        changes.append(Change(f"context {n} → {train}", "the model's training context"))
        n = train
    if req.image_tokens and req.prompt_tokens + req.image_tokens >= n:
        raise PlanRefused(
            f"a prompt of {req.prompt_tokens} text tokens and {req.image_tokens} image "
            f"tokens does not fit a context of {n} (the model was trained on "
            f"{train or 'an unknown number of'} tokens); use fewer or smaller images, "
            "a shorter prompt, or a larger context"
        )
    if req.prompt_tokens >= n:
        raise PlanRefused(
            f"a prompt of {req.prompt_tokens} tokens does not fit a context of {n} "
            f"(the model was trained on {train or 'an unknown number of'} tokens); "
            "shorten the prompt"
        )
    return n, pinned, changes


def plan_load(
    facts: ModelFacts,
    machine: Machine,
    req: LoadRequest | None = None,
    calibration: Calibration | None = None,
) -> Plan:
    """The plan to load `facts` on `machine` for `req` (see the module contract)."""
    req = req or LoadRequest()
    req.validate()
    pf = _projector_facts(req.mmproj)
    machine, changes = _machine_for(_with_request_devices(machine, req), req.backend)
    plan = _plan_text(facts, machine, req, calibration, changes)
    if pf is not None:
        plan = _with_projector(plan, pf, facts, machine, req, calibration)
    if req.lora:
        plan = _with_adapters(plan, facts, machine, req, calibration)
    return plan if req.draft is None else _with_draft(plan, facts, machine, req, calibration)


def _with_draft(plan: Plan, facts: ModelFacts, machine: Machine, req: LoadRequest,
                calibration: Calibration | None) -> Plan:
    """`plan` with its drafter decided (plan/draft_choice.py): the candidates priced at
    this plan's predicted prefill and decode, within the RAM it leaves."""
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.speculative import learned_draft

    asked = req.draft.strip() if req.draft else draft_choice.NONE
    asked = asked.lower() if asked.lower() in (draft_choice.AUTO, draft_choice.NONE) else asked
    cal = calibration or machine_calibration()
    w = _objective(req)
    prefill_s, decode_s = w.costs(facts, machine, plan.ctx, plan.placement, cal, plan.threads)
    c_row = draft_choice.row_cost(prefill_s / max(w.prompt_tokens, 1), decode_s)
    ram_left = plan.budgets.get("CPU", 0) - plan.memory.by_device.get("CPU", 0)
    named = () if asked in (draft_choice.AUTO, draft_choice.NONE) else (asked,)
    options = draft_choice.price_drafters(
        facts, ("ngram", "self", *named), c_row,
        plan.ctx.n_ctx, ram_left, load_model_facts, learned_draft)  # a draft context
    # holds every slot's cells, as the target's (engine/drafters.ModelDrafter)
    chosen = draft_choice.choose_draft(options, asked, req.policy.strip().lower())
    return replace(plan, draft=chosen)


def _projector_facts(mmproj: str | Path | ProjectorFacts | None) -> ProjectorFacts | None:
    if mmproj is None or isinstance(mmproj, ProjectorFacts):
        return mmproj
    return load_projector(mmproj)


def _with_projector(
    plan: Plan,
    pf: ProjectorFacts,
    facts: ModelFacts,
    machine: Machine,
    req: LoadRequest,
    calibration: Calibration | None,
) -> Plan:
    """`plan` with the projector placed and charged (see the module contract)."""
    pp = place_projector(
        pf, machine, plan.memory, prefer=plan.accelerators, image_tokens=req.image_tokens,
        flash_attn=True,  # mtmd's default "auto" (see plan/projector.py)
    )
    memory = with_projector(plan.memory, pp)
    ram = machine.cpu.memory_bytes
    if pp.device == "CPU" and memory.by_device.get("CPU", 0) > ram:
        left = ram - pp.bytes
        if left <= 0:
            raise PlanRefused(
                f"the projector {Path(pf.path).name} needs {fb(pp.bytes)} of RAM "
                f"(weights {fb(pp.weight_bytes)}, encoder compute {fb(pp.compute_bytes)}); "
                f"RAM budget {fb(ram)}"
            )
        smaller = apply_overrides(machine, Overrides(ram=left))
        ch = Change(
            f"{fb(pp.bytes)} of RAM kept for the projector",
            f"its encoder runs on the CPU ({pp.why}); the text model planned within {fb(left)}",
        )
        plan = replace(
            _plan_text(facts, smaller, req, calibration, [ch]), budgets=plan.budgets
        )
        memory = with_projector(plan.memory, pp)
    return replace(plan, memory=memory, projector=pp)


def _with_adapters(plan: Plan, facts: ModelFacts, machine: Machine, req: LoadRequest,
                   calibration: Calibration | None) -> Plan:
    """`plan` with the LoRA adapters of `req` charged (see the module contract)."""
    adapters = [load_adapter_facts(p, facts.spec.block_count) for p in dict.fromkeys(req.lora)]
    by_dev = adapter_bytes_by_device(adapters, plan.placement)
    memory = with_adapters(plan.memory, by_dev)
    if not _over(memory, plan):
        return replace(plan, memory=memory)
    total = sum(by_dev.values())
    smaller = replace(machine, devices=tuple(
        replace(d, memory_bytes=max(0, d.memory_bytes - by_dev.get(d.name, 0)))
        for d in machine.devices))
    ch = Change(f"{fb(total)} kept for LoRA adapters",
                f"{len(adapters)} adapter(s) beside the layers they adapt; "
                "the model planned within what they leave")
    names = ", ".join(Path(a.path).name for a in adapters)
    try:
        text = _plan_text(facts, smaller, req, calibration, [ch])
    except PlanRefused as exc:
        raise PlanRefused(f"with its LoRA adapters ({names}: {fb(total)}): {exc}") from None
    if plan.projector is not None:
        text = replace(text, memory=with_projector(text.memory, plan.projector),
                       projector=plan.projector)
    text = replace(text, budgets=plan.budgets)
    memory = with_adapters(text.memory, adapter_bytes_by_device(adapters, text.placement))
    if _over(memory, replace(text, budgets=plan.budgets)):
        raise PlanRefused(f"the LoRA adapters ({names}) need {fb(total)} beside the "
                          "model; it does not fit with them")
    return replace(text, memory=memory)


def _over(memory: MemoryEstimate, plan: Plan) -> bool:
    """Whether `memory` puts more on some device than `plan`'s budget there (the CPU's
    weights left to stream from disk not counted, as the optimizer counts them)."""
    return any(used - (plan.placement.disk_bytes if d == "CPU" else 0) > plan.budgets[d]
               for d, used in memory.by_device.items() if d in plan.budgets)


def _plan_text(
    facts: ModelFacts,
    machine: Machine,
    req: LoadRequest,
    calibration: Calibration | None,
    changes: list[Change],
) -> Plan:
    """The text model's plan on `machine` (already restricted to the request)."""
    from inferenceos.plan.microbatch import size_ubatch

    changes = list(changes)
    changes += [Change("worker left out", why) for why in machine.lost]
    n, pinned, ctx_changes = _context(facts, req)
    changes += ctx_changes
    fa_off = req.flash_attn is None and off_by_default(
        machine, req.cached_turns, req.type_v or "f16", req.n_seq)
    ctx = ContextSettings(
        n_ctx=n * req.n_seq,
        n_seq=req.n_seq,
        type_k=req.type_k or "f16",
        type_v=req.type_v or "f16",
        # on by default, as llama.cpp's own "auto" resolves on its CPU, CUDA and Metal
        # backends: 2 % faster decode for Gemma 3 270M on 2 threads here (paired
        # rounds), and a quantized V cache needs it anyway; off first for cached turns
        # on the CPU alone (plan/flash_attn.py)
        flash_attn=(not fa_off) if req.flash_attn is None else req.flash_attn,
        swa_full=req.swa_full or req.n_seq > 1,
        # a KV stream per sequence, as llama-server -np N: through serve, 4 streams,
        # Gemma 3 270M and Qwen2.5-Coder 0.5B and 1.5B within the noise of one shared
        # pool; the tiny llama +8 % at 8 streams and +29 % at 32, where a shared pool's
        # every row attends over every sequence's cells (docs/engine.md, issue 44)
        kv_unified=False,
    )
    if req.n_batch:  # the placement is priced with the compute buffers of the asked batch
        ctx = replace(ctx, n_batch=req.n_batch, n_ubatch=min(req.n_batch, ctx.n_ubatch))
    threads = req.threads
    if not threads and req.cpu_load is not None:
        from inferenceos.plan.threads import fewer_threads_reason, pick_threads

        threads = pick_threads(machine.cpu.threads, req.cpu_load)
        if threads < machine.cpu.threads:
            why = fewer_threads_reason(req.cpu_load) or "fewer free cores"
            changes.append(Change(f"threads {machine.cpu.threads} → {threads}", why))
    cal = calibration or machine_calibration()

    def optimize(c: ContextSettings) -> Plan:
        return make_plan(
            facts, machine, c, threads=threads,
            leeway=Leeway(pinned_ctx=pinned, quantize_kv=req.type_k is None and req.type_v is None),
            kv_floor=_kv_floor(req), need_tokens=req.need_tokens + req.image_tokens,
            calibration=cal, objective=_objective(req), explain=req.explain,
        )

    def solve() -> Plan:  # at the current `threads`
        return prefer_without(optimize, ctx) if fa_off else optimize(ctx)

    plan = solve()
    # the cost model overrules the rule only where the probe timed this machine's thread
    # response: uncalibrated, the tiny llama's 1 and 2 threads priced within 1 % (a 2 ms
    # token overhead, its weights bound by an assumed RAM), and one clock tick of
    # another process (0.1 busy CPUs) picked 1 thread, which decoded at half the speed
    if not req.threads and req.cpu_load is not None and cal.threads_timed:
        pick = choose_threads(facts, plan.placement, machine, plan.ctx, cal, req.cpu_load,
                              _objective(req), rule=threads)
        if pick.threads != threads:  # the cost model overrules the free-core rule
            changes = [c for c in changes if not c.what.startswith("threads ")]
            cores = machine.cpu.threads
            what = f"threads {cores} → {pick.threads}" if pick.threads < cores else (
                f"threads {cores}")
            changes.append(Change(what, (
                f"not {threads}: predicted {pick.gain_over(threads):.2f}x faster for this "
                f"workload beside {req.cpu_load.busy_others:.1f} busy CPUs")))
            threads = pick.threads
            plan = solve()
    plan = size_ubatch(facts, machine, plan, cal)
    if req.n_batch:
        ctx = replace(plan.ctx, n_batch=req.n_batch, n_ubatch=min(req.n_batch, plan.ctx.n_ubatch))
        plan = replace(plan, ctx=ctx)
        changes.append(Change(f"batch {req.n_batch}", "asked for"))
    if not req.use_mmap:
        plan = replace(plan, use_mmap=False)
    if req.gpu_layers is not None:
        plan, ch = force_gpu_layers(plan, facts, machine, req.gpu_layers)
        changes.append(ch)
    return replace(plan, changes=(*changes, *plan.changes)) if changes else plan


def _kv_floor(req: LoadRequest) -> str:
    """The request's KV quality floor, else the config's `plan.kv_quality`, else q4_0."""
    if req.kv_quality:
        return req.kv_quality.strip().lower()
    from inferenceos.config import load_config

    return str(load_config().get("plan.kv_quality") or "q4_0").strip().lower()


def _objective(req: LoadRequest) -> Objective:
    """The workload the optimizer judges plans on: the request's prompt and output."""
    prompt = req.prompt_tokens or 512
    out = req.need_tokens - req.prompt_tokens if req.need_tokens > req.prompt_tokens else 128
    return Objective(prompt_tokens=prompt + req.image_tokens, output_tokens=out)

