"""KV cache usage and fragmentation, per sequence (slot) and for the whole cache.

Two kinds of fragmentation are reported:
- slot level (always): each sequence owns a budget of `capacity` cells. Cells of its
  budget it does not use are reserved but idle (`reserved_idle`); free cells spread
  over several slots cannot all serve one long request (`external` = 1 - largest free
  budget / all free cells, 0 when the free space is in one slot).
- cell level (when attention is probed, i.e. the h2o policy): which llama.cpp KV cells
  hold each sequence is known, so a sequence's cells can be compared with the range
  they are spread over (`cell_span`, `cell_holes` = 1 - cells / span), and the cache's
  used cells with the attention window llama.cpp computes over (`window`, `window_idle`).
  llama.cpp exposes cell placement nowhere else; without a probe these are None.
"""

from __future__ import annotations

from typing import Any, Protocol

from inferenceos.engine.kv.attention_probe import CellTracker


class SlotLike(Protocol):
    index: int
    busy: bool
    cached: list[int]


def slot_stats(slot: SlotLike, capacity: int, tracker: CellTracker | None) -> dict[str, Any]:
    """One sequence's usage and fragmentation (see module docstring)."""
    used = len(slot.cached)
    cells = tracker.cells.get(slot.index, []) if tracker is not None else None
    span = (max(cells) - min(cells) + 1) if cells else 0
    return {
        "slot": slot.index,
        "busy": slot.busy,
        "cached_tokens": used,
        "capacity": capacity,
        "reserved_idle": 1 - used / capacity if capacity else 0.0,
        "cell_span": span if cells is not None else None,
        "cell_holes": (1 - len(cells) / span if span else 0.0) if cells is not None else None,
    }


def cache_stats(
    slots: list[dict[str, Any]], window: int | None
) -> dict[str, Any]:
    """Whole-cache figures from `slot_stats` rows; `window` is the attention window
    (cells) of the last probed decode, or None."""
    used = sum(s["cached_tokens"] for s in slots)
    capacity = sum(s["capacity"] for s in slots)
    free = [s["capacity"] - s["cached_tokens"] for s in slots]
    total_free = sum(free)
    return {
        "kv_used_cells": used,
        "kv_capacity_cells": capacity,
        "kv_usage": used / capacity if capacity else 0.0,
        "kv_external_fragmentation": 1 - max(free) / total_free if total_free else 0.0,
        "kv_window_cells": window,
        "kv_window_idle": (1 - used / window if window else 0.0) if window is not None else None,
    }
