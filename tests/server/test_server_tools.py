"""Function calling through the model's chat template, judged by the real `openai` and
`ollama` clients against a real server.

The tiny models have random weights: a call is only certain when it is forced (OpenAI
`tool_choice` "required" or a named function: a grammar), or when the output is
constrained to the call's JSON by a schema (`response_format` / Ollama `format`), which
exercises the parsing of a free ("auto") reply.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import ollama
import openai
import pytest

from server_harness import TINY_REQUEST, Harness, serving
from tiny_models import write_tiny_model
from tool_templates import TINY_HERMES_TEMPLATE

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}},
                  "required": ["city"], "additionalProperties": False}
CLOCK_PARAMS = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]},
                                                 "hours": {"type": "boolean"}},
                "required": ["zone", "hours"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": WEATHER_PARAMS}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": CLOCK_PARAMS}}
ASK = [{"role": "user", "content": "weather in paris"}]
GREEDY: dict[str, Any] = {"model": "hermes", "messages": ASK, "max_tokens": 120, "temperature": 0}
# the call object, as a schema: constraining a free reply to it makes a parseable call
CALL_SCHEMA = {"type": "object", "properties": {"name": {"const": "weather"},
                                                "arguments": WEATHER_PARAMS},
               "required": ["name", "arguments"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-tools")
    hermes = write_tiny_model(root / "tiny-hermes.gguf", chat_template=TINY_HERMES_TEMPLATE)
    # 512: the whole training context of the tiny models; a prompt with tools needs it
    with serving({"hermes": hermes, "tiny": tiny_llama}, root,
                 manager_kw={"base": replace(TINY_REQUEST, n_ctx=512)}) as h:
        yield h


@pytest.fixture
def client(server: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def oclient(server: Harness) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


def _valid(params: dict[str, Any], arguments: str | dict[str, Any]) -> dict[str, Any]:
    args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    assert jsonschema_rs.is_valid(params, args), args
    return args


def test_required_tool_choice_forces_a_valid_call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(**GREEDY, tools=[WEATHER], tool_choice="required")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].id.startswith("call_")
    assert calls[0].function.name == "weather"
    _valid(WEATHER_PARAMS, calls[0].function.arguments)


@pytest.mark.parametrize("parallel", [False, True])
def test_parallel_tool_calls_decides_how_many_calls_a_reply_holds(
    client: openai.OpenAI, parallel: bool
) -> None:
    """`parallel_tool_calls` false: the forced grammar admits one call and the reply
    ends there. True: it admits several, and the random model writes calls until
    max_tokens cuts one; each whole call is returned, each valid, each with its id."""
    r = client.chat.completions.create(**{**GREEDY, "max_tokens": 200}, tools=[WEATHER],
                                       tool_choice="required", parallel_tool_calls=parallel)
    calls = r.choices[0].message.tool_calls or []
    assert len(calls) == 1 if not parallel else len(calls) >= 2, calls
    assert len({c.id for c in calls}) == len(calls)
    for c in calls:
        _valid(WEATHER_PARAMS if c.function.name == "weather" else CLOCK_PARAMS,
               c.function.arguments)


def test_named_function_is_the_one_called(client: openai.OpenAI) -> None:
    choice = {"type": "function", "function": {"name": "clock"}}
    r = client.chat.completions.create(**GREEDY, tools=[WEATHER, CLOCK], tool_choice=choice)
    calls = r.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["clock"]
    _valid(CLOCK_PARAMS, calls[0].function.arguments)
    assert r.choices[0].finish_reason == "tool_calls"


def test_stream_reassembles_to_the_same_call(client: openai.OpenAI) -> None:
    kw = {**GREEDY, "tools": [WEATHER], "tool_choice": "required"}
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls or []
    chunks = list(client.chat.completions.create(**kw, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == ""  # the call is held back, never shown as content
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or ()]
    assert [d.index for d in deltas] == [0]
    d = deltas[0]
    assert d.id and d.id.startswith("call_") and d.type == "function" and d.function
    assert d.function.name == whole[0].function.name == "weather"
    assert json.loads(d.function.arguments or "") == json.loads(whole[0].function.arguments)
    finals = [c.choices[0].finish_reason for c in chunks]
    assert finals[-1] == "tool_calls" and all(f is None for f in finals[:-1])


def test_auto_reply_is_parsed_into_a_call(client: openai.OpenAI) -> None:
    """A free ("auto") reply that is a bare JSON call becomes a tool call; the schema
    only makes the random model write one."""
    fmt = {"type": "json_schema", "json_schema": {"name": "call", "schema": CALL_SCHEMA}}
    r = client.chat.completions.create(**GREEDY, tools=[WEATHER], response_format=fmt)
    calls = r.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["weather"]
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None


def _literal(text: str) -> str:
    """A GBNF grammar whose only sentence is `text` (JSON escapes are GBNF's too)."""
    return "root ::= " + json.dumps(text)


FENCED = 'Checking.\n```json\n{"name": "weather", "arguments": {"city": "Paris"}}\n```'


def test_a_fenced_call_after_text_is_a_tool_call(client: openai.OpenAI) -> None:
    """What Qwen 2.5 Coder often writes instead of `<tool_call>` (a grammar makes the
    random model write it), whole and streamed."""
    kw = {**GREEDY, "tools": [WEATHER], "extra_body": {"grammar": _literal(FENCED)}}
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("weather", {"city": "Paris"})]
    chunks = list(client.chat.completions.create(**kw, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.strip() == "Checking." and "```" not in text
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or ()]
    assert [d.function.name for d in deltas if d.function] == ["weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("text", [
    # a function nobody declared; arguments that do not fit the declared one
    '```json\n{"name": "clock", "arguments": {"zone": "UTC", "hours": true}}\n```',
    '{"name": "weather", "arguments": {"city": "Berlin"}}',
])
def test_json_naming_no_declared_call_stays_content(client: openai.OpenAI, text: str) -> None:
    kw = {**GREEDY, "tools": [WEATHER], "extra_body": {"grammar": _literal(text)}}
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "stop" and choice.message.content == text
    assert not choice.message.tool_calls
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


