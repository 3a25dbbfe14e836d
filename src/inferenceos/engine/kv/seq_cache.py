"""One sequence's KV cache as a KV policy sees it (kv_policies.SequenceView)."""

from __future__ import annotations

from typing import Any

import numpy as np

from inferenceos.engine.kv.attention_probe import CellTracker


class SeqCacheView:
    """Positions 0..n_past-1 of sequence `seq_id` in llama.cpp memory `mem`.

    `cached` is the caller's list of the tokens those positions hold; it is edited in
    place, as is the `tracker` (when attention is watched), so that both stay in step
    with llama.cpp after a removal.
    """

    def __init__(
        self, ll: Any, mem: Any, seq_id: int, cached: list[int], tracker: CellTracker | None
    ) -> None:
        self._ll, self._mem, self._seq = ll, mem, seq_id
        self._cached, self._tracker = cached, tracker

    @property
    def n_past(self) -> int:
        return len(self._cached)

    def remove(self, p0: int, p1: int) -> None:
        """Drop positions [p0, p1) and shift the later ones down to close the gap."""
        n_past = len(self._cached)
        if not 0 <= p0 < p1 <= n_past:
            raise ValueError(f"cannot remove [{p0}, {p1}) of {n_past} cells")
        self._ll.llama_memory_seq_rm(self._mem, self._seq, p0, p1)
        self._ll.llama_memory_seq_add(self._mem, self._seq, p1, n_past, p0 - p1)
        del self._cached[p0:p1]
        if self._tracker is not None:
            self._tracker.remove(self._seq, p0, p1)

    def attention_scores(self) -> np.ndarray | None:
        return None if self._tracker is None else self._tracker.scores(self._seq)
