"""/metrics families of the tiered KV cache (engine/kv/store.py), per model and tier.

The figures come from each engine's `stats()["kv_cache"]`, read during the scrape's
round trip to the workers (server/ops/kv_stats.py keeps the last one per model). Counters
are the worker's own: a worker that restarts (killed, or unloaded and loaded again)
starts them from 0, which Prometheus' `rate()` reads as a counter reset.

    inferenceos:kv_cache_hits_total{model_name, tier}           prefixes found (hot: in
        the context's own slots; ram / disk: restored from that tier)
    inferenceos:kv_cache_misses_total{model_name}               prompts nothing cached
    inferenceos:kv_cache_restored_tokens_total{model_name, tier}  prompt tokens not prefilled
    inferenceos:kv_cache_restored_bytes_total{model_name, tier}   state bytes restored
    inferenceos:kv_cache_bytes{model_name, tier}                 bytes held (ram, disk)
    inferenceos:kv_cache_entries{model_name, tier}               entries held
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

P = "inferenceos:"
# model name -> its engine's last reported KV cache stats, kept by server/ops/kv_stats.py
# from the scrape's round trip to the workers (this module imports nothing of ours)
KV_CACHE: dict[str, dict[str, Any]] = {}
Sample = tuple[dict[str, str], float]
TIERS = ("hot", "ram", "disk")


def _samples(loaded: Callable[[], Iterable[str]], field: str,
             tiers: tuple[str, ...]) -> Callable[[], list[Sample]]:
    """Samples of `field` (+ "_<tier>" per tier) for the models still loaded."""
    def collect() -> list[Sample]:
        names = set(loaded())
        out: list[Sample] = []
        for name, kv in list(KV_CACHE.items()):
            if name not in names:
                continue
            if not tiers:
                out.append(({"model_name": name}, float(kv.get(field, 0))))
            for tier in tiers:
                value = kv.get(f"{field}_{tier}")
                if isinstance(value, (int, float)):
                    out.append(({"model_name": name, "tier": tier}, float(value)))
        return out
    return collect


def register(metrics: Any, loaded: Callable[[], Iterable[str]]) -> None:
    """Add the families above to `metrics` (a ServerMetrics); `loaded` names the
    models loaded now (an unloaded model's figures are not shown)."""
    families = (
        ("kv_cache_hits_total", "Prompt prefixes found in the KV cache, by tier", "counter",
         "hits", TIERS),
        ("kv_cache_misses_total", "Prompts for which the KV cache held nothing", "counter",
         "misses", ()),
        ("kv_cache_restored_tokens_total", "Prompt tokens taken from the KV cache instead "
         "of prefilled, by tier", "counter", "restored_tokens", TIERS),
        ("kv_cache_restored_bytes_total", "KV state bytes restored, by tier", "counter",
         "restored_bytes", ("ram", "disk")),
        ("kv_cache_bytes", "Bytes the KV cache holds, by tier", "gauge", "bytes",
         ("ram", "disk")),
        ("kv_cache_entries", "Entries the KV cache holds, by tier", "gauge", "entries",
         ("ram", "disk")),
    )
    for name, help_, kind, field, tiers in families:
        metrics.scraped(P + name, help_, kind, _samples(loaded, field, tiers))
