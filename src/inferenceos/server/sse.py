"""Streaming response bodies: SSE for OpenAI, NDJSON for Ollama.

Both take an async iterator of JSON-able dicts. An exception in the middle of a stream
(headers already sent) is reported in-band, in the API's error shape, and ends the
stream; it never closes the connection without a word.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from inferenceos.server.errors import api_error_from, error_body

_NO_BUFFER = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
Cleanup = Callable[[], Awaitable[None]]


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


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


async def _sse_body(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    try:
        async for event in events:
            yield f"data: {_dumps(event)}\n\n"
    except Exception as exc:
        e = api_error_from(exc)
        yield f"data: {_dumps(error_body('/v1/', e.status, e.message, e.code))}\n\n"
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    yield "data: [DONE]\n\n"


def sse_response(events: AsyncIterator[dict[str, Any]],
                 cleanup: Cleanup | None = None) -> StreamingResponse:
    """`data: {...}` events, then `data: [DONE]` (text/event-stream)."""
    return ClosingStreamingResponse(_sse_body(events), "text/event-stream", cleanup)


async def _ndjson_body(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    try:
        async for event in events:
            yield _dumps(event) + "\n"
    except Exception as exc:
        yield _dumps({"error": api_error_from(exc).message}) + "\n"
    finally:
        await events.aclose()  # type: ignore[attr-defined]


def ndjson_response(events: AsyncIterator[dict[str, Any]],
                    cleanup: Cleanup | None = None) -> StreamingResponse:
    """One JSON object per line (application/x-ndjson), as Ollama streams."""
    return ClosingStreamingResponse(_ndjson_body(events), "application/x-ndjson", cleanup)
