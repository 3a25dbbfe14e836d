"""The OpenAI Responses API (/v1/responses), judged by the real `openai` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest

from server_harness import TINY_REQUEST, Harness, serving
from tiny_models import write_tiny_model
from tool_templates import TINY_HERMES_TEMPLATE

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}},
                  "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "weather", "parameters": WEATHER_PARAMS}


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-responses")
    hermes = write_tiny_model(root / "tiny-hermes.gguf", chat_template=TINY_HERMES_TEMPLATE)
    # 512: the whole training context of the tiny models; a prompt with tools needs it
    with serving({"tiny": tiny_llama, "hermes": hermes}, root,
                 manager_kw={"base": replace(TINY_REQUEST, n_ctx=512)}) as h:
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
    with pytest.raises(openai.BadRequestError, match="web_search"):
        client.responses.create(model="tiny", input="hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="does not support tools"):
        client.responses.create(model="tiny", input="hi", tools=[WEATHER])
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="hi", previous_response_id="resp_nope")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi")
    # images are taken (tests/server/test_server_media.py), but not fetched from URLs by default
    with pytest.raises(openai.BadRequestError, match="does not fetch media from URLs"):
        client.responses.create(model="tiny", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}])
    with pytest.raises(openai.BadRequestError, match="input_file"):
        client.responses.create(model="tiny", input=[{"role": "user", "content": [
            {"type": "input_file", "file_id": "file-1"}]}])


FORCED = {"model": "hermes", "input": "weather in paris", "tools": [WEATHER],
          "tool_choice": "required", "max_output_tokens": 120, "temperature": 0}


def test_forced_tool_call_comes_back_as_a_function_call_item(client: openai.OpenAI) -> None:
    r = client.responses.create(**FORCED)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1
    call = calls[0]
    assert call.name == "weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] in ("Paris", "Tokyo")
    assert r.tools and r.tools[0].name == "weather"


def test_streamed_tool_call_matches_the_whole_one(client: openai.OpenAI) -> None:
    whole = next(o for o in client.responses.create(**FORCED).output
                 if o.type == "function_call")
    types, final = [], None
    with client.responses.create(**FORCED, stream=True) as stream:
        for ev in stream:
            types.append(ev.type)
            if ev.type == "response.function_call_arguments.done":
                assert json.loads(ev.arguments) == json.loads(whole.arguments)
            if ev.type == "response.completed":
                final = ev.response
    assert "response.function_call_arguments.delta" in types
    assert types[-1] == "response.completed" and final is not None
    [call] = [o for o in final.output if o.type == "function_call"]
    assert call.name == whole.name and call.arguments == whole.arguments


def test_the_call_and_its_output_go_into_the_next_turn(client: openai.OpenAI) -> None:
    first = client.responses.create(**FORCED)
    call = next(o for o in first.output if o.type == "function_call")
    result = "sunny and warm today"
    items = [{"role": "user", "content": "weather in paris"},
             {"type": "function_call", "call_id": call.call_id, "name": call.name,
              "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": result}]
    second = client.responses.create(model="hermes", input=items, tools=[WEATHER],
                                     max_output_tokens=4, temperature=0)
    assert first.usage and second.usage
    # the call and its result are in the prompt (one token per character, here)
    grown = second.usage.input_tokens - first.usage.input_tokens
    assert grown >= len(call.arguments) + len(result)
    # the same through previous_response_id: the stored reply holds the call
    chained = client.responses.create(
        model="hermes", previous_response_id=first.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": result}],
        max_output_tokens=4, temperature=0)
    assert chained.usage and chained.usage.input_tokens == second.usage.input_tokens
