"""A reusable llama_batch: tokens of several sequences evaluated in one llama_decode."""

from __future__ import annotations

import ctypes
from typing import Any

from inferenceos.engine.llama.lib import lib


class TokenBatch:
    """Owns a llama_batch of up to `capacity` tokens, each in one sequence.

    Fill with `add`, evaluate with the context, then `clear` for the next step. Rows
    are numbered in insertion order; a row added with `logits=True` can be sampled with
    `llama_sampler_sample(..., row)`.
    """

    def __init__(self, capacity: int, n_seq_max: int) -> None:
        self._ll = lib()
        self.capacity = capacity
        self.raw: Any = self._ll.llama_batch_init(capacity, 0, n_seq_max)
        # the batch's arrays, read once: each field read off the struct builds a new
        # pointer object (~0.3 µs), five a token (they never move: llama_batch_init)
        b = self.raw
        self._token, self._pos, self._n_seq_id = b.token, b.pos, b.n_seq_id
        self._seq_id, self._logits = b.seq_id, b.logits
        self.n = 0

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        """Append one token; returns its row index."""
        i = self.n
        if i >= self.capacity:
            raise OverflowError(f"batch full ({self.capacity} tokens)")
        self._token[i] = token
        self._pos[i] = pos
        self._n_seq_id[i] = 1
        self._seq_id[i][0] = seq_id
        self._logits[i] = 1 if logits else 0
        self.n = i + 1
        self.raw.n_tokens = i + 1
        return i

    @property
    def free(self) -> int:
        return self.capacity - self.n

    def clear(self) -> None:
        self.n = 0
        self.raw.n_tokens = 0

    def close(self) -> None:
        if self.raw is not None:
            self._ll.llama_batch_free(self.raw)
            self.raw = None


class EmbdBatch:
    """A llama_batch of embeddings (rows of `n_embd` floats) instead of token ids: how
    a media chunk's encoder output enters the context. Same row contract as
    TokenBatch; filled all at once by `fill`."""

    def __init__(self, capacity: int, n_embd: int, n_seq_max: int) -> None:
        self._ll = lib()
        self.capacity, self.n_embd = capacity, n_embd
        self.raw: Any = self._ll.llama_batch_init(capacity, n_embd, n_seq_max)
        self.n = 0

    def fill(self, embd: Any, pos0: int, seq_id: int, logits_last: bool) -> list[int]:
        """Rows 0..len(embd)-1 ← `embd` (float32, shape (n, n_embd)) at positions
        pos0.., all in `seq_id`; logits for the last row only when asked."""
        import numpy as np

        n = int(embd.shape[0])
        if n > self.capacity or embd.shape[1] != self.n_embd:
            raise OverflowError(f"{n} embedding rows of {embd.shape[1]} do not fit "
                                f"{self.capacity} of {self.n_embd}")
        b = self.raw
        src = np.ascontiguousarray(embd, dtype=np.float32)
        ctypes.memmove(b.embd, src.ctypes.data, src.nbytes)
        for i in range(n):
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = 1 if (logits_last and i == n - 1) else 0
        self.n = b.n_tokens = n
        return list(range(n))

    def close(self) -> None:
        if self.raw is not None:
            self._ll.llama_batch_free(self.raw)
            self.raw = None
