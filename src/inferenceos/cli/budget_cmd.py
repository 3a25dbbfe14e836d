"""`inferenceos budget [DEVICE [SIZE|none]]`: a running server's memory caps per device.

With no argument: every device the server knows of, with what our models hold there,
what is free and the cap. `DEVICE SIZE` caps what the server's models may hold on that
device ("leave room on this GPU now", before starting a game or another job); `none`
lifts the cap. A lowered cap is memory pressure: the server migrates models down to fit
(fewer layers there, quantized KV, a smaller context) and back up when the cap is lifted.
Device names are llama.cpp's: CPU, CUDA0, Metal, RPC[127.0.0.1:50052].
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from inferenceos.cli.console import out, print_json, safe_text
from inferenceos.cli.server_client import (
    FIRST_TIMEOUT_S,
    Patience,
    ServerClient,
    TimeoutOpt,
    retry_busy,
    say_busy,
)
from inferenceos.errors import UsageError
from inferenceos.units import format_bytes as fb
from inferenceos.units import parse_size

LIFT = ("none", "null", "off", "unlimited")


def parse_cap(text: str) -> int | None:
    """'4GiB' → bytes; 'none' → None (lift); UsageError otherwise."""
    if text.strip().lower() in LIFT:
        return None
    return parse_size(text)


def budget(
    device: Annotated[str | None, typer.Argument(
        help="llama.cpp device name (CPU, CUDA0, RPC[host:port])")] = None,
    size: Annotated[str | None, typer.Argument(
        help="Most our models may hold there (4GiB, 512MiB); 'none' lifts the cap")] = None,
    url: Annotated[str | None, typer.Option(
        "--url", help="The server (default: config server.host / server.port)")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="The server's API key (default: config server.api_key)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    timeout: TimeoutOpt = FIRST_TIMEOUT_S,
) -> None:
    """Show or change a running server's memory cap per device (a lowered cap migrates
    models down; see `inferenceos monitor`). A busy server is asked again until it
    answers (said on stderr; setting a cap twice is setting it once)."""
    if device is not None and size is None:
        raise UsageError("give a SIZE after the device (e.g. 2GiB), or 'none' to lift its cap")
    change = None if device is None else {"device": device.strip(),
                                          "bytes": parse_cap(size or "")}
    client = ServerClient.configured(url, api_key=api_key, timeout=timeout)
    data = retry_busy(
        lambda t: client.get_json("/api/budget", t) if change is None
        else client.post_json("/api/budget", change, t), say_busy, Patience(timeout))
    if as_json:
        print_json(data)
        return
    _table(data, device)


def _table(data: dict[str, Any], changed: str | None) -> None:
    table = Table("DEVICE", "OURS", "FREE", "CAP", box=None)
    for d in data.get("devices", []):
        cap = d.get("cap_bytes")
        free = d.get("free_bytes")
        name = safe_text(d["name"])
        table.add_row(f"[bold]{name}[/bold]" if d["name"] == changed else name,
                      fb(d.get("used_bytes") or 0), fb(free) if free is not None else "?",
                      fb(cap) if cap is not None else "-")
    out.print(table)
    p = data.get("pressure")
    if changed and p:
        out.print(f"models over a cap migrate down within {p['dwell_s']:g} s "
                  "(watch with `inferenceos monitor`)")
