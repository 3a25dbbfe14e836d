"""The OpenAI Responses API (/v1/responses), judged by the real `openai` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from server_harness import Harness, serving


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with serving({"tiny": tiny_llama}, tmp_path_factory.mktemp("server-responses")) as h:
        yield h


@pytest.fixture
def client(server: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)


def test_create_returns_a_response_the_client_parses(client: openai.OpenAI) -> None:
    r = client.responses.create(model="tiny", input="hello", max_output_tokens=6,
                                temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.status in ("completed", "incomplete")
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.content[0].type == "output_text"
    assert r.output_text == msg.content[0].text and r.output_text
    assert r.usage is not None and 0 < r.usage.output_tokens <= 6
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":  # cut by max_output_tokens, as OpenAI reports it
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"


def test_same_text_as_chat_completions(client: openai.OpenAI) -> None:
    """Same model, same messages, greedy: the two APIs give the same reply."""
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "abc"}]
    chat = client.chat.completions.create(model="tiny", messages=msgs,  # type: ignore[arg-type]
                                          max_tokens=8, temperature=0)
    resp = client.responses.create(model="tiny", instructions="be brief", input="abc",
                                   max_output_tokens=8, temperature=0)
    assert resp.output_text == chat.choices[0].message.content


def test_stream_sends_openais_events_in_order(client: openai.OpenAI) -> None:
    types: list[str] = []
    deltas: list[str] = []
    final = None
    with client.responses.create(model="tiny", input="hello", max_output_tokens=8,
                                 temperature=0, stream=True) as stream:
        for ev in stream:
            types.append(ev.type)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert deltas and final is not None
    assert final.output_text == "".join(deltas)
    whole = client.responses.create(model="tiny", input="hello", max_output_tokens=8,
                                    temperature=0)
    assert whole.output_text == final.output_text


def test_stream_sequence_numbers_and_event_names(server: Harness) -> None:
    """Raw SSE: every `data:` has an `event:` line naming its type, numbers count up."""
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 4, "stream": True}
    with httpx.stream("POST", server.v1 + "/responses", json=body, timeout=60) as r:
        text = "".join(r.iter_text())
    blocks = [b for b in text.split("\n\n") if b.strip()]
    seen = []
    for block in blocks:
        event, data = block.split("\n", 1)
        payload = json.loads(data.removeprefix("data: "))
        assert event == f"event: {payload['type']}"
        seen.append(payload["sequence_number"])
    assert seen == list(range(len(blocks)))


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(model="tiny", input="abc", max_output_tokens=5,
                                    temperature=0)
    second = client.responses.create(model="tiny", input="more", max_output_tokens=5,
                                     temperature=0, previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    # the second prompt holds the first exchange: longer, and its start came from cache
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    assert client.responses.retrieve(first.id).output_text == first.output_text


def test_json_object_format_gives_json(client: openai.OpenAI) -> None:
    r = client.responses.create(model="tiny", input="json please", max_output_tokens=40,
                                temperature=0, text={"format": {"type": "json_object"}})
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)
    else:  # cut mid-object by max_output_tokens: still a JSON prefix
        assert r.output_text.lstrip().startswith("{")


def test_unsupported_things_are_refused_not_ignored(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.responses.create(model="tiny", input="hi", tools=[{
            "type": "function", "name": "f", "parameters": {"type": "object"}}])
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="hi", previous_response_id="resp_nope")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi")
    with pytest.raises(openai.BadRequestError, match="input_image"):
        client.responses.create(model="tiny", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}])
