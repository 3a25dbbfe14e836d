"""The console entry point, importing nothing until it can answer a Ctrl-C.

`inferenceos.cli.main` imports Typer, Rich and every command module (a few hundred
milliseconds); a Ctrl-C in that time used to end in a Python traceback and exit -2.
Here it ends in one line and exit 130, as it does once the command runs.
"""

from __future__ import annotations

import sys
from typing import NoReturn


def main() -> None:
    """Console entry point: import the CLI, then run it (`inferenceos.cli.main.main`).

    A Ctrl-C that reaches here, while importing or from any moment the CLI's own
    handling does not cover, ends in the same one line and exit 130."""
    import signal

    from inferenceos import interrupt

    # a Ctrl-C that lands in a weakref callback of importlib's module locks (or any other
    # place Python drops exceptions) is raised again, not printed and lost
    interrupt.guard_unraisable()
    # the package's early handler (inferenceos/__init__.py) gives way to Python's
    # KeyboardInterrupt, which the commands handle (chat: Ctrl-C stops a reply)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        from inferenceos.cli.main import main as run_cli

        run_cli()
    except KeyboardInterrupt:
        _interrupted()
    except Exception as exc:
        # a Ctrl-C inside a class definition while importing (Typer's first import of
        # ipaddress, before 3.12) arrives wrapped in a RuntimeError: CI's exit 1
        if not interrupt.interrupted_inside(exc):
            raise
        _interrupted()


def _interrupted() -> NoReturn:
    """The one line and exit 130 of a Ctrl-C that ended the process."""
    from inferenceos.interrupt import exit_interrupted

    sys.stderr.write("error: interrupted\n")
    exit_interrupted(130)
