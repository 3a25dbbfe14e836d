"""The `inferenceos` command: a thin Typer shell over the Python API.

Each command lives in its own module and is registered here. `main()` is the console
entry point: it turns user errors (`InferenceOSError`) into one line on stderr and a
non-zero exit code, and never shows a traceback unless INFERENCEOS_DEBUG=1. When the
command line has `--json`, every failure (a usage error included) is printed as one JSON
object `{"error": ..., "type": ...}` on stdout instead, still with a non-zero exit code.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
import typer.core

from inferenceos.cli import (
    benchmark_cmd,
    budget_cmd,
    cache_cmd,
    chat_cmd,
    config_cmd,
    doctor_cmd,
    hardware_cmd,
    inspect_cmd,
    logs_cmd,
    models_cmd,
    monitor_cmd,
    optimize_cmd,
    placement_cmd,
    plugins_cmd,
    profile_cmd,
    ps_cmd,
    reset_cmd,
    run_cmd,
    serve_cmd,
    simulate_cmd,
    stats_cmd,
    telemetry_cmd,
    update_cmd,
    version_cmd,
    worker_cmd,
)
from inferenceos.cli.console import print_error, print_json
from inferenceos.errors import InferenceOSError, Interrupted


class _Commands(typer.core.TyperGroup):
    """The command group, with Ctrl-C inside a command made an error that `main` prints
    (Typer would turn it into a silent exit 130)."""

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

# One line per command; keep the order of `inferenceos --help`.
app.command("run")(run_cmd.run)
app.command("chat")(chat_cmd.chat)
app.command("serve")(serve_cmd.serve)
app.add_typer(models_cmd.models_app, name="models")
app.command("pull")(models_cmd.pull)
app.command("list")(models_cmd.list_models)
app.command("show")(models_cmd.show)
app.command("rm")(models_cmd.rm)
app.command("cp")(models_cmd.cp)
app.command("stop")(models_cmd.stop)
app.command("ps")(ps_cmd.ps)
app.command("monitor")(monitor_cmd.monitor)
app.command("budget")(budget_cmd.budget)
app.command("inspect")(inspect_cmd.inspect)
app.command("simulate")(simulate_cmd.simulate)
app.command("optimize")(optimize_cmd.optimize)
app.command("benchmark")(benchmark_cmd.benchmark)
app.command("profile")(profile_cmd.profile)
app.command("placement")(placement_cmd.placement)
app.command("hardware")(hardware_cmd.hardware)
app.command("doctor")(doctor_cmd.doctor)
app.command("version")(version_cmd.version)
app.add_typer(config_cmd.config_app, name="config")
app.add_typer(cache_cmd.cache_app, name="cache")
app.command("reset")(reset_cmd.reset)
app.command("update")(update_cmd.update)
app.command("plugins")(plugins_cmd.plugins)
app.add_typer(telemetry_cmd.telemetry_app, name="telemetry")
app.command("stats")(stats_cmd.stats)
app.command("logs")(logs_cmd.logs)
app.command("worker")(worker_cmd.worker)


def _print_version(value: bool) -> None:
    if value:
        from inferenceos import __version__

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
    from inferenceos import logs

    logs.setup("cli")
    try:
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
        if os.environ.get("INFERENCEOS_DEBUG"):
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc} "
              "(set INFERENCEOS_DEBUG=1 to see the traceback)", 70, "InternalError", as_json)
    _exit(code if isinstance(code, int) else 0)
