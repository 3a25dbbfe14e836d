"""Run the app under uvicorn with a graceful shutdown.

On SIGINT/SIGTERM (or `begin_shutdown()`): new generation requests get 503, uvicorn stops
accepting connections and waits for in-flight ones; streams still running after
`grace_s` are cancelled, which ends them cleanly (a last chunk with a finish reason,
then `data: [DONE]` / a `done: true` line) rather than cutting the connection. Then the
process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn
from fastapi import FastAPI

from inferenceos.server.direct_stream import with_transport
from inferenceos.server.state import ServerState

# An idle TLS connection that uvicorn closes at shutdown waits for the client's
# close_notify (asyncio's ssl_shutdown_timeout, 30 s), and uvicorn waits for every
# connection: one idle keep-alive client held `serve --tls-*` 15.5 s past its drain.
# A close still pending after this long is cut instead (the client is idle: it loses
# nothing but the courtesy of the TLS goodbye).
CLOSE_PENDING_S = 1.0


class GracefulServer(uvicorn.Server):
    """uvicorn.Server that drains generation streams before exiting."""

    def __init__(self, config: uvicorn.Config, state: ServerState, grace_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.grace_s = grace_s
        self._timer: threading.Timer | None = None

    def begin_shutdown(self) -> None:
        """Start draining: refuse new work, cancel what still runs after the grace."""
        if not self.state.draining:
            self.state.draining = True
            self._timer = threading.Timer(self.grace_s, self.state.cancel_all)
            self._timer.daemon = True
            self._timer.start()
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, except that the SIGINT/SIGTERM that started the graceful shutdown
        is not raised again once it is done (uvicorn re-raises it, so `serve` died by
        SIGTERM, status -15, or printed an interruption): the drain is its handling, and
        the exit status is 0."""
        with super().capture_signals():
            try:
                yield
            finally:
                getattr(self, "_captured_signals", []).clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, with closes that hang on an idle peer cut short."""
        cutter = asyncio.create_task(self._cut_pending_closes())
        try:
            await super().shutdown(sockets)
        finally:
            cutter.cancel()

    async def _cut_pending_closes(self) -> None:
        """Abort any connection whose transport has been closing for CLOSE_PENDING_S.

        A connection uvicorn is still serving (a stream) is not closing, so it is left
        to drain; only closes already asked for and not finished are cut."""
        loop = asyncio.get_running_loop()
        since: dict[int, float] = {}
        while True:
            now = loop.time()
            for conn in list(self.server_state.connections):
                transport = getattr(conn, "transport", None)
                if transport is None or not transport.is_closing():
                    continue
                if now - since.setdefault(id(conn), now) >= CLOSE_PENDING_S:
                    transport.abort()
            await asyncio.sleep(0.1)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first:
            self.begin_shutdown()


def make_server(app: FastAPI, host: str, port: int, grace_s: float = 10.0,
                log_level: str = "warning", tls_cert: str | None = None,
                tls_key: str | None = None) -> GracefulServer:
    """A server for `app` (built by `create_app`), not yet started. With `tls_cert` and
    `tls_key` (PEM files) it speaks HTTPS only (uvicorn's own TLS; the files are read
    when the server starts, so a bad one fails there, before any request)."""
    config = uvicorn.Config(
        with_transport(app), host=host, port=port, log_level=log_level, access_log=False,
        timeout_graceful_shutdown=int(grace_s) + 5, lifespan="on",
        timeout_keep_alive=5, server_header=False,
        ssl_certfile=tls_cert, ssl_keyfile=tls_key,
    )
    return GracefulServer(config, app.state.ios, grace_s)
