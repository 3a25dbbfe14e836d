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
from typing import Any

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


def read_logprobs(
    ll: Any,
    ctx: Any,
    row: int,
    n_vocab: int,
    chosen: int,
    top_n: int,
    piece: Callable[[int], bytes],
) -> tuple[TokenLogprob, tuple[TokenLogprob, ...]]:
    """The chosen token's log-probability and the `top_n` best tokens (most likely first)
    under the logits of batch row `row` (-1: the last row with logits) of `ctx`.

    Must be called after the llama_decode that produced the row and before the next one.
    """
    ptr = ll.llama_get_logits_ith(ctx, row)
    logits = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
    peak = float(logits.max())
    # float64 accumulation: a 262k-term sum in float32 loses the small tail's mass
    log_z = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
    best: tuple[TokenLogprob, ...] = ()
    if top_n > 0:
        n = min(top_n, n_vocab)
        idx = np.argpartition(-logits, n - 1)[:n]
        idx = idx[np.argsort(-logits[idx], kind="stable")]
        best = tuple(_entry(int(t), float(logits[t]), log_z, piece) for t in idx)
    return _entry(chosen, float(logits[chosen]), log_z, piece), best


def _entry(token: int, logit: float, log_z: float, piece: Callable[[int], bytes]) -> TokenLogprob:
    return TokenLogprob(token, piece(token), logit - log_z, logit)
