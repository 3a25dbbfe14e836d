"""The real `anthropic` SDK against a real `inferenceos serve` process serving
Qwen2.5-Coder-0.5B-Instruct, as a coding agent built for Claude would talk to it: the
model name it hard-codes (`--any-model`), its key in the SDK's own header, a message, a
stream the SDK assembles, a tool call answered after its result, and count_tokens.

Greedy (temperature 0, sent in `extra_body`: this SDK has no sampling arguments) and
short replies; the model is loaded once for the module.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from cli_helpers import start_serve

pytestmark = pytest.mark.slow

KEY = "test-key-123"
CLAUDE = "claude-sonnet-4-5"  # any name reaches the served model (--any-model)
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
FRANCE = [{"role": "user", "content": "What is the capital of France? Answer with one word."}]
BERLIN = [{"role": "user", "content": "Berlin weather?"}]
RESULT = json.dumps({"temperature_c": 17, "sky": "sunny"})
# as in test_server_qwen: after the result alone the 0.5B repeats its call; a short
# follow-up in the same user turn gets an answer in words
FOLLOW_UP = {"type": "text", "text": "Tell me in one sentence."}
GREEDY: dict[str, Any] = {"model": CLAUDE, "max_tokens": 64, "extra_body": {"temperature": 0}}
CONTROL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


@pytest.fixture(scope="module")
def serve(qwen05_path: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[subprocess.Popen[str], str]]:
    home = tmp_path_factory.mktemp("anthropic-qwen-home")
    proc, base = start_serve(str(qwen05_path), "--ctx", "2048", "--any-model",
                             "--api-key", KEY, INFERENCEOS_HOME=str(home))
    try:
        yield proc, base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


@pytest.fixture
def client(serve: tuple[subprocess.Popen[str], str]) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=serve[1], api_key=KEY, max_retries=0, timeout=300)


def _text(message: Any) -> str:
    """The text blocks' text, once checked to hold no raw control token."""
    text = "".join(b.text for b in message.content if b.type == "text")
    for token in CONTROL_TOKENS:
        assert token not in text, text
    return text


def test_a_message(client: anthropic.Anthropic) -> None:
    r = client.messages.create(**{**GREEDY, "max_tokens": 8}, messages=FRANCE,
                               system="You are a geography teacher.")
    assert "Paris" in _text(r)
    assert r.stop_reason == "end_turn"
    assert r.model.startswith("qwen2.5-coder-0.5b")  # the model that answered, by its name
    counted = client.messages.count_tokens(model=CLAUDE, messages=FRANCE,  # type: ignore[arg-type]
                                           system="You are a geography teacher.")
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == counted.input_tokens


def test_a_streamed_message_assembles(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "In one short sentence: what is the capital of France?"}]
    with client.messages.stream(**{**GREEDY, "max_tokens": 32}, messages=ask) as stream:  # type: ignore[arg-type]
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "Paris" in "".join(pieces)
    assert _text(final) == "".join(pieces)
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def _weather_call(message: Any) -> Any:
    assert message.stop_reason == "tool_use", message.content
    [call] = [b for b in message.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.input["city"].lower() == "berlin", call
    assert not _text(message).strip()
    return call


def test_a_tool_call_is_answered_after_its_result(client: anthropic.Anthropic) -> None:
    first = client.messages.create(**GREEDY, messages=BERLIN, tools=[WEATHER])  # type: ignore[arg-type, list-item]
    call = _weather_call(first)
    messages: Any = [*BERLIN, {"role": "assistant", "content": first.content},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": call.id, "content": RESULT},
                         FOLLOW_UP]}]
    r = client.messages.create(**GREEDY, messages=messages, tools=[WEATHER])  # type: ignore[list-item]
    said = _text(r)
    assert r.stop_reason == "end_turn" and "17" in said and "{" not in said, said


def test_a_streamed_tool_call(client: anthropic.Anthropic) -> None:
    with client.messages.stream(**GREEDY, messages=BERLIN, tools=[WEATHER]) as stream:  # type: ignore[arg-type, list-item]
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    call = _weather_call(final)
    assert "input_json" in kinds and call.id.startswith("toolu_")


def test_tool_choice_none_answers_in_words(client: anthropic.Anthropic) -> None:
    """With tool_choice none the tools stay out of the prompt and no reply is read as a
    call: the weather question gets words, never a tool_use block."""
    r = client.messages.create(**GREEDY, messages=BERLIN, tools=[WEATHER],  # type: ignore[arg-type]
                               tool_choice={"type": "none"})
    assert r.stop_reason in ("end_turn", "max_tokens"), r
    assert [b.type for b in r.content] == ["text"] and _text(r).strip()


def test_a_bad_request_is_the_sdks_bad_request_error(client: anthropic.Anthropic) -> None:
    """Anthropic's error shape through the real server: the SDK raises its own class
    with the API's error type and the request id."""
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(**{**GREEDY, "max_tokens": 0}, messages=FRANCE)  # type: ignore[arg-type]
    assert err.value.status_code == 400
    body: Any = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert err.value.request_id
