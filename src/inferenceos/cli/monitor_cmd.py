"""`inferenceos monitor`: a live terminal view of a running server (htop-like).

Reads the same routes any client can: /api/budget (devices: memory, caps, pressure),
/health (RPC workers: up, in use, lost), /api/ps (loaded models, tiers), /metrics
(requests running / waiting, KV usage, tokens generated → throughput; a model that
streams weights from disk gets a line under the models: resident against streamed,
page-ins and bytes read per token, the expert hit rate) and
/api/events?since= (migrations, evictions, loads, budget changes as they happen).
Redraws every `--interval` seconds with Rich Live on the terminal's alternate screen;
`q` (or Ctrl-C) quits. Plain text over a TTY: it works over SSH. `--once` prints one
frame and exits (scripts, and terminals without a TTY).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from inferenceos.cli.console import out, safe_text
from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.units import format_bytes as fb

MAX_EVENTS = 12


def server_url(url: str | None) -> str:
    """`--url`, else the configured server's address."""
    if url:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--url must start with http:// or https://, got {url!r}")
        return url.rstrip("/")
    from inferenceos.config import load_config

    cfg = load_config()
    host = cfg.get("server.host")
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{cfg.get('server.port')}"


def fetch(url: str, path: str, api_key: str, timeout: float = 5.0,
          data: dict[str, Any] | None = None) -> Any:
    """GET (or POST `data` as JSON) `url + path`; JSON, or text for /metrics.
    InferenceOSError with one line when the server cannot be reached or refuses."""
    body = json.dumps(data).encode() if data is not None else None
    req = urllib.request.Request(url + path, data=body, method="POST" if body else "GET")
    if body:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return raw.decode() if path == "/metrics" else json.loads(raw)
    except urllib.error.HTTPError as exc:
        detail = ""
        with contextlib.suppress(Exception):
            err = json.loads(exc.read()).get("error", "")  # Ollama-style: a string
            detail = err if isinstance(err, str) else str(err.get("message", ""))
        hint = ": it needs an API key (--api-key)" if exc.code == 401 else (
            f": {detail}" if detail else "")
        raise InferenceOSError(f"the server at {url} answered {exc.code}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InferenceOSError(
            f"no InferenceOS server at {url} ({getattr(exc, 'reason', exc)}); "
            "start one with `inferenceos serve`"
        ) from None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {sample name: value summed over its labels} (histogram
    `_sum` / `_count` series kept under their own names), read by prometheus-client's
    own parser. InferenceOSError when the text is not the Prometheus format."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                values[s.name] = values.get(s.name, 0.0) + s.value
    except ValueError as exc:
        raise InferenceOSError(f"/metrics is not Prometheus text: {exc}"[:200]) from None
    return values


@dataclass
class Snapshot:
    """What one refresh read; `tps` is derived from two readings of the token counter."""

    budget: dict[str, Any]
    ps: dict[str, Any]
    metrics: dict[str, float]
    at: float
    tps: float | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    workers: dict[str, str] = field(default_factory=dict)  # RPC workers (serve --rpc)
    weights: dict[str, dict[str, float]] = field(default_factory=dict)  # per model


class Monitor:
    """Polls a server and keeps the recent events (the view reads it)."""

    def __init__(self, url: str, api_key: str) -> None:
        self.url, self.key = url, api_key
        self.last_id = 0
        self.events: list[dict[str, Any]] = []
        self.prev: Snapshot | None = None
        self.error = ""

    def poll(self) -> Snapshot:
        g = lambda p: fetch(self.url, p, self.key)  # noqa: E731
        from inferenceos.cli.ps_cmd import weight_figures

        text = g("/metrics")
        snap = Snapshot(g("/api/budget"), g("/api/ps"), parse_metrics(text), time.monotonic())
        snap.weights = weight_figures(text)
        snap.workers = dict(g("/health").get("workers") or {})
        new = g(f"/api/events?since={self.last_id}")
        self.last_id = new.get("last_id", self.last_id)
        self.events = (self.events + new.get("events", []))[-MAX_EVENTS:]
        snap.events = self.events
        gen = "inferenceos:generation_tokens_total"
        if self.prev is not None and snap.at > self.prev.at:
            snap.tps = (snap.metrics.get(gen, 0) - self.prev.metrics.get(gen, 0)) / (
                snap.at - self.prev.at)
        self.prev = snap
        return snap


def _bar(used: float, total: float, width: int = 20) -> Text:
    frac = 0.0 if not total else max(0.0, min(1.0, used / total))
    n = round(frac * width)
    color = "red" if frac >= 0.95 else "yellow" if frac >= 0.8 else "green"
    return Text("█" * n, style=color) + Text("░" * (width - n), style="dim")


