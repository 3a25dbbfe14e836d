"""Continuous batching with chunked prefill over one llama.cpp context.

Split as vLLM v1's scheduler is, each part with one job:
- the slot table (slots.py): sequence ids of the context, the tokens their KV cells
  hold, prefix reuse and the slot policy;
- `schedule()` (step_plan.py): a pure function from the running sequences' needs to the
  step's `StepPlan` (decode first, then prefill chunks up to the token budget);
- the executor (executor.py): fills one llama_batch from the plan and decodes it;
- the output processor (output.py): chosen tokens → UTF-8 text, stop strings,
  eos/length, metrics;
- the speculative decoder (engine/spec/decode.py): each step's drafts before the batch is
  planned, and the verification of a drafting sequence's rows after the decode;
- the request and its running sequence's state (running.py).

This module ties them together: admission, the step loop, sampling each sequence on its
batch row with its own sampler chain (in C), KV policies, the thread governor and media
steps. When a sequence fills its slot, its KV policy (see engine/kv/policies.py) decides:
`none` ends it ("length"), `streaming` (StreamingLLM) drops the middle of the cache,
keeping the first sink tokens and the most recent ones, and shifts positions so
generation continues indefinitely. `generate_one` is the one decode path of a single
sequence in process (`run`): a one-slot scheduler, stepped by the engine loop
(core.py) like every other.

Not thread-safe: one thread (the worker loop) calls submit / cancel / step.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import replace
from typing import Any

from inferenceos.engine import candidates
from inferenceos.engine.core import EngineCore
from inferenceos.engine.executor import Executor, StepRows
from inferenceos.engine.generation import GenerationMetrics, TokenEvent
from inferenceos.engine.kv.attention_probe import AttentionProbe, CellTracker
from inferenceos.engine.kv.policies import KVPolicy, load_policy
from inferenceos.engine.kv.seq_cache import SeqCacheView
from inferenceos.engine.kv.slot_state import import_slot
from inferenceos.engine.kv.slots import Slot, SlotTable
from inferenceos.engine.kv.stats import cache_stats, slot_stats
from inferenceos.engine.kv.store import KVStore
from inferenceos.engine.kv.tiers import (
    PendingStores,
    park_bytes,
    restore_into,
    set_checkpoint,
    store_checkpoints,
    store_slot,
)
from inferenceos.engine.lora import LoraSet, adapters_of, set_key, step_set
from inferenceos.engine.messages import Event, Failed, Finished, Progress, TokenOut
from inferenceos.engine.output import Extra, snapshot
from inferenceos.engine.running import NO_PROJECTOR, Request, RunningSequence, prompt_request
from inferenceos.engine.sampling import SamplerChain, SamplingParams
from inferenceos.engine.session import LoadedModel, decode_failed
from inferenceos.engine.spec.decode import SpeculativeDecoder
from inferenceos.engine.spec.ngram_replay import ReplayBudget
from inferenceos.engine.step_plan import MediaWork, StepPlan, media_step, schedule
from inferenceos.engine.thread_governor import ThreadGovernor
from inferenceos.errors import EngineBusyError, GenerationError, UsageError

__all__ = ["Event", "Request", "RunningSequence", "Scheduler", "Slot", "StepTrace",
           "generate_one", "prompt_request"]

# (phase, start, end, tokens): one timed step of the scheduler, for `inferenceos profile`
# (tuning/profiler.py). phase is "prefill" (a batch carrying prompt or media rows),
# "decode" (a batch of decode rows only) or "sampling" (one sampler call of a decode
# path without drafts); start and end are time.perf_counter() readings; tokens is the
# batch's token count (0 for sampling). Called right after the step, so the callback's
# own time falls between timed steps.
StepTrace = Callable[[str, float, float, int], None]


class Scheduler:
    """Serves many requests at once on one LoadedModel (see module docstring)."""

    def __init__(
        self,
        model: LoadedModel,
        n_slots: int,
        token_budget: int,
        kv_policy: str = "none",
        slot_policy: str = "lru",
        max_queue: int = 64,
        probe: AttentionProbe | None = None,
        max_step_s: float = 0.25,
        policy_options: dict[str, dict[str, Any]] | None = None,
        draft: str | None = None,
        draft_options: dict[str, dict[str, Any]] | None = None,
        media: Any = None,
        adaptive_threads: bool = True,
        kv_store: KVStore | None = None,
        trace: StepTrace | None = None,
    ) -> None:
        """`draft` names the default drafter ("ngram", "self", a plugin, or a .gguf draft
        model; None or "none": no speculative decoding), which requests may override;
        `draft_options` maps a drafter name to its constructor options (e.g. p_min).
        `probe` must be the AttentionProbe whose callback `model`'s context was created
        with; policies that need attention (h2o) require it. While some sequence is
        generating, prefill chunks are cut so that a step takes about `max_step_s`
        (measured), keeping inter-token latency bounded; otherwise the full budget.
        `media`: the model's MediaEncoder (media_encoder.py) when it has a projector;
        media steps alternate with the others (step_plan). `adaptive_threads`: a
        ThreadGovernor (thread_governor.py) lowers llama.cpp's threads while decode
        steps run far slower than they did (another program took a core). `kv_store`:
        the tiered KV cache (engine/kv/store.py) a finished sequence's state goes to and a
        prompt's longest cached prefix comes from; None: the context's slots only.
        `trace`: told of every batch evaluation and sampler call (StepTrace); with one,
        each evaluation ends with llama_synchronize so that asynchronous GPU work is
        charged to the batch that queued it. None (`run`, `serve`): no synchronize."""
        self.probe = probe
        self.trace = trace
        self.policy_options = policy_options or {}  # policy name → constructor options
        self.policy = self._policy(kv_policy)
        self.tracker = CellTracker(model.n_ctx) if probe is not None else None
        self.model = model
        self._ll = model._ll
        self.mem = self._ll.llama_get_memory(model.ctx)
        self.can_shift = bool(self._ll.llama_memory_can_shift(self.mem))
        if kv_policy != "none" and not self.can_shift:
            raise UsageError(f"this model's KV cache cannot shift positions: no {kv_policy} policy")
        self.n_ctx_slot = model.n_ctx // n_slots
        self.kv_store = kv_store if self.tracker is None else None  # h2o: no restores
        self._to_store = PendingStores()  # finished slots whose state goes to the store
        # idle prefixes are parked only out of a shared pool (kv/slots.py): a stream of
        # its own is in nobody else's attention, and a park and its restore cost copies
        shared = n_slots > 1 and model.settings.kv_unified
        self.table = SlotTable(self._ll, self.mem, n_slots, self.n_ctx_slot, slot_policy,
                               self.tracker, self._park_bytes if shared else None,
                               model.restore_sequence)
        self.max_batch = model.settings.n_batch  # llama_decode takes at most n_batch tokens
        self.token_budget = max(1, min(token_budget, self.max_batch))
        self.max_queue = max_queue
        self.queue: collections.deque[Request] = collections.deque()
        self.running: list[RunningSequence] = []
        self.executor = Executor(self._ll, model.ctx, self.max_batch + n_slots, n_slots,
                                 by_slot=n_slots > 1 and not model.settings.kv_unified)
        self.max_step_s = max_step_s
        self.media = media
        n_threads = int(self._ll.llama_n_threads(model.ctx))
        self._threads_batch = int(self._ll.llama_n_threads_batch(model.ctx))
        self.governor = ThreadGovernor(n_threads) if adaptive_threads else None
        self._media_turn = True  # whether a waiting media span may take the next step
        self.lora = adapters_of(model)  # LoRA adapters: one set per step (engine/lora.py)
        self._lora_step: LoraSet = ()
        self._ll.llama_memory_clear(self.mem, True)
        self.spec_decode = SpeculativeDecoder(model, n_slots, self.n_ctx_slot,
                                              self.executor.step_times, draft,
                                              draft_options, guesses=self.tracker is None,
                                              step_shapes=self.executor.step_shapes)
        self._replays = ReplayBudget()  # n-gram replays: a bounded share of this loop

    def footprint_bytes(self) -> int:
        """Memory the drafters hold (draft model weights and KV), for the planner."""
        return self.spec_decode.footprint_bytes()

    @property
    def slots(self) -> list[Slot]:
        return self.table.slots

    @property
    def s_per_token(self) -> float:
        """Moving average of a step's seconds per batched token (measured)."""
        return self.executor.s_per_token

    @s_per_token.setter
    def s_per_token(self, value: float) -> None:
        self.executor.s_per_token = value

    @property
    def step_times(self) -> collections.deque[float]:
        return self.executor.step_times

    def _policy(self, name: str) -> KVPolicy:
        policy = load_policy(name, **self.policy_options.get(name, {}))
        if getattr(policy, "needs_attention", False) and self.probe is None:
            raise UsageError(
                f"the {name} policy needs attention probabilities: load the model "
                "with an attention probe and flash attention off"
            )
        return policy

    # -- requests ------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        """Queue a request.

        Raises UsageError when it can never be served (empty, or longer than a slot) and
        EngineBusyError when the queue is full.
        """
        if not req.prompt:
            raise UsageError("the prompt is empty")
        n_vocab = self.model.n_vocab
        bad = next((t for t in req.prompt if not (0 <= t < n_vocab or t in req.media)), None)
        if bad is not None:
            raise UsageError(f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})")
        if req.media:
            self._check_media(req)
        if len(req.prompt) >= self.n_ctx_slot:
            raise UsageError(
                f"the prompt has {len(req.prompt)} tokens; a sequence holds {self.n_ctx_slot}"
            )
        if len(self.queue) >= self.max_queue:
            raise EngineBusyError(f"busy: {len(self.queue)} requests are already waiting")
        SamplerChain(req.sampling, self.model.vocab).close()  # a bad grammar fails here
        if req.sampling.lora:  # a bad adapter file fails here; drafts would skip it
            self.lora.check(req.sampling.lora)
            req.draft = "none"
        if req.kv_policy not in (None, "none"):
            self._policy(req.kv_policy)  # unknown, or needs what this engine lacks
            if not self.can_shift:
                raise UsageError(f"this model's KV cache cannot shift: no {req.kv_policy} policy")
        self.spec_decode.check(req)
        self.queue.append(req)

    def _check_media(self, req: Request) -> None:
        """A request with media: its chunks must be decodable here; no drafter (draft
        models read token ids, and media cells have none)."""
        if self.media is None:
            raise UsageError("this model has no projector: it cannot take images or audio")
        for span in req.spans:
            if span.atomic and span.end - span.start > self.max_batch:
                raise UsageError(f"an image takes {span.end - span.start} cells, which must "
                                 f"be evaluated in one batch of at most {self.max_batch}: "
                                 "load the model with a larger batch")
        req.draft = "none"

    def media_tokens(self, item: Any) -> int:
        """Context cells the MediaItem `item` takes (UsageError without a projector)."""
        if self.media is None:
            raise UsageError(NO_PROJECTOR)
        return int(self.media.media_tokens(item))

    def _free_media(self, req: Request) -> None:
        if req.media and self.media is not None:
            self.media.release(req.media.values())

    def cancel(self, req_id: int) -> list[Event]:
        """Stop a queued or running request; its slot is free at once."""
        for req in self.queue:
            if req.id == req_id:
                self.queue.remove(req)
                self._free_media(req)
                return [Finished(req_id, snapshot(GenerationMetrics(stop_reason="interrupted")))]
        for seq in self.running:
            if seq.req.id == req_id:
                seq.metrics.stop_reason = "interrupted"
                self._release(seq)
                return [seq.out.done()]
        return []

    def has_work(self) -> bool:
        """Whether `step` has something to do now (a finished turn's store only once
        it is due: see kv_tiers.PendingStores)."""
        return bool(self.queue or self.running or self._to_store.due_in() == 0.0)

    def store_due_in(self) -> float | None:
        """Seconds until a finished turn's store is due (the idle loop's wait); None
        when none waits."""
        return self._to_store.due_in()

    def stats(self) -> dict[str, Any]:
        """KV usage and fragmentation per slot and for the cache, queue state (for `ps`,
        /metrics and tests); see engine.kv_stats for what each figure means."""
        self.store_finished()  # the KV cache's figures include the turns just finished
        slots = [slot_stats(s, self.n_ctx_slot, self.tracker) for s in self.slots]
        window = None
        if self.probe is not None and self.probe.mass.size:
            window = int(self.probe.mass.size)  # n_kv of the last decode's attention
        return {
            "running": len(self.running),
            "waiting": len(self.queue),
            **cache_stats(slots, window),
            "slots": slots,
            "policy": self.policy.name,
            "threads": int(self._ll.llama_n_threads(self.model.ctx)),
            "thread_changes": self.governor.changes if self.governor else 0,
            **({"kv_cache": self.kv_store.stats()} if self.kv_store is not None else {}),
        }

    # -- the tiered KV store (engine/kv/tiers.py) ---------------------------------------------

    def _restore(self, slot: Slot, prompt: list[int], reuse: int) -> int:
        if self.kv_store is None:
            return reuse
        return restore_into(self, self.kv_store, slot, prompt, reuse)

    def store_finished(self) -> None:
        """Put the states of the slots that finished since the last step into the store
        (before anything can reuse or park them)."""
        for slot in self._to_store.take_all():
            self._store(slot)

    def prefetch(self, tokens: list[int]) -> int:
        """Put the store's longest prefix of `tokens` into an idle slot now, unless an
        idle slot holds more of them already; returns how many of `tokens` an idle slot
        holds afterwards (0: every slot busy, or nothing cached). The slot stays idle
        and holds the whole entry: the next prompt starting with `tokens` reuses it."""
        self.store_finished()  # a restore may replace a finished turn's cells
        picked = self.table.pick(tokens)
        if picked is None:
            return 0
        slot, reuse = picked
        # lookup() leaves a prompt's last token out (it is always evaluated): all count
        return min(self._restore(slot, [*tokens, 0], reuse), len(tokens))

    def _store(self, slot: Slot) -> None:
        if self.kv_store is not None:
            store_slot(self, self.kv_store, slot)

    def _park_bytes(self, index: int) -> bytes:
        return park_bytes(self, self.kv_store, index)

    # -- admission -------------------------------------------------------------------------

    def _progress(self, seq: RunningSequence) -> Progress:
        """A Progress event: prompt tokens, from the cache, processed, ms so far."""
        ms = (time.perf_counter() - seq.req.arrival) * 1000
        return Progress(seq.req.id, len(seq.req.prompt), seq.metrics.cached_tokens,
                        seq.n_prefilled, round(ms, 3))

    def _admit(self, events: list[Event]) -> None:
        while self.queue:
            lora = set_key(self.queue[0].sampling.lora)
            picked = self.table.pick(self.queue[0].prompt, lora)
            if picked is None:
                return
            slot, reuse = picked
            req = self.queue.popleft()
            if self._to_store.claim(slot) and reuse < len(slot.cached):
                self._store(slot)  # before its cells past `reuse` are dropped
            if not lora:  # the store holds base states only (engine/lora.py)
                reuse = self._restore(slot, req.prompt, reuse)
            span = next((m for m in req.spans if m.start < reuse < m.end), None)
            if span is not None and span.atomic:  # never half an atomic chunk
                reuse = span.start
            self.table.claim(slot, reuse, lora)
            policy = self._policy(req.kv_policy) if req.kv_policy else self.policy
            self.running.append(RunningSequence(req, slot, reuse, self.model, policy,
                                                self.spec_decode.draft_for(req),
                                                self._replays))
            if self.kv_store is not None and not req.media and not lora:
                set_checkpoint(self, self.kv_store, self.running[-1])
            if req.progress:  # before any prompt work: processed == cached
                events.append(self._progress(self.running[-1]))

    # -- one step ----------------------------------------------------------------------

    def step(self) -> list[Event]:
        """Admit what fits, evaluate one batch, sample, and return the events."""
        events: list[Event] = []
        self._admit(events)  # first: a returning turn claims its slot, not stored
        self.store_finished()
        self._make_room(events)
        if not self.running:
            return events
        self.table.park_idle()  # keep idle prefixes out of the running ones' attention
        self.spec_decode.propose(self.running)
        plan = self.plan()
        if plan.media is not None:
            try:
                rows = self._fill_media(plan.media)
            except GenerationError as exc:
                return [*events, self._fail(self._seq_at(plan.media.key), str(exc))]
        else:
            rows = self.executor.fill(plan)
        self._commit(plan)
        if self.probe is not None:
            self.probe.reset()
        self.lora.apply(self.model.ctx, self._lora_step)
        t0 = time.perf_counter()
        rc = self.executor.decode()
        if rc != 0:
            decode_failed(rc)  # a Ctrl-C: KeyboardInterrupt, which the caller cleans up
            return events + self.fail_all(f"llama_decode failed (code {rc})")
        if self.trace is not None:
            self._ll.llama_synchronize(self.model.ctx)  # GPU work ends inside the span
            phase = "prefill" if plan.prefills or plan.media is not None else "decode"
            self.trace(phase, t0, time.perf_counter(), plan.n_tokens)
        if self.governor is not None and not plan.prefills and plan.media is None:
            self._govern(plan.n_tokens)
        for p in (*plan.prefills, *([plan.media] if plan.media else [])):
            seq = self._seq_at(p.key)
            if seq.req.progress:
                events.append(self._progress(seq))
        if self.kv_store is not None:  # prefixes other conversations share
            store_checkpoints(self, self.kv_store, plan.prefills)
        if self.tracker is not None and self.probe is not None:
            try:
                self.tracker.observe(self.probe, rows.by_slot)
            except GenerationError as exc:
                return events + self.fail_all(str(exc))
        events.extend(self._sample_all(rows))
        return events

    def plan(self) -> StepPlan:
        """This step's batch, from the running sequences' needs (pure: step_plan)."""
        self._lora_step = step_set([s.req.sampling.lora for s in self.running],
                                   self._lora_step)  # one adapter set per decode
        needs = [seq.needs() for seq in self.running
                 if seq.req.sampling.lora == self._lora_step]
        generating = any(n.pending is not None for n in needs)
        budget = self.step_budget(generating)
        plan = schedule(needs, budget, self.max_batch, media_first=self._media_turn)
        if not plan and not self._media_turn:  # nothing else to do: media goes now
            plan = media_step(needs, budget, self.max_batch)
        self._media_turn = plan.media is None
        return plan

    def _govern(self, rows: int) -> None:
        """Show the governor this decode step; apply the thread count it asks for (the
        batch threads scaled alike). Thread counts do not change llama.cpp's CPU results
        (same tokens and logits at 1 and 2 threads, checked on Gemma and a tiny model)."""
        assert self.governor is not None
        g = self.governor
        n = g.observe(self.executor.step_times[-1], rows, time.perf_counter())
        if n is not None:
            self.set_threads(n)

    def set_threads(self, n: int) -> None:
        """llama.cpp's decode threads → n (prefill threads in the same proportion)."""
        assert self.governor is not None
        batch = max(1, self._threads_batch * n // self.governor.max_threads)
        self._ll.llama_set_n_threads(self.model.ctx, n, batch)
        self.governor.threads = n

    def _fill_media(self, work: MediaWork) -> StepRows:
        """Encode the span on its first step (kept until the span is prefilled) and fill
        the embedding batch with this step's rows."""
        assert self.media is not None
        seq = self._seq_at(work.key)
        span = work.span
        embd = seq.embd.get(span.start)
        if embd is None:
            embd = seq.embd[span.start] = self.media.encode(seq.req.media[work.tokens[0]])
        off = work.start - span.start
        rows = self.executor.fill_media(work, embd[off:off + len(work.tokens)],
                                        self.media.n_embd, span.atomic)
        if work.start + len(work.tokens) >= span.end:
            del seq.embd[span.start]
        return rows

    def _seq_at(self, key: int) -> RunningSequence:
        """The running sequence in slot `key`."""
        return next(s for s in self.running if s.slot.index == key)

    def _fail(self, seq: RunningSequence, message: str) -> Failed:
        """End `seq` with an error; its cells are dropped (they cannot be trusted)."""
        self.table.truncate(seq.slot, 0)
        self._release(seq)
        return Failed(seq.req.id, "GenerationError", message)

    def _commit(self, plan: StepPlan) -> None:
        """Record in each slot the tokens the plan puts in its cells."""
        by_key = {seq.slot.index: seq for seq in self.running}
        for d in plan.decodes:
            seq = by_key[d.key]
            seq.slot.cached.extend(d.tokens)
            seq.pending = None
            seq.draft = d.tokens[1:]  # what the batch really carries (maybe trimmed)
        for p in (*plan.prefills, *([plan.media] if plan.media else [])):
            seq = by_key[p.key]
            seq.slot.cached.extend(p.tokens)
            seq.n_prefilled = p.start + len(p.tokens)

    def _make_room(self, events: list[Event]) -> None:
        """Apply the KV policy to generating sequences whose slot is full."""
        for seq in list(self.running):
            if seq.pending is None or seq.n_past + 1 <= self.n_ctx_slot:
                continue
            view = SeqCacheView(self._ll, self.mem, seq.slot.index, seq.slot.cached, self.tracker)
            if not seq.policy.make_room(view):
                self._release(seq)
                events.extend(seq.out.finish("length"))  # held-back text flushed
            else:
                seq.kv_edited = True

    def step_budget(self, generating: bool) -> int:
        """Tokens for the next step: the full budget, or what fits `max_step_s` while
        sequences are generating (at least one 16-token chunk beyond the decodes)."""
        if not generating or not self.s_per_token:
            return self.token_budget
        fits = int(self.max_step_s / self.s_per_token)
        return max(16 + len(self.running), min(self.token_budget, fits))

    def _sample_all(self, rows: StepRows) -> list[Event]:
        events: list[Event] = []
        picked = self._greedy_picks(rows)
        for seq in list(self.running):
            key = seq.slot.index
            if key in rows.decode:
                seq.metrics.decode_steps += 1
                if seq.draft:
                    events.extend(self._verify(seq, rows.decode[key]))
                    continue
                events.extend(self._sample(seq, rows.decode[key][0], picked))
            elif key in rows.prefill_last:
                events.extend(self._sample(seq, rows.prefill_last[key], picked))
        return events

    def _greedy_picks(self, rows: StepRows) -> dict[int, int]:
        """Row -> token of this step's greedy rows, picked in one pass over the logits
        (candidates.greedy_rows); {} with fewer than two, or under a trace (whose
        "sampling" spans time each sampler call)."""
        if self.trace is not None:
            return {}
        want = [rows.decode[s.slot.index][0] if s.slot.index in rows.decode
                else rows.prefill_last[s.slot.index] for s in self.running
                if s.sampler.greedy and not s.draft
                and (s.slot.index in rows.decode or s.slot.index in rows.prefill_last)]
        if len(want) < 2:
            return {}
        logit_rows = [r for rs in rows.decode.values() for r in rs]
        logit_rows += rows.prefill_last.values()
        return candidates.greedy_rows(self._ll, self.model.ctx, want, logit_rows,
                                      self.model.n_vocab) or {}

    def _verify(self, seq: RunningSequence, rows: Seq[int]) -> list[Event]:
        """Emit what verifying the sequence's draft accepted (engine/spec/decode.py) and drop
        the rejected drafts' cells."""
        verdict = self.spec_decode.verify(seq, rows)
        self.table.truncate(seq.slot, verdict.keep)
        events: list[Event] = []
        for tok, row in verdict.chosen:
            self._ll.llama_sampler_accept(seq.sampler.ptr, tok)
            events += seq.out.push(tok, self._extra(seq, row, tok))
            if seq.out.finished:
                self._release(seq)
                return events
        seq.pending = verdict.chosen[-1][0]
        return events

    def _sample(self, seq: RunningSequence, row: int,
                picked: dict[int, int] | None = None) -> list[Event]:
        t0 = time.perf_counter()
        token = picked.get(row) if picked else None
        if token is None:
            token = seq.sampler.sample(self.model.ctx, row)
        else:
            seq.sampler.accept(token)
        if self.trace is not None:
            self.trace("sampling", t0, time.perf_counter(), 0)
        events = seq.out.push(token, self._extra(seq, row, token))
        if seq.out.finished:
            self._release(seq)
        else:
            seq.pending = token
        return events

    def _extra(self, seq: RunningSequence, row: int, token: int) -> Extra:
        """(logprob, top logprobs) when the request asks for them, else ()."""
        n = seq.req.sampling.logprobs
        return () if n is None else self.model.logprobs(row, token, n)

    def _release(self, seq: RunningSequence) -> None:
        self.spec_decode.release(seq)
        seq.sampler.close()
        self._free_media(seq.req)
        seq.embd.clear()
        self.table.release(seq.slot)
        self.running.remove(seq)
        cached = seq.slot.cached
        if (self.kv_store is not None and not seq.kv_edited and not seq.slot.lora
                and len(cached) >= self.kv_store.min_tokens and min(cached) >= 0):
            self._to_store.add(seq.slot)  # stored later: the reply is not held

    def fail_all(self, message: str) -> list[Failed]:
        """End every running sequence with an error and clear its cache."""
        return [self._fail(seq, message) for seq in list(self.running)]

    def close(self) -> None:
        for seq in list(self.running):
            self._release(seq)
        self.store_finished()
        for req in self.queue:
            self._free_media(req)
        self.spec_decode.close()
        self.executor.close()


def generate_one(
    lm: LoadedModel, prompt: list[int] | str, sampling: SamplingParams,
    draft: str | None = None, kv_policy: str = "none", probe: AttentionProbe | None = None,
    media: Any = None, items: Seq[Any] = (), state: tuple[Seq[int], bytes] | None = None,
    adaptive_threads: bool = True, trace: StepTrace | None = None,
) -> Iterator[TokenEvent]:
    """Stream the completion of one `prompt` (token ids, or text to tokenize) on `lm`
    through a one-slot scheduler: the one decode path of a single sequence in process,
    `run`'s with or without `draft` (speculative decoding), `kv_policy` (eviction when
    the context fills; `probe`: the AttentionProbe `lm`'s context was created with, for
    H2O) and media (`media`: a MediaEncoder on `lm`, for `items` in a text `prompt`).

    `state`: (tokens, bytes from `LoadedModel.save_sequence`), the KV state of a prefix
    of the prompt to start from (a migrated or saved conversation): only the rest is
    evaluated. `lm`'s context is cleared first; afterwards it holds the prompt and the
    evaluated reply in sequence 0. `adaptive_threads`: the scheduler's thread governor
    (thread_governor.py) for this run; `run` and the benchmarks that time a thread count
    turn it off, so that the threads `lm` was loaded with are the ones that decoded (and
    that a telemetry row records). Either way `lm` ends with the threads it started with.
    `trace`: the Scheduler's hook (StepTrace) for `inferenceos profile`; None adds nothing.

    `lm.metrics` describes the run so far at every step, and the whole run once the
    iterator ends; closed early (Ctrl-C, a consumer that left) its stop_reason is
    "interrupted". Raises UsageError for an empty prompt or one that does not fit the
    context; without a KV policy the reply is capped by the cells left after the prompt.
    """
    lm.metrics = GenerationMetrics(load_s=lm.load_s, stop_reason="interrupted")
    sched: Scheduler | None = None
    try:
        sched = Scheduler(lm, 1, lm.settings.n_batch, kv_policy, probe=probe, draft=draft,
                          media=media, adaptive_threads=adaptive_threads, trace=trace)
        req = _one_request(lm, prompt, sampling, kv_policy, media, items)
        lm.metrics.prompt_tokens = len(req.prompt)
        if state is not None:
            import_slot(sched, list(state[0]), state[1])
        sched.submit(req)
        for events in EngineCore(lambda: sched).steps():
            if sched.running:
                lm.metrics = sched.running[0].metrics
                lm.metrics.load_s = lm.load_s  # a footer read mid-run (Ctrl-C) shows it
            yield from _one_events(lm, events)
    finally:
        lm.metrics.load_s = lm.load_s
        if not lm.metrics.stop_reason:  # closed early (Ctrl-C, a consumer that left)
            lm.metrics.stop_reason = "interrupted"
        if sched is not None:
            if sched.governor is not None:  # the next run on `lm` starts as this one did
                sched.set_threads(sched.governor.max_threads)
            sched.close()


def _one_request(lm: LoadedModel, prompt: list[int] | str, sampling: SamplingParams,
                 kv_policy: str, media: Any, items: Seq[Any]) -> Request:
    """generate_one's request: the prompt checked against the whole context (one slot:
    the scheduler's own check says "a sequence holds", `run` says "the context holds"),
    and, with no KV policy, max_tokens capped by the cells left after the prompt (the
    reply's every token but the last gets a cell; `run` has always stopped one short)."""
    req = prompt_request(1, prompt, sampling, lm, media, items)
    if not req.prompt:
        raise UsageError("the prompt is empty")
    if len(req.prompt) >= lm.n_ctx:
        raise UsageError(f"the prompt has {len(req.prompt)} tokens; the context holds {lm.n_ctx}")
    if kv_policy in (None, "none"):
        req.sampling = replace(sampling, max_tokens=min(sampling.max_tokens,
                                                        lm.n_ctx - len(req.prompt)))
    return req


def _one_events(lm: LoadedModel, events: list[Event]) -> Iterator[TokenEvent]:
    """generate_one's view of one step's events: tokens out, the final metrics kept."""
    for ev in events:
        match ev:
            case TokenOut():
                yield ev.event()
            case Finished(metrics=metrics):
                lm.metrics = metrics
            case Failed(message=message):
                raise GenerationError(message)
