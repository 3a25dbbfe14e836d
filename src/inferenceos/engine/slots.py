"""The slot table: which sequence id of the context holds which tokens (prefix reuse).

A context holds `n_slots` sequence ids; each slot owns `n_ctx_slot` KV cells (as
llama-server's `--parallel` does), so admission never has to guess whether the shared
cache will overflow. A finished slot keeps its tokens in the cache, so a later prompt
that starts the same way reuses them; which idle cache to give up when a slot is needed
is the slot policy (`lru` or `fifo`).

`Slot.cached` is always exactly the tokens of the slot's KV cells, positions 0..n-1: every
method that drops cells from llama.cpp's memory edits it (and the cell tracker) in step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from inferenceos.engine.attention_probe import CellTracker
from inferenceos.errors import UsageError

SLOT_POLICIES = ("lru", "fifo")


@dataclass
class Slot:
    """One sequence id in the context and the tokens its KV cells hold."""

    index: int
    cached: list[int] = field(default_factory=list)
    last_used: float = 0.0
    filled_at: float = 0.0
    busy: bool = False


def common_prefix(cached: list[int], prompt: list[int]) -> int:
    """How many leading tokens of `prompt` (all but its last: at least one token must be
    evaluated, for its logits) the cache `cached` already holds."""
    n = 0
    for a, b in zip(cached, prompt[:-1], strict=False):
        if a != b:
            break
        n += 1
    return n


class SlotTable:
    """The slots of one context (`ll` the llama.cpp binding, `mem` its memory)."""

    def __init__(
        self,
        ll: Any,
        mem: Any,
        n_slots: int,
        n_ctx_slot: int,
        slot_policy: str = "lru",
        tracker: CellTracker | None = None,
    ) -> None:
        if slot_policy not in SLOT_POLICIES:
            raise UsageError(f"unknown slot policy {slot_policy!r} (use lru or fifo)")
        self._ll, self._mem = ll, mem
        self.slots = [Slot(i) for i in range(n_slots)]
        self.n_ctx_slot = n_ctx_slot
        self.slot_policy = slot_policy
        self.tracker = tracker

    def pick(self, prompt: list[int]) -> tuple[Slot, int] | None:
        """A free slot for `prompt` and how many of its leading tokens the slot's cache
        already holds; None when every slot is busy."""
        free = [s for s in self.slots if not s.busy]
        if not free:
            return None
        best = max(free, key=lambda s: common_prefix(s.cached, prompt))
        reuse = common_prefix(best.cached, prompt)
        if reuse == 0:  # nothing to reuse: give up the idle cache the policy names
            key = (lambda s: s.last_used) if self.slot_policy == "lru" else (lambda s: s.filled_at)
            best = min(free, key=key)
        return best, reuse

    def claim(self, slot: Slot, reuse: int) -> None:
        """Mark `slot` busy, keeping only the first `reuse` cached tokens."""
        self.truncate(slot, reuse)
        if reuse == 0:
            slot.filled_at = time.perf_counter()
        slot.busy = True

    def release(self, slot: Slot) -> None:
        """The slot's sequence ended; its cache stays for prefix reuse."""
        slot.busy = False
        slot.last_used = time.perf_counter()

    def truncate(self, slot: Slot, n: int) -> None:
        """Drop the slot's cells from position `n` on."""
        self._ll.llama_memory_seq_rm(self._mem, slot.index, n, -1)
        del slot.cached[n:]
        if self.tracker is not None:
            self.tracker.truncate(slot.index, n)

    def idle_cells(self) -> int:
        """Cells held by idle slots' cached prefixes."""
        return sum(len(s.cached) for s in self.slots if not s.busy)
