"""Per-request telemetry: each finished generation becomes one record (source "server").

Called from `Run._record` on the event loop: it queues the request's figures for the
recorder's writer thread (`Recorder.later`), which builds the row there: on the loop a
request pays one queue put. Building it here (a uid, the settings and metrics as JSON,
a stat, the load average) was ~0.3 ms of the loop's CPU a request, which on a small
machine is taken from the model's compute threads (issue 44). Any failure becomes one
warning line; the request is never affected.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any


def record_request(done: Any, *, total_s: float, concurrency: int) -> None:
    """Queue a generation record for `done` (a `generation.Done`)."""
    try:
        from inferenceos import telemetry

        rec = telemetry.recorder()
        if not rec.enabled:
            return
        ended = time.time()
        rec.later(lambda: _record(rec, done, total_s, concurrency, ended))
    except Exception as exc:  # telemetry must never fail a request
        _warn(exc)


def _record(rec: Any, done: Any, total_s: float, concurrency: int, ended: float) -> None:
    """The record, made in the writer thread (`ended`: when the request ended, the
    record's timestamp)."""
    loaded = done.model  # registry.leases.ResidentModel
    resolved = loaded.model
    rec.generation(resolved.path, source="server", digest=resolved.digest or None,
                   name=resolved.name, metrics=done.metrics.to_json(),
                   settings=_settings(loaded.settings), concurrency=max(1, concurrency),
                   total_s=round(total_s, 4), contention="sample", ts=ended)


_last: list[tuple[Any, dict[str, Any]]] = []  # the last model's settings, as a dict


def _settings(params: Any) -> dict[str, Any]:
    """`params` (a model's LlamaParams) as a dict, made once per loaded model: every
    request of a model shares its settings object (writer thread only)."""
    if _last and _last[0][0] is params:
        return _last[0][1]
    out = (dataclasses.asdict(params)
           if dataclasses.is_dataclass(params) and not isinstance(params, type) else {})
    _last[:] = [(params, out)]
    return out


def _warn(exc: Exception) -> None:
    from inferenceos.telemetry.db import warn_once

    warn_once("error", f"could not record a request ({exc!r}); requests are unaffected")
