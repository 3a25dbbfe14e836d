"""Continuous batching with chunked prefill over one llama.cpp context.

The context holds `n_slots` sequences; each slot owns `n_ctx // n_slots` KV cells (as
llama-server's `--parallel` does), so admission never has to guess whether the shared
cache will overflow. Every `step()` builds one llama_batch:

1. the pending token of every generating sequence (decode first: running streams never
   stall behind a long prompt), then
2. prefill chunks of admitted prompts, in arrival order, up to the step's token budget.

After one `llama_decode`, each sequence that produced logits samples its next token with
its own sampler chain (in C, on the batch row). A finished slot keeps its tokens in the
cache, so a later prompt that starts the same way reuses them (prefix reuse); which idle
cache to give up when a slot is needed is the slot policy (`lru` or `fifo`).

When a sequence fills its slot, its KV policy (see kv_policies.py) decides: `none`
ends it ("length"), `streaming` (StreamingLLM) drops the middle of the cache, keeping
the first sink tokens and the most recent ones, and shifts positions so generation
continues indefinitely.

Not thread-safe: one thread (the worker loop) calls submit / cancel / step.
"""

from __future__ import annotations

import codecs
import collections
import time
from dataclasses import dataclass, field
from typing import Any

from inferenceos.engine.attention_probe import AttentionProbe, CellTracker
from inferenceos.engine.batch import TokenBatch
from inferenceos.engine.kv_policies import KVPolicy, load_policy
from inferenceos.engine.kv_stats import cache_stats, slot_stats
from inferenceos.engine.sampling import SamplerChain, SamplingParams
from inferenceos.engine.seq_cache import SeqCacheView
from inferenceos.engine.session import GenerationMetrics, LoadedModel
from inferenceos.engine.stop import StopMatcher
from inferenceos.errors import EngineBusyError, GenerationError, UsageError

# Events returned by step(): (request id, kind, payload)
#   ("token", (token_id, text[, logprob, top logprobs])), ("done", metrics dict),
#   ("error", (class name, message))
Event = tuple[int, str, Any]


@dataclass
class Request:
    id: int
    prompt: list[int]
    sampling: SamplingParams
    arrival: float = field(default_factory=time.perf_counter)
    kv_policy: str | None = None  # None: the scheduler's default policy


@dataclass
class Slot:
    """One sequence id in the context and the tokens its KV cells hold."""

    index: int
    cached: list[int] = field(default_factory=list)
    last_used: float = 0.0
    filled_at: float = 0.0
    busy: bool = False


