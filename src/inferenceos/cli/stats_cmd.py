"""`inferenceos stats`: per model and machine, how many runs and how fast they went."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from inferenceos.cli.console import out, print_json, safe_text


def _f(x: float | None, nd: int = 1) -> str:
    """A figure with `nd` decimals below 100, none above (the last digits are noise)."""
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.{nd}f}"


def stats(
    model: Annotated[str | None, typer.Option(
        "--model", help="Only this model (a path, digest or recorded name)")] = None,
    machine: Annotated[str, typer.Option(
        "--machine", help="all, current (this exact machine), kind (same hardware), "
                          "or a fingerprint")] = "all",
    source: Annotated[str | None, typer.Option(
        "--source", help="Only runs from run, server, benchmark:NAME (a trailing * "
                         "matches a prefix)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Runs per model and machine, decode and prefill t/s and TTFT percentiles."""
    from inferenceos import telemetry

    rows = telemetry.stats(model, None if machine == "all" else machine, source=source)
    if as_json:
        print_json({"database": str(telemetry.db_path()),
                    "runs": sum(s.runs for s in rows),
                    "models": [s.to_json() for s in rows]})
        return
    if not rows:
        out.print("no runs recorded yet (see `inferenceos telemetry`)")
        return
    table = Table(box=None, caption="t/s: p50 / p90 · TTFT: p50 / p90 / p99",
                  caption_justify="left")
    table.add_column("MODEL", min_width=10, overflow="fold")
    for name in ("MACHINE", "RUNS", "DECODE t/s", "PREFILL t/s", "TTFT ms"):
        table.add_column(name, no_wrap=True)  # figures never break over lines
    table.add_column("FROM", min_width=8, overflow="fold")
    for s in rows:
        table.add_row(
            safe_text(s.model_name), s.machine[:8], str(s.runs),
            f"{_f(s.decode_tps['p50'])} / {_f(s.decode_tps['p90'])}",
            f"{_f(s.prefill_tps['p50'])} / {_f(s.prefill_tps['p90'])}",
            f"{_f(s.ttft_ms['p50'], 0)} / {_f(s.ttft_ms['p90'], 0)} / "
            f"{_f(s.ttft_ms['p99'], 0)}",
            safe_text(", ".join(f"{k} {v}" for k, v in sorted(s.sources.items()))))
    out.print(table)
