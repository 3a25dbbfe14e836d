"""Re-scoring token sequences with logits read back from llama.cpp.

This is the slow path that copies vocabulary-sized logits into Python, for checks and
benchmarks only: was a batched greedy output what a lone run would have picked, and how
well does a model (under a KV policy) predict a fixed text.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from inferenceos.engine.attention_probe import AttentionProbe, CellTracker
from inferenceos.engine.batch import TokenBatch
from inferenceos.engine.kv_policies import KVPolicy
from inferenceos.engine.seq_cache import SeqCacheView
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import GenerationError


@dataclass(frozen=True)
class GreedyAgreement:
    """How a generated continuation compares with single-sequence argmax decoding."""

    tokens: int
    argmax: int  # tokens that are exactly the lone run's argmax
    near_ties: int  # not the argmax, but within `rel_tol` relative logit of it
    worst_rel_gap: float  # largest (max - chosen) / |max| seen

    @property
    def ok(self) -> bool:
        return self.argmax + self.near_ties == self.tokens


def _logits_rows(lm: LoadedModel, tokens: list[int], first_row: int) -> np.ndarray:
    """Evaluate `tokens` as one fresh sequence; logits of rows first_row..end-1."""
    ll = lm._ll
    if len(tokens) > lm.n_ctx:
        raise GenerationError(f"{len(tokens)} tokens do not fit a context of {lm.n_ctx}")
    lm.reset()
    n_vocab = int(ll.llama_vocab_n_tokens(lm.vocab))
    rows = []
    step = lm.settings.n_batch
    for start in range(0, len(tokens), step):
        chunk = tokens[start : start + step]
        batch = ll.llama_batch_init(len(chunk), 0, 1)
        try:
            for j, tok in enumerate(chunk):
                pos = start + j
                batch.token[j], batch.pos[j], batch.n_seq_id[j] = tok, pos, 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = 1 if pos >= first_row else 0
            batch.n_tokens = len(chunk)
            if ll.llama_decode(lm.ctx, batch) != 0:
                raise GenerationError("llama_decode failed while re-scoring")
            for j in range(len(chunk)):
                if start + j >= first_row:
                    ptr = ll.llama_get_logits_ith(lm.ctx, j)
                    rows.append(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy())
        finally:
            ll.llama_batch_free(batch)
    return np.stack(rows)


def _lone_run_logits(lm: LoadedModel, prompt: list[int], output: list[int]) -> np.ndarray:
    """Logits a lone generation would see: the prompt prefilled, then one token a step."""
    ll = lm._ll
    if len(prompt) + len(output) > lm.n_ctx:
        raise GenerationError(f"{len(prompt) + len(output)} tokens do not fit {lm.n_ctx}")
    lm.reset()
    lm.prefill(prompt)
    n_vocab = int(ll.llama_vocab_n_tokens(lm.vocab))
    rows = []
    for tok in [None, *output[:-1]]:
        if tok is not None:
            lm.decode_one(tok)
        ptr = ll.llama_get_logits_ith(lm.ctx, -1)
        rows.append(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy())
    return np.stack(rows)


def greedy_agreement(
    lm: LoadedModel, prompt: list[int], output: list[int], rel_tol: float = 1e-3
) -> GreedyAgreement:
    """Check each output token against a lone run's argmax at its position.

    The lone run is replayed as generation does it (prompt prefilled, then one token per
    decode), so its numerics are those of a real single-stream run.
    """
    if not output:
        return GreedyAgreement(0, 0, 0, 0.0)
    logits = _lone_run_logits(lm, prompt, output)
    argmax = near = 0
    worst = 0.0
    for row, tok in zip(logits, output, strict=True):
        best = int(row.argmax())
        if best == tok:
            argmax += 1
            continue
        gap = float(row[best] - row[tok]) / max(abs(float(row[best])), 1e-9)
        worst = max(worst, gap)
        near += gap <= rel_tol
    return GreedyAgreement(len(output), argmax, near, worst)


def perplexity(lm: LoadedModel, tokens: list[int]) -> float:
    """exp(mean negative log-likelihood) of tokens[1:] given their prefixes (full cache)."""
    logits = _logits_rows(lm, tokens[:-1], 0)
    nll = 0.0
    for row, tok in zip(logits, tokens[1:], strict=True):
        top = float(row.max())
        log_z = top + math.log(float(np.exp(row - top).sum()))
        nll += log_z - float(row[tok])
    return math.exp(nll / (len(tokens) - 1))


def budgeted_perplexity(
    lm: LoadedModel,
    tokens: list[int],
    policy: KVPolicy,
    budget: int,
    probe: AttentionProbe | None = None,
) -> float:
    """Perplexity of tokens[1:] read one token at a time with at most `budget` KV cells.

    Whenever the cache is full, `policy` makes room (as in generation). `probe` must be
    the AttentionProbe `lm` was created with when the policy needs attention.
    """
    ll = lm._ll
    lm.reset()
    mem = ll.llama_get_memory(lm.ctx)
    tracker = CellTracker(lm.n_ctx) if probe is not None else None
    cached: list[int] = []
    view = SeqCacheView(ll, mem, 0, cached, tracker)
    n_vocab = int(ll.llama_vocab_n_tokens(lm.vocab))
    batch = TokenBatch(1, 1)
    nll = 0.0
    try:
        for tok, nxt in itertools.pairwise(tokens):
            if len(cached) >= budget and not policy.make_room(view):
                raise GenerationError(f"the {policy.name} policy could not make room")
            batch.clear()
            batch.add(tok, len(cached), 0, True)
            if probe is not None:
                probe.reset()
            if ll.llama_decode(lm.ctx, batch.raw) != 0:
                raise GenerationError("llama_decode failed while scoring")
            cached.append(tok)
            if tracker is not None and probe is not None:
                tracker.observe(probe, {0: [0]})
            row = np.ctypeslib.as_array(ll.llama_get_logits_ith(lm.ctx, 0), shape=(n_vocab,))
            top = float(row.max())
            nll += top + math.log(float(np.exp(row - top).sum())) - float(row[nxt])
    finally:
        batch.close()
    return math.exp(nll / (len(tokens) - 1))
