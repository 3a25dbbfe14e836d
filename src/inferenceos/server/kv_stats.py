"""KV cache usage as the engines report it, read when /metrics is scraped.

Each loaded engine's `stats()` is a round trip to its worker process, so it runs on a
thread of its own (server.ops.Latest: one in flight per engine, all models at once):

- an idle model (no request in flight) answers at once: the scrape waits for it, at
  most `timeout_s` (a stuck worker is left out);
- a busy one answers only between two steps of its batch, which may take longer than
  an operations route may wait: the scrape does not wait. It starts a question for the
  next scrape and reports the last answer if it is at most KV_STATS_FRESH_S old;
- a model that may not be asked at all is left out: moving (a migration, promotion,
  demotion or resize holds its worker) or with a dead worker (asking would start a new
  worker: a load, from a scrape).

A model left out falls back to the caller's own estimate. The scrape never fails
because of an engine.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from inferenceos.registry.leases import ResidentModel
from inferenceos.registry.manager import ModelManager
from inferenceos.server.kv_cache_metrics import KV_CACHE
from inferenceos.server.ops import Latest
from inferenceos.server.weight_metrics import WEIGHTS

KV_STATS_TIMEOUT_S = 0.5  # an idle worker answers at once: this only catches a stuck one
KV_STATS_FRESH_S = 5.0  # how long a busy model's last answer stands for it
# by id(engine): (time.monotonic() of the answer, the usage or None)
_PROBES: Latest[int, tuple[float, float | None]] = Latest("kv-stats")


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


async def reported_kv_usage(manager: ModelManager,
                            timeout_s: float = KV_STATS_TIMEOUT_S) -> dict[str, float]:
    """{model name: KV cells in use / cells} for every loaded model that answered (see
    the module doc: an idle one now, a busy one lately)."""
    loaded = manager.loaded()
    _PROBES.forget({id(lm.engine) for lm in loaded})

    async def one(lm: ResidentModel) -> float | None:
        if not _askable(manager, lm):
            return None
        key = id(lm.engine)

        def ask() -> tuple[float, float | None]:
            value = _read(manager, lm)
            return time.monotonic(), value

        if not getattr(lm, "refs", 0):
            try:
                return (await _PROBES.fresh(key, ask, timeout_s))[1]
            except Exception:  # timeout, dead worker, odd engine: the estimate stands
                return None
        _PROBES.start(key, ask)  # answered between two steps: for the next scrape
        last = _PROBES.last(key)
        if last is None or time.monotonic() - last[0] > KV_STATS_FRESH_S:
            return None
        return last[1]

    values = await asyncio.gather(*(one(lm) for lm in loaded))
    return {lm.model.name: v for lm, v in zip(loaded, values, strict=True) if v is not None}
