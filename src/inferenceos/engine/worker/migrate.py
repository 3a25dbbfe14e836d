"""Live migration, the mechanism: export every live sequence from one scheduler at a
step boundary and import it into another (a new worker on a new placement).

What moves, per running sequence (`SeqState`, picklable; it and `LiveState` are
records of engine/live_state.py, importable from here too): its request (id, prompt,
sampling with the sampler's seed made explicit), the tokens its KV cells hold and those
cells' bytes (`llama_state_seq_get_data`), how much of the prompt is prefilled, the
token sampled but not yet evaluated (`pending`), and the output processor's state (the
UTF-8 decoder's held bytes, stop-string hold-back, metrics and clocks). Queued requests
move as they are; idle cached prefixes (prefix reuse, server sessions) move with
`slot_state`, or, where the worker keeps a tiered KV cache with a disk tier, as its
entries: the old worker stores them (and finishes writing them as it exits), the new
one restores them from disk when a prompt asks (the same entries as every other
transition's).

On import the sequence resumes exactly where it stopped: the KV bytes go into a free
slot, the sampler chain is rebuilt and re-accepts the generated tokens (grammar and
penalties see the same history), and `pending` is evaluated by the next step. When the
new context refuses the bytes (another KV type: quantized KV is one of the placements
down) the sequence re-prefills what its cells held plus `pending`, and samples its next
token from that prefill's last row: the same token greedily, up to float differences
between the two KV types. A sequence that no longer fits a slot of the new context
ends with stop reason "length" (never an error).

Greedy generation is therefore token-exact across a migration between placements on
the same kind of kernels. Seeded random sampling continues with a seed derived from the
original (llama.cpp cannot export a sampler's RNG state): the same distribution, not
the same draws.

Both functions run on the worker's thread between scheduler steps (that *is* the step
boundary): nothing else touches the scheduler meanwhile.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

from inferenceos.engine.kv.slot_state import import_slot
from inferenceos.engine.kv.slots import Slot
from inferenceos.engine.kv.store import KVStore
from inferenceos.engine.kv.tiers import store_idle
from inferenceos.engine.live_state import LiveState, SeqState
from inferenceos.engine.messages import Event
from inferenceos.engine.running import RunningSequence
from inferenceos.engine.scheduler import Scheduler
from inferenceos.errors import InferenceOSError, UsageError

__all__ = ["LiveState", "SeqState", "export_live", "import_live", "live_need"]


def _accepted(seq: RunningSequence) -> list[int]:
    """The tokens this sequence's sampler chain has accepted: everything generated."""
    n_prompt = len(seq.req.prompt)
    out = list(seq.slot.cached[n_prompt:]) if seq.n_past >= n_prompt else []
    if seq.pending is not None:
        out.append(seq.pending)
    return out


def live_need(sched: Scheduler) -> int:
    """Cells per sequence the live requests were promised: the largest prompt +
    max_tokens among running and queued ones, at most a slot (0: none live). A
    placement with a smaller context would end one of them early."""
    reqs = [seq.req for seq in sched.running] + list(sched.queue)
    need = max((len(r.prompt) + r.sampling.max_tokens for r in reqs), default=0)
    return min(need, sched.n_ctx_slot)


def export_live(sched: Scheduler, prefixes: bool = True,
                store: KVStore | None = None) -> LiveState:
    """Detach every running and queued request from `sched` (no event is emitted for
    them: their streams continue wherever the state is imported) and copy out idle
    cached prefixes when `prefixes`. With `store` (a tiered KV cache with a disk tier,
    which the importing worker reads too), idle prefixes become its entries instead
    and only those it could not take are copied out (kv_tiers.store_idle)."""
    if any(r.media for r in [*sched.queue, *(s.req for s in sched.running)]):
        # their media chunks live in this worker's projector context (not picklable)
        raise UsageError("requests with images or audio in flight cannot migrate yet")
    state = LiveState()
    if prefixes:  # before the running ones are detached: their released slots are not idle prefixes
        left = store_idle(sched, store, durable=True) if store is not None else None
        state.prefixes = _idle_prefixes(sched, left)
    for seq in list(sched.running):
        sched.table.unpark(seq.slot)
        kv = sched.model.save_sequence(seq.slot.index) if seq.slot.cached else None
        out = seq.out
        sampling = replace(seq.req.sampling, seed=seq.sampler.seed)
        state.running.append(SeqState(
            req=replace(seq.req, sampling=sampling), cached=list(seq.slot.cached),
            n_prefilled=seq.n_prefilled, pending=seq.pending, kv=kv, metrics=out.metrics,
            utf8=out._utf8.getstate(), stop_held=out._stops._held,
            stop_stopped=out._stops.stopped, t_start=out._t_start, t_first=out._t_first,
            steps=out._steps, accepted=_accepted(seq),
        ))
        if seq.spec is not None:
            seq.spec.drafter.release(seq.slot.index)
        seq.sampler.close()
        sched.table.release(seq.slot)
        sched.running.remove(seq)
    state.queued = list(sched.queue)
    sched.queue.clear()
    return state


