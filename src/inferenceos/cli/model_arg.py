"""Turn the MODEL argument of a command into a file path."""

from __future__ import annotations

from pathlib import Path

from inferenceos.cli.console import err
from inferenceos.model.default_model import ensure_default_model


def resolve_model(arg: str | None) -> Path:
    """An empty argument means the built-in default model; otherwise a .gguf path."""
    if not arg:
        return ensure_default_model(
            on_assemble=lambda: err.print(
                "Assembling the built-in model (Gemma 3 270M, ~250 MB) into the cache, once..."
            )
        )
    return Path(arg).expanduser()
