"""The slot table: which sequence id of the context holds which tokens (prefix reuse).

A context holds `n_slots` sequence ids; each slot owns `n_ctx_slot` KV cells (as
llama-server's `--parallel` does), so admission never has to guess whether the shared
cache will overflow. A finished slot keeps its tokens in the cache, so a later prompt
that starts the same way reuses them; which idle cache to give up when a slot is needed
is the slot policy (`lru` or `fifo`).

`Slot.cached` is always exactly the tokens of the slot's KV cells, positions 0..n-1: every
method that drops cells from llama.cpp's memory edits it (and the cell tracker) in step.

**Parked prefixes.** In the shared KV pool, llama.cpp attends over every cell up to the
highest one in use, masked per sequence: idle cached prefixes stay inside a running
sequence's attention window and slowed a lone Gemma stream by 4-8 %. So while anything
runs, idle prefixes are *parked*: their cells are copied to host memory
(`llama_state_seq_get_data`, ~18 KB a token on Gemma 3 270M) and removed, and a prompt
that shares the prefix gets them back (`llama_state_seq_set_data`) before it is
prefilled. A parked slot keeps `cached` (the tokens its saved state holds); `is_parked`
tells it apart. Parked bytes are capped (`park_limit`); beyond it the least recently used
parked prefix is forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferenceos.engine.kv.attention_probe import CellTracker
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
    lora: str = ""  # the adapter set its cells were computed under (engine/lora.set_key)


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` have in common."""
    if len(a) <= len(b) and list(b[: len(a)]) == list(a):  # the common case, at C speed
        return len(a)
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def common_prefix(cached: list[int], prompt: list[int]) -> int:
    """How many leading tokens of `prompt` (all but its last: at least one token must be
    evaluated, for its logits) the cache `cached` already holds."""
    return shared_prefix(cached, prompt[:-1])


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
        save: Callable[[int], bytes] | None = None,
        restore: Callable[[bytes, int], None] | None = None,
        park_limit: int = 256 << 20,
    ) -> None:
        """`save(seq)` / `restore(bytes, seq)` copy one sequence's KV state out and back
        (LoadedModel.save_sequence / restore_sequence); without them, or with a cell
        tracker (whose cell map a restore would invalidate), nothing is parked."""
        if slot_policy not in SLOT_POLICIES:
            raise UsageError(f"unknown slot policy {slot_policy!r} (use lru or fifo)")
        self._ll, self._mem = ll, mem
        self.slots = [Slot(i) for i in range(n_slots)]
        self.n_ctx_slot = n_ctx_slot
        self.slot_policy = slot_policy
        self.tracker = tracker
        self._save, self._restore = save, restore
        self.can_park = save is not None and restore is not None and tracker is None
        self.park_limit = park_limit
        self.parked: dict[int, bytes] = {}  # slot index → its saved KV state

    def is_parked(self, slot: Slot) -> bool:
        return slot.index in self.parked

    def park_idle(self) -> None:
        """Move every idle, resident cached prefix out of the KV pool (see module doc)."""
        if not self.can_park:
            return
        assert self._save is not None
        for slot in self.slots:
            if slot.busy or not slot.cached or slot.index in self.parked:
                continue
            self.parked[slot.index] = self._save(slot.index)
            self._ll.llama_memory_seq_rm(self._mem, slot.index, -1, -1)
        while sum(map(len, self.parked.values())) > self.park_limit:
            oldest = min((self.slots[i] for i in self.parked), key=lambda s: s.last_used)
            del self.parked[oldest.index]
            oldest.cached.clear()

    def unpark(self, slot: Slot) -> None:
        """Bring a parked slot's cells back into the KV pool."""
        data = self.parked.pop(slot.index, None)
        if data is not None:
            assert self._restore is not None
            try:
                self._restore(data, slot.index)
            except Exception:  # refused (cannot happen for our own bytes): start empty
                self._ll.llama_memory_seq_rm(self._mem, slot.index, -1, -1)
                slot.cached.clear()
                raise

    def pick(self, prompt: list[int], lora: str = "") -> tuple[Slot, int] | None:
        """A free slot for `prompt` and how many of its leading tokens the slot's cache
        already holds; None when every slot is busy. Only a cache computed under the
        same adapter set `lora` counts (another set's cells hold other K and V)."""
        free = [s for s in self.slots if not s.busy]
        if not free:
            return None

        def held(s: Slot) -> int:
            return common_prefix(s.cached, prompt) if s.lora == lora else 0

        best = max(free, key=held)
        reuse = held(best)
        if reuse == 0:  # nothing to reuse: give up the idle cache the policy names
            key = (lambda s: s.last_used) if self.slot_policy == "lru" else (lambda s: s.filled_at)
            best = min(free, key=key)
        return best, reuse

    def claim(self, slot: Slot, reuse: int, lora: str = "") -> None:
        """Mark `slot` busy, keeping only the first `reuse` cached tokens (computed under
        the adapter set `lora`, which the slot's cells hold from now on)."""
        if reuse == 0:
            self.parked.pop(slot.index, None)
        self.truncate(slot, reuse)
        slot.lora = lora
        if reuse == 0:
            slot.filled_at = time.perf_counter()
        slot.busy = True

    def release(self, slot: Slot) -> None:
        """The slot's sequence ended; its cache stays for prefix reuse."""
        slot.busy = False
        slot.last_used = time.perf_counter()

    def truncate(self, slot: Slot, n: int) -> None:
        """Drop the slot's cells from position `n` on (a parked slot comes back first)."""
        if slot.index in self.parked:
            if n == 0:
                del self.parked[slot.index]
            else:
                self.unpark(slot)
        self._ll.llama_memory_seq_rm(self._mem, slot.index, n, -1)
        del slot.cached[n:]
        if self.tracker is not None:
            self.tracker.truncate(slot.index, n)

    def idle_cells(self) -> int:
        """Cells held by idle slots' cached prefixes."""
        return sum(len(s.cached) for s in self.slots if not s.busy)
