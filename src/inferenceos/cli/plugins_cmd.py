"""`inferenceos plugins`: extensions found through Python entry points."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from inferenceos.cli.console import out, print_json, safe_text


def plugins(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """List installed plugins: KV cache policies (group inferenceos.kv_policies)."""
    from inferenceos.engine.kv_policies import ENTRY_POINT_GROUP, available_policies

    policies = available_policies()
    if as_json:
        print_json({"kv_policies": policies})
        return
    t = Table(title=f"KV cache policies ({ENTRY_POINT_GROUP})", title_justify="left")
    t.add_column("name", style="bold cyan")
    t.add_column("provided by")
    for name, target in sorted(policies.items()):
        t.add_row(safe_text(name), safe_text(target))
    out.print(t)
