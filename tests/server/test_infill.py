"""Fill in the middle on Qwen2.5-Coder-0.5B-Instruct (a FIM model): the prompt
builder token for token (llama-server's format_prompt_infill), then llama-server's
/infill (whole and streamed), Ollama's `suffix` (the real `ollama` client) and
OpenAI's `suffix` on /v1/completions (the real `openai` client) completing the middle
of a Python function so that the whole parses and the middle does not repeat the
suffix; and a model without FIM tokens refused with a 400 in each dialect's shape.
Greedy, short. The same requests against llama-server's own /infill are in
benchmarks/llama_server_parity.py (this suite does not need llama-server)."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from inferenceos.plan.entry import LoadRequest
from inferenceos.server.infill import FimTokens, Limits, infill_prompt, require_fim
from inferenceos.server.vocab import Vocab, vocab_for
from server_harness import Harness, serving

PREFIX = "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n"
SUFFIX = '\n\n\nif __name__ == "__main__":\n    print(fibonacci(10))\n'
GREEDY: dict[str, Any] = {"temperature": 0, "n_predict": 48}


@pytest.fixture(scope="module")
def vocab(qwen05_path: Path) -> Vocab:
    return vocab_for(qwen05_path)


@pytest.fixture(scope="module")
def fim(vocab: Vocab) -> FimTokens:
    return require_fim(vocab, "no FIM")


def _ids(vocab: Vocab, text: str) -> list[int]:
    return vocab.tokenize(text, add_special=False, parse_special=False)


# -- the prompt builder ----------------------------------------------------------------


def test_qwen_has_fim_tokens(vocab: Vocab, fim: FimTokens) -> None:
    """The GGUF's tokenizer.ggml.fim_*_token_id are Qwen's FIM tokens."""
    names = {t: vocab.token_text(t) for t in (fim.pre, fim.suf, fim.mid, fim.rep, fim.sep)}
    assert list(names.values()) == ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                                    "<|repo_name|>", "<|file_sep|>"]


def test_repo_level_prompt(vocab: Vocab, fim: FimTokens) -> None:
    """/infill's layout: the repository header, each extra file, the current file's
    name, then prefix, suffix, middle (no BOS: Qwen adds none)."""
    ids = infill_prompt(vocab, fim, _ids(vocab, "a = 1\n"), _ids(vocab, "b = 2\n"),
                        Limits(n_ctx=4096), prompt=_ids(vocab, "x"),
                        extra=[("util.py", "import os\n")])
    assert vocab.detokenize(ids) == (
        "<|repo_name|>myproject\n<|file_sep|>util.py\nimport os\n<|file_sep|>filename\n"
        "<|fim_prefix|>a = 1\nx<|fim_suffix|>b = 2\n<|fim_middle|>")


def test_plain_and_spm_prompts(vocab: Vocab, fim: FimTokens) -> None:
    """Without `extra` (Ollama's and OpenAI's suffix) no header; SPM puts the suffix
    part first."""
    pre, suf = _ids(vocab, "a"), _ids(vocab, "b")
    assert vocab.detokenize(infill_prompt(vocab, fim, pre, suf, Limits(0))) == \
        "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>"
    assert vocab.detokenize(infill_prompt(vocab, fim, pre, suf, Limits(0), spm=True)) == \
        "<|fim_suffix|>b<|fim_prefix|>a<|fim_middle|>"


def test_trimming_as_llama_server(vocab: Vocab, fim: FimTokens) -> None:
    """The prefix keeps its last 3/4 batch, the suffix its first batch/4 - 2 - prompt,
    the extra part its last n_ctx - n_batch - 2*n_predict tokens."""
    pre, suf = list(range(100, 140)), list(range(200, 240))
    ids = infill_prompt(vocab, fim, pre, suf, Limits(n_ctx=0, n_batch=16), prompt=[7])
    assert ids == [fim.pre, *pre[-12:], 7, fim.suf, *suf[:1], fim.mid]
    header = infill_prompt(vocab, fim, [], [], Limits(n_ctx=4096), extra=[])
    assert vocab.detokenize(header[:-3]) == "<|repo_name|>myproject\n<|file_sep|>filename\n"
    # a context no larger than a batch keeps n_ctx - n_batch + 2 of it (llama-server's -1
    # n_predict): 2 tokens at 2048
    kept = infill_prompt(vocab, fim, [], [], Limits(n_ctx=2048), extra=[])
    assert kept[:-3] == header[:-3][-2:]


def test_code_stays_text(vocab: Vocab, fim: FimTokens) -> None:
    """A FIM token's text typed in the code is text, not the token."""
    ids = infill_prompt(vocab, fim, _ids(vocab, "s = '<|fim_middle|>'"), [], Limits(0))
    assert ids.count(fim.mid) == 1 and ids[-1] == fim.mid


