"""InferenceOS: a control plane over llama.cpp for running GGUF models locally.

The Python API (see docs/python.md) loads lazily: `import inferenceos` stays cheap, and
`inferenceos.load`, `pull`, `list`, `simulate`, `Model`, `Completion` and `TextStream`
import `inferenceos.api` on first use.
"""

from __future__ import annotations

import sys as _sys


def _cli_early_interrupt() -> None:
    """The CLI's process (`python -m inferenceos`, the `inferenceos` script): until its
    entry point runs (cli/entry.py, which gives Python its own handler back), a Ctrl-C
    ends the process in the CLI's one line and exit 130, not in a traceback from the
    middle of an import. A fresh clone compiles every module on first use, and a SIGINT
    at 0.14 s landed in this file's imports (tests/cli/test_interrupt_stress.py). Here
    first, before any other import; an importing library or program is left alone."""
    import os
    import signal

    argv0 = os.path.basename(_sys.argv[0]) if _sys.argv else ""
    if _sys.orig_argv[1:3] != ["-m", "inferenceos"] and argv0 != "inferenceos":
        return

    def stop(signum: int, frame: object) -> None:
        os.write(2, b"error: interrupted\n")
        os._exit(130)

    signal.signal(signal.SIGINT, stop)


_cli_early_interrupt()

import builtins  # noqa: E402  (after the handler above: see its docstring)
from typing import TYPE_CHECKING, Any  # noqa: E402

from inferenceos.version import __version__  # noqa: E402

_API = ("Completion", "Model", "TextStream", "list", "load", "pull", "simulate")
__all__ = [
    "Completion", "Model", "TextStream", "__version__", "list", "load", "pull", "simulate",
]

if TYPE_CHECKING:
    from inferenceos.api import Completion, Model, TextStream, list, load, pull, simulate


def __getattr__(name: str) -> Any:
    if name in _API:
        from inferenceos import api

        return getattr(api, name)
    raise AttributeError(f"module 'inferenceos' has no attribute {name!r}")


def __dir__() -> builtins.list[str]:
    return sorted([*globals(), *_API])
