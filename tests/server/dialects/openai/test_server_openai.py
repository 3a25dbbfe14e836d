"""The OpenAI routes, judged by the real `openai` client against a real server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from server_harness import Harness, serving

MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-openai")
    with serving({"tiny": tiny_llama}, root) as h:
        yield h


@pytest.fixture
def client(server: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)


def test_chat_completion(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=6,
                                       temperature=0)
    assert r.object == "chat.completion" and r.model == "tiny"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens <= 6
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_greedy_is_deterministic_and_stream_matches(client: openai.OpenAI) -> None:
    kw = {"model": "tiny", "messages": MSG, "max_tokens": 8, "temperature": 0}
    whole = client.chat.completions.create(**kw).choices[0].message.content
    assert client.chat.completions.create(**kw).choices[0].message.content == whole
    chunks = list(client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] in ("stop", "length") and all(f is None for f in finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens <= 8


def test_stream_ends_with_done_marker(server: Harness) -> None:
    body = {"model": "tiny", "messages": MSG, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)


def test_seed_reproduces_sampling_and_n_choices(client: openai.OpenAI) -> None:
    kw = {"model": "tiny", "messages": MSG, "max_tokens": 8, "temperature": 1.0, "seed": 7}
    a = client.chat.completions.create(**kw).choices[0].message.content
    assert client.chat.completions.create(**kw).choices[0].message.content == a
    r = client.chat.completions.create(**kw, n=2)
    assert [c.index for c in r.choices] == [0, 1]


def test_json_mode_is_grammar_constrained(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=12,
                                       response_format={"type": "json_object"}, seed=1)
    assert (r.choices[0].message.content or "").startswith("{")


def test_json_schema_response_format_is_followed(client: openai.OpenAI) -> None:
    import json

    schema = {"type": "object", "properties": {"c": {"enum": ["red", "blue"]}},
              "required": ["c"]}
    r = client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert json.loads(r.choices[0].message.content or "")["c"] in ("red", "blue")


def test_penalties_and_logit_bias(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4,
                                       presence_penalty=0.5, frequency_penalty=0.5,
                                       logit_bias={"260": -100})
    assert r.choices[0].finish_reason in ("stop", "length")


def test_text_completion_and_stream(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="abc", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.usage and r.usage.completion_tokens <= 5
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="abc", max_tokens=5, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text
    echo = client.completions.create(model="tiny", prompt="abc", max_tokens=2, echo=True,
                                     temperature=0)
    assert echo.choices[0].text.startswith("abc")
    batch = client.completions.create(model="tiny", prompt=["ab", "cd"], max_tokens=2)
    assert len(batch.choices) == 2


def test_token_prompt(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt=[1, 260, 261], max_tokens=3)
    assert r.usage and r.usage.prompt_tokens == 3


def test_embeddings_float_and_base64(client: openai.OpenAI) -> None:
    r = client.embeddings.create(model="tiny", input=["abc", "xyz"])  # client asks base64
    assert [d.index for d in r.data] == [0, 1] and len(r.data[0].embedding) == 64
    assert sum(x * x for x in r.data[0].embedding) == pytest.approx(1.0, abs=1e-4)
    f = client.embeddings.create(model="tiny", input="abc", encoding_format="float")
    assert f.data[0].embedding == pytest.approx(r.data[0].embedding, abs=1e-6)
    assert r.usage.prompt_tokens > 0


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny:latest"]
    assert client.models.retrieve("tiny").id == "tiny:latest"


def test_concurrent_clients(client: openai.OpenAI) -> None:
    results: list[str] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            stream = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=6,
                temperature=0, stream=True)
            results.append("".join(c.choices[0].delta.content or "" for c in stream
                                   if c.choices))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 8


@pytest.mark.parametrize("kw, status", [
    ({"model": "nope"}, openai.NotFoundError),
    ({"model": "../../etc/passwd"}, openai.BadRequestError),
    ({"temperature": -1}, openai.BadRequestError),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, openai.BadRequestError),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     openai.BadRequestError),
    ({"logit_bias": {"abc": 1}}, openai.BadRequestError),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x" * 2000}]},
     openai.BadRequestError),
])
def test_errors_in_openai_shape(client: openai.OpenAI, kw: dict, status: type) -> None:
    args = {"model": "tiny", "messages": MSG, "max_tokens": 2, **kw}
    with pytest.raises(status) as info:
        client.chat.completions.create(**args)
    body = info.value.body
    assert isinstance(body, dict) and body["message"] and body["type"]
    assert "Traceback" not in str(body)


def test_unknown_route_and_bad_json(server: Harness) -> None:
    r = httpx.post(server.v1 + "/nothing", json={})
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.post(server.v1 + "/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
