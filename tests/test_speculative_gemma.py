"""Speculative decoding on the real Gemma 3 270M: greedy output is plain greedy's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.scoring import lone_run_logits
from inferenceos.engine.session import LoadedModel, LoadSettings

pytestmark = pytest.mark.slow

PASSAGE = (
    "The committee met on Tuesday to review the budget for the new library. After a long "
    "discussion, the members agreed to fund the reading room, the children's corner and a "
    "small garden behind the building."
)
PROMPT = f"Passage: {PASSAGE}\n\nThe secretary read the passage aloud: \"The committee met"
# Gemma's logits move by up to 8e-2 relative with the batch shape alone (docs/engine.md);
# a verified token must be the lone argmax or a near tie within this
REL_TOL = 2e-2


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[LoadedModel]:
    with LoadedModel(gemma_path, LoadSettings(n_ctx=1024, n_threads=2)) as lm:
        yield lm


@pytest.mark.parametrize("draft", ["ngram", "self"])
def test_greedy_drafted_output_is_plain_greedy(gemma: LoadedModel, draft: str) -> None:
    sp = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    prompt = gemma.tokenize(PROMPT)
    plain = [ev.token for ev in generate_one(gemma, prompt, sp) if ev.token >= 0]
    drafted = [ev.token for ev in generate_one(gemma, prompt, sp, draft) if ev.token >= 0]
    m = gemma.metrics
    assert m.draft == draft and m.draft_tokens > 0
    if draft == "ngram":  # the passage is copied: nearly every draft is accepted
        assert m.acceptance_rate > 0.6 and m.tokens_per_step > 3
    if drafted != plain:  # only near ties may flip (see REL_TOL)
        logits = lone_run_logits(gemma, prompt, drafted)
        for row, tok in zip(logits, drafted, strict=True):
            best = float(row.max())
            assert (best - float(row[tok])) / abs(best) <= REL_TOL
