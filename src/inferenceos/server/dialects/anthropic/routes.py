"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

What the `anthropic` SDK sends and parses, on the same dialect core as the other APIs
(server/generation.py, tools.py, tool_calls.py, media_parts.py): the request is
translated by server/dialects/anthropic/convert.py, the reply rendered here as content blocks —
`thinking` (for templates with a reasoning section, server/reasoning.py), `text`,
then one `tool_use` block per call read from the text (held back while streaming, as
the other dialects do). `stop_reason`: `tool_use` when calls were read, else
`end_turn` (end of generation), `stop_sequence` (with the string), `max_tokens`, or
`model_context_window_exceeded` (the context ran out before `max_tokens`).

Streamed, it is SSE with named events in Anthropic's order: `message_start` (usage
with the prompt's tokens, from the engine's admission report), per block
`content_block_start` (the first followed by a `ping`, as Anthropic's streams have it),
`content_block_delta` (`thinking_delta`, `text_delta`, `input_json_delta`),
`content_block_stop`, then
`message_delta` (stop_reason, stop_sequence, cumulative usage) and `message_stop`;
more `ping`s every few seconds while a long prompt is processed. A failure after the
start is an `error` event in Anthropic's error shape.

`usage.input_tokens` counts the prompt tokens computed for this request and
`cache_read_input_tokens` those reused from the KV cache (their sum is the prompt);
`cache_creation_input_tokens` is 0 (caching is automatic, nothing is charged for it).
The `anthropic-version` and `anthropic-beta` headers are accepted, not checked.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from inferenceos.engine.chat_template import ChatMessage
from inferenceos.media.item import MEDIA_MARKER, MediaItem
from inferenceos.server.dialects.anthropic.convert import (
    chat_messages,
    has_media,
    sampling_of,
    tools_of,
)
from inferenceos.server.dialects.anthropic.schema import (
    ERROR_RESPONSES,
    CountTokensRequest,
    Message,
    MessagesRequest,
    ThinkingIn,
    TokensCount,
)
from inferenceos.server.errors import Dialect, anthropic_request_id, route_class
from inferenceos.server.generation import (
    Done,
    GenRequest,
    Run,
    call_in_thread,
    start_generation,
    until_disconnect,
)
from inferenceos.server.llama_shapes import stopping_word
from inferenceos.server.media_parts import decode_in_thread, media_set
from inferenceos.server.reasoning import Think
from inferenceos.server.reply import Delta, Final, read_reply, reply_events
from inferenceos.server.sse import ANTHROPIC_SSE, SSE_CONTENT, stream_response
from inferenceos.server.state import ServerState, state_of
from inferenceos.server.tool_calls import ParsedCall
from inferenceos.server.tools import ToolRequest
from inferenceos.server.vocab import vocab_for

router = APIRouter(prefix="/v1", tags=["anthropic"], responses=ERROR_RESPONSES,
                   route_class=route_class(Dialect.ANTHROPIC))
_SSE = SSE_CONTENT
PING_EVERY_S = 5.0  # while a long prompt is processed, a ping keeps proxies from timing out


async def _conversation(state: ServerState, body: CountTokensRequest
                        ) -> tuple[list[ChatMessage], str, tuple[MediaItem, ...]]:
    """The chat messages, prefill and media items of a request; images are decoded in
    a worker thread (CPU work on untrusted bytes), never on the event loop."""
    if not has_media(body):
        return (*chat_messages(body), ())
    media = media_set(state.settings)
    messages, prefill = await decode_in_thread(lambda: chat_messages(body, media))
    return messages, prefill, tuple(media.items)


def _think(thinking: ThinkingIn | None) -> Think:
    """Anthropic's `thinking`: "disabled" turns the reasoning section off, "enabled"
    keeps it within `budget_tokens`; "adaptive" (or none) leaves it to the template."""
    if thinking is None or thinking.type not in ("enabled", "disabled"):
        return Think()
    if thinking.type == "disabled":
        return Think(enabled=False)
    return Think(enabled=True, budget=thinking.budget_tokens)


def _usage(done: Done) -> dict[str, int]:
    g = done.metrics
    cached = min(g.cached_tokens, g.prompt_tokens)
    return {"input_tokens": g.prompt_tokens - cached, "output_tokens": g.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def _stop(done: Done, text: str, stops: tuple[str, ...], max_tokens: int,
          calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished generation whose raw text is `text`.
    Blocking when several stop sequences were given (reads the vocabulary)."""
    g = done.metrics
    if calls:
        return "tool_use", None
    if g.stop_reason == "length":
        full = g.completion_tokens >= max_tokens
        return ("max_tokens" if full else "model_context_window_exceeded"), None
    if g.stop_reason == "stop" and stops:
        tail = ""
        if len(stops) > 1:  # which one: the detokenized output holds it after the text
            tail = vocab_for(done.model.model.path).detokenize(done.output_ids)[len(text):]
        return "stop_sequence", stopping_word(stops, "stop", tail) or None
    return "end_turn", None


def _blocks(text: str, run: Run) -> tuple[list[dict[str, Any]], list[ParsedCall]]:
    """The content blocks of a whole reply, and the calls among them."""
    thinking, answer, calls = read_reply(text, run.tool_format, run.reasoning)
    blocks: list[dict[str, Any]] = []
    if thinking:
        blocks.append({"type": "thinking", "thinking": thinking, "signature": ""})
    if answer or not (blocks or calls):  # never an empty content list
        blocks.append({"type": "text", "text": answer})
    blocks += [_tool_use(c) for c in calls]
    return blocks, calls


def _tool_use(call: ParsedCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call.name,
            "input": call.arguments}


def _message(mid: str, model: str, content: list[dict[str, Any]], usage: dict[str, int],
             stop: tuple[str | None, str | None] = (None, None)) -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
            "usage": usage}


@router.post("/messages", response_model=None, responses={200: {
    "model": Message, "content": _SSE,
    "description": "A message, or SSE events (message_start ... message_stop) when stream "
                   "is true"}})
async def create_message(body: MessagesRequest, request: Request) -> Any:
    """A model reply in Anthropic's Messages API shape, streamed as named SSE events
    when `stream` is true."""
    state = state_of(request)
    messages, prefill, items = await _conversation(state, body)
    tools: ToolRequest | None = tools_of(body)
    name = state.model_name(body.model)
    sampling = sampling_of(body)
    req = GenRequest(name, sampling, messages=tuple(messages), tools=tools, media=items,
                     progress=body.stream, prefill=prefill, think=_think(body.thinking))
    run = await until_disconnect(request, start_generation(state, req))
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    if body.stream:
        stream = _Stream(run, mid, name, sampling.stop, body.max_tokens)
        response = stream_response(stream.events(), ANTHROPIC_SSE, run.close)
        response.headers["request-id"] = anthropic_request_id()
        return response

    async def whole() -> dict[str, Any]:
        text, done = await run.collect()
        blocks, calls = _blocks(text, run)
        stop = await call_in_thread(lambda: _stop(done, text, sampling.stop,
                                                  body.max_tokens, bool(calls)))
        return _message(mid, name, blocks, _usage(done), stop)

    return JSONResponse(await until_disconnect(request, whole()),
                        headers={"request-id": anthropic_request_id()})


@router.post("/messages/count_tokens", response_model=TokensCount)
async def count_tokens(body: CountTokensRequest, request: Request) -> Any:
    """How many tokens the request's prompt takes under the model's chat template
    (system, messages, tools; an image counts the cells its encoder tokens take)."""
    state = state_of(request)
    messages, prefill, items = await _conversation(state, body)
    tools = tools_of(body)
    name = state.model_name(body.model)

    def work() -> int:
        with state.manager.acquire(name) as lease:
            engine = lease.engine
            text = engine.chat_prompt(messages, tools=tools.tools if tools else None)
            text += prefill
            if not items:
                return len(engine.tokenize(text))
            cells = engine.media_tokens
            return (len(engine.tokenize(text.replace(MEDIA_MARKER, "")))
                    + sum(int(cells(m)) for m in items))

    return {"input_tokens": await call_in_thread(work)}


class _Stream:
    """The event sequence of one streamed reply (see the module docstring)."""

    def __init__(self, run: Run, mid: str, model: str, stops: tuple[str, ...],
                 max_tokens: int) -> None:
        self.run, self.mid, self.model = run, mid, model
        self.stops, self.max_tokens = stops, max_tokens
        self.index = -1
        self.kind: str | None = None  # the open block's type
        self.raw: list[str] = []  # the reply as generated, for the stop sequence

    def _open(self, kind: str) -> list[dict[str, Any]]:
        """Events that make a block of `kind` the open one."""
        if self.kind == kind:
            return []
        out = self._close()
        self.index += 1
        self.kind = kind
        block = ({"type": "text", "text": ""} if kind == "text"
                 else {"type": "thinking", "thinking": "", "signature": ""})
        return [*out, {"type": "content_block_start", "index": self.index,
                       "content_block": block}]

    def _close(self) -> list[dict[str, Any]]:
        if self.kind is None:
            return []
        self.kind = None
        return [{"type": "content_block_stop", "index": self.index}]

    def _delta(self, kind: str, piece: str) -> list[dict[str, Any]]:
        if not piece:
            return []
        delta = ({"type": "text_delta", "text": piece} if kind == "text"
                 else {"type": "thinking_delta", "thinking": piece})
        return [*self._open(kind), {"type": "content_block_delta", "index": self.index,
                                    "delta": delta}]

    def _calls(self, calls: list[ParsedCall]) -> list[dict[str, Any]]:
        out = self._close()
        for call in calls:
            self.index += 1
            block = _tool_use(call)
            out += [{"type": "content_block_start", "index": self.index,
                     "content_block": {**block, "input": {}}},
                    {"type": "content_block_delta", "index": self.index,
                     "delta": {"type": "input_json_delta",
                               "partial_json": json.dumps(call.arguments)}},
                    {"type": "content_block_stop", "index": self.index}]
        return out

    def _start(self, progress: tuple[int, int, int, float] | None) -> dict[str, Any]:
        total, cached = (progress[0], progress[1]) if progress else (0, 0)
        usage = {"input_tokens": total - cached, "output_tokens": 0,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}
        return {"type": "message_start",
                "message": {**_message(self.mid, self.model, [], usage)}}

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The events, with Anthropic's one `ping` right after the first block's start."""
        pinged = False
        async for event in self._events():
            yield event
            if not pinged and event["type"] == "content_block_start":
                pinged = True
                yield {"type": "ping"}

    async def _events(self) -> AsyncIterator[dict[str, Any]]:
        started = False
        last = time.monotonic()  # of the last event sent
        async with aclosing(reply_events(self.run)) as replies:
            async for d in replies:
                if not started:
                    started = True
                    progress = d.event.progress if isinstance(d, Delta) else None
                    yield self._start(progress)
                    if progress is not None:
                        continue
                if isinstance(d, Final):
                    for ev in await self._end(d):
                        yield ev
                    continue  # the last one: the loop ends
                if d.event.progress is not None:  # a long prompt is still being read
                    if time.monotonic() - last > PING_EVERY_S:
                        last = time.monotonic()
                        yield {"type": "ping"}
                    continue
                last = time.monotonic()
                if not d.event.text:
                    continue
                self.raw.append(d.event.text)
                for ev in [*self._delta("thinking", d.thought), *self._delta("text", d.text)]:
                    yield ev

    async def _end(self, final: Final) -> list[dict[str, Any]]:
        """The events after the last token: what was held back, the calls, the end."""
        out = [*self._delta("thinking", final.thought), *self._delta("text", final.text)]
        if self.index < 0 and not final.calls:  # never an empty content list
            out += self._open("text")
        out += self._calls(final.calls) if final.calls else self._close()
        raw, done, calls = "".join(self.raw), final.done, bool(final.calls)
        reason, seq = await call_in_thread(lambda: _stop(done, raw, self.stops,
                                                         self.max_tokens, calls))
        return [*out, {"type": "message_delta",
                       "delta": {"stop_reason": reason, "stop_sequence": seq},
                       "usage": _usage(done)},
                {"type": "message_stop"}]
