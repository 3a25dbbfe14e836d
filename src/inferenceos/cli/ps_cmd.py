"""`inferenceos ps`: models loaded by a running server (asks its /api/ps)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Annotated, Any

import typer
from rich.table import Table

from inferenceos.cli.console import out, print_json, safe_text
from inferenceos.errors import InferenceOSError
from inferenceos.units import format_bytes as fmt_bytes


def fetch_ps(host: str, port: int, api_key: str, timeout: float = 5.0) -> dict[str, Any]:
    """GET /api/ps from the server; InferenceOSError when it cannot be reached."""
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown = "127.0.0.1"
    req = urllib.request.Request(f"http://{shown}:{port}/api/ps")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data
    except urllib.error.HTTPError as exc:
        hint = ""
        if exc.code == 401:  # the server wants a key: say how to give it
            hint = (": wrong API key" if api_key else ": it needs an API key") + (
                "; pass --api-key KEY or set it with `inferenceos config server.api_key KEY`")
        raise InferenceOSError(f"the server at {shown}:{port} answered {exc.code}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InferenceOSError(
            f"no InferenceOS server at {shown}:{port} ({getattr(exc, 'reason', exc)}); "
            "start one with `inferenceos serve`"
        ) from None


def ps(
    host: Annotated[str | None, typer.Option("--host")] = None,
    port: Annotated[int | None, typer.Option("--port")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="The server's API key (default: config server.api_key)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Models loaded by the running server: state (hot / warm), memory per device,
    context × slots, pinned, expiry and the reason for the last change."""
    from inferenceos.config import load_config

    cfg = load_config()
    data = fetch_ps(host or cfg.get("server.host"), port or cfg.get("server.port"),
                    api_key or cfg.get("server.api_key"))
    if as_json:
        print_json(data)
        return
    table = Table("NAME", "STATE", "MEMORY", "CONTEXT", "UNTIL", "WHY", box=None)
    for m in data.get("models", []):
        table.add_row(safe_text(str(m.get("name"))), _state(m), _memory(m),
                      f"{m.get('context_length', '')} × {m.get('slots', 1)}",
                      safe_text(str(m.get("expires_at", ""))),
                      safe_text(str(m.get("reason", ""))))  # fmt: skip
    out.print(table)


def _state(m: dict[str, Any]) -> str:
    state = str(m.get("state", "hot"))
    return state + (" (pinned)" if m.get("pinned") else "")


def _memory(m: dict[str, Any]) -> str:
    """Per device ('CPU 512 MiB, CUDA0 4.1 GiB'), or the total from a plain Ollama."""
    by_device = m.get("memory_by_device") or {}
    if not by_device:
        return fmt_bytes(int(m.get("size", 0)))
    return ", ".join(f"{safe_text(str(d))} {fmt_bytes(int(b))}" for d, b in by_device.items())
