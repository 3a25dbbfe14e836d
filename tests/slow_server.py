"""A loopback HTTP server that takes every connection at once and answers only when the
test releases it: how tests show a client a busy server (and then an answer) without
sleeping. Beside it, a port where nothing listens (an absent server), and a reader of a
subprocess's lines that a test can wait on.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any

HOLD_LIMIT_S = 120  # a test that never releases still ends: the answers go then


@dataclass(frozen=True)
class Answer:
    """What a route answers: `body` (JSON-able, or str / bytes sent as they are) with
    `status`, after the release when `held`. `first`, when given, goes at once (the
    head and these bytes) and the body follows the release: a stream that stalls."""

    body: Any
    status: int = 200
    held: bool = True
    first: bytes = b""


@dataclass
class Asked:
    """One request as it arrived."""

    method: str
    path: str
    body: Any  # parsed JSON, or None
    authorization: str | None


@dataclass
class HeldServer:
    """The running server: its `url` and `port`; `release` lets every held answer go
    (those waiting, and all later ones); `asked` lists the requests in arrival order."""

    url: str
    port: int
    release: threading.Event = field(default_factory=threading.Event)
    asked: list[Asked] = field(default_factory=list)


def _encode(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    return body.encode() if isinstance(body, str) else json.dumps(body).encode()


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up before the answer: its broken pipe is expected


@contextmanager
def held_server(routes: dict[str, Answer]) -> Iterator[HeldServer]:
    """A server answering `routes` (the path without its query; any other path: 404
    at once, Ollama-style error), each held answer only once `release` is set."""
    held: HeldServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def _answer(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(size) if size else b""
            path = self.path.split("?")[0]
            held.asked.append(Asked(self.command, path, json.loads(raw) if raw else None,
                                    self.headers.get("Authorization")))
            ans = routes.get(path) or Answer({"error": f"no route {path}"}, 404, held=False)
            data = _encode(ans.body)
            if ans.first:  # the head and a first part now, the rest after the release
                self.send_response(ans.status)
                self.end_headers()
                self.wfile.write(ans.first)
                self.wfile.flush()
                held.release.wait(HOLD_LIMIT_S)
                self.wfile.write(data)
                return
            if ans.held:
                held.release.wait(HOLD_LIMIT_S)
            self.send_response(ans.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = _Quiet(("127.0.0.1", 0), Handler)
    port = int(server.server_address[1])
    held = HeldServer(f"http://127.0.0.1:{port}", port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield held
    finally:
        held.release.set()
        server.shutdown()
        server.server_close()


@contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening, kept for the block: a connection there
    is refused, and no other process can start listening on it meanwhile."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


class Lines:
    """A text pipe's lines as they come (read by a thread), so that a test waits for
    the next one with a bound rather than blocking for ever on a process that hangs."""

    def __init__(self, pipe: IO[str] | None) -> None:
        assert pipe is not None, "the process's pipe was not opened"
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def next(self, timeout: float = 60) -> str | None:
        """The next line; None once the pipe is closed. AssertionError when none comes
        within `timeout` seconds."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s") from None

    def rest(self, timeout: float = 60) -> list[str]:
        """The lines left until the pipe closes."""
        out: list[str] = []
        while (line := self.next(timeout)) is not None:
            out.append(line)
        return out
