"""`inferenceos models list|show|pull|rm|cp|stop|discover|search`: the models on this machine.

`pull`, `list`, `show`, `rm`, `cp` and `stop` are also top-level commands, as in Ollama.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from inferenceos.cli.console import err, out, print_json, safe_text
from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.units import format_bytes as fmt_bytes

if TYPE_CHECKING:
    from inferenceos.registry.store import ModelEntry, ModelStore

models_app = typer.Typer(
    help="Models on disk: list, show, pull (Hugging Face Hub or a local file), rm, cp, "
         "stop, discover, search.",
    no_args_is_help=True)


def _store() -> ModelStore:
    from inferenceos.registry.store import ModelStore

    return ModelStore()


def _entry_json(e: ModelEntry) -> dict[str, Any]:
    return {"name": e.name, "digest": e.digest, "size": e.size, "source": e.source,
            "architecture": e.architecture, "file_type": e.file_type,
            "modified_at": e.modified_at, "parts": e.parts, "in_place": e.in_place,
            "projector": str(e.projector) if e.projector is not None else None}


def _projector_json(e: ModelEntry) -> dict[str, Any] | None:
    """The entry's projector as `show` reports it; `problem` says why it cannot be
    used (missing, or not a projector), "" when it can."""
    from inferenceos.model.projector_files import read_projector

    if e.projector is None:
        return None
    data: dict[str, Any] = {"path": str(e.projector), "digest": e.projector_digest,
                            "in_place": e.projector_location is not None, "problem": ""}
    try:
        p = read_projector(e.projector)
    except InferenceOSError as exc:
        data["problem"] = "missing" if not e.projector.exists() else \
            " ".join(str(exc).replace(str(e.projector), "the file").split())[:200]
        return data
    data.update(type=p.projector_type or "unknown", weights=p.weight_type, size=p.size,
                vision=p.vision, audio=p.audio)
    return data


def _projector_line(proj: dict[str, Any]) -> str:
    if proj["problem"]:
        return f"{proj['path']} ({proj['problem']}: images cannot be used; pull the model " \
               "again or pass --mmproj FILE)"
    media = " + ".join(m for m in ("vision", "audio") if proj[m]) or "no encoder"
    return f"{proj['path']} ({proj['type']}, {media}, {proj['weights']}, " \
           f"{fmt_bytes(proj['size'])})"


def _table(entries: list[ModelEntry]) -> Table:
    table = Table(box=None)
    # names are never cut: a user copies them into the next command
    table.add_column("NAME", no_wrap=True, min_width=max((len(e.name) for e in entries),
                                                          default=4))
    for column in ("ID", "SIZE", "TYPE", "MODIFIED"):
        table.add_column(column)
    for e in entries:
        kind = f"{e.architecture} {e.file_type}" + (" +mmproj" if e.projector else "") + \
            (" (in place)" if e.in_place else "")
        table.add_row(safe_text(e.name), e.digest[:12], fmt_bytes(e.size), safe_text(kind),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(e.modified_at)))
    return table


@models_app.command("list")
def list_models(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Registered models."""
    entries = _store().list()
    if as_json:
        print_json([_entry_json(e) for e in entries])
        return
    out.print(_table(entries))


