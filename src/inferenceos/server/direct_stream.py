"""A streamed reply that the model worker writes to the client itself (issue 44).

Through the pipe, each token of each stream woke this process, which framed it and
wrote it: on a small machine that took a core from the compute threads once per token,
mid-graph. `DirectStream` writes the headers and the first events as any stream does,
then hands the connection to the worker (`Run.attach`, engine/worker/direct.py), which
frames the following tokens from the dialect's `FrameSpec` and writes each step's in
one send after the step. This process wakes again only for the stream's end: the
worker's report (`Wrote`: what it wrote, and any bytes the socket had not taken yet,
written here first), then the final event, written here as always.

A stream is handed over only where the bytes would be the same: a plain (not TLS)
HTTP/1.1 connection of uvicorn's, whose transport has nothing waiting to be written,
a dialect that gives a `FrameSpec`, an engine with a worker pipe. Anything else, or
`server.direct_writes` off, streams as `ClosingStreamingResponse` does. A client that
leaves is seen by either side: here by the disconnect (the generation is cancelled, as
for any stream), there by the failed send (the worker cancels the stream itself).

`with_transport(app)` is the outermost layer of `serve`'s app: it finds the
connection's transport (the owner of uvicorn's `send`) and puts it in the scope.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from starlette.types import ASGIApp, Receive, Scope, Send

from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.server.generation import Run
from inferenceos.server.sse import (
    Cleanup,
    ClosingStreamingResponse,
    Event,
    Framing,
    framed,
    stream_response,
)

TRANSPORT = "inferenceos.transport"  # the scope key `with_transport` sets


class with_transport:
    """`app`, with each HTTP request's transport in `scope[TRANSPORT]` where the server
    is uvicorn (its `send` is a bound method of the request's cycle, which holds it).
    `.app` is the app wrapped."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if isinstance(transport, asyncio.Transport):
                scope[TRANSPORT] = transport
        await self.app(scope, receive, send)


def _plain_socket(scope: Scope) -> tuple[asyncio.Transport, int] | None:
    """(transport, socket descriptor) of a connection whose stream a worker may write:
    HTTP/1.1 (chunked bodies, which the FrameSpec writes), no TLS, open."""
    transport = scope.get(TRANSPORT)
    if not isinstance(transport, asyncio.Transport) or scope.get("http_version") != "1.1" \
            or scope.get("method") == "HEAD" or transport.is_closing() \
            or transport.get_extra_info("sslcontext") is not None:
        return None
    sock = transport.get_extra_info("socket")
    fd = sock.fileno() if sock is not None else -1
    return (transport, fd) if fd >= 0 else None


class DirectStream(ClosingStreamingResponse):
    """`ClosingStreamingResponse` of `run`'s events, handed to the worker after the
    first write that leaves nothing waiting (see the module contract). `frame()`: the
    dialect's FrameSpec for the stream's next token (None: not this stream)."""

    def __init__(self, content: AsyncIterator[str], media_type: str,
                 cleanup: Cleanup | None, run: Callable[[], Run],
                 frame: Callable[[], FrameSpec | None]) -> None:
        super().__init__(content, media_type, cleanup)
        self._run, self._frame = run, frame
        self._conn: tuple[asyncio.Transport, int] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._conn = _plain_socket(scope)
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        """Starlette's, with the hand-over after a write (one try per write until one
        takes: an event read but not yet written, or the stream's end in line, defers
        it)."""
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        handed = self._conn is None
        async for chunk in self.body_iterator:
            body = chunk.encode() if isinstance(chunk, str) else bytes(chunk)
            await send({"type": "http.response.body", "body": body, "more_body": True})
            if not handed:
                handed = self._hand_over()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _hand_over(self) -> bool:
        """Attach the stream to its worker; True once done, or once it never will be."""
        assert self._conn is not None
        transport, fd = self._conn
        if transport.is_closing():
            return True
        if transport.get_write_buffer_size():  # the socket is behind: not yet
            return False
        frame = self._frame()
        if frame is None:
            return True
        run = self._run()
        frame = replace(frame, interval_s=run.state.settings.stream_interval_ms / 1000)
        return run.attach(frame, fd, transport.write)


def direct_response(events: AsyncIterator[Event], framing: Framing, cleanup: Cleanup,
                    run: Callable[[], Run], frame: Callable[[], FrameSpec | None],
                    enabled: bool = True, ready: Callable[[], bool] | None = None
                    ) -> ClosingStreamingResponse:
    """`events` streamed as `framing` writes them (server/sse.py `stream_response`, with
    its `ready`), the worker writing its tokens where it can (`enabled`: the request was
    sent as one the worker may write, `GenRequest.direct`). The dialect's `events` must
    skip the worker's reports (events whose `written` is not None): counted, never
    sent."""
    if not enabled:
        return stream_response(events, framing, cleanup, ready)
    return DirectStream(framed(events, framing, ready), framing.media_type, cleanup, run,
                        frame)


__all__ = ["TRANSPORT", "DirectStream", "direct_response", "with_transport"]
