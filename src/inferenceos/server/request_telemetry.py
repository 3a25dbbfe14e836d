"""Per-request telemetry: each finished generation becomes one record (source "server").

Called from `Run._record` on the event loop: it only reads a few fields and puts a job
on the recorder's queue (microseconds). Any failure becomes one warning line; the
request is never affected.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def record_request(done: Any, *, total_s: float, concurrency: int) -> None:
    """Queue a generation record for `done` (a `generation.Done`)."""
    try:
        from inferenceos import telemetry

        rec = telemetry.recorder()
        if not rec.enabled:
            return
        loaded = done.model  # registry.leases.ResidentModel
        resolved = loaded.model
        params = loaded.settings
        settings = (dataclasses.asdict(params)
                    if dataclasses.is_dataclass(params) and not isinstance(params, type)
                    else {})
        rec.generation(resolved.path, source="server", digest=resolved.digest or None,
                       name=resolved.name, metrics=done.metrics.to_json(),
                       settings=settings, concurrency=max(1, concurrency),
                       total_s=round(total_s, 4), contention="sample")
    except Exception as exc:  # telemetry must never fail a request
        from inferenceos.telemetry.db import warn_once

        warn_once("error", f"could not record a request ({exc!r}); requests are "
                           "unaffected")
