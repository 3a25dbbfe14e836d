"""Sequence state save/restore: a conversation survives a move to a fresh context."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import GenerationError
from inferenceos.plan.llama_params import LlamaParams

SETTINGS = LlamaParams(n_ctx=256, n_batch=64, n_threads=1)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def test_state_moves_to_another_context_and_continues_identically(tiny_llama: Path) -> None:
    with LoadedModel(tiny_llama, SETTINGS) as a:
        prompt = a.tokenize("hello abc")
        first = [ev.token for ev in generate_one(a, prompt, GREEDY)]
        # the uninterrupted run: 12 more tokens after the first 12
        reference = [ev.token for ev in generate_one(a, prompt, SamplingParams(
            temperature=0, max_tokens=24, ignore_eos=True))][12:]
        a.reset()
        list(generate_one(a, prompt, GREEDY))  # state: prompt + first 11 tokens evaluated
        state = a.save_sequence()
    assert len(state) > 0
    with LoadedModel(tiny_llama, SETTINGS) as b:  # a different context, as after migration
        # the state holds the prompt and the first 11 tokens; the 12th is evaluated next
        held = prompt + first[:-1]
        moved = [ev.token for ev in generate_one(b, prompt + first, GREEDY,
                                                 state=(held, state))]
        assert b.metrics.cached_tokens == len(held)  # only the last token was evaluated
    assert moved == reference


def test_state_from_another_model_is_refused(tiny_llama: Path, tiny_swa: Path) -> None:
    with LoadedModel(tiny_llama, SETTINGS) as a:
        list(generate_one(a, a.tokenize("abc"), GREEDY))
        state = a.save_sequence()
    with LoadedModel(tiny_swa, SETTINGS) as b, pytest.raises(GenerationError):
        b.restore_sequence(state)
