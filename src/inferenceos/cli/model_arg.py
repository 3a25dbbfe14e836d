"""Turn the MODEL argument of a command into a file path: names everywhere a path works."""

from __future__ import annotations

from pathlib import Path

from inferenceos.cli.console import err
from inferenceos.model.default_model import ensure_default_model


def resolve_model(arg: str | None) -> Path:
    """An empty argument means the built-in default model; an existing path is itself;
    anything else is a registry name (`llama3:8b`, `hf.co/org/repo:Q4_K_M`, the
    built-in `gemma3-270m`), as `inferenceos.resolve` reads it. A `.gguf` path that
    does not exist is returned as is, so the model layer reports it as `run` always
    has."""
    if not arg:
        return ensure_default_model(
            on_assemble=lambda: err.print(
                "Assembling the built-in model (Gemma 3 270M, ~250 MB) into the cache, once..."
            )
        )
    path = Path(arg).expanduser()
    if path.exists() or path.suffix == ".gguf" or arg.startswith((".", "/", "~")):
        return path
    from inferenceos.api import resolve

    return resolve(arg)
