"""`inferenceos config`: show, get, set, unset and edit the TOML configuration."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from inferenceos.cli.console import out, print_json
from inferenceos.config import (
    SETTINGS,
    ConfigError,
    config_path,
    env_var,
    load_config,
    read_file,
    set_value,
    unset_value,
)


class _ShorthandGroup(TyperGroup):
    """`config KEY VALUE` means `config set KEY VALUE`, and `config KEY` means
    `config get KEY` (a key has a dot; no subcommand does)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in self.commands and "." in args[0]:
            args = ["set" if len(args) > 1 else "get", *args]
        return super().resolve_command(ctx, args)


config_app = typer.Typer(
    help="Show or change settings (`config KEY VALUE` sets one, `config KEY` prints it). "
    "The file is TOML; INFERENCEOS_* env vars override it.",
    no_args_is_help=False, invoke_without_command=True, cls=_ShorthandGroup,
)


@config_app.callback()
def _default(ctx: typer.Context) -> None:
    """Without a subcommand: show every setting."""
    if ctx.invoked_subcommand is None:
        show(as_json=False)


@config_app.command("show")
def show(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Every setting with its effective value and where it comes from."""
    cfg = load_config()
    if as_json:
        print_json({"path": str(cfg.path), "values": cfg.values, "sources": cfg.sources})
        return
    t = Table(title=f"Settings ({escape(str(cfg.path))})", title_justify="left")
    t.add_column("key", no_wrap=True)
    t.add_column("value", overflow="fold")
    t.add_column("from")
    t.add_column("meaning")
    for key, s in SETTINGS.items():
        t.add_row(key, escape(_show(cfg.values[key])), cfg.sources[key], s.help)
    out.print(t)
    out.print("[dim]env vars override the file: INFERENCEOS_ + key in upper case, dots as "
              "underscores (server.port → INFERENCEOS_SERVER_PORT)[/]")


def _show(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@config_app.command("get")
def get(key: Annotated[str, typer.Argument(help="Setting, e.g. server.port")]) -> None:
    """Print one setting's effective value."""
    out.print(_show(load_config().get(key)), markup=False)


@config_app.command("set")
def set_(
    key: Annotated[str, typer.Argument(help="Setting, e.g. server.port")],
    value: Annotated[str, typer.Argument(help="New value")],
) -> None:
    """Store a setting in the config file (validated first)."""
    stored = set_value(key, value)
    out.print(f"{key} = {stored!r}  ({config_path()})", markup=False)
    if os.environ.get(env_var(key)) is not None:
        out.print(f"note: {env_var(key)} is set and overrides this value", markup=False)


@config_app.command("unset")
def unset(key: Annotated[str, typer.Argument(help="Setting to return to its default")]) -> None:
    """Remove a setting from the config file so its default applies again."""
    removed = unset_value(key)
    out.print(f"{key} {'reset to its default' if removed else 'was not set'}", markup=False)


@config_app.command("path")
def path() -> None:
    """Print where the config file lives."""
    out.print(str(config_path()), markup=False)


@config_app.command("edit")
def edit() -> None:
    """Open the config file in $VISUAL / $EDITOR; it is saved only if it validates."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or _first_editor()
    if not editor:
        raise ConfigError("no editor found: set $EDITOR, or use `inferenceos config set`")
    target = config_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, draft_name = tempfile.mkstemp(prefix="config.", suffix=".toml", dir=target.parent)
    draft = Path(draft_name)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(target.read_text(encoding="utf-8") if target.exists() else _template())
    if subprocess.call([*shlex.split(editor), str(draft)]) != 0:
        draft.unlink(missing_ok=True)
        raise ConfigError(f"editor {editor!r} failed; config unchanged")
    try:
        read_file(draft)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; config unchanged, your edit is kept in {draft}") from None
    os.replace(draft, target)
    out.print(f"saved {target}", markup=False)


def _first_editor() -> str | None:
    return next((e for e in ("nano", "vi", "vim") if shutil.which(e)), None)


def _template() -> str:
    lines = ["# InferenceOS configuration. Uncomment and change what you need.", ""]
    section = None
    for key, s in SETTINGS.items():
        sec, _, name = key.rpartition(".")
        if sec != section:
            lines += ["", f"[{sec}]"]
            section = sec
        default = str(s.default).lower() if isinstance(s.default, bool) else repr(s.default)
        default = f'"{s.default}"' if isinstance(s.default, str) else default
        lines.append(f"# {name} = {default}    # {s.help}")
    return "\n".join(lines) + "\n"
