"""Engine tiers: sleep (context freed, weights kept), wake, and a context resize that
carries a cached conversation across, token-identically."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos.engine.engine import Engine
from inferenceos.engine.sampling import SamplingParams
from inferenceos.errors import UsageError
from inferenceos.plan.llama_params import LlamaParams

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
SETTINGS = LlamaParams(n_ctx=128, n_batch=64, n_ubatch=64, n_threads=1)


def _tokens(engine: Engine, prompt: list[int]) -> list[int]:
    return [e.token for e in engine.generate(prompt, GREEDY)]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_sleep_frees_the_context_and_wake_answers_the_same(tiny_llama: Path) -> None:
    with Engine(tiny_llama, SETTINGS, n_parallel=2) as engine:
        prompt = engine.tokenize("abc abc")
        before = _tokens(engine, prompt)
        pid = engine.worker_pid
        engine.sleep()
        assert engine.asleep and engine.worker_pid == pid
        engine.wake()
        assert not engine.asleep
        assert _tokens(engine, prompt) == before  # same weights, same worker


def test_a_request_wakes_a_sleeping_worker(tiny_llama: Path) -> None:
    with Engine(tiny_llama, SETTINGS, n_parallel=1) as engine:
        prompt = engine.tokenize("hello")
        before = _tokens(engine, prompt)
        engine.sleep()
        assert _tokens(engine, prompt) == before


def test_sleep_frees_memory_in_the_worker(tiny_llama: Path) -> None:
    """A large context (KV + compute) is what sleep gives back."""
    big = LlamaParams(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1, swa_full=True)
    with Engine(tiny_llama, big, n_parallel=8) as engine:
        engine.generate("abc", GREEDY).text()
        hot = _rss_kib(engine.worker_pid)
        engine.sleep()
        warm = _rss_kib(engine.worker_pid)
        assert warm < hot, (hot, warm)


def test_resize_carries_a_conversation_token_identically(tiny_llama: Path) -> None:
    """A sequence that lives through a context resize continues exactly as it would
    have: the continuation after the resize equals an undisturbed run's, and its
    prompt is served from the carried KV state (no prefill of the old tokens)."""
    with Engine(tiny_llama, SETTINGS, n_parallel=2) as undisturbed:
        prompt = undisturbed.tokenize("ab cab")
        first = _tokens(undisturbed, prompt)
        expected = _tokens(undisturbed, prompt + first)
    with Engine(tiny_llama, SETTINGS, n_parallel=2) as engine:
        first2 = _tokens(engine, prompt)
        assert first2 == first
        info = engine.resize(256)
        assert info["carried"] >= 1 and engine.n_ctx == 256
        gen = engine.generate(prompt + first, GREEDY)
        assert [e.token for e in gen] == expected
        assert gen.metrics.cached_tokens >= len(prompt)  # read from the carried state


def test_sleep_is_refused_while_a_request_runs(tiny_llama: Path) -> None:
    with Engine(tiny_llama, SETTINGS, n_parallel=1) as engine:
        gen = engine.generate("abc", SamplingParams(temperature=0, max_tokens=100,
                                                    ignore_eos=True))
        it = iter(gen)
        next(it)
        with pytest.raises(UsageError, match="in flight"):
            engine.sleep()
        for _ in it:
            pass
