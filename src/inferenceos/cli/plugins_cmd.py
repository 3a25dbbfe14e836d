"""`inferenceos plugins`: extensions found through Python entry points."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from inferenceos.cli.console import out, print_json, safe_text


def plugins(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """List installed plugins: KV cache policies (group inferenceos.kv_policies) and
    speculative-decoding drafters (group inferenceos.drafters)."""
    from inferenceos.engine.kv import policies as kv_policies
    from inferenceos.engine.spec import drafters, speculative

    groups = [
        ("kv_policies", "KV cache policies", kv_policies.ENTRY_POINT_GROUP,
         kv_policies.available_policies()),
        ("drafters", "Drafters", speculative.ENTRY_POINT_GROUP,
         drafters.available_drafters()),
    ]
    if as_json:
        print_json({key: found for key, _, _, found in groups})
        return
    for _, title, group, found in groups:
        t = Table(title=f"{title} ({group})", title_justify="left")
        t.add_column("name", style="bold cyan")
        t.add_column("provided by")
        for name, target in sorted(found.items()):
            t.add_row(safe_text(name), safe_text(target))
        out.print(t)
