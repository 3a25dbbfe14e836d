"""`inferenceos reset`: back to defaults — config file and caches go, models stay."""

from __future__ import annotations

from typing import Annotated

import typer

from inferenceos.cli.cache_cmd import cache_kinds, clean
from inferenceos.cli.console import out
from inferenceos.config import config_path


def reset(
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask")] = False,
) -> None:
    """Delete the config file and every cache (hardware profiles, file digests,
    self-draft models). Models, sessions and the telemetry database are kept. Asks first
    unless --yes."""
    targets = [str(config_path()), *(str(p) for p in cache_kinds().values())]
    out.print("This deletes:\n  " + "\n  ".join(targets), markup=False)
    if not yes and not typer.confirm("Reset InferenceOS to its defaults?", default=False):
        out.print("nothing changed")
        raise typer.Exit(1)
    config_path().unlink(missing_ok=True)
    clean(list(cache_kinds()))
    out.print("reset done: default settings, empty caches")