# -- over HTTP -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(qwen05_path: Path, tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-infill")
    with serving({"qwen": qwen05_path, "tiny": tiny_llama}, root,
                 manager_kw={"base": LoadRequest(n_ctx=2048)}) as h:
        yield h


@pytest.fixture
def http(server: Harness) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


def _fits(middle: str) -> None:
    """The middle completes the function: prefix + middle + suffix parses, the middle
    recurses, and it does not write the suffix itself."""
    ast.parse(PREFIX + middle + SUFFIX)
    assert "fibonacci(n" in middle.replace(" ", ""), middle
    assert "__main__" not in middle and "print(" not in middle, middle


def test_infill(http: httpx.Client) -> None:
    r = http.post("/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                   "input_extra": [{"filename": "util.py", "text": "x = 1\n"}],
                                   **GREEDY})
    assert r.status_code == 200, r.text
    b = r.json()
    _fits(b["content"])
    assert b["stop_type"] == "eos" and b["model"] == "qwen"
    assert b["prompt"].endswith("<|fim_suffix|>" + SUFFIX + "<|fim_middle|>")


def test_infill_stream(http: httpx.Client) -> None:
    """Streamed as /completion streams: one event per token, then the final object;
    the same text as the whole answer."""
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "stream": True, **GREEDY}
    with http.stream("POST", "/infill", json=body) as r:
        assert r.status_code == 200
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    assert events[-1]["stop"] is True and all(not e["stop"] for e in events[:-1])
    middle = "".join(e["content"] for e in events)
    _fits(middle)
    whole = http.post("/infill", json={**body, "stream": False}).json()["content"]
    assert middle == whole


def test_ollama_suffix(server: Harness) -> None:
    client = ollama.Client(host=server.url, timeout=300)
    options = {"temperature": 0, "num_predict": 48}
    r = client.generate(model="qwen", prompt=PREFIX, suffix=SUFFIX, options=options)
    _fits(r.response)
    assert r.done_reason == "stop" and r.context  # the FIM prompt's ids and the middle
    streamed = "".join(p.response for p in client.generate(
        model="qwen", prompt=PREFIX, suffix=SUFFIX, options=options, stream=True))
    assert streamed == r.response


def test_openai_suffix(server: Harness) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)
    r = client.completions.create(model="qwen", prompt=PREFIX, suffix=SUFFIX,
                                  temperature=0, max_tokens=48)
    _fits(r.choices[0].text)
    assert r.choices[0].finish_reason == "stop"


def test_no_fim_tokens(http: httpx.Client, server: Harness) -> None:
    """A model without FIM tokens: a 400 in each dialect's shape, saying why."""
    r = http.post("/infill", json={"model": "tiny", "input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(
        "Infill is not supported by this model: prefix token is missing.")
    with pytest.raises(ollama.ResponseError) as exc:
        ollama.Client(host=server.url).generate(model="tiny", prompt="a", suffix="b")
    assert exc.value.status_code == 400 and "does not support insert" in exc.value.error
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="not supported by this model"):
        client.completions.create(model="tiny", prompt="a", suffix="b")
    # an empty suffix is none (as Ollama reads its own): a plain completion
    assert client.completions.create(model="tiny", prompt="a", suffix="", max_tokens=2).choices


@pytest.mark.parametrize(("body", "message"), [
    ({"input_suffix": "b"}, '"input_prefix" is required'),
    ({"input_prefix": "a"}, '"input_suffix" is required'),
    ({"input_prefix": "a", "input_suffix": "b", "prompt": 3}, '"prompt" must be a string'),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]},
     'extra_context chunk must contain a "text" field'),
    ({"input_prefix": {"a": 1}, "input_suffix": "b"}, '"input_prefix" must be text'),
])
def test_bad_infill_bodies(http: httpx.Client, body: dict[str, Any], message: str) -> None:
    r = http.post("/infill", json={"model": "qwen", **body})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(message), r.text
