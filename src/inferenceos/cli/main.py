"""The `inferenceos` command: a thin Typer shell over the Python API.

Each command lives in its own module and is registered here. `main()` is the console
entry point: it turns user errors (`InferenceOSError`) into one line on stderr and a
non-zero exit code, and never shows a traceback unless INFERENCEOS_DEBUG=1. When the
command line has `--json`, every failure (a usage error included) is printed as one JSON
object `{"error": ..., "type": ...}` on stdout instead, still with a non-zero exit code.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from difflib import get_close_matches
from typing import Annotated, Any

import typer
import typer.core
import typer.main

from inferenceos import __version__
from inferenceos.cli.console import print_error, print_json
from inferenceos.errors import InferenceOSError, Interrupted
from inferenceos.interrupt import interrupted_inside


class _Commands(typer.core.TyperGroup):
    """The command group: the commands of COMMANDS, loaded when asked for, and Ctrl-C
    inside a command made an error that `main` prints (Typer would turn it into a
    silent exit 130)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMANDS, *GROUPS]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in COMMANDS or cmd_name in GROUPS:
            return _command(cmd_name)
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """Typer's, with its "Did you mean" taken from every command, loaded or not."""
        try:
            return super().resolve_command(ctx, args)
        except Exception as exc:
            message = getattr(exc, "message", None)
            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if _is_click_usage(exc) and isinstance(message, str) and matches \
                    and "Did you mean" not in message:
                names = ", ".join(f"{m!r}" for m in matches)
                exc.message = f"{message.rstrip('.')}. Did you mean {names}?"  # type: ignore[attr-defined]
            raise

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            raise Interrupted("interrupted") from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted("interrupted") from None


app = typer.Typer(
    cls=_Commands,
    name="inferenceos",
    help="Plan, run and serve GGUF models locally on llama.cpp.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Each command's module, imported only when the command runs (or --help lists it): the
# modules pull in the planner, numpy and gguf, ~0.17 s of every start that `ps`,
# `version` or `config` do not need. One line per command, in `inferenceos --help`'s
# order.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run_cmd", "run"),
    "chat": ("chat_cmd", "chat"),
    "serve": ("serve_cmd", "serve"),
    "pull": ("models_cmd", "pull"),
    "list": ("models_cmd", "list_models"),
    "show": ("models_cmd", "show"),
    "rm": ("models_cmd", "rm"),
    "cp": ("models_cmd", "cp"),
    "create": ("create_cmd", "create"),
    "stop": ("models_cmd", "stop"),
    "ps": ("ps_cmd", "ps"),
    "monitor": ("monitor_cmd", "monitor"),
    "budget": ("budget_cmd", "budget"),
    "inspect": ("inspect_cmd", "inspect"),
    "simulate": ("simulate_cmd", "simulate"),
    "optimize": ("optimize_cmd", "optimize"),
    "benchmark": ("benchmark_cmd", "benchmark"),
    "profile": ("profile_cmd", "profile"),
    "placement": ("placement_cmd", "placement"),
    "hardware": ("hardware_cmd", "hardware"),
    "doctor": ("doctor_cmd", "doctor"),
    "version": ("version_cmd", "version"),
    "reset": ("reset_cmd", "reset"),
    "update": ("update_cmd", "update"),
    "plugins": ("plugins_cmd", "plugins"),
    "stats": ("stats_cmd", "stats"),
    "logs": ("logs_cmd", "logs"),
    "worker": ("worker_cmd", "worker"),
}
# The command groups, listed after the commands (as Typer lists groups).
GROUPS: dict[str, tuple[str, str]] = {
    "models": ("models_cmd", "models_app"),
    "config": ("config_cmd", "config_app"),
    "cache": ("cache_cmd", "cache_app"),
    "telemetry": ("telemetry_cmd", "telemetry_app"),
}


@functools.cache
def _command(name: str) -> Any:
    """The Click command for COMMANDS[name] or GROUPS[name], its module imported now."""
    module, attr = COMMANDS.get(name) or GROUPS[name]
    target = getattr(importlib.import_module(f"inferenceos.cli.{module}"), attr)
    if name in GROUPS:
        group = typer.main.get_group(target)
        group.name = name
        return group
    single = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    single.command(name)(target)
    return typer.main.get_command(single)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"inferenceos {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", "-V", callback=_print_version, is_eager=True,
        help="Print the version and exit")] = False,
) -> None:
    """Plan, run and serve GGUF models locally on llama.cpp."""


def _wants_json(argv: list[str]) -> bool:
    """`--json` among the options (not after a `--` that ends them)."""
    args = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in args


def _fail(message: str, code: int, kind: str, as_json: bool) -> None:
    if as_json:
        print_json({"error": " ".join(message.split()), "type": kind})
    else:
        print_error(message)
    _exit(code)


def _exit(code: int) -> None:
    if code == Interrupted.exit_code:
        from inferenceos import interrupt

        interrupt.exit_interrupted(code)
    sys.exit(code)


def _is_click_usage(exc: Exception) -> bool:
    """A Click usage exception, whichever Click raised it (Typer vendors its own, so the
    class cannot be imported from a public place): it can show itself and has a code."""
    return all(hasattr(exc, a) for a in ("show", "format_message", "exit_code"))


def main() -> None:
    """Console entry point."""
    as_json = _wants_json(sys.argv[1:])
    try:
        # inside the try: with the commands loaded lazily, this is the first import of
        # platformdirs and the logging set-up, and a Ctrl-C in it must end in one line
        # (it ended in a traceback and exit -2: the stress test's moment at 0.46 s)
        from inferenceos import logs

        logs.setup("cli")
        code = app(standalone_mode=False)
    except InferenceOSError as exc:
        _fail(str(exc), exc.exit_code, type(exc).__name__, as_json)
    except KeyboardInterrupt:  # outside a command (while parsing the command line)
        _fail("interrupted", Interrupted.exit_code, Interrupted.__name__, as_json)
    except Exception as exc:
        if _is_click_usage(exc):  # a bad option, a missing argument, an unknown command
            if not as_json or type(exc).__name__ == "NoArgsIsHelpError":
                exc.show()  # type: ignore[attr-defined]
                sys.exit(int(exc.exit_code))  # type: ignore[attr-defined]
            _fail(exc.format_message(), int(exc.exit_code),  # type: ignore[attr-defined]
                  "UsageError", as_json)
        if type(exc).__name__ == "Abort":  # Ctrl-C or Ctrl-D at a confirmation prompt
            _fail("aborted", 1, "Aborted", as_json)
        if interrupted_inside(exc):
            _fail("interrupted", Interrupted.exit_code, Interrupted.__name__, as_json)
        if os.environ.get("INFERENCEOS_DEBUG"):
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc} "
              "(set INFERENCEOS_DEBUG=1 to see the traceback)", 70, "InternalError", as_json)
    _exit(code if isinstance(code, int) else 0)
