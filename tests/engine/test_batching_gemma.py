"""Continuous batching on the real Gemma: concurrent greedy outputs vs lone runs."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from inferenceos.engine.engine import Engine
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scoring import batch_shape_noise, greedy_agreement
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams

PROMPTS = [
    "The three primary colors are",
    "Water boils at a temperature of",
    "The largest planet in the solar system is",
    "A haiku about autumn leaves:",
    "def fibonacci(n):",
    "The capital of Japan is",
    "Once upon a time, in a small village,",
    "The chemical symbol for gold is",
]
# 16 tokens: 16 batched steps of eight rows each, every one checked against lone runs
# (the lone runs and the one-token-at-a-time noise decodes are most of the test's time)
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.mark.slow
def test_eight_concurrent_outputs_are_lone_argmax(gemma_path: Path) -> None:
    """Each token of 8 concurrent greedy outputs is what a lone run in the same engine
    picks, or a near tie within the noise llama.cpp's kernels give a lone sequence when
    only its batch shape changes (measured here; the issue's 1e-3 is far below it on
    this CPU build, so the strict 1e-3 check runs on the f32 tiny model instead, in
    test_engine_facade)."""
    settings = LlamaParams(n_ctx=512, n_batch=256, n_ubatch=256)
    with Engine(gemma_path, settings, n_parallel=8) as engine:
        prompts = [engine.tokenize(p) for p in PROMPTS]
        results: dict[int, list[int]] = {}

        def run(i: int) -> None:
            results[i] = [ev.token for ev in engine.generate(prompts[i], GREEDY) if ev.token >= 0]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        # the lone runs in the same engine, now idle (rel_tol only counts near ties, so
        # the checks are read against the noise measured after them)
        checks = [greedy_agreement(engine, prompts[i], results[i], rel_tol=0.0)
                  for i in range(8)]
    with LoadedModel(gemma_path, settings) as lm:
        noise = max(batch_shape_noise(lm, prompts[i] + results[i]) for i in range(8))
    identical = sum(c.argmax == c.tokens for c in checks)
    ok = [c.worst_rel_gap <= noise for c in checks]  # every non-argmax token a near tie
    print(f"\n{identical}/8 concurrent outputs identical to the lone runs; "
          f"not argmax {sum(c.tokens - c.argmax for c in checks)}, "
          f"worst relative gap {max(c.worst_rel_gap for c in checks):.2e}; "
          f"lone-sequence batch-shape noise {noise:.2e}")
    assert all(len(results[i]) == GREEDY.max_tokens for i in range(8))
    assert all(ok), (noise, checks)
