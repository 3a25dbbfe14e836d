"""`inferenceos create NAME -f Modelfile`: a preset (registry/presets.py), as `ollama
create` makes one: FROM a registered model or a GGUF file, with SYSTEM, TEMPLATE,
PARAMETER, ADAPTER and MESSAGE."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from inferenceos.cli.console import out, safe_text
from inferenceos.errors import UsageError


def create(
    name: Annotated[str, typer.Argument(help="The preset's name")],
    file: Annotated[Path, typer.Option(
        "--file", "-f", help="The Modelfile (FROM, SYSTEM, TEMPLATE, PARAMETER, ADAPTER, "
        "MESSAGE)")] = Path("Modelfile"),
) -> None:
    """Create a model preset from a Modelfile (a system prompt, parameters, adapters)."""
    from inferenceos.registry.presets import create_preset, parse_modelfile
    from inferenceos.registry.store import ModelStore

    path = file.expanduser()
    if not path.is_file():
        raise UsageError(f"no Modelfile at {path}")
    mf = parse_modelfile(path.read_text(encoding="utf-8"))
    entry = create_preset(ModelStore(), name, mf, path.absolute().parent)
    out.print(f"created '{safe_text(entry.name)}' from '{safe_text(mf.from_)}'")
