"""Log-probabilities of generated tokens, read from llama.cpp's logits on request.

Only requests that ask for logprobs pay for this: the vocabulary-sized logits row of the
sampled batch row is viewed (not copied) through numpy and reduced to a log-softmax
value for the chosen token and the `top_n` most likely tokens. The figures describe the
model's raw distribution, before temperature, penalties, logit bias or grammar, as
OpenAI's and llama-server's `logprobs` do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's upper bound for top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One token, its bytes (a piece may be part of a UTF-8 character), log-probability
    and raw logit (for relative near-tie checks)."""

    token: int
    piece: bytes
    logprob: float
    logit: float = 0.0


def log_partition(logits: np.ndarray) -> float:
    """log(sum(exp(logits))), computed stably: a token's logprob is its logit minus this."""
    peak = float(logits.max())
    # float64 accumulation: a 262k-term sum in float32 loses the small tail's mass
    return peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))


def read_logprobs(
    logits: np.ndarray, chosen: int, top_n: int, piece: Callable[[int], bytes]
) -> tuple[TokenLogprob, tuple[TokenLogprob, ...]]:
    """The chosen token's log-probability and the `top_n` best tokens (most likely first)
    under one row of `logits` (a view of llama.cpp's, valid until the next decode)."""
    log_z = log_partition(logits)
    best: tuple[TokenLogprob, ...] = ()
    if top_n > 0:
        n = min(top_n, len(logits))
        idx = np.argpartition(-logits, n - 1)[:n]
        idx = idx[np.argsort(-logits[idx], kind="stable")]
        best = tuple(_entry(int(t), float(logits[t]), log_z, piece) for t in idx)
    return _entry(chosen, float(logits[chosen]), log_z, piece), best


def _entry(token: int, logit: float, log_z: float, piece: Callable[[int], bytes]) -> TokenLogprob:
    return TokenLogprob(token, piece(token), logit - log_z, logit)
