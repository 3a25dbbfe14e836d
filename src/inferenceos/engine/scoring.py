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

from inferenceos.engine.engine import Engine
from inferenceos.engine.generation import TokenEvent
from inferenceos.engine.kv.attention_probe import AttentionProbe, CellTracker
from inferenceos.engine.kv.policies import KVPolicy
from inferenceos.engine.kv.seq_cache import SeqCacheView
from inferenceos.engine.llama.batch import TokenBatch
from inferenceos.engine.logprobs import MAX_TOP_LOGPROBS, log_partition
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.session import LoadedModel, decode_failed
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
    if len(tokens) > lm.n_ctx:
        raise GenerationError(f"{len(tokens)} tokens do not fit a context of {lm.n_ctx}")
    lm.reset()
    rows = []
    step = lm.settings.n_batch
    batch = TokenBatch(step, 1)
    try:
        for start in range(0, len(tokens), step):
            batch.clear()
            for pos in range(start, min(start + step, len(tokens))):
                batch.add(tokens[pos], pos, 0, pos >= first_row)
            rc = lm._ll.llama_decode(lm.ctx, batch.raw)
            if rc != 0:
                decode_failed(rc)
                raise GenerationError("llama_decode failed while re-scoring")
            rows += [lm.logits_row(j - start).copy()
                     for j in range(max(start, first_row), start + batch.n)]
    finally:
        batch.close()
    return np.stack(rows)


def lone_run_logits(lm: LoadedModel, prompt: list[int], output: list[int]) -> np.ndarray:
    """Logits a lone generation would see: the prompt prefilled, then one token a step."""
    if len(prompt) + len(output) > lm.n_ctx:
        raise GenerationError(f"{len(prompt) + len(output)} tokens do not fit {lm.n_ctx}")
    lm.reset()
    lm.prefill(prompt)
    rows = []
    for tok in [None, *output[:-1]]:
        if tok is not None:
            lm.decode_one(tok)
        rows.append(lm.logits_row().copy())
    return np.stack(rows)


def greedy_agreement(
    engine: Engine, prompt: list[int], output: list[int], rel_tol: float = 1e-3
) -> GreedyAgreement:
    """Check a batched greedy `output` of `prompt` against lone runs in the same engine.

    A lone run (one request at a time, greedy, EOS ignored) of the prompt must pick the
    same tokens. Where it does not, the output's token must be within `rel_tol` relative
    logit of the lone run's argmax (a near tie the batched kernels may flip); checking
    then goes on from a lone run of the prompt extended by the output so far, because the
    lone argmax is only defined for the same prefix. Call it while the engine is idle.
    """
    argmax = near = 0
    worst = 0.0
    start = 0
    while start < len(output):
        ref = _lone_run(engine, prompt + output[:start], len(output) - start)
        if not ref:
            raise GenerationError("the lone run produced no tokens to compare with")
        for j, ev in enumerate(ref):
            tok = output[start + j]
            if ev.token == tok:
                argmax += 1
                continue
            gap = _relative_gap(ev, tok)
            worst = max(worst, gap)
            near += gap <= rel_tol
            start += j + 1
            break
        else:
            start += len(ref)
    return GreedyAgreement(len(output), argmax, near, worst)


def _lone_run(engine: Engine, prompt: list[int], n: int) -> list[TokenEvent]:
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                            logprobs=MAX_TOP_LOGPROBS)
    return [ev for ev in engine.generate(prompt, params) if ev.token >= 0]


def _relative_gap(ev: TokenEvent, token: int) -> float:
    """(argmax logit - logit of `token`) / |argmax logit| at a lone run's step; infinite
    when `token` is not among the step's top logprobs."""
    best = ev.top_logprobs[0]
    for alt in ev.top_logprobs:
        if alt.token == token:
            return (best.logit - alt.logit) / max(abs(best.logit), 1e-9)
    return math.inf


def batch_shape_noise(lm: LoadedModel, tokens: list[int], top: int = 5) -> float:
    """How far a lone sequence's logits move when only the batch shape changes.

    `tokens` are evaluated once in n_batch-sized decodes and once one token per decode;
    returns the largest |difference| of any of a position's `top` logits, relative to
    that position's largest logit. llama.cpp's CPU kernels differ by batch size
    (tinyBLAS for two or more rows, vector dot products for one), so greedy choices
    closer than about twice this are decided by rounding, not by the model.
    """
    together = _logits_rows(lm, tokens, 0)
    one_by_one = lone_run_logits(lm, tokens[:1], [*tokens[1:], 0])
    worst = 0.0
    for a, b in zip(together, one_by_one, strict=True):
        best = np.argpartition(a, -top)[-top:]
        worst = max(worst, float(np.abs(a[best] - b[best]).max()) / max(abs(float(a.max())), 1e-9))
    return worst


def perplexity(lm: LoadedModel, tokens: list[int]) -> float:
    """exp(mean negative log-likelihood) of tokens[1:] given their prefixes (full cache)."""
    logits = _logits_rows(lm, tokens[:-1], 0)
    nll = 0.0
    for row, tok in zip(logits, tokens[1:], strict=True):
        nll += log_partition(row) - float(row[tok])
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
            rc = ll.llama_decode(lm.ctx, batch.raw)
            if rc != 0:
                decode_failed(rc)
                raise GenerationError("llama_decode failed while scoring")
            cached.append(tok)
            if tracker is not None and probe is not None:
                tracker.observe(probe, {0: [0]})
            row = lm.logits_row(0)
            nll += log_partition(row) - float(row[nxt])
    finally:
        batch.close()
    return math.exp(nll / (len(tokens) - 1))
