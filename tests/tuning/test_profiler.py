"""`profile_run` decodes through `generate_one`, `run`'s one decode path: the same
tokens, stop handling and context cap, and spans that count the steps that path takes.
The phase breakdown as the CLI shows it is tests/cli/test_profile_cli.py."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import StepTrace, generate_one
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import UsageError
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.tuning.profiler import Profile, Span, profile_run

PROMPT = "the quick brown fox jumps over the lazy dog. " * 2  # ~90 byte tokens
SETTINGS = LlamaParams(n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1)


def _run(path: Path, settings: LlamaParams, sampling: SamplingParams,
         trace: StepTrace | None = None) -> tuple[list[tuple[int, str]], str, int, int]:
    """(token, text) events, stop reason, prompt and completion tokens of `run`'s path."""
    with LoadedModel(path, settings) as lm:
        events = [(ev.token, ev.text) for ev in generate_one(
            lm, lm.tokenize(PROMPT), sampling, adaptive_threads=False,
            trace=trace)]
        m = lm.metrics
    return events, m.stop_reason, m.prompt_tokens, m.completion_tokens


def _phase(p: Profile, phase: str) -> list[Span]:
    return [s for s in p.spans if s.phase == phase]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_profile_generates_what_run_generates(tiny_llama: Path, temperature: float) -> None:
    sampling = SamplingParams(temperature=temperature, seed=3, max_tokens=12)
    prof = profile_run(tiny_llama, SETTINGS, PROMPT, sampling)
    events, _, prompt_tokens, completion_tokens = _run(tiny_llama, SETTINGS, sampling)
    assert prof.text == "".join(text for _, text in events)
    assert (prof.prompt_tokens, prof.completion_tokens) == (prompt_tokens, completion_tokens)


def test_spans_count_the_steps_of_the_decode_path(tiny_llama: Path) -> None:
    prof = profile_run(tiny_llama, SETTINGS, PROMPT, SamplingParams(temperature=0, max_tokens=12))
    n = prof.completion_tokens
    assert 1 <= n <= 12
    # n_batch chunks, then the prompt's last token in a step of its own (step_plan.py)
    prefill = _phase(prof, "prefill")
    assert len(prefill) == math.ceil((prof.prompt_tokens - 1) / 32) + 1
    assert [s.tokens for s in prefill[:-2]] == [32] * (len(prefill) - 2)
    assert prefill[-1].tokens == 1
    assert sum(s.tokens for s in prefill) == prof.prompt_tokens
    assert prefill[0].name == f"chunk 1: {prefill[0].tokens} tokens"
    # one sample per token, one more when the last sample was end-of-generation; a piece
    # per emitted token; a decode between two samples
    sampling, detok, decode = (_phase(prof, p) for p in ("sampling", "detokenize", "decode"))
    assert len(detok) == n and len(sampling) in (n, n + 1)
    assert len(decode) == len(sampling) - 1
    assert all(s.tokens == 1 for s in decode)
    assert (sampling[0].name, detok[0].name) == ("token 1", "token 1")
    assert not decode or decode[0].name == "step 1"
    # the steps run one after another: no span starts before the previous one ended
    for a, b in itertools.pairwise(prof.spans):
        assert a.start_s + a.duration_s <= b.start_s + 1e-6, (a, b)
    assert prof.rates()["prefill_tps"] > 0


def test_max_tokens_is_capped_by_the_context_left(tiny_llama: Path) -> None:
    settings = LlamaParams(n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    sampling = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
    prof = profile_run(tiny_llama, settings, PROMPT, sampling)
    events, stop, prompt_tokens, completion_tokens = _run(tiny_llama, settings, sampling)
    assert stop == "length" and completion_tokens < 500
    assert (prof.prompt_tokens, prof.completion_tokens) == (prompt_tokens, completion_tokens)
    assert prof.text == "".join(text for _, text in events)
    assert len(_phase(prof, "decode")) == prof.completion_tokens - 1


def test_a_prompt_longer_than_the_context_is_a_usage_error(tiny_llama: Path) -> None:
    with pytest.raises(UsageError, match="the context holds"):
        profile_run(tiny_llama, SETTINGS, PROMPT * 4, SamplingParams(max_tokens=4))


def test_a_trace_changes_nothing_generate_one_yields(tiny_llama: Path) -> None:
    sampling = SamplingParams(temperature=0.9, seed=5, max_tokens=10)
    seen: list[tuple[str, float, float, int]] = []
    traced = _run(tiny_llama, SETTINGS, sampling,
                  lambda phase, start, end, tokens: seen.append((phase, start, end, tokens)))
    assert traced == _run(tiny_llama, SETTINGS, sampling)
    assert {p for p, *_ in seen} <= {"prefill", "decode", "sampling"}
    assert all(start <= end for _, start, end, _ in seen)
    assert sum(t for p, _, _, t in seen if p == "prefill") == traced[2]
