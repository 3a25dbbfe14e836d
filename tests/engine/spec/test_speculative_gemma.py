"""Speculative decoding on the real Gemma 3 270M: greedy output is plain greedy's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.messages import Finished, TokenOut
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import Request, Scheduler, generate_one
from inferenceos.engine.scoring import lone_run_logits
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams

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
    with LoadedModel(gemma_path, LlamaParams(n_ctx=1024, n_threads=2)) as lm:
        yield lm


def _drafted(lm: LoadedModel, prompt: list[int], sp: SamplingParams, draft: str
             ) -> tuple[list[int], GenerationMetrics]:
    """Tokens and metrics drafted by `draft`; `self` is forced to draft (cost=0): on
    Gemma it could never pay, so by default it does not draft at all."""
    opts = {"self": {"cost": 0.0}} if draft == "self" else None
    sched = Scheduler(lm, 1, lm.settings.n_batch, draft=draft, draft_options=opts)
    sched.submit(Request(1, prompt, sp))
    tokens, done = [], GenerationMetrics()
    while sched.has_work():
        for ev in sched.step():
            if isinstance(ev, TokenOut) and ev.token >= 0:
                tokens.append(ev.token)
            elif isinstance(ev, Finished):
                done = ev.metrics
    sched.close()
    return tokens, done


@pytest.mark.parametrize("draft", ["ngram", "self"])
def test_greedy_drafted_output_is_plain_greedy(gemma: LoadedModel, draft: str) -> None:
    sp = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    prompt = gemma.tokenize(PROMPT)
    plain = [ev.token for ev in generate_one(gemma, prompt, sp) if ev.token >= 0]
    drafted, m = _drafted(gemma, prompt, sp, draft)
    assert m.draft == draft and m.draft_tokens > 0
    if draft == "ngram":  # the passage is copied: nearly every draft is accepted
        assert m.acceptance_rate > 0.6 and m.tokens_per_step > 3
    if drafted != plain:  # only near ties may flip (see REL_TOL)
        logits = lone_run_logits(gemma, prompt, drafted)
        for row, tok in zip(logits, drafted, strict=True):
            best = float(row.max())
            assert (best - float(row[tok])) / abs(best) <= REL_TOL


def test_self_does_not_draft_where_it_cannot_pay(gemma: LoadedModel) -> None:
    """Gemma's layer-skipped copy reads ~95 % of its bytes per draft token (the output
    head dominates): drafting could never pay, so `self` decodes plainly, at plain speed
    (benchmarks/speculative.py), with plain greedy's text."""
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = gemma.tokenize("Once upon a time, in a small village by the sea, there lived")
    plain = [ev.token for ev in generate_one(gemma, prompt, sp) if ev.token >= 0]
    drafted = [ev.token for ev in generate_one(gemma, prompt, sp, "self") if ev.token >= 0]
    m = gemma.metrics
    assert m.draft == "self" and m.draft_tokens == 0 and m.decode_steps == 23
    assert drafted == plain
