"""Export and import one scheduler slot's KV state (what server-side sessions keep).

A finished request leaves its tokens in its slot's KV cells (prefix reuse). Exporting
copies those cells out with `llama_state_seq_get_data`; importing writes them into an
idle slot with `llama_state_seq_set_data` and records the tokens they hold, so the next
request whose prompt starts with those tokens skips their prefill, exactly as if it had
followed the original one. The state only fits the model (and KV types) it came from:
llama.cpp checks the layout and refuses a foreign one.

Both functions run where the scheduler lives (the worker process, or the caller's
thread for the in-process engine) and never touch a busy slot.
"""

from __future__ import annotations

import time
from typing import Any

from inferenceos.engine.kv.slots import shared_prefix
from inferenceos.errors import GenerationError, UsageError


def export_slot(sched: Any, tokens: list[int]) -> tuple[list[int], bytes] | None:
    """(tokens held, state bytes) of the idle slot sharing the longest prefix with
    `tokens`, trimmed to that prefix; None when no idle slot shares any."""
    sched.store_finished()  # the trim may drop a finished turn's cells: stored first
    best, n = None, 0
    for slot in sched.slots:
        if not slot.busy and (c := shared_prefix(slot.cached, tokens)) > n:
            best, n = slot, c
    if best is None:
        return None
    sched.table.unpark(best)  # a parked prefix (slots.py) comes back into the pool first
    if n < len(best.cached):  # drop what the caller's conversation does not contain
        sched._ll.llama_memory_seq_rm(sched.mem, best.index, n, -1)
        del best.cached[n:]
        if sched.tracker is not None:
            sched.tracker.truncate(best.index, n)
    return list(best.cached), sched.model.save_sequence(best.index)


def import_slot(sched: Any, tokens: list[int], data: bytes) -> int:
    """Put a state from `export_slot` into an idle slot; returns how many of `tokens`
    the cache now holds (0 when every slot is busy: the caller just prefills).

    UsageError for tokens that cannot be a slot's content; GenerationError when
    llama.cpp refuses the bytes (another model, corrupt), leaving the slot empty.
    """
    if sched.tracker is not None:
        raise UsageError("saved KV state cannot be restored under a policy that tracks "
                         "attention (h2o)")
    n_vocab = sched.model.n_vocab
    if not tokens or len(tokens) >= sched.n_ctx_slot or not all(
            0 <= t < n_vocab for t in tokens):
        raise UsageError(f"a saved state must hold 1..{sched.n_ctx_slot - 1} valid tokens")
    sched.store_finished()  # a finished turn's cells may be the ones replaced
    free = [s for s in sched.slots if not s.busy]
    if not free:
        return 0
    for slot in free:  # already there (the slot was not reused since): nothing to do
        if shared_prefix(slot.cached, tokens) == len(tokens):
            return len(tokens)
    slot = min(free, key=lambda s: s.last_used)
    sched.table.parked.pop(slot.index, None)  # its parked prefix (slots.py) is replaced
    slot.cached.clear()
    sched.model.restore_sequence(data, slot.index)
    ll = sched._ll
    if int(ll.llama_memory_seq_pos_max(sched.mem, slot.index)) != len(tokens) - 1:
        ll.llama_memory_seq_rm(sched.mem, slot.index, -1, -1)
        raise GenerationError("the saved KV state does not match its tokens")
    slot.cached.extend(tokens)
    slot.last_used = slot.filled_at = time.perf_counter()
    return len(tokens)
