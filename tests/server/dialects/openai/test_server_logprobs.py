"""Token logprobs through the OpenAI (chat and legacy completions) and Ollama routes,
judged by the real clients: figures are log-probabilities (≤ 0), alternatives come
best first, and under greedy sampling the chosen token is the top one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from server_harness import Harness, serving

MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-logprobs")
    with serving({"tiny": tiny_llama}, root) as h:
        yield h


@pytest.fixture
def client(server: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)


def _check_entry(e: Any, n: int) -> None:
    """One token's entry (OpenAI object or Ollama model): sane figures, greedy = top-1."""
    assert e.logprob <= 0
    tops = [t.logprob for t in e.top_logprobs]
    assert len(tops) == n and tops == sorted(tops, reverse=True) and all(t <= 0 for t in tops)
    assert e.top_logprobs[0].token == e.token
    assert e.top_logprobs[0].logprob == pytest.approx(e.logprob)


def test_chat_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": "tiny", "messages": MSG, "max_tokens": 6, "temperature": 0,
                          "logprobs": True, "top_logprobs": 3}
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.logprobs and choice.logprobs.content and r.usage
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        _check_entry(e, 3)
        assert e.bytes is not None and bytes(e.bytes).decode("utf-8", "replace") == e.token
    # the tokens' bytes make the text (the random model writes invalid UTF-8 too)
    joined = bytes(b for e in content for b in e.bytes or ())
    assert joined.decode("utf-8", "replace") == choice.message.content
    streamed = [e for c in client.chat.completions.create(**kw, stream=True)
                if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content or ()]
    assert [e.token for e in streamed] == [e.token for e in content]
    # another run (its prompt partly reused from the cache): float noise only
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content],
                                                          abs=1e-4)


def test_chat_without_logprobs_has_none(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
    assert r.choices[0].logprobs is None


def test_top_logprobs_needs_logprobs(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="top_logprobs requires logprobs"):
        client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2,  # type: ignore[arg-type]
                                       top_logprobs=2)


def test_completion_legacy_logprobs(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": "tiny", "prompt": "ab", "max_tokens": 5, "temperature": 0,
                          "logprobs": 2, "echo": True}
    r = client.completions.create(**kw)
    lp = r.choices[0].logprobs
    assert lp and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    assert r.usage and len(lp.tokens) == r.usage.completion_tokens
    assert lp.text_offset[0] == len("ab")  # after the echoed prompt
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:],
                                                  lp.tokens, strict=False))
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and 1 <= len(top) <= 2
        assert max(top, key=top.__getitem__) == token  # greedy: the chosen is the best
    chunks = list(client.completions.create(**kw, stream=True))
    tokens = [t for c in chunks if c.choices[0].logprobs
              for t in c.choices[0].logprobs.tokens or ()]
    assert tokens == lp.tokens


def test_ollama_logprobs(server: Harness) -> None:
    c = ollama.Client(host=server.url, timeout=60)
    opts = {"num_predict": 5, "temperature": 0}
    r = c.chat(model="tiny", messages=MSG, options=opts, logprobs=True, top_logprobs=2)
    assert r.logprobs and len(r.logprobs) == r.eval_count
    for e in r.logprobs:
        _check_entry(e, 2)
    parts = list(c.generate(model="tiny", prompt="hello", options=opts, logprobs=True,
                            stream=True))
    streamed = [e for p in parts for e in p.logprobs or ()]
    assert len(streamed) == parts[-1].eval_count and all(e.logprob <= 0 for e in streamed)
    assert c.chat(model="tiny", messages=MSG, options=opts).logprobs is None
