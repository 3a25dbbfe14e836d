"""Streaming response bodies, framed once for every API: SSE `data:` events (OpenAI,
with `data: [DONE]` at the end; llama-server, without), SSE named events (`event:
TYPE` / `data:`; Anthropic, and OpenAI's Responses API with sequence numbers) and
NDJSON (Ollama).

Each takes an async iterator of JSON-able dicts. An exception in the middle of a stream
(headers already sent) is reported in-band, in the API's error shape and framed like
the other events, and ends the stream; it never closes the connection without a word.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from inferenceos.server.errors import APIError, Dialect, api_error_from, error_body

_NO_BUFFER = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
Cleanup = Callable[[], Awaitable[None]]
Event = dict[str, Any]


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that runs `cleanup` however it ends, even when the client
    left before the body iterator ever started (so a queue slot is never leaked)."""

    def __init__(self, content: AsyncIterator[str], media_type: str,
                 cleanup: Cleanup | None) -> None:
        super().__init__(content, media_type=media_type, headers=_NO_BUFFER)
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._cleanup is not None:
                await self._cleanup()


@dataclass(frozen=True)
class Framing:
    """How one API writes a stream: `frame(event, index)` is an event's text on the
    wire (`index`: how many events came before it); `error(e, index)` the event a
    failure becomes (framed like the others); `end` is written after the last event,
    whether the stream ended or failed."""

    media_type: str
    frame: Callable[[Event, int], str]
    error: Callable[[APIError, int], Event]
    end: str = ""


def _encoder() -> Callable[[Any], str]:
    """`json.dumps(obj, ensure_ascii=False, separators=(",", ":"))`, the same text, with
    the C encoder made once instead of per call (an event per token of every stream;
    without circular-reference checks: an event is a tree)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the standard call
        return lambda obj: json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    default = json.JSONEncoder().default
    enc = make(None, default, json.encoder.encode_basestring, None, ":", ",", False, False,
               True)
    return lambda obj: "".join(enc(obj, 0))


_dumps = _encoder()


# The OpenAPI description of one event of a text/event-stream response, as the
# OpenAPI 3.2 text gives it for the media type (and schema checkers such as
# schemathesis read `schema` as, on 3.0 and 3.1): the parsed fields of an event, each a
# string (retry an integer); the JSON in `data` is each dialect's own. Declaring the
# whole stream a string was wrong: an event is validated one at a time.
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                   "id": {"type": "string"}, "retry": {"type": "integer"}},
}
SSE_CONTENT: dict[str, Any] = {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}}


def _data(event: Event, _: int) -> str:
    return f"data: {_dumps(event)}\n\n"


def _named(event: Event, _: int) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def _numbered(event: Event, index: int) -> str:
    return _named({**event, "sequence_number": index}, index)


def _line(event: Event, _: int) -> str:
    return _dumps(event) + "\n"


def _openai_error(e: APIError, _: int) -> Event:
    return error_body(Dialect.OPENAI, e.status, e.message, e.code)


def _anthropic_error(e: APIError, _: int) -> Event:
    return error_body(Dialect.ANTHROPIC, e.status, e.message)


OPENAI_SSE = Framing("text/event-stream", _data, _openai_error, "data: [DONE]\n\n")
LLAMACPP_SSE = Framing("text/event-stream", _data, _openai_error)  # no [DONE], as llama-server
ANTHROPIC_SSE = Framing("text/event-stream", _named, _anthropic_error)
RESPONSES_SSE = Framing("text/event-stream", _numbered, lambda e, n: {
    "type": "error", "code": e.code, "message": e.message, "param": None,
    "sequence_number": n})
NDJSON = Framing("application/x-ndjson", _line,
                 lambda e, _: error_body(Dialect.OLLAMA, e.status, e.message))


MAX_COALESCED = 64  # events written in one frame at most (a client far behind)


async def framed(events: AsyncIterator[Event], framing: Framing,
                ready: Callable[[], bool] | None = None) -> AsyncIterator[str]:
    """The framed events; with `ready` (true while the next event is already there:
    the stream is behind its generation), the events that wait are framed into one
    body chunk, one write through the middleware and the socket for them all."""
    sent = 0
    held: list[str] = []
    try:
        async for event in events:
            held.append(framing.frame(event, sent))
            sent += 1
            if ready is not None and len(held) < MAX_COALESCED and ready():
                continue
            yield held[0] if len(held) == 1 else "".join(held)
            held.clear()
        if held:
            yield "".join(held)
    except Exception as exc:
        held.append(framing.frame(framing.error(api_error_from(exc), sent), sent))
        yield "".join(held)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    if framing.end:
        yield framing.end


def stream_response(events: AsyncIterator[Event], framing: Framing,
                    cleanup: Cleanup | None = None,
                    ready: Callable[[], bool] | None = None) -> ClosingStreamingResponse:
    """`events` as `framing` writes them; `cleanup` runs however the response ends.
    `ready()`: whether `events`' next event is there already (it is then written in
    one chunk with this one); only for a stream whose every engine event becomes an
    event of its own (else a frame could wait for an event that never comes)."""
    return ClosingStreamingResponse(framed(events, framing, ready), framing.media_type,
                                    cleanup)


def sse_response(events: AsyncIterator[Event],
                 cleanup: Cleanup | None = None) -> ClosingStreamingResponse:
    """`data: {...}` events, then `data: [DONE]` (text/event-stream), as OpenAI streams."""
    return stream_response(events, OPENAI_SSE, cleanup)


def ndjson_response(events: AsyncIterator[Event],
                    cleanup: Cleanup | None = None) -> ClosingStreamingResponse:
    """One JSON object per line (application/x-ndjson), as Ollama streams."""
    return stream_response(events, NDJSON, cleanup)
