"""`inferenceos models list|show|pull|rm|cp`: the model registry on this machine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from inferenceos.cli.console import err, out, print_json, safe_text
from inferenceos.units import format_bytes as fmt_bytes

models_app = typer.Typer(help="Models on disk: list, show, pull (import), rm, cp.",
                         no_args_is_help=True)


def _store():  # type: ignore[no-untyped-def]
    from inferenceos.registry.store import ModelStore

    return ModelStore()


@models_app.command("list")
def list_models(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Registered models."""
    entries = _store().list()
    if as_json:
        print_json([{"name": e.name, "digest": e.digest, "size": e.size, "source": e.source,
                     "architecture": e.architecture, "file_type": e.file_type,
                     "modified_at": e.modified_at} for e in entries])
        return
    table = Table("NAME", "ID", "SIZE", "TYPE", "MODIFIED", box=None)
    for e in entries:
        table.add_row(safe_text(e.name), e.digest[:12], fmt_bytes(e.size),
                      safe_text(f"{e.architecture} {e.file_type}"),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(e.modified_at)))
    out.print(table)


@models_app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="Model name")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """One model's entry: file, digest, architecture."""
    e = _store().get(name)
    data = {"name": e.name, "path": str(e.path), "digest": e.digest, "size": e.size,
            "source": e.source, "architecture": e.architecture, "file_type": e.file_type,
            "parameters": e.parameters, "context_length": e.context_length}
    if as_json:
        print_json(data)
        return
    for k, v in data.items():
        out.print(f"{k:>15}  {safe_text(str(v))}")


@models_app.command("pull")
def pull(
    source: Annotated[str, typer.Argument(help="A .gguf path, or 'gemma3-270m' (built-in)")],
    name: Annotated[str | None, typer.Option("--name", help="Register under this name")] = None,
    link: Annotated[bool, typer.Option(
        "--link", help="Hard-link instead of copying (the file must then stay unchanged)")
    ] = False,
) -> None:
    """Register a model: import a local GGUF file, or the built-in model by name.

    There is no model hub here: nothing is downloaded.
    """
    store = _store()
    path = Path(source).expanduser()
    def progress(msg: str) -> None:
        err.print(msg, style="dim")
    if path.is_file():
        e = store.import_file(path, name, link=link, progress=progress)
    else:
        e = store.pull(source, progress=progress)
        if name:
            e = store.copy(e.name, name)
    out.print(f"{safe_text(e.name)}  {e.digest[:12]}  {fmt_bytes(e.size)}")


@models_app.command("rm")
def rm(names: Annotated[list[str], typer.Argument(help="Model names")]) -> None:
    """Remove models (their file goes when no other name uses it)."""
    store = _store()
    for n in names:
        store.remove(n)
        out.print(f"deleted '{safe_text(n)}'")


@models_app.command("cp")
def cp(
    source: Annotated[str, typer.Argument(help="Existing name")],
    destination: Annotated[str, typer.Argument(help="New name")],
) -> None:
    """Give a model a second name (no copy of the file)."""
    e = _store().copy(source, destination)
    out.print(f"copied '{safe_text(source)}' to '{safe_text(e.name)}'")
