"""KV cache usage as the engines report it, read when /metrics is scraped.

Each loaded engine's `stats()` is a round trip to its worker process, so it runs on a
thread of its own (server.ops.Latest: one in flight per engine, all models at once) and
the scrape waits for it at most a bound: `timeout_s` for an idle model, `busy_s` for one
with requests in flight (its worker answers only between two steps, and a step of a
large batch can take longer than an operations route may). A model that does not answer
in time is left out (the caller falls back to its own estimate), and so is one that may
not be asked at all: moving (a migration, promotion, demotion or resize holds its
worker) or with a dead worker (asking would start a new worker: a load, from a scrape).
The scrape never fails because of an engine.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from inferenceos.registry.leases import ResidentModel
from inferenceos.registry.manager import ModelManager
from inferenceos.server.kv_cache_metrics import KV_CACHE
from inferenceos.server.ops import Latest
from inferenceos.server.weight_metrics import WEIGHTS

KV_STATS_TIMEOUT_S = 0.5  # an idle worker answers at once: this only catches a stuck one
KV_STATS_BUSY_S = 0.02  # a generating worker answers between steps, or not this scrape
_PROBES: Latest[int, float | None] = Latest("kv-stats")  # by id(engine)


def _read(manager: ModelManager, lm: ResidentModel) -> float | None:
    """`lm`'s reported usage (0-1), or None. A model unloaded since the snapshot is
    skipped: calling a closed engine would start a new worker for it."""
    stats = getattr(lm.engine, "stats", None)
    if stats is None or not any(m is lm for m in manager.loaded()):
        return None
    reported = stats()
    if isinstance(reported.get("kv_cache"), dict):  # the tiered KV cache's figures
        KV_CACHE[lm.model.name] = reported["kv_cache"]
    if isinstance(reported.get("weights"), dict):  # residency and paging (weight_metrics)
        WEIGHTS[lm.model.name] = reported["weights"]
    value: Any = reported.get("kv_usage")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return min(1.0, max(0.0, float(value)))


def _askable(manager: ModelManager, lm: ResidentModel) -> bool:
    """Whether `lm`'s worker may be asked now: not moving (its worker is being swapped,
    put to sleep or woken: the answer would wait for that) and alive (a dead worker's
    engine starts a new one on the next call: a load)."""
    moving = getattr(manager, "is_moving", None)
    if moving is not None and moving(lm.model.name):
        return False
    return bool(getattr(lm.engine, "worker_alive", True))


async def reported_kv_usage(manager: ModelManager, timeout_s: float = KV_STATS_TIMEOUT_S,
                            busy_s: float = KV_STATS_BUSY_S) -> dict[str, float]:
    """{model name: KV cells in use / cells} for every loaded model that answered within
    its bound (`timeout_s` idle, `busy_s` with requests in flight)."""
    loaded = manager.loaded()
    _PROBES.forget({id(lm.engine) for lm in loaded})

    async def one(lm: ResidentModel) -> float | None:
        if not _askable(manager, lm):
            return None
        wait = timeout_s if not getattr(lm, "refs", 0) else min(timeout_s, busy_s)
        try:
            return await _PROBES.fresh(id(lm.engine), lambda: _read(manager, lm), wait)
        except Exception:  # timeout, dead worker, odd engine: the estimate stands
            return None

    values = await asyncio.gather(*(one(lm) for lm in loaded))
    return {lm.model.name: v for lm, v in zip(loaded, values, strict=True) if v is not None}