def test_second_turn_with_the_tool_result(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(**GREEDY, tools=[WEATHER], tool_choice="required")
    call = (first.choices[0].message.tool_calls or [])[0]
    result = "sunny and warm today"
    messages = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": result}]
    r = client.chat.completions.create(**{**GREEDY, "messages": messages, "max_tokens": 4},
                                       tools=[WEATHER])
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert first.usage and r.usage
    # the call and its result are in the prompt: one token per character, here
    grown = r.usage.prompt_tokens - first.usage.prompt_tokens
    assert grown >= len(call.function.arguments) + len(result)


def test_tool_choice_none_renders_no_tools(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(**{**GREEDY, "max_tokens": 1})
    r = client.chat.completions.create(**{**GREEDY, "max_tokens": 1}, tools=[WEATHER],
                                       tool_choice="none")
    assert plain.usage and r.usage and r.usage.prompt_tokens == plain.usage.prompt_tokens
    assert r.choices[0].message.tool_calls is None


def test_model_without_tools_support_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{**GREEDY, "model": "tiny"}, tools=[WEATHER])
    assert err.value.status_code == 400
    assert "tiny does not support tools" in str(err.value)


@pytest.mark.parametrize("extra", [
    {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
    {"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{bad"}}]}]},
    {"tools": [WEATHER, WEATHER]},
])
def test_bad_tool_requests_are_400(server: Harness, extra: dict[str, Any]) -> None:
    body = {**GREEDY, "tools": [WEATHER], **extra}
    r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


# -- Ollama ---------------------------------------------------------------------------

def test_ollama_reply_is_parsed_into_tool_calls(oclient: ollama.Client) -> None:
    kw: dict[str, Any] = {"model": "hermes", "messages": ASK, "tools": [WEATHER],
                          "format": CALL_SCHEMA, "options": {"temperature": 0,
                                                             "num_predict": 120}}
    r = oclient.chat(**kw)
    calls = r.message.tool_calls or []
    assert [c.function.name for c in calls] == ["weather"]
    _valid(WEATHER_PARAMS, calls[0].function.arguments)
    assert r.message.content == "" and r.done
    parts = list(oclient.chat(**kw, stream=True))
    streamed = [c for p in parts for c in p.message.tool_calls or ()]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == \
        [(c.function.name, dict(c.function.arguments)) for c in calls]
    assert "".join(p.message.content or "" for p in parts) == ""
    assert parts[-1].done and not any(p.done for p in parts[:-1])


def test_ollama_second_turn_with_tool_message(oclient: ollama.Client) -> None:
    messages = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny and warm today", "tool_name": "weather"}]
    first = oclient.chat(model="hermes", messages=ASK, tools=[WEATHER],
                         options={"num_predict": 1})
    r = oclient.chat(model="hermes", messages=messages, tools=[WEATHER],
                     options={"num_predict": 4, "temperature": 0})
    assert r.done and r.prompt_eval_count and first.prompt_eval_count
    assert r.prompt_eval_count - first.prompt_eval_count >= len("sunny and warm today")


def test_ollama_model_without_tools_support(oclient: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        oclient.chat(model="tiny", messages=ASK, tools=[WEATHER])
    assert err.value.status_code == 400 and err.value.error == "tiny does not support tools"


def test_ollama_show_lists_the_tools_capability(oclient: ollama.Client) -> None:
    assert "tools" in (oclient.show("hermes").capabilities or [])
    assert "tools" not in (oclient.show("tiny").capabilities or [])


def test_apply_template_renders_the_tools_as_a_chat_request_does(server: Harness) -> None:
    """llama-server's /apply-template with `tools`: the prompt the chat completion would
    send, the tool declarations in it (they were left out)."""
    plain = httpx.post(server.url + "/apply-template", timeout=30,
                       json={"model": "hermes", "messages": ASK}).json()["prompt"]
    r = httpx.post(server.url + "/apply-template", timeout=30,
                   json={"model": "hermes", "messages": ASK, "tools": [WEATHER]})
    assert r.status_code == 200
    with_tools = r.json()["prompt"]
    assert '"weather"' not in plain and '"weather"' in with_tools
    assert with_tools.endswith(plain[plain.rindex("<|im_start|>user"):])
