"""The greedy and top-k fast paths pick exactly what llama.cpp's full sampler chain picks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from inferenceos.engine.candidates import top_k_ids
from inferenceos.engine.sampling import SamplingParams, _fast_path
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams

CHAINS = [
    SamplingParams(temperature=0),
    SamplingParams(seed=7),  # the default chain: top-k 40, top-p, min-p, temperature
    SamplingParams(temperature=1.5, top_k=5, top_p=1.0, min_p=0.0, seed=3),
    SamplingParams(temperature=1.0, top_k=100_000, top_p=0.9, seed=11),  # k > vocabulary
]


def _tokens(lm: LoadedModel, sampling: SamplingParams, n: int) -> list[int]:
    params = replace(sampling, max_tokens=n, ignore_eos=True)
    return [ev.token for ev in generate_one(lm, lm.tokenize("The story begins"), params)
            if ev.token >= 0]


def _slow(sampling: SamplingParams) -> SamplingParams:
    """The same chain forced through llama_sampler_sample (a zero logit bias changes no
    logit but disables the fast paths)."""
    return replace(sampling, logit_bias=((0, 0.0),))


def test_fast_paths_are_taken_only_for_plain_chains() -> None:
    assert [_fast_path(p) for p in CHAINS] == ["greedy", "top_k", "top_k", "top_k"]
    others = [SamplingParams(top_k=0), SamplingParams(repeat_penalty=1.1),
              SamplingParams(grammar='root ::= "a"'), *map(_slow, CHAINS)]
    assert [_fast_path(p) for p in others] == [None] * len(others)


@pytest.mark.parametrize("sampling", CHAINS, ids=["greedy", "default", "top5", "bigk"])
def test_tiny_model_fast_equals_full_chain(tiny_llama: Path, sampling: SamplingParams) -> None:
    with LoadedModel(tiny_llama, LlamaParams(n_ctx=256, n_threads=1)) as lm:
        assert _tokens(lm, sampling, 60) == _tokens(lm, _slow(sampling), 60)


@pytest.mark.slow
def test_gemma_fast_equals_full_chain(gemma_path: Path) -> None:
    with LoadedModel(gemma_path, LlamaParams(n_ctx=512)) as lm:
        for sampling in CHAINS[:3]:
            assert _tokens(lm, sampling, 48) == _tokens(lm, _slow(sampling), 48)


def test_top_p_zero_keeps_only_the_most_likely_token(tiny_llama: Path) -> None:
    """Ollama and OpenAI clients send top_p 0; llama.cpp's top-p keeps one token then
    (min_keep 1), so any temperature and seed decode greedily, on both paths."""
    hot = SamplingParams(temperature=1.5, top_k=40, top_p=0.0, min_p=0.0, seed=5)
    hot.validate()  # refused before: "top-p must be in (0, 1]"
    with LoadedModel(tiny_llama, LlamaParams(n_ctx=256, n_threads=1)) as lm:
        greedy = _tokens(lm, SamplingParams(temperature=0), 40)
        assert _tokens(lm, hot, 40) == greedy
        assert _tokens(lm, _slow(hot), 40) == greedy


def test_top_k_ids_is_a_superset_of_the_k_best() -> None:
    rng = np.random.default_rng(0)
    for scale in (0.01, 1.0, 30.0):  # flat, normal and very peaked rows
        logits = (rng.standard_normal(5000) * scale).astype(np.float32)
        for k in (1, 40, 4999, 6000):
            ids = top_k_ids(logits, k)
            kth = np.sort(logits)[::-1][min(k, 5000) - 1]
            assert set(np.flatnonzero(logits >= kth)) <= set(ids.tolist())


def test_a_steps_greedy_rows_picked_together_equal_their_own_argmax(tiny_llama: Path) -> None:
    """candidates.greedy_rows (one argmax over the step's logits buffer) picks for every
    greedy row what that row's own argmax picks, for all rows of a decode step and for
    a subset of them; a prefill row without logits before them shifts nothing."""
    from inferenceos.engine.candidates import greedy_rows, logits_row
    from inferenceos.engine.llama.batch import TokenBatch

    with LoadedModel(tiny_llama, LlamaParams(n_ctx=256, n_seq_max=4, kv_unified=True)) as lm:
        ll = lm._ll
        batch = TokenBatch(16, 4)
        try:
            rows = [batch.add(1, 0, 0, False)]  # no logits: not in the buffer
            rows += [batch.add(t, i + 1, 0, True) for i, t in enumerate((5, 9))]
            rows += [batch.add(t, 0, s, True) for s, t in ((1, 7), (2, 11), (3, 3))]
            assert ll.llama_decode(lm.ctx, batch.raw) == 0
            with_logits = rows[1:]
            own = {r: int(logits_row(ll, lm.ctx, r, lm.n_vocab).argmax()) for r in with_logits}
            assert greedy_rows(ll, lm.ctx, with_logits, with_logits, lm.n_vocab) == own
            some = with_logits[1:3]
            assert greedy_rows(ll, lm.ctx, some, with_logits, lm.n_vocab) == {
                r: own[r] for r in some}
        finally:
            batch.close()
