"""Recent events in this process (migrations, evictions, reloads, budget changes), for
`GET /api/events?since=ID`, `inferenceos monitor` and the dashboard.

A bounded ring buffer beside the telemetry store: the store keeps history across runs,
this answers "what happened since I last looked" at once, without a database read.
Every event gets an increasing id; `since(id)` returns the newer ones, oldest first.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import time
from typing import Any

MAX_EVENTS = 500


class EventLog:
    """Thread-safe ring buffer of event dicts: {"id", "ts", "kind", "model", ...}."""

    def __init__(self, size: int = MAX_EVENTS) -> None:
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, kind: str, model: str = "", **detail: Any) -> dict[str, Any]:
        with self._lock:
            event = {"id": next(self._ids), "ts": time.time(), "kind": kind, "model": model,
                     **detail}  # fmt: skip
            self._events.append(event)
        return event

    def since(self, after: int = 0, kind: str | None = None) -> list[dict[str, Any]]:
        """Events with an id above `after` (of one `kind` when given), oldest first."""
        with self._lock:
            return [e for e in self._events
                    if e["id"] > after and (kind is None or e["kind"] == kind)]  # fmt: skip

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
