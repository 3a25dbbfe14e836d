"""LoRA adapters (engine/lora.py): loaded once, applied per scheduler step, one adapter
set per llama_decode, prefix reuse only within a set (tiny llama, real llama.cpp)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferenceos.engine.lora import adapters_of, lora_set, parse_lora_arg, step_set
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import Request, Scheduler
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import UsageError
from inferenceos.plan.llama_params import LlamaParams
from lora_craft import write_lora
from scheduler_helpers import drain

N_SLOTS = 4


@pytest.fixture(scope="module")
def lm(tiny_llama: Path) -> Iterator[LoadedModel]:
    settings = LlamaParams(n_ctx=256 * N_SLOTS, n_batch=64, n_ubatch=64,
                           n_seq_max=N_SLOTS, n_threads=1)
    with LoadedModel(tiny_llama, settings) as model:
        yield model


@pytest.fixture(scope="module")
def adapters(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("lora")
    a = write_lora(d / "a.gguf", tiny_llama, seed=1, magnitude=0.3)
    b = write_lora(d / "b.gguf", tiny_llama, seed=2, magnitude=0.3)
    return str(a), str(b)


def greedy(lora: tuple[tuple[str, float], ...] = (), n: int = 16) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, lora=lora)


def last_logits(lm: LoadedModel, tokens: list[int], lora: tuple[tuple[str, float], ...]
                ) -> np.ndarray:
    """The logits after `tokens`, evaluated under `lora` as given (not normalised)."""
    adapters_of(lm).apply(lm.ctx, lora)
    lm.reset()
    lm.prefill(tokens)
    return np.array(lm.logits_row(-1))


def test_scale_one_changes_the_logits_and_scale_zero_is_the_base(
        lm: LoadedModel, adapters: tuple[str, str]) -> None:
    prompt = lm.tokenize("hello there abc")
    base = last_logits(lm, prompt, ())
    one = last_logits(lm, prompt, ((adapters[0], 1.0),))
    zero = last_logits(lm, prompt, ((adapters[0], 0.0),))  # applied at 0, not dropped
    half = last_logits(lm, prompt, ((adapters[0], 0.5),))
    adapters_of(lm).apply(lm.ctx, ())
    assert np.abs(one - base).max() > 1e-2
    assert np.array_equal(zero, base)
    assert 0 < np.abs(half - base).max() < np.abs(one - base).max()
    assert lora_set([(adapters[0], 0.0)]) == ()  # the normal form of scale 0: the base


def test_requests_with_different_adapters_in_one_batch_each_get_their_own(
        lm: LoadedModel, adapters: tuple[str, str]) -> None:
    sched = Scheduler(lm, N_SLOTS, 64)
    prompt = lm.tokenize("a b c d")
    sets = [(), ((adapters[0], 1.0),), ((adapters[1], 1.0),),
            lora_set([(adapters[0], 0.5), (adapters[1], 0.5)])]
    alone = []
    for i, s in enumerate(sets):
        fresh = Scheduler(lm, 1, 64)
        fresh.submit(Request(i, prompt, greedy(s)))
        alone.append(drain(fresh)[0][i])
        fresh.close()
    assert len({tuple(t) for t in alone}) == len(sets)  # each adapter set writes its own
    for i, s in enumerate(sets):
        sched.submit(Request(10 + i, prompt, greedy(s)))
    together, _ = drain(sched)
    assert [together[10 + i] for i in range(len(sets))] == alone
    sched.close()


def test_prefix_cache_is_reused_only_under_the_same_adapters(
        lm: LoadedModel, adapters: tuple[str, str]) -> None:
    sched = Scheduler(lm, N_SLOTS, 64)
    prompt = lm.tokenize("a b c d e f g h i j k l m n o p")
    a = ((adapters[0], 1.0),)
    sched.submit(Request(1, prompt, greedy(a, 4)))
    first, _ = drain(sched)
    sched.submit(Request(2, prompt, greedy((), 4)))
    _, done = drain(sched)
    assert done[2]["cached_tokens"] == 0  # adapter A's cells are not the base's
    sched.submit(Request(3, prompt, greedy(a, 4)))
    again, done = drain(sched)
    assert done[3]["cached_tokens"] >= len(prompt) - 1
    assert again[3] == first[1]
    sched.close()


def test_bad_adapters_are_refused_at_submit(lm: LoadedModel, tmp_path: Path) -> None:
    sched = Scheduler(lm, 1, 64)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    with pytest.raises(UsageError, match="could not load"):
        sched.submit(Request(1, lm.tokenize("abc"), greedy(((str(junk), 1.0),))))
    with pytest.raises(UsageError, match="no LoRA adapter"):
        sched.submit(Request(2, lm.tokenize("abc"), greedy(((str(tmp_path / "x"), 1.0),))))
    sched.close()


def test_sets_take_turns_and_lora_args_parse(tmp_path: Path) -> None:
    a, b = (("a", 1.0),), (("b", 1.0),)
    assert step_set([(), a, (), b], None) == ()
    assert step_set([(), a, (), b], ()) == a
    assert step_set([(), a, (), b], a) == b
    assert step_set([(), a, (), b], b) == ()
    assert step_set([a, a], ()) == a
    f = tmp_path / "x:y.gguf"
    f.write_bytes(b"")
    assert parse_lora_arg(f"{f}:0.5") == (str(f), 0.5)
    assert parse_lora_arg(str(f)) == (str(f), 1.0)
    with pytest.raises(UsageError):
        parse_lora_arg(str(tmp_path / "missing.gguf"))
    with pytest.raises(UsageError):
        lora_set([("a", float("nan"))])
