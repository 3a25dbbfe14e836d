"""`inferenceos simulate MODEL`: will it run here, how fast, and what holds it back.

Metadata only: the GGUF header is read, no tensor data, no llama.cpp. The machine is
this one (its cached hardware profile), a `--hardware PROFILE.json`, or either with
overrides such as `--gpu-memory 4GiB --ram 32GiB` for a hypothetical machine.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from inferenceos.cli.console import out, print_json
from inferenceos.cli.model_arg import resolve_model
from inferenceos.plan.devices import (
    Machine,
    Overrides,
    apply_overrides,
    load_profile_file,
    local_machine,
    parse_size,
)
from inferenceos.plan.simulate import Prediction, Workload
from inferenceos.plan.simulate import simulate as simulate_plan
from inferenceos.units import format_bytes

HardwareOpt = Annotated[
    str | None,
    typer.Option("--hardware", help="A hardware profile JSON (inferenceos hardware --json)"),
]
GpuMemOpt = Annotated[
    list[str] | None,
    typer.Option("--gpu-memory", help="Hypothetical GPU with this memory, e.g. 4GiB (repeatable)"),
]
RamOpt = Annotated[str | None, typer.Option("--ram", help="RAM budget, e.g. 32GiB")]
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
) -> Machine:
    """The Machine the options describe (shared by `simulate` and `placement`)."""
    base = load_profile_file(hardware) if hardware else local_machine()
    return apply_overrides(
        base,
        Overrides(
            ram=parse_size(ram) if ram else None,
            gpu_memory=tuple(parse_size(g) for g in gpu_memory) if gpu_memory else None,
            threads=threads or None,
            ram_gbps=ram_bandwidth,
            gpu_gbps=gpu_bandwidth,
            disk_gbps=disk_bandwidth,
        ),
    )


def simulate(
    model: Annotated[
        str, typer.Argument(help="Path to a .gguf file (default: built-in Gemma)")
    ] = "",
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="Prompt length")] = 512,
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Tokens to generate")] = 128,
    ctx: Annotated[
        int, typer.Option("--ctx", help="Context size (0: auto, may shrink to fit)")
    ] = 0,
    cache_type: Annotated[
        str, typer.Option("--cache-type", help="KV cache type: f16, q8_0, q4_0")
    ] = "f16",
    hardware: HardwareOpt = None,
    gpu_memory: GpuMemOpt = None,
    ram: RamOpt = None,
    threads: ThreadsOpt = 0,
    ram_bandwidth: RamBwOpt = None,
    gpu_bandwidth: GpuBwOpt = None,
    disk_bandwidth: DiskBwOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Predict memory, speed and the bottleneck of running MODEL, without loading it."""
    machine = machine_from_options(
        hardware, gpu_memory, ram, threads, ram_bandwidth, gpu_bandwidth, disk_bandwidth
    )
    pred = simulate_model(model, machine, prompt_tokens, output_tokens, ctx, cache_type, threads)
    if as_json:
        print_json(pred.to_json())
    else:
        print_report(pred)


def simulate_model(
    model: str,
    machine: Machine,
    prompt_tokens: int,
    output_tokens: int,
    ctx: int,
    cache_type: str,
    threads: int,
) -> Prediction:
    w = Workload(prompt_tokens=prompt_tokens, output_tokens=output_tokens, n_ctx=ctx or None)
    return simulate_plan(
        resolve_model(model), machine, w, threads=threads, type_k=cache_type, type_v=cache_type
    )


def _section(title: str, rows: list[tuple[str, str]]) -> None:
    t = Table(title=title, show_header=False, title_justify="left", title_style="bold")
    t.add_column(style="cyan")
    t.add_column()
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)


def print_report(p: Prediction) -> None:
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
    hw.append(("disk", f"{m.disk_gbps:g} GB/s"))
    _section(f"Hardware ({m.source})", hw)
    _section("Model", [("file", plan.model_path), ("name", plan.model_name)])
    verdict = "yes" + (" — disk-bound: " + plan.reason if plan.disk_bound else "")
    feas = [("fits", verdict), ("plan", plan.summary().removeprefix("plan: "))]
    feas += [("changed", str(c)) for c in plan.changes]
    _section("Feasibility", feas)
    _section("Peak memory", [(k, format_bytes(v)) for k, v in p.peak_memory.items()])
    perf = [
        ("prefill", f"{p.prefill_tps:.1f} tokens/s"),
        ("decode", f"{p.decode_tps:.1f} tokens/s"),
        ("TTFT", f"{p.ttft_s * 1000:.0f} ms for {p.workload.prompt_tokens} prompt tokens"),
        ("total", f"{p.total_s:.2f} s for {p.workload.output_tokens} output tokens"),
    ]
    _section("Performance", perf)
    _section(
        "Memory traffic per token", [(k, format_bytes(v)) for k, v in p.traffic_per_token.items()]
    )
    _section("Bottleneck", [("decode", p.bottleneck), ("recommendation", p.recommendation)])
    for note in m.notes:
        out.print(f"[dim]note: {note}[/]")
    out.print(f"[dim]calibration: {p.calibration.source}[/]")
