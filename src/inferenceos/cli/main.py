"""The `inferenceos` command: a thin Typer shell over the Python API.

Each command lives in its own module and is registered here. `main()` is the console
entry point: it turns user errors (`InferenceOSError`) into one line on stderr and a
non-zero exit code, and never shows a traceback unless INFERENCEOS_DEBUG=1.
"""

from __future__ import annotations

import os
import sys

import typer

from inferenceos.cli import (
    cache_cmd,
    config_cmd,
    doctor_cmd,
    hardware_cmd,
    inspect_cmd,
    logs_cmd,
    models_cmd,
    placement_cmd,
    plugins_cmd,
    ps_cmd,
    reset_cmd,
    run_cmd,
    serve_cmd,
    simulate_cmd,
    stats_cmd,
    telemetry_cmd,
    update_cmd,
    version_cmd,
)
from inferenceos.cli.console import print_error
from inferenceos.errors import InferenceOSError

app = typer.Typer(
    name="inferenceos",
    help="Plan, run and serve GGUF models locally on llama.cpp.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# One line per command; keep the order of `inferenceos --help`.
app.command("run")(run_cmd.run)
app.command("serve")(serve_cmd.serve)
app.add_typer(models_cmd.models_app, name="models")
app.command("ps")(ps_cmd.ps)
app.command("inspect")(inspect_cmd.inspect)
app.command("simulate")(simulate_cmd.simulate)
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


def main() -> None:
    """Console entry point."""
    from inferenceos import logs

    logs.setup("cli")
    try:
        app()
    except InferenceOSError as exc:
        print_error(str(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print_error("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug: say so briefly, keep the traceback for debugging
        if os.environ.get("INFERENCEOS_DEBUG"):
            raise
        print_error(
            f"internal error: {type(exc).__name__}: {exc} "
            "(set INFERENCEOS_DEBUG=1 to see the traceback)"
        )
        sys.exit(70)
