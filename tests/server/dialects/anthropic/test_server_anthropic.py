"""Anthropic's Messages API on tiny models, judged by the real `anthropic` SDK (and raw
SSE on the wire) against a real server: the message shape, the exact stream event
sequence, stop reasons, usage with cached prompt tokens, count_tokens, forced tool
calls as `tool_use` blocks, reasoning as `thinking` blocks, images to the tiny VLM (a real
`serve` process with its projector), and every error status in Anthropic's error shape.

The tiny models have random weights: what they write is noise, so the tests judge
shapes, counts and the server's own decisions (a forced call's grammar, a stop
sequence taken from a greedy reply), never the words.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from cli_helpers import start_serve
from faults.helpers import worker_pid
from inferenceos.server.dialects.anthropic.schema import Message
from inferenceos.server.reasoning import (
    Reasoning,
    ThinkingSplit,
    reasoning_of,
    split_reasoning,
)
from inferenceos.server.settings import ServerSettings
from server_harness import TINY_REQUEST, Harness, serving
from tiny_models import write_tiny_model
from tiny_vlm import IMAGE_TOKENS, RED
from tool_templates import TINY_HERMES_TEMPLATE

# a DeepSeek-R1-style template: its generation prompt opens the reasoning section
THINKER_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}"
    "{% endif %}")
WEATHER = {"name": "weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                            "required": ["city"], "additionalProperties": False}}
HI = [{"role": "user", "content": "hi"}]
# the body on the wire; the SDK (2.15) has no sampling arguments: they go in extra_body
BODY: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "temperature": 0, "messages": HI}
GREEDY: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "messages": HI,
                          "extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-anthropic")
    hermes = write_tiny_model(root / "hermes.gguf", chat_template=TINY_HERMES_TEMPLATE)
    thinker = write_tiny_model(root / "thinker.gguf", chat_template=THINKER_TEMPLATE)
    broken = write_tiny_model(root / "broken.gguf", seed=3)
    # the 6-layer shape: its 400-token reply must still be generating when the test reads
    # the first delta and kills the worker; the 2-layer one had finished all 400 tokens
    # by then once, beside a busy neighbour (the stream then ended well, no error event)
    victim = write_tiny_model(root / "victim.gguf", "wide", seed=4)
    with serving({"tiny": tiny_llama, "hermes": hermes, "thinker": thinker,
                  "broken": broken, "victim": victim}, root,
                 manager_kw={"base": replace(TINY_REQUEST, n_ctx=512)}) as h:
        size = broken.stat().st_size
        with open(broken, "r+b") as f:  # the weights cut off: llama.cpp refuses the load
            f.truncate(size // 2)
        yield h


@pytest.fixture
def client(server: Harness) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                               timeout=60)


def _sse(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs of an SSE body."""
    out = []
    for frame in response.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_a_message_has_anthropic_shape_and_usage(client: anthropic.Anthropic) -> None:
    r = client.messages.create(**GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.model == "tiny"
    assert r.id.startswith("msg_") and (r._request_id or "").startswith("req_")
    [block] = r.content
    assert block.type == "text" and block.text
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    assert r.usage.output_tokens == 8
    counted = client.messages.count_tokens(model="tiny", messages=HI).input_tokens
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == counted
    assert r.usage.cache_creation_input_tokens == 0


def test_the_body_on_the_wire(server: Harness) -> None:
    r = httpx.post(server.url + "/v1/messages", json=BODY, timeout=60)
    body = r.json()
    assert set(body) == {"id", "type", "role", "model", "content", "stop_reason",
                         "stop_sequence", "usage"}
    assert set(body["usage"]) == {"input_tokens", "output_tokens",
                                  "cache_creation_input_tokens", "cache_read_input_tokens"}
    Message.model_validate(body)  # what /openapi.json documents


def test_the_cached_prompt_is_reported_as_cache_read(client: anthropic.Anthropic) -> None:
    messages = [{"role": "user", "content": "a longer prompt, to reuse from the KV cache"}]
    first = client.messages.create(**{**GREEDY, "messages": messages})
    second = client.messages.create(**{**GREEDY, "messages": messages})
    whole = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    assert second.usage.cache_read_input_tokens and second.usage.cache_read_input_tokens > 0
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == whole
    assert second.usage.input_tokens < whole


def test_the_stream_is_anthropics_exact_event_sequence(server: Harness) -> None:
    r = httpx.post(server.url + "/v1/messages", timeout=60,
                   headers={"anthropic-version": "2023-06-01"},
                   json={**BODY, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["request-id"].startswith("req_")
    events = _sse(r)
    names = [name for name, _ in events]
    assert all(data["type"] == name for name, data in events)
    # as Anthropic's own streams: the ping right after the first block's start
    assert names[:4] == ["message_start", "content_block_start", "ping", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"] > 0
    assert events[1][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert all(d["type"] == "text_delta" for d in deltas)
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert end["usage"]["output_tokens"] == 8
    assert (end["usage"]["input_tokens"] + end["usage"]["cache_read_input_tokens"]
            == start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"])


def test_pings_while_the_prompt_is_read(server: Harness,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill progress becomes pings (every PING_EVERY_S; 0 here: at each report)
    between message_start and the first block, which the SDK skips."""
    from inferenceos.server.dialects.anthropic import routes as anthropic_routes

    monkeypatch.setattr(anthropic_routes, "PING_EVERY_S", 0.0)
    body = {**BODY, "stream": True,
            "messages": [{"role": "user", "content": "a prompt never seen before " * 12}]}
    names = [n for n, _ in _sse(httpx.post(server.url + "/v1/messages", json=body, timeout=60))]
    first_block = names.index("content_block_start")
    assert names[0] == "message_start" and "ping" in names[1:first_block], names
    assert names[first_block + 1] == "ping" and names[-1] == "message_stop"


def test_the_sdk_assembles_the_stream(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(**GREEDY)
    with client.messages.stream(**GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == streamed
    assert streamed == whole.content[0].text  # greedy: the same reply either way
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_ends_the_reply_and_is_named(client: anthropic.Anthropic,
                                                     stream: bool) -> None:
    text = client.messages.create(**{**GREEDY, "max_tokens": 12}).content[0].text
    stop = next(c for c in text[3:] if c.strip() and c not in text[:3])  # first occurrence
    kw = {**GREEDY, "max_tokens": 12, "stop_sequences": ["\x00never", stop]}
    if stream:
        with client.messages.stream(**kw) as s:
            r = s.get_final_message()
    else:
        r = client.messages.create(**kw)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == text[:text.index(stop)]


def test_a_final_assistant_turn_is_a_prefill(client: anthropic.Anthropic,
                                            server: Harness) -> None:
    """The reply continues the prefill, as a completion of the rendered prompt plus
    the prefill does (llama.cpp's own route, greedy), without repeating it."""
    messages: Any = [*HI, {"role": "assistant", "content": "Sure, "}]
    r = client.messages.create(**{**GREEDY, "messages": messages})
    prompt = httpx.post(server.url + "/apply-template", timeout=60,
                        json={"model": "tiny", "messages": HI}).json()["prompt"]
    done = httpx.post(server.url + "/completion", timeout=60, json={
        "model": "tiny", "prompt": prompt + "Sure, ", "n_predict": 8, "temperature": 0})
    assert r.content[0].type == "text" and r.content[0].text == done.json()["content"]
    counted = client.messages.count_tokens(model="tiny", messages=messages).input_tokens
    assert counted == done.json()["tokens_evaluated"]
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == counted


def test_output_config_format_constrains_the_reply(client: anthropic.Anthropic) -> None:
    schema = WEATHER["input_schema"]
    r = client.messages.create(**{**GREEDY, "max_tokens": 60},
                               output_config={"format": {"type": "json_schema",
                                                         "schema": schema}})
    assert json.loads(r.content[0].text)["city"] in ("Paris", "Oslo")  # type: ignore[union-attr]
    long = {"type": "json_schema", "schema": {"type": "string", "minLength": 30}}
    text = client.messages.create(**{**GREEDY, "max_tokens": 60},
                                  output_config={"format": long}).content[0].text  # type: ignore[typeddict-item]
    # no end of text before the string's 30 characters (the reply may stop at max_tokens)
    assert text.startswith('"') and len(text) > 30  # type: ignore[union-attr]


def test_a_full_context_is_model_context_window_exceeded(client: anthropic.Anthropic) -> None:
    """max_tokens beyond the context: the reply stops where the context ends (its
    grammar, a string longer than the context, rules out an earlier end of text)."""
    endless = {"type": "json_schema", "schema": {"type": "string", "minLength": 4000}}
    r = client.messages.create(**{**GREEDY, "max_tokens": 100_000},
                               output_config={"format": endless})  # type: ignore[typeddict-item]
    assert r.stop_reason == "model_context_window_exceeded"
    prompt = r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
    assert prompt + r.usage.output_tokens >= 500  # the whole 512-token context, about


def test_count_tokens_counts_system_and_tools(client: anthropic.Anthropic) -> None:
    plain = client.messages.count_tokens(model="hermes", messages=HI).input_tokens
    system = client.messages.count_tokens(model="hermes", messages=HI,
                                          system="be brief").input_tokens
    blocks = client.messages.count_tokens(
        model="hermes", messages=HI, system=[{"type": "text", "text": "be brief"}]).input_tokens
    tools = client.messages.count_tokens(model="hermes", messages=HI,
                                         tools=[WEATHER]).input_tokens  # type: ignore[list-item]
    assert plain < system == blocks and plain < tools


# parallel calls allowed (Anthropic's default), the random model writes calls until
# max_tokens cuts one: the whole ones before it are the reply's calls
@pytest.mark.parametrize("choice", [{"type": "any", "disable_parallel_tool_use": True},
                                    {"type": "tool", "name": "weather",
                                     "disable_parallel_tool_use": True},
                                    {"type": "any"}])
def test_a_forced_call_is_a_tool_use_block(client: anthropic.Anthropic,
                                           choice: dict[str, Any]) -> None:
    kw: Any = {"model": "hermes", "max_tokens": 120, "extra_body": {"temperature": 0},
               "tools": [WEATHER],
               "tool_choice": choice, "messages": [{"role": "user", "content": "weather?"}]}
    r = client.messages.create(**kw)
    assert r.stop_reason == "tool_use"
    calls = [b for b in r.content if b.type == "tool_use"]
    assert len(calls) == 1 if choice.get("disable_parallel_tool_use") else len(calls) >= 1
    assert all(b.type == "tool_use" for b in r.content)  # no call markup left as text
    call = calls[0]
    assert call.name == "weather" and call.input["city"] in ("Paris", "Oslo")
    assert call.id.startswith("toolu_")
    with client.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert [b.input for b in streamed] == [b.input for b in calls]  # the SDK parsed the deltas
    assert any(e.type == "input_json" for e in events)
    # the result goes back as a tool_result: the template renders it, and a reply comes
    reply = client.messages.create(
        model="hermes", max_tokens=4, tools=[WEATHER],  # type: ignore[list-item]
        messages=[kw["messages"][0], {"role": "assistant", "content": r.content},  # type: ignore[typeddict-item]
                  {"role": "user", "content": [
                      {"type": "tool_result", "tool_use_id": c.id, "content": "sunny"}
                      for c in calls]}])
    assert reply.usage.output_tokens > 0


def test_tool_choice_none_leaves_tools_out(client: anthropic.Anthropic) -> None:
    kw: Any = {"model": "hermes", "messages": HI}
    plain = client.messages.count_tokens(**kw).input_tokens
    none = client.messages.count_tokens(**kw, tools=[WEATHER],
                                        tool_choice={"type": "none"}).input_tokens
    assert none == plain


def test_reasoning_comes_back_as_thinking_blocks(client: anthropic.Anthropic) -> None:
    kw: Any = {**GREEDY, "model": "thinker"}
    r = client.messages.create(**kw)
    # the prompt opened <think>; the random model never closes it: all of it is reasoning
    [block] = r.content
    assert block.type == "thinking" and block.thinking and block.signature == ""
    with client.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking"]
    assert final.content[0].thinking == block.thinking  # type: ignore[union-attr]


def test_thinking_split_reads_both_spellings() -> None:
    assert reasoning_of("{{ '<|im_start|>assistant\\n' }}") is None
    assert reasoning_of(THINKER_TEMPLATE) == Reasoning(starts_inside=True)
    assert reasoning_of("{% if m.reasoning %}<think>{{ r }}</think>{% endif %}") == \
        Reasoning(starts_inside=False)
    reply = "  <think>\nplan it</think>\n\nthe answer"
    assert split_reasoning(reply, Reasoning(False)) == ("\nplan it", "the answer")
    assert split_reasoning("no tags at all", Reasoning(False)) == ("", "no tags at all")
    assert split_reasoning("inside</think> out", Reasoning(True)) == ("inside", "out")
    split = ThinkingSplit(Reasoning(False))  # fed a character at a time: tags split
    pieces = [split.feed(c) for c in reply]
    split.finish()
    assert "".join(t for t, _ in pieces) + "" == "\nplan it"
    assert (split.thinking, split.text) == ("\nplan it", "the answer")
    assert all("<" not in t and ">" not in t for t, _ in pieces)


# -- errors -------------------------------------------------------------------------


def _error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert body["request_id"].startswith("req_")
    message: str = body["error"]["message"]
    return message


@pytest.mark.parametrize("body, words", [
    ({"model": "tiny", "messages": HI}, "max_tokens"),
    ({**BODY, "temperature": 1.5}, "temperature"),
    ({**BODY, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, "document"),
    ({**BODY, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
    ({**BODY, "messages": [*HI, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]}]}, "prefill"),
    ({**BODY, "messages": [{"role": "assistant", "content": "Sure"}]}, "user message"),
    ({**BODY, "system": [{"type": "image", "source": {"type": "base64"}}]}, "system"),
    ({**BODY, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}, "file"),
    ({**BODY, "model": "hermes", "tool_choice": {"type": "tool", "name": "nope"},
      "tools": [WEATHER]}, "nope"),
    ({**BODY, "model": "tiny", "tools": [WEATHER]}, "does not support tools"),
])
def test_bad_requests_are_invalid_request_errors(server: Harness, body: dict[str, Any],
                                                 words: str) -> None:
    r = httpx.post(server.url + "/v1/messages", json=body, timeout=60)
    assert words in _error(r, 400, "invalid_request_error")


def test_sdk_raises_its_own_error_classes(client: anthropic.Anthropic,
                                          server: Harness) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(**{**GREEDY, "model": "claude-sonnet-4-5"})
    assert err.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    # the body's id in the request-id header too, where the SDK's errors read it
    assert err.value.request_id == err.value.body["request_id"]  # type: ignore[index]
    _error(httpx.post(server.url + "/v1/messages/batches", json={}), 404, "not_found_error")
    _error(httpx.post(server.url + "/v1/messages", json=BODY,  # DNS rebinding
                      headers={"Host": "attacker.test"}), 403, "permission_error")
    with pytest.raises(anthropic.InternalServerError) as err:  # the weights are cut off
        client.messages.create(**{**GREEDY, "model": "broken"})
    assert err.value.status_code == 500
    assert err.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    server.state.draining = True  # shutting down: Anthropic's "overloaded"
    try:
        with pytest.raises(anthropic.OverloadedError) as over:
            client.messages.create(**GREEDY)
    finally:
        server.state.draining = False
    assert over.value.status_code == 529
    assert over.value.response.headers["retry-after"]


def test_a_failure_mid_stream_is_an_error_event(server: Harness) -> None:
    """The worker killed while a reply streams: the headers (200) are sent, so the
    stream ends with Anthropic's `error` event (overloaded: the next request restarts
    the worker), never a cut connection; the SDK raises it as its error class."""
    long = {"type": "json_schema", "schema": {"type": "string", "minLength": 380}}
    body = {**BODY, "model": "victim", "max_tokens": 400, "stream": True,
            "output_config": {"format": long}}
    names: list[str] = []
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("event: "):
                names.append(line[7:])
            if names[-1:] == ["content_block_delta"]:
                os.kill(worker_pid(server, "victim"), signal.SIGKILL)
                break
        rest = "\n".join(lines)
    assert r.status_code == 200
    [frame] = [f for f in rest.split("\n\n") if f.startswith("event: error")]
    error = json.loads(frame.split("data: ", 1)[1])
    assert error["type"] == "error" and error["error"]["type"] == "overloaded_error", error
    assert "message_stop" not in rest
    sdk = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    assert sdk.messages.create(**{**GREEDY, "model": "victim"}).usage.output_tokens == 8
    kw: Any = {"model": "victim", "max_tokens": 400, "messages": HI,
               "extra_body": {"temperature": 0, "output_config": {"format": long}}}
    killed = False
    with pytest.raises(anthropic.APIStatusError) as err, sdk.messages.stream(**kw) as s:
        for event in s:
            if event.type == "content_block_delta" and not killed:
                killed = True
                os.kill(worker_pid(server, "victim"), signal.SIGKILL)
    assert err.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


@pytest.fixture(scope="module")
def guarded(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """One request at a time, none queued, a key and a small body limit."""
    root = tmp_path_factory.mktemp("server-anthropic-guarded")
    settings = ServerSettings(api_key="sekrit", max_body_bytes=4096, max_running=1,
                              max_waiting=0)
    with serving({"tiny": tiny_llama}, root, settings=settings,
                 manager_kw={"base": replace(TINY_REQUEST, n_ctx=512)}) as h:
        yield h


def test_the_api_key_is_taken_from_x_api_key(guarded: Harness) -> None:
    url = guarded.url + "/v1/messages"
    _error(httpx.post(url, json=BODY), 401, "authentication_error")
    _error(httpx.post(url, json=BODY, headers={"x-api-key": "wrong"}), 401,
           "authentication_error")
    ok = httpx.post(url, json=BODY, timeout=60,
                    headers={"x-api-key": "sekrit", "anthropic-version": "2023-06-01"})
    assert ok.status_code == 200 and ok.json()["type"] == "message"
    sdk = anthropic.Anthropic(base_url=guarded.url, api_key="sekrit", max_retries=0)
    assert sdk.messages.create(**GREEDY).usage.output_tokens == 8
    with pytest.raises(anthropic.AuthenticationError) as err:  # refused before the app
        anthropic.Anthropic(base_url=guarded.url, api_key="no", max_retries=0
                            ).messages.create(**GREEDY)
    assert (err.value.request_id or "").startswith("req_")


def test_too_large_and_rate_limited(guarded: Harness) -> None:
    url, key = guarded.url + "/v1/messages", {"x-api-key": "sekrit"}
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 5000}]}
    _error(httpx.post(url, json=big, headers=key), 413, "request_too_large")
    # a stream that keeps the one running slot: its grammar (a long JSON string) rules
    # out an early end of text, which the random model may otherwise write
    long = {"type": "json_schema", "schema": {"type": "string", "minLength": 380}}

    def refused_while_held() -> httpx.Response:
        opened, release = threading.Event(), threading.Event()

        def hold() -> None:
            with httpx.stream("POST", url, headers=key, timeout=60, json={
                    **BODY, "max_tokens": 400, "stream": True,
                    "output_config": {"format": long}}) as r:
                for _ in r.iter_lines():
                    opened.set()
                    if release.wait(30):
                        break

        t = threading.Thread(target=hold)
        t.start()
        try:
            assert opened.wait(30)
            return httpx.post(url, json=BODY, headers=key, timeout=60)
        finally:
            release.set()
            t.join(60)

    # the tiny model writes the 400 tokens in ~0.3 s: on a busy machine the held
    # stream can end before the second request arrives (then it is served: 200, seen
    # once in a full suite), so the case is tried a few times; one 429 must come
    for _ in range(5):
        r = refused_while_held()
        if r.status_code != 200:
            break
    assert "retry-after" in r.headers
    _error(r, 429, "rate_limit_error")


# -- images -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vlm(tiny_vlm_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[str]:
    """A real `inferenceos serve` process of the tiny VLM and its projector (the base
    URL): images reach it as a user's would, through the command, not the harness."""
    model, projector = tiny_vlm_pair
    home = tmp_path_factory.mktemp("anthropic-vlm")
    proc, base = start_serve(str(model), "--mmproj", str(projector), "--any-model",
                             "--ctx", "512", INFERENCEOS_HOME=str(home))
    try:
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def _image(raw: bytes) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": base64.b64encode(raw).decode()}}


def test_an_image_reaches_the_vlm(vlm: str) -> None:
    sdk = anthropic.Anthropic(base_url=vlm, api_key="x", max_retries=0, timeout=60)
    content: Any = [{"type": "text", "text": "look"}, _image(RED)]
    kw: Any = {"model": "vlm", "max_tokens": 4, "extra_body": {"temperature": 0}}
    r = sdk.messages.create(**kw, messages=[{"role": "user", "content": content}])
    text = sdk.messages.create(**kw, messages=[{"role": "user", "content": "look"}])
    assert r.content[0].type == "text" and r.usage.output_tokens == 4
    seen = r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
    plain = text.usage.input_tokens + (text.usage.cache_read_input_tokens or 0)
    assert seen >= plain + IMAGE_TOKENS - 2  # the image's cells are in the prompt
    counted = sdk.messages.count_tokens(model="vlm", messages=[
        {"role": "user", "content": content}]).input_tokens
    assert abs(counted - seen) <= 2  # the marker's own text splits a little differently
    with sdk.messages.stream(**kw, messages=[{"role": "user", "content": content}]) as s:
        events = list(s)
        final = s.get_final_message()
    start = next(e for e in events if e.type == "message_start").message.usage
    assert start.input_tokens + (start.cache_read_input_tokens or 0) == seen
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == seen
    url = {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1:1/x.png"}}
    r2 = httpx.post(vlm + "/v1/messages", timeout=60, json={
        "model": "vlm", "max_tokens": 4, "messages": [{"role": "user", "content": [url]}]})
    _error(r2, 400, "invalid_request_error")
