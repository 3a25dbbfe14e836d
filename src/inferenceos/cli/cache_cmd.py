"""`inferenceos cache`: list and clean what InferenceOS keeps to save work.

Kinds and where they live (each written by some part of InferenceOS, each re-created
when needed; models, sessions and the telemetry history are never touched here):
  profiles     <data dir>/hardware          hardware profiles (`inferenceos hardware`)
  digests      <cache dir>/digests.json     sha256 of model files, by size and mtime
  self-drafts  <cache dir>/self-drafts      layer-skipped draft models (speculative decoding)
  kv-cache     <data dir>/kv-cache          the KV cache's disk tier (engine/kv/store.py):
                                            saved conversation prefixes, one folder per
                                            model and KV layout
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from inferenceos.cli.console import out, print_json
from inferenceos.errors import UsageError
from inferenceos.paths import cache_dir, data_dir
from inferenceos.units import format_bytes

cache_app = typer.Typer(help="List and clean cached hardware profiles, file digests, "
                        "self-draft models and the KV cache's disk tier.",
                        invoke_without_command=True)


def cache_kinds() -> dict[str, Path]:
    """Every cache kind and its folder."""
    return {"profiles": data_dir() / "hardware", "digests": cache_dir() / "digests.json",
            "self-drafts": cache_dir() / "self-drafts", "kv-cache": data_dir() / "kv-cache"}


def usage(path: Path) -> tuple[int, int]:
    """(files, bytes) of the file or folder `path`; (0, 0) when it does not exist."""
    if path.is_file():
        return 1, path.stat().st_size
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
    return len(files), sum(p.stat().st_size for p in files)


def clean(kinds: list[str]) -> dict[str, int]:
    """Delete the folders of `kinds`; {kind: bytes freed}. UsageError on unknown kinds."""
    known = cache_kinds()
    unknown = [k for k in kinds if k not in known]
    if unknown:
        raise UsageError(f"unknown cache kind(s) {', '.join(unknown)}; "
                         f"known: {', '.join(known)}")
    freed = {}
    for kind in kinds:
        if kind == "kv-cache":  # under its lock: a running server may be writing
            from inferenceos.engine.kv.store import clear_disk

            freed[kind] = clear_disk(known[kind])
            continue
        freed[kind] = usage(known[kind])[1]
        if known[kind].is_file():
            known[kind].unlink(missing_ok=True)
        else:
            shutil.rmtree(known[kind], ignore_errors=True)
    return freed


@cache_app.callback()
def _default(ctx: typer.Context) -> None:
    """Without a subcommand: list the caches."""
    if ctx.invoked_subcommand is None:
        list_(as_json=False)


@cache_app.command("list")
def list_(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Each cache kind with its folder, file count and size."""
    from inferenceos.engine.kv.store import disk_usage

    rows = {k: (p, *usage(p)) for k, p in cache_kinds().items()}
    kv = disk_usage(cache_kinds()["kv-cache"])
    if as_json:
        data = {k: {"path": str(p), "files": n, "bytes": b} for k, (p, n, b) in rows.items()}
        data["kv-cache"]["keys"] = kv
        print_json(data)
        return
    t = Table(title="Caches", title_justify="left")
    for col in ("kind", "files", "size", "where"):
        t.add_column(col)
    for kind, (folder, n, size) in rows.items():
        t.add_row(kind, str(n), format_bytes(size), str(folder))
    out.print(t)
    if kv:
        k = Table(title="KV cache (disk tier), by model and KV layout", title_justify="left")
        for col in ("key", "entries", "tokens", "size"):
            k.add_column(col)
        for key, row in sorted(kv.items()):
            k.add_row(key, str(row["entries"]), str(row["tokens"]), format_bytes(row["bytes"]))
        out.print(k)


@cache_app.command("clean")
def clean_cmd(
    kinds: Annotated[list[str] | None, typer.Argument(
        help="profiles, digests, self-drafts, kv-cache (default: all)")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask")] = False,
) -> None:
    """Delete cached files (all kinds unless some are named). Asks first."""
    chosen = kinds or list(cache_kinds())
    if not yes and not typer.confirm(f"Delete cached {', '.join(chosen)}?", default=False):
        out.print("nothing deleted")
        raise typer.Exit(1)
    freed = clean(chosen)
    out.print(", ".join(f"{k}: {format_bytes(b)} freed" for k, b in freed.items()))
