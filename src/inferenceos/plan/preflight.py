"""Preflight: a plan that does not fit is never loaded.

`make_plan` is the optimizer's entry (plan/optimize.py: placement, context, KV type
and ubatch chosen together; quality lowered only when no device holds it). What
follows describes `ladder_plan`, the previous planner, kept for paired comparisons.

`make_plan` starts from what was asked and, while RAM would overflow, degrades in this
stated order, recording each change and why:

1. smaller context   — halve n_ctx (down to `min_ctx`) unless the user pinned it;
2. quantized KV      — q8_0 K and V (turns flash attention on: llama.cpp needs it for a
                       quantized V), then q4_0;
3. smaller ubatch    — halve n_ubatch (down to `MIN_UBATCH`): the compute buffer grows
                       linearly with it (Gemma 3 270M: ~515 MiB at 512, mostly the
                       262k-vocabulary logits, more than its weights); a smaller one
                       only slows prefill, so it comes before anything that slows decode;
4. fewer GPU layers  — placement keeps on each accelerator only the layers that fit;
5. experts to CPU    — routed experts leave accelerators before dense layers do (this
                       is the placement's own order: see placement.py);
6. mmap from disk    — weights that do not fit in RAM stay in the file and are read
                       from disk as needed: feasible, but disk-bound, and said so;
                       loaded without CPU_REPACK, so they stay reclaimable page cache.

Steps 4 and 5 are decided by `placement.place` from the accelerators' budgets; they are
listed among the changes when they happen. When even the smallest settings leave no
room in RAM for the KV cache, compute and output buffers, the plan is refused with the
numbers (`PlanRefused`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.plan.devices import GPU_RESERVE_FRACTION, Machine
from inferenceos.plan.footprint import estimate, gpu_compute_reserve, stream_room
from inferenceos.plan.memory import ContextSettings, MemoryEstimate
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.optimize import Objective, min_ubatch, optimize
from inferenceos.plan.perf import Calibration
from inferenceos.plan.placement import Placement, place
from inferenceos.plan.plan import Change, Plan
from inferenceos.units import format_bytes as fb

MIN_CTX = 2048
MIN_UBATCH = 32  # the ladder's (the optimizer's: optimize.ubatches)
KV_FLOORS = ("f16", "q8_0", "q4_0")  # --kv-quality: the lowest KV precision accepted


class PlanRefused(InferenceOSError):
    """Nothing fits: the message gives the bytes needed and available."""


@dataclass(frozen=True)
class Leeway:
    """What a plan may give up to fit, besides where the layers go: the context (halved
    down to `min_ctx`, never when `pinned_ctx`), the KV cache's precision
    (`quantize_kv`) and RAM for weights left in the file (`allow_mmap`). Both planners,
    `make_plan` and `ladder_plan`, take it."""

    pinned_ctx: bool = False
    min_ctx: int = MIN_CTX
    allow_mmap: bool = True
    quantize_kv: bool = True


def _gpu_free(facts: ModelFacts, machine: Machine, ctx: ContextSettings) -> dict[str, int]:
    reserve = gpu_compute_reserve(facts, ctx)
    return {
        d.name: max(0, int(d.memory_bytes * (1 - GPU_RESERVE_FRACTION)) - reserve)
        for d in machine.accelerators
    }


def _try(
    facts: ModelFacts, machine: Machine, ctx: ContextSettings, **kw: bool
) -> tuple[Placement, MemoryEstimate, int]:
    """Placement, its estimate, and RAM overflow in bytes (≤ 0: fits)."""
    p = place(facts, machine, ctx, _gpu_free(facts, machine, ctx), **kw)
    est = estimate(facts, p, machine, ctx)
    return p, est, est.by_device.get("CPU", 0) - machine.cpu.memory_bytes


def _context_ladder(ctx: ContextSettings, pinned: bool, min_ctx: int) -> list[ContextSettings]:
    """Candidates in degradation order: smaller contexts, then quantized KV at the
    smallest context, then smaller ubatches with the smallest KV."""
    out = [ctx]
    if not pinned:
        n = ctx.n_ctx
        while n // 2 >= min_ctx:
            n //= 2
            out.append(replace(ctx, n_ctx=n))
    last = out[-1]
    if last.type_v == "f16" or last.type_k == "f16":
        out.append(replace(last, type_k="q8_0", type_v="q8_0", flash_attn=True))
        out.append(replace(last, type_k="q4_0", type_v="q4_0", flash_attn=True))
    return out


def _ubatch_ladder(ctx: ContextSettings) -> list[ContextSettings]:
    """`ctx` with n_ubatch halved down to MIN_UBATCH (step 3)."""
    out, n = [], ctx.n_ubatch
    while n // 2 >= MIN_UBATCH:
        n //= 2
        out.append(replace(ctx, n_ubatch=n))
    return out


def _describe(prev: ContextSettings, cur: ContextSettings, overflow: int) -> Change:
    why = f"RAM short by {fb(overflow)}"
    if cur.n_ctx != prev.n_ctx:
        return Change(f"context {prev.n_ctx} → {cur.n_ctx}", why)
    if cur.n_ubatch != prev.n_ubatch:
        return Change(
            f"ubatch {prev.n_ubatch} → {cur.n_ubatch}", why + " (smaller compute buffer)"
        )
    return Change(
        f"KV cache {prev.type_k}/{prev.type_v} → {cur.type_k}/{cur.type_v}"
        + (" with flash attention" if cur.flash_attn and not prev.flash_attn else ""),
        why,
    )


def make_plan(
    facts: ModelFacts,
    machine: Machine,
    ctx: ContextSettings,
    threads: int = 0,
    leeway: Leeway = Leeway(),
    *,
    kv_floor: str = "q4_0",
    need_tokens: int = 0,
    calibration: Calibration | None = None,
    objective: Objective | None = None,
    explain: bool = False,
) -> Plan:
    """The best plan that fits `machine` (plan/optimize.py): quality (context, then KV
    precision down to `kv_floor`) is lowered only when no placement over every device
    holds it, the context never below `need_tokens`; weights stay on disk only when
    nothing else fits. With `explain` the plan carries the best rejected alternatives.

    Raises PlanRefused when nothing fits (not even with weights left on disk).
    """
    _check_settings(facts, ctx)
    if kv_floor not in KV_FLOORS:
        raise UsageError(f"unknown KV quality {kv_floor!r} (one of {', '.join(KV_FLOORS)})")
    floor = min(ctx.n_ctx, max(min(leeway.min_ctx, ctx.n_ctx), need_tokens))
    res = optimize(
        facts, machine, ctx, cal=calibration or Calibration.default(),
        threads=threads or machine.cpu.threads, obj=objective or Objective(),
        pinned_ctx=leeway.pinned_ctx, floor_ctx=floor, kv_floor=kv_floor,
        quantize_kv=leeway.quantize_kv, allow_disk=leeway.allow_mmap, explain=explain,
    )
    if res is None:
        raise PlanRefused(_refused(facts, machine, ctx, floor, kv_floor, leeway.quantize_kv))
    b = res.best
    plan = _finish(facts, machine, b.ctx, b.placement, b.memory, threads, list(res.changes),
                   disk_bound=res.disk_bound)
    return replace(plan, alternatives=tuple(c.to_json() for c in res.alternatives))


def _refused(
    facts: ModelFacts, machine: Machine, ctx: ContextSettings, floor: int, kv_floor: str,
    quantize_kv: bool,
) -> str:
    """The refusal message at the smallest settings the optimizer may use."""
    least = min_ubatch(bool(machine.accelerators))
    small = replace(ctx, n_ctx=floor, n_ubatch=least, n_batch=max(least, 32))
    if quantize_kv and not (facts.spec.key_length % 32 or facts.spec.value_length % 32):
        small = replace(small, type_k=kv_floor, type_v=kv_floor,
                        flash_attn=small.flash_attn or kv_floor != "f16")
    _, est, _ = _try(facts, machine, small)
    fixed = est.by_device.get("CPU", 0) - est.weights.get("CPU", 0)
    return _refusal(facts, machine, est, fixed, small)


def ladder_plan(
    facts: ModelFacts, machine: Machine, ctx: ContextSettings, threads: int = 0,
    leeway: Leeway = Leeway(),
) -> Plan:
    """The old ladder (kept to compare against, benchmarks/cluster.py): degrade `ctx`
    in the stated order, then let `place` fill the accelerators greedily.

    Raises PlanRefused when nothing fits (not even with weights left on disk).
    """
    _check_settings(facts, ctx)
    changes: list[Change] = []
    ladder = _context_ladder(ctx, leeway.pinned_ctx, min(leeway.min_ctx, ctx.n_ctx))
    if not leeway.quantize_kv or facts.spec.key_length % 32 or facts.spec.value_length % 32:
        ladder = [c for c in ladder if c.type_k == ctx.type_k and c.type_v == ctx.type_v]
    ladder += _ubatch_ladder(ladder[-1])
    prev, last_overflow = ladder[0], 0
    for cand in ladder:
        p, est, overflow = _try(facts, machine, cand)
        if cand is not ladder[0]:
            changes.append(_describe(prev, cand, last_overflow))
        if overflow <= 0:
            return _finish(facts, machine, cand, p, est, threads, changes)
        prev, last_overflow = cand, overflow
    return _disk_fallback(facts, machine, prev, threads, changes, leeway.allow_mmap,
                          last_overflow)


def _disk_fallback(
    facts: ModelFacts,
    machine: Machine,
    ctx: ContextSettings,
    threads: int,
    changes: list[Change],
    allow_mmap: bool,
    overflow: int,
) -> Plan:
    """Step 6: leave `overflow` bytes of weights in the file (mmap) if the rest fits.

    A disk-bound plan loads without CPU_REPACK (`use_extra_bufts` off): a repacked copy
    is anonymous memory, so weights planned to stream would be pinned in RAM and the
    process OOM-killed under a real limit. Every CPU weight then stays in the mapped
    file; what must fit is the anonymous part (KV, compute, logits, overhead) plus room
    in the page cache for the largest layer, which a token cannot compute without."""
    p = place(facts, machine, ctx, _gpu_free(facts, machine, ctx))
    est = estimate(facts, p, machine, ctx, repack=False)
    cpu_weights = est.weights.get("CPU", 0)
    fixed = est.anonymous
    ram = machine.cpu.memory_bytes
    if not allow_mmap or fixed > ram:
        raise PlanRefused(_refusal(facts, machine, est, fixed, ctx))
    disk = min(cpu_weights, max(overflow, est.by_device.get("CPU", 0) - ram))
    changes.append(
        Change(
            f"{fb(disk)} of weights left on disk (mmap)",
            f"RAM holds {fb(ram)}; the model needs {fb(est.by_device['CPU'])} there",
        )
    )
    p = replace(p, disk_bytes=disk)
    return _finish(facts, machine, ctx, p, est, threads, changes, disk_bound=True)


def _refusal(
    facts: ModelFacts,
    machine: Machine,
    est: MemoryEstimate,
    fixed: int,
    ctx: ContextSettings,
    window: int | None = None,
) -> str:
    """The refusal with its figures; `window` (None: found here) is named when the
    bytes besides the weights fit but leave no room to stream a layer through."""
    if window is None:
        ram = machine.cpu.memory_bytes
        w = stream_room(facts)
        window = w if fixed <= ram < fixed + w else 0
    acc = ", ".join(f"{d.name} {fb(d.memory_bytes)}" for d in machine.accelerators) or "no GPU"
    stream = (f", plus {fb(window)} of page cache to stream its largest layer (with a "
              "layer of slack for reclaim)" if window else "")
    return (
        f"{facts.spec.name} cannot run here: even at context {ctx.n_ctx}, ubatch "
        f"{ctx.n_ubatch}, with a "
        f"{ctx.type_k}/{ctx.type_v} KV cache it needs {fb(fixed)} of RAM besides the weights "
        f"(KV {fb(est.kv.get('CPU', 0))}, compute {fb(est.compute.get('CPU', 0))}, "
        f"output {fb(est.output)}, overhead {fb(est.overhead)}){stream} and "
        f"{fb(facts.spec.tensor_bytes)} of weights; RAM budget {fb(machine.cpu.memory_bytes)}, "
        f"accelerators: {acc}"
    )


def _check_stream_room(
    facts: ModelFacts, machine: Machine, ctx: ContextSettings, est: MemoryEstimate,
    head_on_cpu: bool = True,
) -> None:
    """A disk-bound plan must hold its anonymous bytes and still leave the page cache
    room to stream a layer through (footprint.stream_room); a smaller limit is refused
    here, with the figures, rather than thrashing or OOM-killed under the kernel's
    limit."""
    window = stream_room(facts, head_on_cpu)
    if est.anonymous + window > machine.cpu.memory_bytes:
        raise PlanRefused(_refusal(facts, machine, est, est.anonymous, ctx, window))


def _check_settings(facts: ModelFacts, ctx: ContextSettings) -> None:
    """UsageError for asked settings no plan may start from, whichever planner runs:
    `ctx` itself invalid (ContextSettings.validate), or a quantized KV cache on heads
    llama.cpp cannot quantize (`_check_quant_heads`)."""
    ctx.validate()
    if ctx.type_k in ("q8_0", "q4_0") or ctx.type_v in ("q8_0", "q4_0"):
        _check_quant_heads(facts, ctx)


def _check_quant_heads(facts: ModelFacts, ctx: ContextSettings) -> None:
    s = facts.spec
    if s.key_length % 32 or s.value_length % 32:
        raise UsageError(
            f"a {ctx.type_k}/{ctx.type_v} KV cache needs head dims divisible by 32; "
            f"{s.name} has {s.key_length}/{s.value_length}"
        )


def _finish(
    facts: ModelFacts,
    machine: Machine,
    ctx: ContextSettings,
    p: Placement,
    est: MemoryEstimate,
    threads: int,
    changes: list[Change],
    disk_bound: bool = False,
) -> Plan:
    if disk_bound:
        _check_stream_room(facts, machine, ctx, est, p.output_device == "CPU")
    n = facts.spec.block_count
    if machine.accelerators and p.gpu_layers < n:
        changes.append(
            Change(
                f"{p.gpu_layers} of {n} layers on accelerators",
                "the fastest split the cost model finds within every device's memory",
            )
        )
    changes.extend(Change(what, why) for what, why in p.notes)
    used = tuple(a.name for a in machine.accelerators if a.name in p.dense)
    return Plan(
        model_path=str(facts.spec.path),
        model_name=facts.spec.name,
        ctx=ctx,
        placement=p,
        memory=est,
        budgets={d.name: d.memory_bytes for d in machine.devices},
        threads=threads or machine.cpu.threads,
        changes=tuple(changes),
        disk_bound=disk_bound,
        accelerators=used,
        reason="weights do not fit in memory: read from disk at every token" if disk_bound else "",
    )
