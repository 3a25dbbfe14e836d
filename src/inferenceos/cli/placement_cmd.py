"""`inferenceos placement MODEL`: the per-layer map of the plan, as a terminal picture.

One row per layer: which device holds its dense part and which its routed experts;
then bytes per device against a bar of its budget.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from inferenceos.cli.cluster_opts import GpuCapOpt, RamCapOpt, RpcOpt
from inferenceos.cli.console import out, print_json
from inferenceos.cli.plan_opts import KvQualityOpt
from inferenceos.cli.simulate_cmd import (
    DiskBwOpt,
    GpuBwOpt,
    HardwareOpt,
    MachineOptions,
    RamBwOpt,
    ThreadsOpt,
    simulate_model,
)
from inferenceos.plan.plan import Plan
from inferenceos.units import format_bytes

BAR = 30
_COLOURS = ("green", "magenta", "yellow", "blue", "red")


def placement(
    model: Annotated[
        str, typer.Argument(help="Path to a .gguf file (default: built-in Gemma)")
    ] = "",
    ctx: Annotated[int, typer.Option("--ctx", help="Context size (0: auto)")] = 0,
    hardware: HardwareOpt = None,
    gpu_memory: GpuCapOpt = None,
    ram: RamCapOpt = None,
    threads: ThreadsOpt = 0,
    ram_bandwidth: RamBwOpt = None,
    gpu_bandwidth: GpuBwOpt = None,
    disk_bandwidth: DiskBwOpt = None,
    rpc: RpcOpt = None,
    kv_quality: KvQualityOpt = None,
    explain: Annotated[bool, typer.Option(
        "--explain", help="Also show the best plans the optimizer rejected, with their "
        "predicted speed and memory")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON")] = False,
) -> None:
    """Show which device holds each layer and its experts, and each device's budget."""
    machine = MachineOptions(hardware, gpu_memory, ram, threads, ram_bandwidth,
                             gpu_bandwidth, disk_bandwidth, rpc).machine()
    pred = simulate_model(model, machine, 512, 128, ctx, "f16", threads,
                          kv_quality=kv_quality, explain=explain)
    plan = pred.plan
    if as_json:
        print_json(plan.to_json())
        return
    out.print(plan.summary())
    _layer_map(plan)
    _budget_bars(plan)
    for ch in plan.changes:
        out.print(f"[dim]changed: {ch}[/]")
    if explain:
        _alternatives(pred.decode_tps, pred.prefill_tps, plan)
        _drafters(pred.decode_tps, plan)


def _alternatives(decode_tps: float, prefill_tps: float, plan: Plan) -> None:
    """The chosen plan beside the best ones the optimizer rejected."""
    t = Table(title="Chosen plan and the best alternatives", title_justify="left")
    for col in ("", "plan", "decode t/s", "prefill t/s", "memory"):
        t.add_column(col)
    mem = ", ".join(f"{d} {format_bytes(b)}" for d, b in plan.memory.by_device.items())
    t.add_row("chosen", plan.summary().removeprefix("plan: "), f"{decode_tps:.1f}",
              f"{prefill_tps:.0f}", mem)
    for a in plan.alternatives:
        mem = ", ".join(f"{d} {format_bytes(b)}" for d, b in a["memory_by_device"].items())
        t.add_row("", a["label"], f"{a['decode_tps']:.1f}", f"{a['prefill_tps']:.0f}", mem)
    if not plan.alternatives:
        t.add_row("", "(no other plan fits)", "", "", "")
    out.print(t)


def _drafters(decode_tps: float, plan: Plan) -> None:
    """Each speculative drafter as the plan priced it (plan/draft_choice.py)."""
    d = plan.draft
    if d is None:
        return
    t = Table(title=f"Drafters: {d.line()}", title_justify="left")
    for col in ("", "drafter", "decode t/s", "speedup", "per draft token", "memory",
                "from"):
        t.add_column(col)
    for o in d.options:
        mark = "chosen" if o.drafter == (d.drafter or "none") else (
            "" if o.fits else "no room")
        t.add_row(mark, o.label, f"{decode_tps * o.speedup:.1f}", f"{o.speedup:.2f}x",
                  f"{o.cost:.2f} step" if o.drafter != "none" else "",
                  format_bytes(o.memory) if o.memory else "", o.basis)
    out.print(t)


def _colour(device: str, devices: list[str]) -> str:
    return "cyan" if device == "CPU" else _COLOURS[devices.index(device) % len(_COLOURS)]


def _layer_map(plan: Plan) -> None:
    p = plan.placement
    devs = [d for d in plan.budgets if d != "CPU"]
    has_experts = any(e is not None for e in p.experts)
    split = bool(p.ffn)  # some layer's FFN group runs away from its attention
    t = Table(title="Layers", title_justify="left")
    t.add_column("layer", justify="right")
    t.add_column("attention + KV" if split else "dense (attention + FFN + KV)")
    if split:
        t.add_column("FFN")
    if has_experts:
        t.add_column("routed experts")
    for i, (d, e) in enumerate(zip(p.dense, p.experts, strict=True)):
        row = [str(i), f"[{_colour(d, devs)}]{'█' * 6} {d}[/]"]
        if split:
            f = p.ffn_device(i)
            row.append(f"[{_colour(f, devs)}]{'▓' * 6} {f}[/]")
        if has_experts:
            row.append(f"[{_colour(e, devs)}]{'▒' * 6} {e}[/]" if e else "")
        t.add_row(*row)
    t.add_row("out", f"[{_colour(p.output_device, devs)}]{'█' * 6} {p.output_device}[/]")
    out.print(t)


def _budget_bars(plan: Plan) -> None:
    t = Table(title="Memory per device", title_justify="left")
    for col in ("device", "used / budget", ""):
        t.add_column(col)
    for dev, budget in plan.budgets.items():
        used = plan.memory.by_device.get(dev, 0)
        if dev == "CPU" and plan.placement.disk_bytes:
            used -= plan.placement.disk_bytes
        frac = min(1.0, used / budget) if budget else 1.0
        filled = round(frac * BAR)
        colour = "red" if used > budget else "green"
        bar = f"[{colour}]{'█' * filled}[/]{'░' * (BAR - filled)}"
        t.add_row(dev, f"{format_bytes(used)} / {format_bytes(budget)}", bar)
    if plan.placement.disk_bytes:
        t.add_row("disk (mmap)", format_bytes(plan.placement.disk_bytes), "read at every token")
    out.print(t)
