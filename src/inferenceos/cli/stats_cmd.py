"""`inferenceos stats`: per model and machine, how many runs and how fast they went."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from inferenceos.cli.console import out, print_json, safe_text


def _f(x: float | None, nd: int = 1) -> str:
    """A figure with `nd` decimals below 100, none above (the last digits are noise)."""
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.{nd}f}"


def _model_filter(model: str | None) -> Path | str | None:
    """What `--model` means to the telemetry store: a file is itself; a registry name
    is its file (runs are keyed by the file's digest, whatever name they ran under:
    `run NAME` records the GGUF header's name, the server NAME:latest); anything else
    is matched against the recorded names."""
    if not model:
        return None
    path = Path(model).expanduser()
    if path.is_file():
        return path
    from inferenceos.errors import InferenceOSError
    from inferenceos.registry.store import ModelStore

    try:
        entry = ModelStore().find(model)
    except InferenceOSError:  # not a registry name (a recorded name may be any text)
        return model
    return entry.path if entry is not None and entry.path.is_file() else model


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

    mach = None if machine == "all" else machine
    rows = telemetry.stats(_model_filter(model), mach, source=source)
    if as_json:
        print_json({"database": str(telemetry.db_path()),
                    "runs": sum(s.runs for s in rows),
                    "models": [s.to_json() for s in rows]})
        return
    if not rows and model:
        from inferenceos.registry.names import did_you_mean

        recorded = [s.model_name for s in telemetry.stats(None, mach, source=source)]
        out.print(f"no runs recorded for {model!r}{did_you_mean(model, recorded)}",
                  markup=False)
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