class Sequence:
    """A request being served in a slot."""

    def __init__(self, req: Request, slot: Slot, reused: int, vocab: Any, policy: KVPolicy) -> None:
        self.req = req
        self.slot = slot
        self.sampler = SamplerChain(req.sampling, vocab)
        self.policy = policy
        self.n_prefilled = reused  # prompt tokens already in the KV cache
        self.pending: int | None = None  # sampled, emitted, not yet evaluated
        self.row: int | None = None  # batch row whose logits we sample this step
        self.metrics = GenerationMetrics(prompt_tokens=len(req.prompt), cached_tokens=reused)
        self.reused = reused
        self.t_start = time.perf_counter()
        self.t_first = 0.0
        self.steps = 0
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stops = StopMatcher(req.sampling.stop)

    @property
    def prefilling(self) -> bool:
        return self.n_prefilled < len(self.req.prompt)

    @property
    def n_past(self) -> int:
        return len(self.slot.cached)


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
    ) -> None:
        """`probe` must be the AttentionProbe whose callback `model`'s context was created
        with; policies that need attention (h2o) require it. While some sequence is
        generating, prefill chunks are cut so that a step takes about `max_step_s`
        (measured), keeping inter-token latency bounded; otherwise the full budget."""
        self.probe = probe
        self.policy_options = policy_options or {}  # policy name → constructor options
        self.policy = self._policy(kv_policy)
        self.tracker = CellTracker(model.n_ctx) if probe is not None else None
        if slot_policy not in ("lru", "fifo"):
            raise UsageError(f"unknown slot policy {slot_policy!r} (use lru or fifo)")
        self.model = model
        self._ll = model._ll
        self.mem = self._ll.llama_get_memory(model.ctx)
        self.can_shift = bool(self._ll.llama_memory_can_shift(self.mem))
        if kv_policy != "none" and not self.can_shift:
            raise UsageError(f"this model's KV cache cannot shift positions: no {kv_policy} policy")
        self.slots = [Slot(i) for i in range(n_slots)]
        self.n_ctx_slot = model.n_ctx // n_slots
        self.token_budget = max(1, min(token_budget, model.settings.n_batch))
        self.slot_policy = slot_policy
        self.max_queue = max_queue
        self.queue: collections.deque[Request] = collections.deque()
        self.running: list[Sequence] = []
        self.batch = TokenBatch(self.token_budget + n_slots, n_slots)
        self.step_times: collections.deque[float] = collections.deque(maxlen=32)
        self.s_per_token = 0.0  # moving average of a step's seconds per batched token
        self.max_step_s = max_step_s
        self._ll.llama_memory_clear(self.mem, True)

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
        bad = next((t for t in req.prompt if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise UsageError(f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})")
        if len(req.prompt) >= self.n_ctx_slot:
            raise UsageError(
                f"the prompt has {len(req.prompt)} tokens; a sequence holds {self.n_ctx_slot}"
            )
        if len(self.queue) >= self.max_queue:
            raise EngineBusyError(f"busy: {len(self.queue)} requests are already waiting")
        SamplerChain(req.sampling, self.model.vocab).close()  # a bad grammar fails here
        if req.kv_policy not in (None, "none"):
            self._policy(req.kv_policy)  # unknown, or needs what this engine lacks
            if not self.can_shift:
                raise UsageError(f"this model's KV cache cannot shift: no {req.kv_policy} policy")
        self.queue.append(req)

    def cancel(self, req_id: int) -> list[Event]:
        """Stop a queued or running request; its slot is free at once."""
        for req in self.queue:
            if req.id == req_id:
                self.queue.remove(req)
                return [(req_id, "done", GenerationMetrics(stop_reason="interrupted").to_json())]
        for seq in self.running:
            if seq.req.id == req_id:
                seq.metrics.stop_reason = "interrupted"
                return [self._finish(seq)]
        return []

    def has_work(self) -> bool:
        return bool(self.queue or self.running)

    def stats(self) -> dict[str, Any]:
        """KV usage and fragmentation per slot and for the cache, queue state (for `ps`,
        /metrics and tests); see engine.kv_stats for what each figure means."""
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
        }

    # -- admission -------------------------------------------------------------------------

    def _pick_slot(self, prompt: list[int]) -> tuple[Slot, int] | None:
        """A free slot and how many leading prompt tokens its cache already holds."""
        free = [s for s in self.slots if not s.busy]
        if not free:
            return None

        def common(slot: Slot) -> int:
            n = 0
            # prompt[:-1]: keep >= 1 token to evaluate, for its logits
            for a, b in zip(slot.cached, prompt[:-1], strict=False):
                if a != b:
                    break
                n += 1
            return n

        best = max(free, key=common)
        reuse = common(best)
        if reuse == 0:  # nothing to reuse: give up the idle cache the policy names
            key = (lambda s: s.last_used) if self.slot_policy == "lru" else (lambda s: s.filled_at)
            best = min(free, key=key)
        return best, reuse

    def _admit(self) -> None:
        while self.queue:
            picked = self._pick_slot(self.queue[0].prompt)
            if picked is None:
                return
            slot, reuse = picked
            req = self.queue.popleft()
            # drop the part of the slot's cache that the new prompt does not share
            self._ll.llama_memory_seq_rm(self.mem, slot.index, reuse, -1)
            del slot.cached[reuse:]
            if self.tracker is not None:
                self.tracker.truncate(slot.index, reuse)
            if reuse == 0:
                slot.filled_at = time.perf_counter()
            slot.busy = True
            policy = self._policy(req.kv_policy) if req.kv_policy else self.policy
            self.running.append(Sequence(req, slot, reuse, self.model.vocab, policy))

    # -- one step ----------------------------------------------------------------------

    def step(self) -> list[Event]:
        """Admit what fits, evaluate one batch, sample, and return the events."""
        events: list[Event] = []
        self._admit()
        self._make_room(events)
        if not self.running:
            return events
        rows = self._fill_batch()
        if self.probe is not None:
            self.probe.reset()
        t0 = time.perf_counter()
        rc = self._ll.llama_decode(self.model.ctx, self.batch.raw)
        elapsed = time.perf_counter() - t0
        self.step_times.append(elapsed)
        per_token = elapsed / max(1, self.batch.n)
        self.s_per_token = (
            per_token if not self.s_per_token else (0.8 * self.s_per_token + 0.2 * per_token)
        )
        if rc != 0:
            return events + self.fail_all(f"llama_decode failed (code {rc})")
        if self.tracker is not None and self.probe is not None:
            try:
                self.tracker.observe(self.probe, rows)
            except GenerationError as exc:
                return events + self.fail_all(str(exc))
        for seq in list(self.running):
            if seq.row is not None:
                events.extend(self._sample(seq))
        return events

    def _make_room(self, events: list[Event]) -> None:
        """Apply the KV policy to generating sequences whose slot is full."""
        for seq in list(self.running):
            if seq.pending is None or seq.n_past + 1 <= self.n_ctx_slot:
                continue
            view = SeqCacheView(self._ll, self.mem, seq.slot.index, seq.slot.cached, self.tracker)
            if not seq.policy.make_room(view):
                seq.metrics.stop_reason = "length"
                events.append(self._finish(seq))

    def _fill_batch(self) -> dict[int, list[int]]:
        """Fill the batch; returns each slot's batch rows in position order."""
        self.batch.clear()
        rows: dict[int, list[int]] = {}
        for seq in self.running:  # 1. decode: one token per generating sequence
            seq.row = None
            if seq.pending is not None:
                seq.row = self.batch.add(seq.pending, seq.n_past, seq.slot.index, True)
                rows[seq.slot.index] = [seq.row]
                seq.slot.cached.append(seq.pending)
                seq.pending = None
        budget = self.step_budget(generating=self.batch.n > 0) - self.batch.n
        for seq in self.running:  # 2. prefill chunks, oldest request first
            if budget <= 0:
                break
            if not seq.prefilling:
                continue
            prompt = seq.req.prompt
            end = min(len(prompt), seq.n_prefilled + budget)
            row = -1
            slot_rows = rows.setdefault(seq.slot.index, [])
            for i in range(seq.n_prefilled, end):
                row = self.batch.add(prompt[i], i, seq.slot.index, i == len(prompt) - 1)
                slot_rows.append(row)
                seq.slot.cached.append(prompt[i])
            if end == len(prompt):
                seq.row = row
            budget -= end - seq.n_prefilled
            seq.n_prefilled = end
        return rows

    def step_budget(self, generating: bool) -> int:
        """Tokens for the next step: the full budget, or what fits `max_step_s` while
        sequences are generating (at least one 16-token chunk beyond the decodes)."""
        if not generating or not self.s_per_token:
            return self.token_budget
        fits = int(self.max_step_s / self.s_per_token)
        return max(16 + len(self.running), min(self.token_budget, fits))

    def _sample(self, seq: Sequence) -> list[Event]:
        assert seq.row is not None
        token = seq.sampler.sample(self.model.ctx, seq.row)
        now = time.perf_counter()
        m = seq.metrics
        if not seq.t_first:
            seq.t_first = now
            m.ttft_s = now - seq.req.arrival
            prefill_s = now - seq.t_start
            m.prompt_tps = (len(seq.req.prompt) - seq.reused) / prefill_s if prefill_s else 0.0
        else:
            seq.steps += 1
            m.decode_tps = seq.steps / (now - seq.t_first)
        if self.model.is_eog(token) and not seq.req.sampling.ignore_eos:
            m.stop_reason = "eos"
            return self._close(seq)
        if m.completion_tokens >= seq.req.sampling.max_tokens:
            m.stop_reason = "length"
            return self._close(seq)
        m.completion_tokens += 1
        text = seq.stops.feed(seq.utf8.decode(self.model.piece(token)))
        events: list[Event] = [(seq.req.id, "token", self._token_payload(seq, token, text))]
        if seq.stops.stopped or m.completion_tokens >= seq.req.sampling.max_tokens:
            m.stop_reason = "stop" if seq.stops.stopped else "length"
            return events + self._close(seq)
        seq.pending = token
        return events

    def _token_payload(self, seq: Sequence, token: int, text: str) -> tuple[Any, ...]:
        """(token, text), plus (logprob, top logprobs) when the request asks for them."""
        n = seq.req.sampling.logprobs
        if n is None:
            return (token, text)
        assert seq.row is not None
        return (token, text, *self.model.logprobs(seq.row, token, n))

    def _close(self, seq: Sequence) -> list[Event]:
        """Flush held-back text, then finish."""
        tail = seq.stops.feed(seq.utf8.decode(b"", final=True)) + seq.stops.flush()
        events: list[Event] = [(seq.req.id, "token", (-1, tail))] if tail else []
        return [*events, self._finish(seq)]

    def _finish(self, seq: Sequence) -> Event:
        seq.sampler.close()
        seq.slot.busy = False
        seq.slot.last_used = time.perf_counter()
        self.running.remove(seq)
        return (seq.req.id, "done", seq.metrics.to_json())

    def fail_all(self, message: str) -> list[Event]:
        """End every running sequence with an error and clear its cache."""
        events = []
        for seq in list(self.running):
            self._ll.llama_memory_seq_rm(self.mem, seq.slot.index, -1, -1)
            seq.slot.cached.clear()
            if self.tracker is not None:
                self.tracker.truncate(seq.slot.index, 0)
            self._finish(seq)
            events.append((seq.req.id, "error", ("GenerationError", message)))
        return events

    def close(self) -> None:
        for seq in list(self.running):
            self._finish(seq)
        self.batch.close()
