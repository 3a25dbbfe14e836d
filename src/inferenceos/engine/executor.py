"""The executor: one StepPlan → one llama_batch → one llama_decode, timed.

Row order: the prefill chunks first — the chunk that completes a prompt (and so gives
its first token) at row 0 — then the decodes. llama.cpp's CPU matrix kernels round
differently depending on where a token's row falls among the batch's rows: on Gemma 3
270M, a 20-token prompt evaluated after 2, 3, 6 or 7 decode rows gave first-token logits
1-2 % (relative) away from the same prompt evaluated alone, and bit-identical ones at row
0 whatever followed it (measured, see docs/engine.md). A prompt prefilled in one chunk at
row 0 thus picks exactly the first token a lone run picks. `fill` returns every slot's
rows, and the decode rows of each sequence (the pending token's first, then one per
draft token) for the sampler and the verifier.

With one KV stream per slot (`by_slot`: kv_unified off), llama.cpp cuts a batch into
micro-batches of consecutive, increasing sequence ids (llama_batch_allocr::split_equal
with `sequential`), one graph evaluation each: rows in the order the plan lists them
(slots in any order) cost several evaluations a step. There the rows after the
completing chunks go in slot order, as llama-server adds its slots' tokens: all busy
slots then make one micro-batch (tiny model, 1 thread, a new request whenever one
ends: 363 against 776 µs of CPU a token at 32 streams, 479 against 835 at 8).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from inferenceos.engine.llama.batch import EmbdBatch, TokenBatch
from inferenceos.engine.step_plan import DecodeWork, MediaWork, PrefillWork, StepPlan


@dataclass
class StepRows:
    """Where each sequence's tokens landed in the batch."""

    by_slot: dict[int, list[int]] = field(default_factory=dict)  # every row, position order
    decode: dict[int, list[int]] = field(default_factory=dict)  # pending + draft rows
    prefill_last: dict[int, int] = field(default_factory=dict)  # row of a prompt's last token


class Executor:
    """Evaluates plans on `ctx` (not thread-safe, like the context itself)."""

    def __init__(self, ll: Any, ctx: Any, capacity: int, n_seq_max: int,
                 by_slot: bool = False) -> None:
        self._ll, self._ctx = ll, ctx
        self.by_slot = by_slot  # one KV stream per slot: rows in slot order (module doc)
        self.batch = TokenBatch(capacity, n_seq_max)
        self._n_seq_max = n_seq_max
        self._embd: EmbdBatch | None = None  # made on the first media step
        self._current: TokenBatch | EmbdBatch = self.batch
        self._non_causal = False
        self.step_times: collections.deque[float] = collections.deque(maxlen=32)
        # (seconds, batch rows) of the recent steps: what one more row costs (spec_decode)
        self.step_shapes: collections.deque[tuple[float, int]] = collections.deque(maxlen=32)
        self.s_per_token = 0.0  # moving average of a step's seconds per batched token

    def fill(self, plan: StepPlan) -> StepRows:
        """Fill the batch from `plan` (see module docstring)."""
        b = self.batch
        b.clear()
        self._current, self._non_causal = b, False
        rows = StepRows()
        # completing chunks first: the first of them lands at row 0
        rest: list[PrefillWork | DecodeWork] = [p for p in plan.prefills if not p.last]
        rest += plan.decodes
        if self.by_slot:
            rest.sort(key=lambda w: w.key)
        for w in [*(p for p in plan.prefills if p.last), *rest]:
            if isinstance(w, DecodeWork):
                rs = [b.add(tok, w.pos + i, w.key, True) for i, tok in enumerate(w.tokens)]
                rows.decode[w.key] = rs
            else:
                n = len(w.tokens)
                rs = [b.add(tok, w.start + i, w.key, w.last and i == n - 1)
                      for i, tok in enumerate(w.tokens)]
                if w.last:
                    rows.prefill_last[w.key] = rs[-1]
            rows.by_slot.setdefault(w.key, []).extend(rs)
        return rows

    def fill_media(self, work: MediaWork, embd: Any, n_embd: int, non_causal: bool) -> StepRows:
        """Fill the embedding batch with `work`'s rows (`embd`: their encoder output)."""
        if self._embd is None or self._embd.n_embd != n_embd:
            if self._embd is not None:
                self._embd.close()
            self._embd = EmbdBatch(self.batch.capacity, n_embd, self._n_seq_max)
        rs = self._embd.fill(embd, work.start, work.key, work.last)
        self._current, self._non_causal = self._embd, non_causal
        rows = StepRows(by_slot={work.key: rs})
        if work.last:
            rows.prefill_last[work.key] = rs[-1]
        return rows

    def decode(self) -> int:
        """Evaluate the filled batch; llama_decode's return code (0: success)."""
        t0 = time.perf_counter()
        if self._non_causal:  # the chunk's cells see each other (e.g. Gemma 3's images)
            self._ll.llama_set_causal_attn(self._ctx, False)
        try:
            rc = int(self._ll.llama_decode(self._ctx, self._current.raw))
        finally:
            if self._non_causal:
                self._ll.llama_set_causal_attn(self._ctx, True)
        elapsed = time.perf_counter() - t0
        self.step_times.append(elapsed)
        self.step_shapes.append((elapsed, self._current.n))
        per_token = elapsed / max(1, self._current.n)
        self.s_per_token = (
            per_token if not self.s_per_token else (0.8 * self.s_per_token + 0.2 * per_token)
        )
        return rc

    def close(self) -> None:
        self.batch.close()
        if self._embd is not None:
            self._embd.close()
