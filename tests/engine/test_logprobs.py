"""Logprobs: read from llama.cpp's logits only when asked, right for every batched row."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

from inferenceos.engine.engine import Engine
from inferenceos.engine.generation import TokenEvent
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.scoring import lone_run_logits
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import UsageError
from inferenceos.plan.llama_params import LlamaParams

SETTINGS = LlamaParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)


def _log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


def _check_shape(events: list[TokenEvent], top_n: int) -> None:
    for ev in events:
        assert ev.logprob is not None and ev.logprob.token == ev.token
        assert ev.logprob.logprob <= 0
        tops = [t.logprob for t in ev.top_logprobs]
        assert len(tops) == top_n and tops == sorted(tops, reverse=True)
        assert sum(math.exp(t) for t in tops) <= 1 + 1e-6


def test_logprobs_match_an_independent_log_softmax(tiny_llama: Path) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=4)
    with LoadedModel(tiny_llama, SETTINGS) as lm:
        prompt = lm.tokenize("abc")
        events = [ev for ev in generate_one(lm, prompt, greedy) if ev.token >= 0]
        _check_shape(events, 4)
        output = [ev.token for ev in events]
        rows = lone_run_logits(lm, prompt, output)
    for ev, row in zip(events, rows, strict=True):
        expected = _log_softmax(row)
        assert ev.logprob is not None
        assert ev.logprob.logprob == pytest.approx(expected[ev.token], abs=1e-4)
        assert ev.top_logprobs[0].token == ev.token  # greedy picks the most likely
        best4 = np.sort(expected)[::-1][:4]
        assert [t.logprob for t in ev.top_logprobs] == pytest.approx(best4, abs=1e-4)
        assert ev.top_logprobs[0].piece == lm.piece(ev.token)


def test_no_logprobs_unless_asked(tiny_llama: Path) -> None:
    with LoadedModel(tiny_llama, SETTINGS) as lm:
        three = SamplingParams(temperature=0, max_tokens=3)
        events = list(generate_one(lm, lm.tokenize("abc"), three))
    assert events and all(ev.logprob is None and ev.top_logprobs == () for ev in events)


def test_out_of_range_top_logprobs_is_refused() -> None:
    with pytest.raises(UsageError, match="top logprobs"):
        SamplingParams(logprobs=21).validate()


def test_concurrent_requests_get_their_own_rows_logprobs(tiny_llama: Path) -> None:
    """Batched rows are mapped to the right request: each of several concurrent greedy
    generations reports the logprobs of its lone run."""
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    prompts = ["abc", "hello there", "zz top", "a b c d e f"]
    with Engine(tiny_llama, SETTINGS, n_parallel=4) as engine:
        alone = {p: [ev for ev in engine.generate(p, greedy) if ev.token >= 0] for p in prompts}
        together: dict[str, list[TokenEvent]] = {}

        def run(p: str) -> None:
            together[p] = [ev for ev in engine.generate(p, greedy) if ev.token >= 0]

        threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    for p in prompts:
        _check_shape(together[p], 2)
        assert [ev.token for ev in together[p]] == [ev.token for ev in alone[p]]
        got = [ev.logprob.logprob for ev in together[p] if ev.logprob]
        want = [ev.logprob.logprob for ev in alone[p] if ev.logprob]
        # batch shapes (rows batched with others, parked prefixes) move a tiny f32 model's
        # logprobs by ~1e-3; a row mix-up moves them by whole units
        assert got == pytest.approx(want, abs=5e-3)
