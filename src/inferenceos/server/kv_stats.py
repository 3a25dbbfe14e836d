"""KV cache usage as the engines report it, read when /metrics is scraped.

Each loaded engine's `stats()` is a round trip to its worker process, so it runs in
its own thread, all models at once, bounded by `timeout_s`: a model whose worker is
busy loading, stuck, or gone is simply left out (the caller falls back to its own
estimate), and the scrape never fails because of it.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from inferenceos.registry.leases import ResidentModel
from inferenceos.registry.manager import ModelManager
from inferenceos.server.generation import call_in_thread
from inferenceos.server.kv_cache_metrics import KV_CACHE
from inferenceos.server.weight_metrics import WEIGHTS

KV_STATS_TIMEOUT_S = 0.5


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


async def reported_kv_usage(manager: ModelManager,
                            timeout_s: float = KV_STATS_TIMEOUT_S) -> dict[str, float]:
    """{model name: KV cells in use / cells} for every loaded model that answered."""
    loaded = manager.loaded()

    async def one(lm: ResidentModel) -> float | None:
        try:
            return await asyncio.wait_for(
                call_in_thread(lambda: _read(manager, lm), "kv-stats"), timeout_s)
        except Exception:  # timeout, dead worker, odd engine: the estimate stands
            return None

    values = await asyncio.gather(*(one(lm) for lm in loaded))
    return {lm.model.name: v for lm, v in zip(loaded, values, strict=True) if v is not None}
