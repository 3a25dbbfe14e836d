"""/metrics families of the weights' residency (engine/weights/residency.py), per model.

The figures come from each engine's `stats()["weights"]`, read during the scrape's
round trip to the workers (server/ops/kv_stats.py keeps the last one per model, as it does
the KV cache's). Counters are the worker's own: a restarted worker starts from 0.

    inferenceos:weights_resident_bytes{model_name}         planned to stay in memory
    inferenceos:weights_streamed_bytes{model_name}         planned on disk (streamed)
    inferenceos:weights_mapped_resident_bytes{model_name}  of the file's mapping in
        memory now (mincore; absent when the file is not mapped)
    inferenceos:weight_page_ins_total{model_name}          major faults since the load
    inferenceos:weight_read_bytes_total{model_name}        bytes read from storage
    inferenceos:weight_page_ins_per_token{model_name}      over the last decode window
    inferenceos:weight_read_bytes_per_token{model_name}
    inferenceos:expert_hit_ratio{model_name}               router picks on experts in
        memory (MoE models that stream; absent otherwise)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

P = "inferenceos:"
# model name -> its engine's last reported "weights" record (engine/messages.py
# WeightStats), kept by server/ops/kv_stats.py from the scrape's round trip
WEIGHTS: dict[str, dict[str, Any]] = {}
Sample = tuple[dict[str, str], float]

FAMILIES = (
    ("weights_resident_bytes", "gauge", "resident_bytes",
     "Weight bytes the engine plans to keep in memory"),
    ("weights_streamed_bytes", "gauge", "streamed_bytes",
     "Weight bytes planned on disk, read back from the file while decoding"),
    ("weights_mapped_resident_bytes", "gauge", "mapped_resident_bytes",
     "Bytes of the model file's mapping in memory now (mincore)"),
    ("weight_page_ins_total", "counter", "page_ins",
     "Major page faults of the model's worker since the load"),
    ("weight_read_bytes_total", "counter", "read_bytes",
     "Bytes the model's worker read from storage since the load"),
    ("weight_page_ins_per_token", "gauge", "page_ins_per_token",
     "Major page faults per decoded token over the last window with tokens"),
    ("weight_read_bytes_per_token", "gauge", "read_bytes_per_token",
     "Bytes read from storage per decoded token over the last window with tokens"),
    ("expert_hit_ratio", "gauge", "expert_hit_ratio",
     "Share of the router's expert picks that fell on experts in memory (0-1)"),
)


def _samples(loaded: Callable[[], Iterable[str]], field: str) -> Callable[[], list[Sample]]:
    """`field` of each model still loaded that reported it."""
    def collect() -> list[Sample]:
        names = set(loaded())
        out: list[Sample] = []
        for name, w in list(WEIGHTS.items()):
            value = w.get(field)
            if name in names and isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append(({"model_name": name}, float(value)))
        return out
    return collect


def register(metrics: Any, loaded: Callable[[], Iterable[str]]) -> None:
    """Add the families above to `metrics` (a ServerMetrics); `loaded` names the
    models loaded now (an unloaded model's figures are not shown)."""
    for name, kind, field, help_ in FAMILIES:
        metrics.scraped(P + name, help_, kind, _samples(loaded, field))
