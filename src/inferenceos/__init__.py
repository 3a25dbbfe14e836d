"""InferenceOS: a control plane over llama.cpp for running GGUF models locally.

The Python API (see docs/python.md) loads lazily: `import inferenceos` stays cheap, and
`inferenceos.load`, `pull`, `list`, `simulate`, `Model`, `Completion` and `TextStream`
import `inferenceos.api` on first use.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from inferenceos.version import __version__

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