def render(snap: Snapshot, url: str) -> Group:
    """One frame: header, devices, models, events."""
    m = snap.metrics
    p = snap.budget.get("pressure") or {}
    tps = f"{snap.tps:.1f} tok/s" if snap.tps is not None else "… tok/s"
    head = Text.assemble(
        ("InferenceOS monitor ", "bold"), (url, "cyan"), "   ",
        f"running {m.get('inferenceos:num_requests_running', 0):.0f} · "
        f"waiting {m.get('inferenceos:num_requests_waiting', 0):.0f} · {tps} · "
        f"KV {m.get('inferenceos:kv_cache_usage_perc', 0):.0%} · "
        f"migrations {p.get('migrations', 0)}   ", ("q quits", "dim"),
    )
    dev = Table("DEVICE", "OURS", "FREE", "CAP", "FILL", "SIGNAL", box=None, title_justify="left",
                title="devices")
    for d in snap.budget.get("devices", []):
        total = d.get("total_bytes") or 0
        free = d.get("free_bytes")
        fill = _bar(total - (free or 0), total) if total else Text("")
        sig = d.get("signal")
        pressured = d["name"] in (p.get("pressured") or [])
        dev.add_row(safe_text(d["name"]), fb(d.get("used_bytes") or 0),
                    fb(free) if free is not None else "?",
                    fb(d["cap_bytes"]) if d.get("cap_bytes") is not None else "-", fill,
                    Text(f"{sig:.0%}" if sig is not None else "-",
                         style="bold red" if pressured else ""))
    models = Table("MODEL", "STATE", "MEMORY", "CONTEXT", "IN USE", "WHY", box=None,
                   title="models", title_justify="left")
    for md in snap.ps.get("models", []):
        mem = ", ".join(f"{k} {fb(v)}" for k, v in (md.get("memory_by_device") or {}).items())
        models.add_row(safe_text(md.get("name", "")), md.get("state", ""), mem,
                       f"{md.get('context_length', 0)}×{md.get('slots', 1)}",
                       str(md.get("in_use", 0)), safe_text(str(md.get("reason", ""))[:60]))
    if not snap.ps.get("models"):
        models.add_row("(none loaded)", "", "", "", "", "")
    streaming = _streaming(snap)
    evs = Table("TIME", "EVENT", "MODEL", "DETAIL", box=None, title="events",
                title_justify="left")
    for e in reversed(snap.events):
        style = "bold magenta" if e.get("kind") == "migration" else ""
        evs.add_row(time.strftime("%H:%M:%S", time.localtime(e.get("ts", 0))),
                    Text(e.get("kind", ""), style=style), safe_text(e.get("model", "")),
                    safe_text(_detail(e)))
    parts: list[Any] = [head, Text(""), dev]
    if snap.workers:
        parts.append(Text("workers: " + ", ".join(
            f"{safe_text(a)} {safe_text(s)}" for a, s in snap.workers.items())))
    return Group(*parts, Text(""), models, *streaming, Text(""), evs)


def _streaming(snap: Snapshot) -> list[Text]:
    """A line per loaded model that streams weights from disk (none otherwise)."""
    from inferenceos.cli.ps_cmd import streaming_line

    lines = (streaming_line(safe_text(str(md.get("name", ""))),
                            snap.weights.get(str(md.get("name", "")), {}))
             for md in snap.ps.get("models", []))
    return [Text(line, style="yellow") for line in lines if line]


def _detail(e: dict[str, Any]) -> str:
    """An event's detail as a person reads it (`load 0.97 s`), cut to the column: the
    server's `text`, else written here (a server from before it had one)."""
    from inferenceos.registry.events import event_text

    text = e.get("text")
    return (text if isinstance(text, str) else event_text(e))[:90]


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """stdin in cbreak mode (keys without Enter) when it is a TTY; yields a reader of
    the pending keys (non-blocking)."""
    if not sys.stdin.isatty():
        yield lambda: ""
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield lambda: os.read(fd, 32).decode(errors="replace") if select.select(
            [fd], [], [], 0)[0] else ""
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def monitor(
    url: Annotated[str | None, typer.Option(
        "--url", help="The server (default: config server.host / server.port)")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="The server's API key (default: config server.api_key)")] = None,
    interval: Annotated[float, typer.Option(
        "--interval", help="Seconds between refreshes", min=0.2, max=60)] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit")] = False,
) -> None:
    """Live view of a running server: devices and their memory, loaded models and their
    tiers, KV usage, queue, throughput, migrations and evictions as they happen.
    `q` quits; works over SSH."""
    from rich.live import Live

    from inferenceos.config import load_config

    base = server_url(url)
    key = api_key if api_key is not None else load_config().get("server.api_key")
    mon = Monitor(base, key)
    snap = mon.poll()  # a dead server or a bad key: one line, exit 1, before any screen
    if once:
        out.print(render(snap, base))
        return
    with _keys() as keys, Live(render(snap, base), console=out, screen=True,
                               auto_refresh=False) as live:
        next_at = time.monotonic() + interval
        while True:
            pressed = keys()
            if "q" in pressed.lower():
                return
            if time.monotonic() >= next_at:
                next_at = time.monotonic() + interval
                try:
                    snap = mon.poll()
                    live.update(render(snap, base), refresh=True)
                except InferenceOSError as exc:  # the server went away: say so, keep trying
                    live.update(Group(render(snap, base), Text(str(exc), style="bold red")),
                                refresh=True)
            time.sleep(0.05)
