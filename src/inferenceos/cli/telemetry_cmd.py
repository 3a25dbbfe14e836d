"""`inferenceos telemetry`: what the runtime has recorded, and moving or clearing it.

    inferenceos telemetry              status: on/off, where, how many rows
    inferenceos telemetry --off / --on turn recording off / on (the telemetry.enabled key)
    inferenceos telemetry export FILE  everything recorded, as JSON
    inferenceos telemetry import FILE  merge an export (seed a machine of the same kind)
    inferenceos telemetry reset        delete the database (asks first unless --yes)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from inferenceos.cli.console import out, print_json
from inferenceos.errors import UsageError
from inferenceos.units import format_bytes

telemetry_app = typer.Typer(
    help="Show, export, import or reset what the runtime has recorded; --off / --on.",
    invoke_without_command=True)


def _status() -> dict[str, Any]:
    from inferenceos import telemetry
    from inferenceos.config import load_config

    path = telemetry.db_path()
    cfg = load_config()
    size = sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal"))
               if p.exists())
    machine = telemetry.current_machine()
    return {"enabled": bool(cfg.get("telemetry.enabled")),
            "enabled_from": cfg.source("telemetry.enabled"), "path": str(path),
            "exists": path.exists(), "bytes": size, "rows": telemetry.counts(),
            "machine": {"fingerprint": machine.fingerprint, "kind": machine.kind},
            "kv_cache": _kv_cache_status()}


def _kv_cache_status() -> dict[str, Any]:
    """The recorded generations' use of the KV cache, and its disk tier now."""
    from inferenceos.engine.kv.store import disk_usage
    from inferenceos.paths import data_dir
    from inferenceos.telemetry.queries import prompt_cache

    disk = disk_usage(data_dir() / "kv-cache")
    return {**prompt_cache(),
            "disk_entries": sum(r["entries"] for r in disk.values()),
            "disk_bytes": sum(r["bytes"] for r in disk.values())}


def _kv_cache_line(kv: dict[str, Any]) -> str:
    used = ""
    if kv.get("generations"):
        share = kv["cached_tokens"] / kv["prompt_tokens"] if kv["prompt_tokens"] else 0.0
        used = (f"{kv['hits']} of {kv['generations']} generations reused a cached prefix, "
                f"{kv['cached_tokens']} of {kv['prompt_tokens']} prompt tokens "
                f"({share:.0%}); ")
    return (f"kv cache:  {used}disk tier {kv['disk_entries']} entries, "
            f"{format_bytes(kv['disk_bytes'])}")


@telemetry_app.callback()
def telemetry_cmd(
    ctx: typer.Context,
    off: Annotated[bool, typer.Option("--off", help="Stop recording (config key "
                                                    "telemetry.enabled = false)")] = False,
    on: Annotated[bool, typer.Option("--on", help="Record again")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Status as JSON")] = False,
) -> None:
    """Show whether runs are recorded, where, and how much; --off / --on switch it."""
    if off and on:
        raise UsageError("--off and --on exclude each other")
    if ctx.invoked_subcommand is not None:
        if off or on:
            raise UsageError("--off / --on go without a subcommand")
        return
    from inferenceos import telemetry

    if off or on:
        telemetry.set_enabled(on)
        out.print(f"telemetry {'on' if on else 'off'}: runs, requests and loads are "
                  f"{'' if on else 'no longer '}recorded (config key telemetry.enabled)",
                  markup=False)
        return
    status = _status()
    if as_json:
        print_json(status)
        return
    state = "on" if status["enabled"] else "off"
    out.print(f"telemetry: {state} (telemetry.enabled from {status['enabled_from']})",
              markup=False)
    out.print(f"database:  {status['path']} ({format_bytes(status['bytes'])})", markup=False)
    out.print(f"machine:   {status['machine']['fingerprint']} "
              f"(kind {status['machine']['kind']})", markup=False)
    rows = status["rows"]
    if rows:
        out.print("rows:      " + _counts(rows), markup=False)
    else:
        out.print("rows:      none recorded yet", markup=False)
    out.print(_kv_cache_line(status["kv_cache"]), markup=False)


def _counts(rows: dict[str, int]) -> str:
    """Rows per table as one line: "generations 3, loads 1" (the order given)."""
    return ", ".join(f"{k} {v}" for k, v in rows.items())


@telemetry_app.command("export")
def export_cmd(
    file: Annotated[Path, typer.Argument(help="Where to write the JSON export")],
) -> None:
    """Write everything recorded to FILE (JSON), to import on another machine."""
    from inferenceos import telemetry

    out.print(f"exported to {file}: {_counts(telemetry.export_file(file))}", markup=False)


@telemetry_app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="A file written by `telemetry export`")],
) -> None:
    """Merge an export into this machine's database (importing twice adds nothing)."""
    from inferenceos import telemetry

    out.print(f"imported {file}: {_counts(telemetry.import_file(file))}", markup=False)


@telemetry_app.command("reset")
def reset_cmd(
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask")] = False,
) -> None:
    """Delete the telemetry database: everything learned on this machine is forgotten."""
    from inferenceos import telemetry

    path = telemetry.db_path()
    if not yes and not typer.confirm(f"Delete {path}?", default=False):
        out.print("nothing changed")
        raise typer.Exit(1)
    existed = telemetry.reset()
    out.print(f"deleted {path}" if existed else f"nothing to delete ({path} does not exist)",
              markup=False)
