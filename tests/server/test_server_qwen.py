"""End to end on a real instruction-tuned model, Qwen2.5-Coder-0.5B-Instruct Q4_K_M,
through a real server, judged by the real `openai` and `ollama` clients: it answers,
calls tools, answers from a tool's result, and follows a JSON schema, on the OpenAI
chat, Responses and Ollama chat APIs, streamed and not.

Greedy (temperature 0) and short replies keep the module under a minute on two cores,
the model loaded once. The model rarely writes its template's `<tool_call>` tags: for
these prompts it writes a ```json fenced call or a bare JSON object (which one can
change with what is cached), both of which must come back as `tool_calls`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import ollama
import openai
import pytest

from inferenceos.plan.entry import LoadRequest
from server_harness import Harness, serving

pytestmark = pytest.mark.slow

CONTROL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}},
                  "required": ["city"]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": WEATHER_PARAMS}}
PLACE = {"type": "object", "properties": {"city": {"type": "string"},
                                          "country": {"type": "string"}},
         "required": ["city", "country"], "additionalProperties": False}
BERLIN = [{"role": "user", "content": "Berlin weather?"}]
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]
FRANCE = [{"role": "user", "content": "What is the capital of France? Answer with one word."}]
GERMANY = [{"role": "user", "content": "Name the capital of Germany and its country as JSON."}]
RESULT = json.dumps({"temperature_c": 17, "sky": "sunny"})
# Given the tool's result alone, the 0.5B repeats its call (as a call or as JSON text)
# under any wording tried, though the prompt is the template's own; a short user
# follow-up after the result gets an answer in words, whose figure is the result's.
FOLLOW_UP = {"role": "user", "content": "Tell me in one sentence."}
GREEDY: dict[str, Any] = {"model": "qwen", "temperature": 0, "max_tokens": 64}
OPTIONS = {"temperature": 0, "num_predict": 64}


@pytest.fixture(scope="module")
def server(qwen05_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-qwen")
    with serving({"qwen": qwen05_path}, root,
                 manager_kw={"base": LoadRequest(n_ctx=2048)}) as h:
        yield h


@pytest.fixture
def client(server: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture
def oclient(server: Harness) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=300)


def _clean(text: str | None) -> str:
    """The reply's text, once checked to hold no raw control token."""
    for token in CONTROL_TOKENS:
        assert token not in (text or ""), text
    return text or ""


def _weather_call(name: str, arguments: str | dict[str, Any], city: str) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    assert name == "get_weather" and jsonschema_rs.is_valid(WEATHER_PARAMS, args), args
    assert args["city"].lower() == city.lower()


def test_a_factual_one_word_answer(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(**{**GREEDY, "max_tokens": 8}, messages=FRANCE)
    assert "Paris" in _clean(r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("messages, city", [(BERLIN, "Berlin"), (PARIS, "Paris")])
def test_a_tool_call_either_way_it_is_written(client: openai.OpenAI,
                                             messages: list[dict[str, str]],
                                             city: str) -> None:
    r = client.chat.completions.create(**GREEDY, messages=messages, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert not _clean(choice.message.content)
    [call] = choice.message.tool_calls or []
    _weather_call(call.function.name, call.function.arguments, city)


def test_a_streamed_fenced_call_shows_no_content(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(**GREEDY, messages=BERLIN, tools=[WEATHER],
                                                 stream=True))
    assert _clean("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)) == ""
    [call] = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert call.function and call.function.name
    _weather_call(call.function.name, call.function.arguments or "", "Berlin")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def _answered(text: str | None) -> None:
    """A reply in words that takes its figure from the tool's result."""
    said = _clean(text)
    assert "17" in said and "{" not in said, said


def test_the_tool_result_is_answered(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(**GREEDY, messages=BERLIN, tools=[WEATHER])
    [call] = first.choices[0].message.tool_calls or []
    messages = [*BERLIN, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": RESULT}, FOLLOW_UP]
    r = client.chat.completions.create(**GREEDY, messages=messages, tools=[WEATHER])
    assert r.choices[0].finish_reason == "stop"
    _answered(r.choices[0].message.content)


def test_a_json_schema_reply_validates(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": PLACE}}
    r = client.chat.completions.create(**GREEDY, messages=GERMANY, response_format=fmt)
    reply = json.loads(_clean(r.choices[0].message.content))
    assert jsonschema_rs.is_valid(PLACE, reply) and "Berlin" in reply["city"], reply


def test_responses_api_returns_a_function_call(client: openai.OpenAI) -> None:
    fn = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMS,
          "description": WEATHER["function"]["description"]}
    r = client.responses.create(model="qwen", input=BERLIN[0]["content"], tools=[fn],
                                temperature=0, max_output_tokens=64)
    [call] = [item for item in r.output if item.type == "function_call"]
    _weather_call(call.name, call.arguments, "Berlin")
    assert not _clean(r.output_text)


def test_ollama_chat_answers_calls_tools_and_follows_a_format(oclient: ollama.Client) -> None:
    r = oclient.chat(model="qwen", messages=FRANCE, options={**OPTIONS, "num_predict": 8})
    assert "Paris" in _clean(r.message.content)
    for messages, city in ((BERLIN, "Berlin"), (PARIS, "Paris")):
        r = oclient.chat(model="qwen", messages=messages, tools=[WEATHER], options=OPTIONS)
        assert not _clean(r.message.content)
        [call] = r.message.tool_calls or []
        _weather_call(call.function.name, call.function.arguments, city)
    r = oclient.chat(model="qwen", messages=GERMANY, format=PLACE, options=OPTIONS)
    reply = json.loads(_clean(r.message.content))
    assert jsonschema_rs.is_valid(PLACE, reply) and "Berlin" in reply["city"], reply


def test_ollama_streamed_call_and_tool_result(oclient: ollama.Client) -> None:
    parts = list(oclient.chat(model="qwen", messages=BERLIN, tools=[WEATHER], options=OPTIONS,
                              stream=True))
    assert _clean("".join(p.message.content or "" for p in parts)) == ""
    [call] = [c for p in parts for c in p.message.tool_calls or ()]
    _weather_call(call.function.name, call.function.arguments, "Berlin")
    messages = [*BERLIN, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": dict(call.function.arguments)}}]},
        {"role": "tool", "tool_name": "get_weather", "content": RESULT}, FOLLOW_UP]
    r = oclient.chat(model="qwen", messages=messages, tools=[WEATHER], options=OPTIONS)
    _answered(r.message.content)
    assert not r.message.tool_calls
