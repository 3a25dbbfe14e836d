"""KV cache usage as the engines report it, read when /metrics is scraped.

Each loaded engine's `stats()` is a round trip to its worker process, so it runs on a
thread of its own (server.ops.Latest: one in flight per engine, all models at once),
and a scrape waits for it only when it has nothing recent that still holds:

- an answer at most KV_STATS_FRESH_S old stands if no request has used the model since
  it was asked (an idle model's figures change only in the background: the tiered KV
  cache writing to disk, residency sampling), or if the model is busy now (its worker
  answers only between two steps of its batch, which may take longer than an
  operations route may wait). The scrape then asks again, for the next one;
- otherwise the scrape waits for the answer, at most `timeout_s`, if the model is idle
  (its worker answers at once: the bound catches a stuck one), and goes without if it
  is busy;
- a model that may not be asked at all is left out: moving (a migration, promotion,
  demotion or resize holds its worker) or with a dead worker (asking would start a new
  worker: a load, from a scrape).

A model left out falls back to the caller's own estimate. The scrape never fails
because of an engine. The tiered KV cache and weight families (KV_CACHE, WEIGHTS) show
what the latest answer to land said.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferenceos.registry.leases import ResidentModel
from inferenceos.registry.manager import ModelManager
from inferenceos.server.ops.kv_cache_metrics import KV_CACHE
from inferenceos.server.ops.reads import Latest
from inferenceos.server.ops.weight_metrics import WEIGHTS

KV_STATS_TIMEOUT_S = 0.5  # an idle worker answers at once: this only catches a stuck one
KV_STATS_FRESH_S = 5.0  # how long an answer may stand in for a new one


@dataclass(frozen=True)
class _Answer:
    at: float  # time.monotonic() when it came
    use: Any  # the model's last_used when it was asked: changed, a request ran since
    value: float | None  # the usage (None: none reported)
    # the engine asked (weakly): answers are kept by id(engine), and a freed engine's
    # id is reused by the next one made (a census: a previous test's 0.5 came back)
    of: Callable[[], Any]


_PROBES: Latest[int, _Answer] = Latest("kv-stats")  # by id(engine)


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
    """{model name: KV cells in use / cells} for every loaded model with an answer (see
    the module doc: a recent one that holds, else a new one if it is idle)."""
    loaded = manager.loaded()
    _PROBES.forget({id(lm.engine) for lm in loaded})
    values = await asyncio.gather(*(_usage(manager, lm, timeout_s) for lm in loaded))
    return {lm.model.name: v for lm, v in zip(loaded, values, strict=True) if v is not None}


async def _usage(manager: ModelManager, lm: ResidentModel, timeout_s: float) -> float | None:
    """`lm`'s usage for this scrape (the module doc's rules), or None."""
    if not _askable(manager, lm):
        return None
    key, use, busy = id(lm.engine), getattr(lm, "last_used", None), bool(getattr(lm, "refs", 0))

    def ask() -> _Answer:
        return _Answer(time.monotonic(), use, _read(manager, lm), _weak(lm.engine))

    last = _PROBES.last(key)
    if last is not None and last.of() is not lm.engine:
        last = None  # another engine's, at a reused id
    recent = last is not None and time.monotonic() - last.at <= KV_STATS_FRESH_S
    if last is not None and recent and (busy or last.use == use):
        _PROBES.start(key, ask)  # for the next scrape
        return last.value
    if busy:
        _PROBES.start(key, ask)
        return None
    deadline = time.monotonic() + timeout_s
    try:
        while True:  # twice at most: a question asked before the last request, then ours
            answer = await _PROBES.fresh(key, ask, max(0.0, deadline - time.monotonic()))
            if answer.use == use:
                return answer.value
    except Exception:  # timeout, dead worker, odd engine: the estimate stands
        return None


def _weak(engine: Any) -> Callable[[], Any]:
    """A reference to `engine` that does not keep it alive (a strong one for an object
    that takes no weak references: the next scrape's forget drops it)."""
    try:
        return weakref.ref(engine)
    except TypeError:
        return lambda: engine
