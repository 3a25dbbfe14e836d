"""Per-request telemetry: each finished generation becomes one record (source "server").

Called from `Run._record` on the event loop: it only reads a few fields and puts a job
on the recorder's queue (microseconds). Any failure becomes one warning line; the
request is never affected.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from inferenceos.telemetry.recorder import FrozenSettings

# id(plan) -> (plan, its settings): a Plan is frozen, so its llama settings are made
# into a dict and JSON once, not per request (asdict of ~40 fields and the JSON cost
# ~0.1 ms a request on the loop, while the compute threads hold the cores)
_SETTINGS: dict[int, tuple[Any, FrozenSettings]] = {}
_SETTINGS_MAX = 16  # plans kept (a server holds a few models; more empties the memo)


def _settings_of(loaded: Any) -> FrozenSettings:
    """`loaded.settings` (LlamaParams) as a FrozenSettings, once per `loaded.plan`."""
    plan = getattr(loaded, "plan", None)
    hit = _SETTINGS.get(id(plan)) if plan is not None else None
    if hit is not None and hit[0] is plan:
        return hit[1]
    params = loaded.settings
    settings = FrozenSettings(dataclasses.asdict(params)
                              if dataclasses.is_dataclass(params)
                              and not isinstance(params, type) else {})
    if plan is not None:
        if len(_SETTINGS) >= _SETTINGS_MAX:
            _SETTINGS.clear()
        _SETTINGS[id(plan)] = (plan, settings)
    return settings


def record_request(done: Any, *, total_s: float, concurrency: int) -> None:
    """Queue a generation record for `done` (a `generation.Done`)."""
    try:
        from inferenceos import telemetry

        rec = telemetry.recorder()
        if not rec.enabled:
            return
        loaded = done.model  # registry.leases.ResidentModel
        resolved = loaded.model
        settings = _settings_of(loaded)
        rec.generation(resolved.path, source="server", digest=resolved.digest or None,
                       name=resolved.name, metrics=done.metrics.to_json(),
                       settings=settings, concurrency=max(1, concurrency),
                       total_s=round(total_s, 4), contention="sample")
    except Exception as exc:  # telemetry must never fail a request
        from inferenceos.telemetry.db import warn_once

        warn_once("error", f"could not record a request ({exc!r}); requests are "
                           "unaffected")
