"""Recent events in this process (migrations, evictions, reloads, budget changes), for
`GET /api/events?since=ID`, `inferenceos monitor` and the dashboard.

A bounded ring buffer beside the telemetry store: the store keeps history across runs,
this answers "what happened since I last looked" at once, without a database read.
Every event gets an increasing id; `since(id)` returns the newer ones, oldest first.
`event_text` is an event's detail as a person reads it (what `monitor` and /ui show).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from inferenceos.units import format_bytes

MAX_EVENTS = 500


class EventLog:
    """Thread-safe ring buffer of event dicts: {"id", "ts", "kind", "model", ...,
    "text"} (`text`: the detail as `event_text` writes it)."""

    def __init__(self, size: int = MAX_EVENTS) -> None:
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, kind: str, model: str = "", **detail: Any) -> dict[str, Any]:
        with self._lock:
            event = {"id": next(self._ids), "ts": time.time(), "kind": kind, "model": model,
                     **detail}
            event["text"] = event_text(event)
            self._events.append(event)
        return event

    def since(self, after: int = 0, kind: str | None = None) -> list[dict[str, Any]]:
        """Events with an id above `after` (of one `kind` when given), oldest first."""
        with self._lock:
            return [e for e in self._events
                    if e["id"] > after and (kind is None or e["kind"] == kind)]

    @property
    def last_id(self) -> int:
        with self._lock:
            return self._events[-1]["id"] if self._events else 0


EVENTS = EventLog()  # this process's events (the server is one process)


def add(kind: str, model: str = "", **detail: Any) -> None:
    """Record an event in this process's log; never raises (events are advice)."""
    with contextlib.suppress(Exception):
        EVENTS.add(kind, model, **_plain(detail))


def _plain(detail: dict[str, Any]) -> dict[str, Any]:
    """Values as JSON can carry them (paths and others as text)."""
    out = {}
    for k, v in detail.items():
        out[k] = v if isinstance(v, (str, int, float, bool, type(None), dict, list)) else str(v)
    return out


_NOT_DETAIL = frozenset(("id", "ts", "kind", "model", "text"))


def event_text(event: Mapping[str, Any]) -> str:
    """An event's detail (its fields but id, ts, kind and model) as a person reads it:
    "load 0.97 s, plan ...", "device CPU, cap 3.0 GiB". A `<name>_s` field is seconds
    (`<name> 0.97 s`), a `<name>_bytes` one a size (None: none), `signal` a share (93 %);
    other floats keep 3 significant digits, dicts and lists are JSON. A migration reads
    "<cause>: pause 0.12 s, 2 streams moved" once done, and "<cause>: <plan before> →
    <plan after>" as it starts (kind "migrating")."""
    if event.get("kind") == "migration":
        return (f"{event.get('cause', '')}: pause {_number(event.get('pause_s') or 0.0)}"
                f" s, {event.get('moved', 0)} streams moved")
    if event.get("kind") == "migrating":
        how = "make before break" if event.get("make_before_break") else "pause, reload"
        return (f"{event.get('cause', '')}: {event.get('plan_before', '')} → "
                f"{event.get('plan_after', '')} ({how})")
    return ", ".join(_field(k, v) for k, v in event.items() if k not in _NOT_DETAIL)


def _field(key: str, value: Any) -> str:
    if isinstance(value, str) and value.startswith(key + ":"):
        return value  # a summary that names itself ("plan: ctx 256 · ...")
    if key.endswith("_s") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{key[:-2]} {_number(value)} s"
    if key.endswith("_bytes") and (value is None or isinstance(value, (int, float))):
        return f"{key[:-6]} {'none' if value is None else format_bytes(value)}"
    if key == "signal" and isinstance(value, float):
        return f"signal {value:.0%}".replace("%", " %")
    if isinstance(value, bool):
        return f"{key} {'yes' if value else 'no'}"
    if isinstance(value, float):
        return f"{key} {value:.3g}"
    if isinstance(value, (dict, list)):
        return f"{key} {json.dumps(value, ensure_ascii=False)}"
    return f"{key} {value}"


def _number(seconds: float) -> str:
    """Seconds to two decimals (tenths of a millisecond below 10 ms)."""
    return f"{seconds:.2f}" if abs(seconds) >= 0.01 or seconds == 0 else f"{seconds:.4f}"