def _idle_prefixes(sched: Scheduler,
                   only: list[Slot] | None = None) -> list[tuple[list[int], bytes]]:
    """Each idle slot's cached prefix (of the slots in `only`, when given), as it is
    (slot_state.export_slot would pick the slot sharing the longest prefix, and trim
    another one down to a shorter one)."""
    out = []
    for slot in sched.slots if only is None else only:
        if not slot.busy and slot.cached:
            sched.table.unpark(slot)
            out.append((list(slot.cached), sched.model.save_sequence(slot.index)))
    return out


def import_live(sched: Scheduler, state: LiveState) -> dict[str, Any]:
    """Resume `state` on `sched` (a fresh scheduler: every slot idle). Returns counts
    ("restored": KV bytes taken as they are, "reprefilled", "ended") and the events of
    sequences that had to end (a "length" Finished for one that no longer fits), under
    "events"."""
    counts = {"restored": 0, "reprefilled": 0, "ended": 0, "prefixes": 0}
    events: list[Event] = []
    if not sched.has_work():
        _clear(sched)
    for st in state.running:
        how, evs = _resume(sched, st)
        counts[how] += 1
        events += evs
    sched.queue.extend(state.queued)
    for tokens, data in state.prefixes:
        if len(tokens) < sched.n_ctx_slot and sched.tracker is None:
            # another KV type refuses the bytes: that prefix is prefilled again if asked
            with contextlib.suppress(InferenceOSError):
                counts["prefixes"] += 1 if import_slot(sched, tokens, data) else 0
    return {**counts, "events": events}


def _clear(sched: Scheduler) -> None:
    """Empty a fresh scheduler's cache (a new worker's warm-up prompt) and rewind its
    cells, so the moved sequences take the cells they held in a fresh engine: a lone
    stream lands on cells 0..n-1 as an undisturbed run's does. The cell layout is not
    only bookkeeping: attention sums over the cells in use (padded to 256), so where a
    sequence's cells lie changes the float rounding of its logits, and a shifted layout
    flipped near-tie greedy tokens hundreds of tokens after a migration."""
    sched._ll.llama_memory_clear(sched.mem, True)
    sched.table.parked.clear()
    for slot in sched.slots:
        slot.cached.clear()
        if sched.tracker is not None:
            sched.tracker.truncate(slot.index, 0)


def _resume(sched: Scheduler, st: SeqState) -> tuple[str, list[Event]]:
    """Put one sequence into a free slot of `sched`; (how, events)."""
    held = len(st.cached) + (1 if st.pending is not None else 0)
    free = [s for s in sched.slots if not s.busy]
    req = st.req
    if not free or held >= sched.n_ctx_slot:  # nowhere to continue: end it cleanly
        seq = RunningSequence(req, sched.slots[0], 0, sched.model, sched.policy)
        _restore_output(seq, st)
        seq.sampler.close()
        return "ended", seq.out.finish("length")
    slot = min(free, key=lambda s: (bool(s.cached), s.last_used))
    sched.table.claim(slot, 0)
    how = "restored"
    if st.kv is not None and not _restore_kv(sched, slot.index, st):
        how = "reprefilled"
    if how == "reprefilled":  # the cells again from tokens: the prompt grows by them
        tokens = [*st.cached, *([st.pending] if st.pending is not None else [])]
        req = replace(req, prompt=tokens)
        n_prefilled, pending = 0, None
    else:
        slot.cached.extend(st.cached)
        n_prefilled, pending = st.n_prefilled, st.pending
    policy = sched._policy(req.kv_policy) if req.kv_policy else sched.policy
    seq = RunningSequence(req, slot, n_prefilled, sched.model, policy,
                          sched.spec_decode.draft_for(req))
    seq.n_prefilled, seq.pending = n_prefilled, pending
    _restore_output(seq, st)
    for tok in st.accepted:  # grammar and penalty stages see the same history
        sched._ll.llama_sampler_accept(seq.sampler.ptr, tok)
    slot.last_used = time.perf_counter()
    sched.running.append(seq)
    return how, []


def _restore_kv(sched: Scheduler, seq_id: int, st: SeqState) -> bool:
    """The sequence's KV bytes into `seq_id`; False when llama.cpp refuses them."""
    assert st.kv is not None
    try:
        sched.model.restore_sequence(st.kv, seq_id)
    except Exception:
        sched._ll.llama_memory_seq_rm(sched.mem, seq_id, -1, -1)
        return False
    if int(sched._ll.llama_memory_seq_pos_max(sched.mem, seq_id)) != len(st.cached) - 1:
        sched._ll.llama_memory_seq_rm(sched.mem, seq_id, -1, -1)
        return False
    return True


def _restore_output(seq: RunningSequence, st: SeqState) -> None:
    """The output processor exactly as it was (held UTF-8 bytes, stop hold-back)."""
    out = seq.out
    out.metrics = st.metrics
    out._utf8.setstate(st.utf8)
    out._stops._held, out._stops.stopped = st.stop_held, st.stop_stopped
    out._t_start, out._t_first, out._steps = st.t_start, st.t_first, st.steps
