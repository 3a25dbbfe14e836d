"""Between the scheduler's slots and the tiered KV store (engine/kv/store.py).

Two moves, both run where the scheduler lives, on idle slots only:

- `store_slot`: a finished sequence's slot holds exactly the KV state of its tokens
  (prompt + evaluated reply); that state goes to the store, keyed by those tokens.
  Never on the reply's path: a finished turn waits in `PendingStores` until the
  scheduler has been idle `STORE_AFTER_IDLE_S`, or until its next step with other
  work. A returning request that continues the whole slot (the next turn of the same
  conversation, an agent's tool result) claims it first: the copy is skipped, since
  the end of that turn stores a state that supersedes it. Without that, the copy
  (12-28 KiB a token: 50-120 MB for a 4,000-token conversation, ~90 ms) landed in the
  next turn's time to first token whenever it came back at once.
- `restore_into`: before a prompt is prefilled, the store's longest cached prefix
  (`KVStore.lookup`) is written into the slot the prompt was given, when it holds more
  than the slot's own cached prefix. The prompt's last token is never part of it
  (`lookup` matches `prompt[:-1]`), so it is still evaluated alone, as the
  "same request, same answer" rule asks (step_plan.SEPARATE_LAST_TOKEN): a restored
  prefix holds the very bytes the uninterrupted conversation's cells held.

A state llama.cpp refuses, or one whose cell count is not its token count, is dropped
from the store and the slot is left empty: the prompt is prefilled.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from inferenceos.engine.kv.slots import Slot
from inferenceos.engine.kv.store import Entry, KVStore, entry_id
from inferenceos.errors import GenerationError

DEFAULT_S_PER_TOKEN = 1e-3  # before any step was timed: a guess for the value rule
# A finished turn's state goes to the store once the scheduler has been idle this long
# (or at its next step with work). A chat's next turn comes seconds later, so it is
# stored by then; an agent's tool call usually returns sooner and finds its slot. The
# risk is bounded: a worker killed within this window loses that one turn's entry
# (the prefix is prefilled again), never a wrong one.
STORE_AFTER_IDLE_S = 1.0


class PendingStores:
    """Finished slots whose state is still only in the context, by slot index."""

    def __init__(self) -> None:
        self._at: dict[int, tuple[Slot, float]] = {}

    def add(self, slot: Slot) -> None:
        self._at[slot.index] = (slot, time.monotonic())

    def due_in(self) -> float | None:
        """Seconds until the oldest is due (0.0: now); None when none waits."""
        if not self._at:
            return None
        oldest = min(t for _, t in self._at.values())
        return max(0.0, oldest + STORE_AFTER_IDLE_S - time.monotonic())

    def claim(self, slot: Slot) -> bool:
        """Take `slot` out (a request was given it); whether it was waiting."""
        return self._at.pop(slot.index, None) is not None

    def take_all(self) -> list[Slot]:
        slots = [slot for slot, _ in self._at.values()]
        self._at.clear()
        return slots


def store_slot(sched: Any, store: KVStore, slot: Slot) -> Entry | None:
    """Put the state of the idle `slot`'s cached tokens into `store` (its parked bytes
    when it is parked: the same state, already copied out); the entry `KVStore.put`
    returned (None: it took nothing; a RAM-only one may be evicted again at once)."""
    if slot.busy or len(slot.cached) < store.min_tokens or slot.lora:
        return None  # (states under LoRA adapters stay out of the store: engine/lora.py)
    data = sched.table.parked.get(slot.index)
    if data is None:
        data = sched.model.save_sequence(slot.index)
    s_per_token = sched.s_per_token or DEFAULT_S_PER_TOKEN
    return store.put(list(slot.cached), data, len(slot.cached) * s_per_token)


def store_idle(sched: Any, store: KVStore, durable: bool = False) -> list[Slot]:
    """Put every idle cached slot's state into `store` (finished turns still waiting
    first): what a resize or a migration hands over through the store instead of
    carrying it. Returns the idle cached slots the store does not now hold (too short,
    no tier with room, or with `durable`, an entry in RAM only, which dies with this
    worker): the caller carries those itself."""
    sched.store_finished()
    left = []
    for slot in sched.slots:
        if slot.busy or not slot.cached or slot.lora:
            continue  # an adapter's cells are neither stored nor carried: dropped
        e = store_slot(sched, store, slot)
        gone = e is None or store.entries.get(e.id) is not e  # (evicted again to fit RAM)
        if gone or (durable and e is not None and e.disk is None and not e.writing):
            left.append(slot)
    return left


def set_checkpoint(sched: Any, store: KVStore, seq: Any) -> None:
    """Give the newly admitted `seq` its prompt's branch point (KVStore.branch_point) as
    its checkpoint: the prefill stops there once and the state of that shared prefix
    is stored; at once when its cells end there already (restored or reused). Only
    where whole entries alone restore (windowed attention): elsewhere any entry
    holding the prefix restores it partially, and the copy would sit on the request's
    time to first token for nothing (~50 ms for 4,000 tokens of Qwen 0.5B)."""
    if store.partial:
        return
    c = store.branch_point(seq.req.prompt)
    if c and c >= seq.n_prefilled:
        seq.checkpoint = c
        if c == seq.n_prefilled:
            store_checkpoint(sched, store, seq)


def store_checkpoints(sched: Any, store: KVStore, prefills: Any) -> None:
    """After a step: store the state of each sequence whose prefill reached its
    checkpoint in it (`prefills`: the step's PrefillWork)."""
    for p in prefills:
        seq = sched._seq_at(p.key)
        if seq.checkpoint and seq.n_prefilled == seq.checkpoint:
            store_checkpoint(sched, store, seq)


def store_checkpoint(sched: Any, store: KVStore, seq: Any) -> None:
    """Store the state of `seq`'s cells, which hold exactly its checkpoint's prefix."""
    n, seq.checkpoint = seq.checkpoint, 0
    if seq.kv_edited or len(seq.slot.cached) != n:
        return
    data = sched.model.save_sequence(seq.slot.index)
    store.put(list(seq.req.prompt[:n]), data, n * (sched.s_per_token or DEFAULT_S_PER_TOKEN))


def restore_into(sched: Any, store: KVStore, slot: Slot, prompt: list[int], reuse: int) -> int:
    """Prompt tokens the idle `slot` holds after restoring the store's longest prefix
    of `prompt`, when it beats the slot's own `reuse`; else `reuse` unchanged. Counts
    a hot hit when the slot's own cache wins."""
    hit = store.lookup(prompt, reuse)
    if hit is None:
        if reuse:
            store.count_hot(reuse)
        return reuse
    data = store.fetch(hit)
    if data is None:  # dropped (failed its checks) or gone: the slot's own prefix
        if reuse:
            store.count_hot(reuse)
        return reuse
    table, ll = sched.table, sched._ll
    table.truncate(slot, 0)  # from here on the slot's old cells are gone
    n_entry = hit.entry.n_tokens
    try:
        sched.model.restore_sequence(data, slot.index)
        ok = int(ll.llama_memory_seq_pos_max(sched.mem, slot.index)) == n_entry - 1
        why = "its cells do not match its token count"
    except GenerationError as exc:
        ok, why = False, f"llama.cpp refused it: {exc}"
    if not ok:
        ll.llama_memory_seq_rm(sched.mem, slot.index, -1, -1)
        store.drop(hit.entry, why)
        return 0
    slot.cached[:] = hit.entry.tokens.tolist()
    return hit.n  # the caller's claim drops the cells past the prefix (partial hits)


def park_bytes(sched: Any, store: KVStore | None, index: int) -> bytes:
    """A slot's state for parking (slots.py): the store's RAM copy when it holds
    exactly the slot's tokens (no second copy, no copy-out), else a fresh one."""
    if store is not None and not sched.slots[index].lora:
        cached = sched.slots[index].cached
        e = store.entries.get(entry_id(store.key, np.asarray(cached, dtype=np.int32)))
        if e is not None and e.data is not None:
            return e.data
    data: bytes = sched.model.save_sequence(index)
    return data
