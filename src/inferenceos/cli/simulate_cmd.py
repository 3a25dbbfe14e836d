"""`inferenceos simulate MODEL`: will it run here, how fast, and what holds it back.

Metadata only: the GGUF header is read, no tensor data, no llama.cpp. The machine is
this one (its cached hardware profile), a `--hardware PROFILE.json`, or either with
overrides such as `--gpu-memory 4GiB --ram 32GiB` for a hypothetical machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from inferenceos.cli.cluster_opts import GpuCapOpt, RamCapOpt, RpcOpt, memory_caps, rpc_workers
from inferenceos.cli.console import err, out, print_json
from inferenceos.cli.model_arg import resolve_model
from inferenceos.cli.plan_opts import KvQualityOpt, draft_choice
from inferenceos.cli.sim_opts import (
    CacheTypeOpt,
    ImageTokensOpt,
    OutputTokensOpt,
    PromptTokensOpt,
    SimCtxOpt,
    SimDraftOpt,
    SimJsonOpt,
    SimKvCacheDiskOpt,
    SimKvCacheRamOpt,
    SimMmprojOpt,
    SimModelArg,
    SimPolicyOpt,
    TaskOpt,
)
from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.plan.calibration_load import self_calibrate
from inferenceos.plan.devices import (
    Machine,
    Overrides,
    apply_overrides,
    load_profile_file,
    local_machine,
    with_workers,
)
from inferenceos.plan.kv_outlook import KVCacheOutlook, kv_outlook
from inferenceos.plan.model_facts import load_model_facts
from inferenceos.plan.preflight import PlanRefused
from inferenceos.plan.simulate import Prediction, Workload, with_draft
from inferenceos.units import format_bytes

HardwareOpt = Annotated[
    str | None,
    typer.Option("--hardware", help="A hardware profile JSON (inferenceos hardware --json)"),
]
ThreadsOpt = Annotated[int, typer.Option("--threads", help="CPU threads (0: all usable)")]
RamBwOpt = Annotated[float | None, typer.Option("--ram-bandwidth", help="RAM bandwidth, GB/s")]
GpuBwOpt = Annotated[float | None, typer.Option("--gpu-bandwidth", help="GPU bandwidth, GB/s")]
DiskBwOpt = Annotated[float | None, typer.Option("--disk-bandwidth", help="Disk read, GB/s")]


def machine_from_options(
    hardware: str | None,
    gpu_memory: list[str] | None,
    ram: str | None,
    threads: int,
    ram_bandwidth: float | None,
    gpu_bandwidth: float | None,
    disk_bandwidth: float | None,
    rpc: list[str] | None = None,
) -> Machine:
    """The Machine the options describe (shared by `simulate` and `placement`), with
    the devices of the `--rpc` workers (or the `cluster.rpc` setting's). When they
    describe this machine as it is (`this_machine`), a data dir that never measured it
    calibrates itself first (once, one line on stderr). First: the probe measures the
    RAM bandwidth its calibration is fitted against, and a machine read before it
    assumed 20 GB/s instead (Qwen 0.5B's first prediction was 19.5 t/s decode against
    61.5 from the same calibration a second later)."""
    if this_machine(hardware, gpu_memory, ram, ram_bandwidth, gpu_bandwidth):
        self_calibrate(lambda line: err.print(f"[dim]{line}[/]"))
    base = load_profile_file(hardware) if hardware else local_machine()
    base = with_workers(base, rpc_workers(rpc))
    ram_bytes, gpu_bytes = memory_caps(ram, gpu_memory)
    return apply_overrides(
        base,
        Overrides(
            ram=ram_bytes,
            gpu_memory=gpu_bytes,
            threads=threads or None,
            ram_gbps=ram_bandwidth,
            gpu_gbps=gpu_bandwidth,
            disk_gbps=disk_bandwidth,
        ),
    )


def this_machine(hardware: str | None, gpu_memory: list[str] | None, ram: str | None,
                 ram_bandwidth: float | None, gpu_bandwidth: float | None) -> bool:
    """Whether the options describe this machine as it is (no profile file, no
    hypothetical memory or rates): its calibration and recorded runs apply."""
    return not (hardware or gpu_memory or ram or ram_bandwidth or gpu_bandwidth)


@dataclass(frozen=True)
class MachineOptions:
    """The machine `simulate` and `placement` predict for: this one, a hardware profile
    file, either with hypothetical memory or rates, and the `--rpc` workers."""

    hardware: str | None = None
    gpu_memory: list[str] | None = None
    ram: str | None = None
    threads: int = 0
    ram_bandwidth: float | None = None
    gpu_bandwidth: float | None = None
    disk_bandwidth: float | None = None
    rpc: list[str] | None = None

    def here(self) -> bool:
        """Whether they describe this machine as it is (see `this_machine`)."""
        return this_machine(self.hardware, self.gpu_memory, self.ram, self.ram_bandwidth,
                            self.gpu_bandwidth)

    def machine(self) -> Machine:
        """The Machine they describe (see `machine_from_options`: it may calibrate)."""
        return machine_from_options(self.hardware, self.gpu_memory, self.ram, self.threads,
                                    self.ram_bandwidth, self.gpu_bandwidth,
                                    self.disk_bandwidth, self.rpc)


def simulate(
    model: SimModelArg = "", prompt_tokens: PromptTokensOpt = 512,
    output_tokens: OutputTokensOpt = 128, ctx: SimCtxOpt = 0,
    cache_type: CacheTypeOpt = "f16", hardware: HardwareOpt = None,
    gpu_memory: GpuCapOpt = None, ram: RamCapOpt = None, threads: ThreadsOpt = 0,
    ram_bandwidth: RamBwOpt = None, gpu_bandwidth: GpuBwOpt = None,
    disk_bandwidth: DiskBwOpt = None, rpc: RpcOpt = None, policy: SimPolicyOpt = "balanced",
    image_tokens: ImageTokensOpt = 0, mmproj: SimMmprojOpt = None,
    draft: SimDraftOpt = None, task: TaskOpt = None, kv_quality: KvQualityOpt = None,
    kv_cache_ram: SimKvCacheRamOpt = None, kv_cache_disk: SimKvCacheDiskOpt = None,
    as_json: SimJsonOpt = False,
) -> None:
    """Predict memory, speed and the bottleneck of running MODEL, without loading it."""
    opts = MachineOptions(hardware, gpu_memory, ram, threads, ram_bandwidth, gpu_bandwidth,
                          disk_bandwidth, rpc)
    local = opts.here()
    machine = opts.machine()
    try:
        pred = simulate_model(
            model, machine, prompt_tokens, output_tokens, ctx, cache_type, threads,
            policy=policy, local=local, image_tokens=image_tokens, mmproj=mmproj,
            kv_quality=kv_quality, explain=as_json,
        )
        if draft and draft.strip().lower() == "auto":  # what the plan chose by itself
            draft = pred.plan.draft.drafter if pred.plan.draft is not None else None
        if draft:
            pred = _with_draft(pred, draft, task, learned=local)
    except PlanRefused as exc:
        if not as_json:
            raise
        workload = {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                    "n_ctx": ctx or None, "image_tokens": image_tokens}
        _print_refusal(exc, model, workload, policy, machine)
        raise typer.Exit(exc.exit_code) from None
    _render(pred, _kv_cache_outlook(pred, kv_cache_ram, kv_cache_disk), as_json)


def _print_refusal(exc: PlanRefused, model: str, workload: dict[str, Any], policy: str,
                   machine: Machine) -> None:
    """`simulate --json`'s one object when the planner refuses: why, for what."""
    print_json(
        {
            "feasible": False,
            "reason": str(exc),
            "model": model or "(built-in default)",
            "workload": workload,
            "policy": policy,
            "machine": machine.to_json(),
        }
    )


def _render(pred: Prediction, kv: KVCacheOutlook, as_json: bool) -> None:
    """The prediction as one JSON object (with the policy, the rejected alternatives
    and the KV cache outlook) or as the report."""
    if as_json:
        data = pred.to_json()
        data["policy"] = _policy_json(pred)
        data["alternatives"] = list(pred.plan.alternatives)
        data["kv_cache"] = kv.to_json()
        print_json(data)
    else:
        print_report(pred, kv)


def _kv_cache_outlook(pred: Prediction, ram: str | None, disk: str | None) -> KVCacheOutlook:
    """What `serve`'s KV cache tiers would take and save for this plan: its budgets
    (the flags, else the config keys, else serve's defaults) and the prompt's prefix."""
    from inferenceos.app.serve import kv_cache_kw
    from inferenceos.config import load_config

    budgets = kv_cache_kw(ram, disk, load_config())
    facts = load_model_facts(Path(pred.plan.model_path))  # parsed once: read_gguf's cache
    w = pred.workload
    return kv_outlook(facts, pred.plan, pred.machine, w.prompt_tokens + w.image_tokens,
                      pred.prefill_tps, pred.decode_tps, budgets["kv_cache_ram"],
                      budgets["kv_cache_disk"])


def _kv_cache_rows(kv: KVCacheOutlook, model_ram: int) -> list[tuple[str, str]]:
    each = f"{kv.prefix_tokens}-token prefixes of {format_bytes(kv.prefix_bytes)}"
    share = kv.ram_budget / (kv.ram_budget + model_ram) if kv.ram_budget + model_ram else 0.0
    return [
        ("RAM tier", f"{format_bytes(kv.ram_budget)} ({share:.0%} of this model's RAM with "
                     f"it): {kv.entries(kv.ram_budget)} {each}"),
        ("disk tier", f"{format_bytes(kv.disk_budget)}: {kv.entries(kv.disk_budget)} {each}"),
        ("returning prompt", f"first token at least {_ms(kv.restore_ram_s)} restored from "
                             f"RAM, {_ms(kv.restore_disk_s)} from disk (the reads and one "
                             f"decode step); {_ms(kv.prefill_s)} prefilled again"),
    ]


def _ms(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def simulate_model(
    model: str,
    machine: Machine,
    prompt_tokens: int,
    output_tokens: int,
    ctx: int,
    cache_type: str,
    threads: int,
    policy: str = "balanced",
    local: bool = True,
    image_tokens: int = 0,
    mmproj: str | None = None,
    kv_quality: str | None = None,
    explain: bool = False,
) -> Prediction:
    """The prediction `simulate` prints. On this machine (`local`) the calibration
    includes what recorded runs taught and the threads follow the free cores. The
    projector is `mmproj`, else one found beside the model ('none': without)."""
    from inferenceos.app.simulate import predict

    w = Workload(prompt_tokens=prompt_tokens, output_tokens=output_tokens, n_ctx=ctx or None,
                 image_tokens=image_tokens)
    return predict(
        resolve_model(model), machine, w, cache_type=cache_type, threads=threads,
        policy=policy, local=local, mmproj=mmproj, kv_quality=kv_quality, explain=explain,
        # on this machine, the drafter `run` would take (what its runs taught)
        draft=lambda: draft_choice(None) if local else None,
    )


def _encoder_rows(p: Prediction) -> list[tuple[str, str]]:
    """The projector's lines of the Performance table."""
    pp, enc = p.plan.projector, p.encoder
    if pp is None:
        if p.workload.image_tokens:
            return [("encoder", "no projector (--mmproj FILE): encoder time not predicted")]
        return []
    rows = [("projector", f"{pp.kind} on {pp.device}: {format_bytes(pp.weight_bytes)} weights + "
             f"{format_bytes(pp.compute_bytes)} compute ({pp.tokens_per_image} tokens per image)")]
    if enc is not None and enc.images:
        rows.append(("encoder", f"{enc.seconds * 1000:.1f} ms for {enc.images} image"
                     f"{'s' * (enc.images != 1)} ({enc.bottleneck})"))
    return rows


def _with_draft(pred: Prediction, draft: str, task: str | None, learned: bool) -> Prediction:
    """`pred` with `--draft`'s expected speedup (plan/simulate.with_draft); a draft model
    may be a path or a registry name."""
    name = draft.strip()
    if name.lower() in ("ngram", "self"):
        name = name.lower()
    else:
        try:
            name = str(resolve_model(name))
        except InferenceOSError as exc:
            raise UsageError(f"unknown drafter {draft!r}: use ngram, self or a draft model "
                             f"(PATH.gguf or a registry name); {exc}") from None
    return with_draft(pred, name, task.strip().lower() if task else None, learned=learned)


def _draft_rows(p: Prediction) -> list[tuple[str, str]]:
    """The 'decode with DRAFTER' line beside plain decode (none without --draft)."""
    d = p.draft
    if d is None:
        return []
    name = d.drafter if d.drafter in ("ngram", "self") else Path(d.drafter).name
    why = ("drafting does not pay: plain decoding" if d.speedup <= 1.0 else
           f"acceptance {d.acceptance:.2f}, {d.tokens_per_step:.2f} tokens per step")
    return [(f"decode, {name} drafts", f"{p.draft_decode_tps:.1f} tokens/s "
             f"(x{d.speedup:.2f}: {why}; {d.basis})")]


def _policy_json(p: Prediction) -> dict[str, Any]:
    c = p.policy
    if c is None:
        return {"name": "balanced", "resolved": "balanced", "changes": []}
    return {"name": c.policy, "resolved": c.resolved, "changes": c.changes(), "why": c.why}


def _section(title: str, rows: list[tuple[str, str]]) -> None:
    t = Table(title=title, show_header=False, title_justify="left", title_style="bold")
    t.add_column(style="cyan")
    t.add_column()
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)


def print_report(p: Prediction, kv: KVCacheOutlook | None = None) -> None:
    plan, m = p.plan, p.machine
    hw = [
        (
            d.name,
            f"{d.kind}, {format_bytes(d.memory_bytes)}, {d.bandwidth_gbps:g} GB/s"
            + (f", {d.threads} threads" if d.is_cpu else "")
            + (" (assumed: " + ", ".join(d.assumed) + ")" if d.assumed else ""),
        )
        for d in m.devices
    ]
    rnd = f" ({m.disk_random_gbps:g} GB/s in random 64 KiB reads)" if m.disk_random_gbps else ""
    hw.append(("disk", f"{m.disk_gbps:g} GB/s{rnd}"))
    _section(f"Hardware ({m.source})", hw)
    _section("Model", [("file", plan.model_path), ("name", plan.model_name)])
    verdict = "yes" + (" — disk-bound: " + plan.reason if plan.disk_bound else "")
    feas = [("fits", verdict), ("plan", plan.summary().removeprefix("plan: "))]
    feas += [("changed", str(c)) for c in plan.changes]
    if p.policy is not None and p.policy.policy != "balanced":
        c = p.policy
        name = c.policy + (f" → {c.resolved}" if c.resolved != c.policy else "")
        feas.append(("policy", name + (": " + ", ".join(c.changes()) if c.changes() else "")))
        if c.why:
            feas.append(("policy basis", c.why))
    _section("Feasibility", feas)
    _section("Peak memory", [(k, format_bytes(v)) for k, v in p.peak_memory.items()])
    w = p.workload
    media = f" + {w.image_tokens} image tokens" if w.image_tokens else ""
    perf = [
        ("prefill", f"{p.prefill_tps:.1f} tokens/s"),
        ("decode", f"{p.decode_tps:.1f} tokens/s"),
        ("decode, as run will", f"{p.expected_decode_tps:.1f} tokens/s: {p.decode_assumes}; "
         f"{p.engine_s * 1e6:.0f} µs a token of our own work"),
        ("TTFT", f"{p.ttft_s * 1000:.0f} ms for {w.prompt_tokens} prompt tokens{media}"),
        ("total", f"{p.total_s:.2f} s for {p.workload.output_tokens} output tokens"),
    ]
    perf += _encoder_rows(p)
    perf += _draft_rows(p)
    _section("Performance", perf)
    if kv is not None:
        _section("KV cache (serve)", _kv_cache_rows(kv, p.plan.memory.by_device.get("CPU", 0)))
    _section(
        "Memory traffic per token", [(k, format_bytes(v)) for k, v in p.traffic_per_token.items()]
    )
    _section("Bottleneck", [("decode", p.bottleneck), ("recommendation", p.recommendation)])
    for note in m.notes:
        out.print(f"[dim]note: {note}[/]")
    cal = p.calibration
    basis = (
        f"learned from {cal.runs} recorded run{'s' * (cal.runs != 1)}"
        if cal.basis == "learned"
        else "modelled (no recorded runs)"
    )
    out.print(f"[dim]basis: {basis}, confidence {cal.confidence:.2f}[/]")
    out.print(f"[dim]calibration: {cal.source}[/]")