@models_app.command("search")
def search(
    words_in: Annotated[list[str], typer.Argument(
        metavar="WORDS...", help="Words to look for (all must match)")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Registered models whose name, architecture, type or source hold every word
    (`models search qwen 1.5b`, as `models search "qwen 1.5b"`)."""
    text = " ".join(words_in)
    words = text.lower().split()
    hits = [e for e in _store().list()
            if all(w in f"{e.name} {e.architecture} {e.file_type} {e.source}".lower()
                   for w in words)]
    if as_json:
        print_json([_entry_json(e) for e in hits])
        return
    if not hits:
        err.print(f"no registered model matches {text!r}", markup=False)
        raise typer.Exit(1)
    out.print(_table(hits))


@models_app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="Model name")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """One model's entry: file, digest, architecture, projector (images / audio)."""
    e = _store().get(name)
    proj = _projector_json(e)
    data = {"name": e.name, "path": str(e.path), "digest": e.digest, "size": e.size,
            "source": e.source, "architecture": e.architecture, "file_type": e.file_type,
            "parameters": e.parameters, "context_length": e.context_length,
            "parts": e.parts, "in_place": e.in_place, "projector": proj}
    if as_json:
        print_json(data)
        return
    for k, v in data.items():
        if k == "projector":
            v = _projector_line(proj) if proj is not None else "none (text only)"
        out.print(f"{k:>15}  {safe_text(str(v))}")


def _looks_like_path(source: str) -> bool:
    return (Path(source).expanduser().exists() or source.lower().endswith(".gguf")
            or source.startswith(("/", "./", "../", "~", "\\")))


@models_app.command("pull")
def pull(
    source: Annotated[str, typer.Argument(
        help="hf.co/ORG/REPO[:QUANT], hf.co/ORG/REPO/FILE.gguf, a .gguf path, or "
             "'gemma3-270m' (built-in)")],
    name: Annotated[str | None, typer.Option("--name", help="Register under this name")] = None,
    link: Annotated[bool, typer.Option(
        "--link", help="Hard-link a local file instead of copying (it must then stay unchanged)")
    ] = False,
    mmproj: Annotated[str | None, typer.Option(
        "--mmproj", help="A local file's projector (mmproj GGUF) for images / audio, or "
                         "'none' (default: the one beside the file, if any)")] = None,
) -> None:
    """Register a model: from the Hugging Face Hub, a local GGUF file, or the built-in one.

    From the Hub, the quant tag picks the file (default: the best that fits this
    machine); the download resumes after a cut, is checked against the Hub's sha256, and
    llama.cpp must accept the file before it is registered. HF_ENDPOINT, HF_TOKEN and
    HF_HUB_OFFLINE are honoured. A vision model's projector (mmproj) comes with it: the
    repo's (f16 preferred), or the one beside a local file.
    """
    from inferenceos.registry import hub
    from inferenceos.registry.loadcheck import check_loadable
    from inferenceos.registry.store import AUTO

    store = _store()
    if mmproj is not None and (hub.is_hub_name(source) or not _looks_like_path(source)):
        raise UsageError("--mmproj is for a local .gguf file; a Hub pull takes the "
                         "repository's projector")
    projector: Path | str | None = AUTO
    if mmproj is not None:
        projector = None if mmproj.lower() == "none" else Path(mmproj).expanduser()

    def progress(msg: str) -> None:
        err.print(msg, style="dim", markup=False)

    if hub.is_hub_name(source):
        e = _pull_hub(store, source, name)
    elif _looks_like_path(source):
        e = store.import_file(Path(source).expanduser(), name, link=link, progress=progress,
                              check=check_loadable, projector=projector)
    else:
        e = store.pull(source, progress=progress)
        if name:
            e = store.copy(e.name, name)
    out.print(f"{safe_text(e.name)}  {e.digest[:12]}  {fmt_bytes(e.size)}", markup=False)
    if e.projector is not None:
        shown = (e.projector_digest or "")[:12] or str(e.projector)
        out.print(f"projector  {safe_text(shown)}  {fmt_bytes(e.projector.stat().st_size)}")


def _pull_hub(store: ModelStore, source: str, name: str | None) -> ModelEntry:
    """A Hub pull with a Rich progress bar per file (on stderr)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from inferenceos.registry import hub

    entry = None
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())
    with contextlib.ExitStack() as stack:
        bar: Progress | None = None  # started with the first byte: no empty live line
        tasks: dict[str, Any] = {}
        for event in hub.pull_events(store, source, name=name):
            if event.digest and event.total is not None:
                if bar is None:
                    bar = stack.enter_context(Progress(*columns, console=err))
                if event.digest not in tasks:
                    tasks[event.digest] = bar.add_task(event.status, total=event.total)
                bar.update(tasks[event.digest], completed=event.completed)
            elif event.status != "success":
                (bar.console if bar else err).print(safe_text(event.status), style="dim")
            entry = event.entry or entry
    assert entry is not None  # pull_events ends with "success" or raises
    return entry


@models_app.command("rm")
def rm(names: Annotated[list[str], typer.Argument(help="Model names")]) -> None:
    """Remove models (a file goes with its last name; `discover`ed files stay in place)."""
    store = _store()
    for n in names:
        e = store.find(n)
        store.remove(n)
        where = " (its file stays where it is)" if e is not None and e.in_place else ""
        out.print(f"deleted '{safe_text(n)}'{where}")


@models_app.command("cp")
def cp(
    source: Annotated[str, typer.Argument(help="Existing name")],
    destination: Annotated[str, typer.Argument(help="New name")],
) -> None:
    """Give a model a second name (no copy of the file)."""
    e = _store().copy(source, destination)
    out.print(f"copied '{safe_text(source)}' to '{safe_text(e.name)}'")


@models_app.command("stop")
def stop(
    model: Annotated[str, typer.Argument(help="A model the running server has loaded")],
    host: Annotated[str | None, typer.Option("--host")] = None,
    port: Annotated[int | None, typer.Option("--port")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="The server's API key (default: server.api_key)")] = None,
) -> None:
    """Unload a model from the running server now (as `ollama stop`)."""
    from inferenceos.cli.server_client import ServerClient
    from inferenceos.registry.names import canonical

    client = ServerClient.configured(host=host, port=port, api_key=api_key)
    loaded = [str(m.get("name")) for m in client.get_json("/api/ps").get("models", [])]
    wanted = canonical(model)
    if wanted not in loaded:
        shown = ", ".join(loaded) or "none"
        raise InferenceOSError(f"model '{wanted}' is not loaded (loaded: {shown})")
    client.post_json("/api/generate", {"model": wanted, "keep_alive": 0}, timeout=60)
    out.print(f"stopped '{safe_text(wanted)}'")


@models_app.command("discover")
def discover(
    folders: Annotated[list[Path] | None, typer.Argument(
        help="Folders to look in (default: Ollama's, LM Studio's and the Hugging Face "
             "cache's places)")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only show what would be registered")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Ask llama.cpp whether it can load each file (about 1-2 s a file)")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Register GGUF models other tools keep, in place, under their familiar names.

    Looks in Ollama's store, LM Studio's models folders and the Hugging Face cache, or in
    FOLDERS; nothing is copied, and `rm` only forgets the name.
    """
    from inferenceos.registry.discover import default_places
    from inferenceos.registry.discover import discover as run_discover
    from inferenceos.registry.loadcheck import check_loadable

    for folder in folders or []:
        if not folder.expanduser().is_dir():
            raise InferenceOSError(f"{folder}: not a folder")
    outcomes = run_discover(_store(), folders or None, dry_run=dry_run,
                            check=check_loadable if check else None)
    if as_json:
        print_json([{"name": o.found.name, "path": str(o.found.path), "tool": o.found.tool,
                     "status": o.status, "reason": o.reason,
                     "projector": str(o.found.projector) if o.found.projector else None}
                    for o in outcomes])
        return
    if not outcomes:
        where = ", ".join(str(f) for f in folders) if folders else \
            ", ".join(str(p) for _, p in default_places())
        out.print(f"no GGUF models found in {where}", markup=False)
        return
    table = Table("STATUS", box=None)
    table.add_column("NAME", no_wrap=True,
                     min_width=max(len(o.found.name) for o in outcomes))
    table.add_column("FROM")
    table.add_column("FILE")
    for o in outcomes:
        table.add_row(o.status, safe_text(o.found.name), o.found.tool,
                      safe_text(o.reason or str(o.found.path)))
    out.print(table)
    counts = {s: sum(o.status == s for o in outcomes)
              for s in ("added", "would-add", "present", "skipped")}
    out.print(", ".join(f"{n} {s}" for s, n in counts.items() if n), markup=False)
