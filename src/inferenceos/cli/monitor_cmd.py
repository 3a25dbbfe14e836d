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
import os
import queue
import select
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from inferenceos.cli.console import out, safe_text
from inferenceos.cli.server_client import (
    FIRST_TIMEOUT_S,
    Patience,
    ServerBusy,
    ServerClient,
    TimeoutOpt,
    retry_busy,
    say_busy,
)
from inferenceos.errors import InferenceOSError
from inferenceos.units import format_bytes as fb

MAX_EVENTS = 12


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

    def __init__(self, client: ServerClient) -> None:
        self.client = client
        self.last_id = 0
        self.events: list[dict[str, Any]] = []
        self.prev: Snapshot | None = None

    def poll(self, timeout: float | None = None) -> Snapshot:
        """One reading of every route, each waited for `timeout` s (default: the
        client's); a ServerError (absent, busy, HTTP) leaves the events as they were."""
        g = lambda p: self.client.get_json(p, timeout)  # noqa: E731
        from inferenceos.cli.ps_cmd import weight_figures

        text = self.client.get_text("/metrics", timeout)
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


def render(snap: Snapshot | None, url: str, status: Text | None = None) -> Group:
    """One frame: header, the status line (a busy or absent server, under the header so
    that a short terminal still shows it), devices, models, events. No snapshot yet
    (a server busy from the start): the header and the status line only."""
    if snap is None:
        return Group(Text.assemble(("InferenceOS monitor ", "bold"), (url, "cyan"), "   ",
                                   ("q quits", "dim")), *([status] if status else []))
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
    parts: list[Any] = [head, *([status] if status else []), Text(""), dev]
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
    timeout: TimeoutOpt = FIRST_TIMEOUT_S,
) -> None:
    """Live view of a running server: devices and their memory, loaded models and their
    tiers, KV usage, queue, throughput, migrations and evictions as they happen.
    `q` quits; works over SSH. An absent server at the start is an error; a busy one
    is waited for (the frame says so), and one that goes away later is said in the
    frame while it is asked again."""
    client = ServerClient.configured(url, api_key=api_key, timeout=timeout)
    mon, patience = Monitor(client), Patience(timeout)
    if once:
        out.print(render(retry_busy(mon.poll, say_busy, patience), client.base))
        return
    try:
        first: Snapshot | ServerBusy = mon.poll(patience.timeout)
    except ServerBusy as exc:  # there, but slow: the screen says so while it waits
        patience.busy()
        first = exc
    _live(Poller(mon, interval, patience, at_once=isinstance(first, ServerBusy)), first,
          client.base)


class Poller:
    """Reads `mon` every `interval` s on a thread of its own, so that `q` is read at
    once while a busy server keeps a reading waiting. Each outcome goes on `results`:
    a Snapshot, or the InferenceOSError of a reading that failed. A busy server is
    asked again at once, with `patience`'s longer waits (each busy try goes on
    `results` too); any other failure, after `interval`. An exception that is not an
    InferenceOSError goes there as well and ends the thread. `at_once`: the first
    reading without waiting `interval` (the one before it was busy)."""

    def __init__(self, mon: Monitor, interval: float, patience: Patience,
                 at_once: bool = False) -> None:
        self.mon, self.interval, self.patience = mon, interval, patience
        self.results: queue.Queue[Snapshot | Exception] = queue.Queue()
        self.stopped = threading.Event()
        self.first_wait = 0.0 if at_once else interval
        self.thread = threading.Thread(target=self._run, name="monitor-poll", daemon=True)

    def _run(self) -> None:
        wait = self.first_wait
        while not self.stopped.wait(wait):
            wait = self.interval
            try:
                self.results.put(retry_busy(self.mon.poll, self.results.put, self.patience))
            except InferenceOSError as exc:  # gone away, or refused: said, asked again
                self.results.put(exc)
            except Exception as exc:  # a bug: the main thread raises it
                self.results.put(exc)
                return


def _live(poller: Poller, first: Snapshot | ServerBusy, base: str) -> None:
    """The screen, redrawn with each result of `poller` until `q`; the last snapshot
    stays on it, under the status line of a reading that failed."""
    from rich.live import Live

    snap, status = (first, None) if isinstance(first, Snapshot) else (None, _status(first))
    with _keys() as keys, Live(render(snap, base, status), console=out, screen=True,
                               auto_refresh=False) as live:
        poller.thread.start()
        try:
            while "q" not in keys().lower():
                try:
                    got = poller.results.get(timeout=0.05)
                except queue.Empty:
                    continue
                if not isinstance(got, (Snapshot, InferenceOSError)):
                    raise got
                snap, status = (got, None) if isinstance(got, Snapshot) else (
                    snap, _status(got))
                live.update(render(snap, base, status), refresh=True)
        finally:
            poller.stopped.set()


def _status(exc: Exception) -> Text:
    """The status line for a reading that failed: busy (yellow), else the error (red)."""
    if isinstance(exc, ServerBusy):
        return Text(f"{exc}, retrying", style="bold yellow")
    return Text(str(exc), style="bold red")
