"""The executor: one StepPlan → one llama_batch → one llama_decode, timed.

Rows are added in the plan's order (decodes, then prefill chunks), so the batch row of
every token is known from the plan alone; `run` returns them per slot, and the decode
rows of each sequence (the pending token's row first, then one per draft token) for the
sampler and the verifier.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from inferenceos.engine.batch import TokenBatch
from inferenceos.engine.step_plan import StepPlan


@dataclass
class StepRows:
    """Where each sequence's tokens landed in the batch."""

    by_slot: dict[int, list[int]] = field(default_factory=dict)  # every row, position order
    decode: dict[int, list[int]] = field(default_factory=dict)  # pending + draft rows
    prefill_last: dict[int, int] = field(default_factory=dict)  # row of a prompt's last token


class Executor:
    """Evaluates plans on `ctx` (not thread-safe, like the context itself)."""

    def __init__(self, ll: Any, ctx: Any, capacity: int, n_seq_max: int) -> None:
        self._ll, self._ctx = ll, ctx
        self.batch = TokenBatch(capacity, n_seq_max)
        self.step_times: collections.deque[float] = collections.deque(maxlen=32)
        self.s_per_token = 0.0  # moving average of a step's seconds per batched token

    def fill(self, plan: StepPlan) -> StepRows:
        """Fill the batch from `plan` (see module docstring)."""
        b = self.batch
        b.clear()
        rows = StepRows()
        for d in plan.decodes:
            rs = [b.add(tok, d.pos + i, d.key, True) for i, tok in enumerate(d.tokens)]
            rows.decode[d.key] = rs
            rows.by_slot.setdefault(d.key, []).extend(rs)
        for p in plan.prefills:
            n = len(p.tokens)
            rs = [b.add(tok, p.start + i, p.key, p.last and i == n - 1)
                  for i, tok in enumerate(p.tokens)]  # fmt: skip
            rows.by_slot.setdefault(p.key, []).extend(rs)
            if p.last:
                rows.prefill_last[p.key] = rs[-1]
        return rows

    def decode(self) -> int:
        """Evaluate the filled batch; llama_decode's return code (0: success)."""
        t0 = time.perf_counter()
        rc = int(self._ll.llama_decode(self._ctx, self.batch.raw))
        elapsed = time.perf_counter() - t0
        self.step_times.append(elapsed)
        per_token = elapsed / max(1, self.batch.n)
        self.s_per_token = (
            per_token if not self.s_per_token else (0.8 * self.s_per_token + 0.2 * per_token)
        )
        return rc

    def close(self) -> None:
        self.batch.close()
