"""A client's disconnect stops its generation as an event (issue 48's "events, not
polls"): the server learns of it from the connection's `http.disconnect`, not by asking
every 0.25 s, and the engine's stream is woken by its cancel, not by a 50 ms timer.

Real parts: uvicorn on loopback, the tiny model in a worker process, a raw socket as the
client. What is observed: the engine's stream (an Engine whose generate wraps the real
Generation to see its tokens and its end) and the ASGI `receive()` calls uvicorn
answers (each one a question the app asked the connection).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from uvicorn.protocols.http import h11_impl

from inferenceos.engine.engine import Engine
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.server.settings import ServerSettings
from server_harness import Harness, start_server

RUN_S = 0.6  # how long a generation runs before its client leaves: 2+ polls' worth


class Watch:
    """One generation as the engine's caller sees it: `ran(s)` is set once it has given
    tokens for `s` seconds (its tokens are the clock), `ended` when its stream stopped."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.ended = threading.Event()
        self.reader: threading.Thread | None = None  # the thread reading its events
        self._marks = {RUN_S: threading.Event(), 2 * RUN_S: threading.Event()}

    def ran(self, seconds: float) -> threading.Event:
        return self._marks[seconds]

    def token(self) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        for seconds, mark in self._marks.items():
            if now - self.first >= seconds:
                mark.set()


class WatchedLoopEvents:
    """A generation's LoopEvents (the tokens the event loop reads itself), watched."""

    def __init__(self, inner: Any, watch: Watch) -> None:
        self.inner, self.watch = inner, watch

    def __aiter__(self) -> WatchedLoopEvents:
        return self

    async def __anext__(self) -> Any:
        self.watch.reader = threading.current_thread()
        ev = await self.inner.__anext__()
        self.watch.token()
        return ev

    def ready(self) -> bool:
        return bool(self.inner.ready())

    def __getattr__(self, name: str) -> Any:  # the rest of LoopEvents (finished, ...)
        return getattr(self.inner, name)


class WatchedEngine(Engine):
    """The real engine; each generation's events pass through a Watch: on the event
    loop (the server's path for an engine's own events), or, with `threaded`, through
    an iterator wrapping them (which keeps the server on its thread path)."""

    watches: ClassVar[list[Watch]] = []
    started: ClassVar[threading.Event] = threading.Event()
    threaded: ClassVar[bool] = False
    closers: ClassVar[list[threading.Thread]] = []  # where each on-loop close ran

    def generate(self, prompt: Any, sampling: Any, cancel: Any = None, **kw: Any) -> Any:
        gen = super().generate(prompt, sampling, cancel, **kw)
        watch, inner = Watch(), gen.events
        WatchedEngine.watches.append(watch)
        WatchedEngine.started.set()
        if not WatchedEngine.threaded:
            on_loop, close = inner.on_loop, inner.close

            def watched_on_loop(loop: Any) -> Any:
                live = on_loop(loop)
                return None if live is None else WatchedLoopEvents(live, watch)

            def closed() -> None:  # once the loop stopped reading
                WatchedEngine.closers.append(threading.current_thread())
                close()
                watch.ended.set()

            inner.on_loop, inner.close = watched_on_loop, closed
            return gen

        def watched() -> Iterator[Any]:
            try:
                for ev in inner:
                    watch.token()
                    yield ev
            finally:
                close = getattr(inner, "close", None)
                if close is not None:
                    close()
                watch.ended.set()

        gen.events = watched()
        return gen

    def generate_now(self, *args: Any, **kw: Any) -> None:
        return None  # never on the event loop: every request's start comes to `generate`


def _factory(path: Path, settings: LlamaParams, slots: int) -> Engine:
    return WatchedEngine(path, settings.per_sequence(), n_parallel=slots)


class Receives:
    """Counts the ASGI receive() calls uvicorn answers, over the whole server."""

    def __init__(self) -> None:
        self.calls = 0
        original = h11_impl.RequestResponseCycle.receive

        async def counted(cycle: Any) -> Any:
            self.calls += 1
            return await original(cycle)

        self.counted = counted


@pytest.fixture(scope="module")
def served(tiny_llama: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Harness, Receives]]:
    """One slot, so a follow-up request can only run once the abandoned one freed it.
    Streams stay with the HTTP process (`direct_writes` off): the watch counts the
    tokens this process reads; a stream the worker writes is tests/server/
    test_direct_stream.py's (its client that leaves)."""
    root = tmp_path_factory.mktemp("server-disconnect")
    receives = Receives()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERENCEOS_HOME", str(root / "home"))
        mp.setattr(h11_impl.RequestResponseCycle, "receive", receives.counted)
        h = start_server({"tiny": tiny_llama}, root, ServerSettings(direct_writes=False),
                         {"factory": _factory, "slots": 1})
        try:
            yield h, receives
        finally:
            h.stop()


def _send(port: int, path: str, body: dict[str, Any]) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
              f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


@pytest.mark.parametrize("threaded", [False, True], ids=["on-loop", "threaded"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_client_leaving_stops_its_generation_as_an_event(
        stream: bool, threaded: bool, served: tuple[Harness, Receives],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An endless generation runs; over RUN_S of it the app asks the connection
    nothing (its listener's one receive() waits for the disconnect; a poll asks every
    0.25 s); its client then closes the socket and the stream ends at once; the one
    slot is free for the next request. The streamed reply's bytes are left unread (a
    client that stops reading and leaves)."""
    h, receives = served
    monkeypatch.setattr(WatchedEngine, "threaded", threaded)
    WatchedEngine.watches.clear()
    WatchedEngine.started.clear()
    body = {"model": "tiny", "prompt": "x", "stream": stream,
            "options": {"num_predict": 100_000, "kv_policy": "streaming",
                        "temperature": 0}}
    client = _send(h.port, "/api/generate", body)
    try:
        assert WatchedEngine.started.wait(60), "no generation started"
        [watch] = WatchedEngine.watches
        assert watch.ran(RUN_S).wait(60), "the generation did not run"
        asked = receives.calls  # the disconnect's listener is waiting by now
        assert watch.ran(2 * RUN_S).wait(60)
        asked_while_running = receives.calls - asked
        assert not watch.ended.is_set()
    finally:
        client.close()
    t0 = time.perf_counter()
    assert watch.ended.wait(10), "the generation went on after its client left"
    took = time.perf_counter() - t0
    assert asked_while_running == 0, f"the app asked the connection {asked_while_running} " \
        f"times in {RUN_S} s"
    assert took < 1.0, f"the generation stopped {took:.2f} s after the client left"
    r = httpx.post(h.url + "/api/generate", timeout=30, json={
        "model": "tiny", "prompt": "y", "stream": False, "options": {"num_predict": 3}})
    assert r.status_code == 200 and r.json()["done"]


def test_a_reply_ends_on_the_loop_after_its_last_event(
        served: tuple[Harness, Receives], monkeypatch: pytest.MonkeyPatch) -> None:
    """At a normal end the loop makes the Done, writes the reply's last event (done:
    true), then ends the generation itself (its close, its lease) before the response
    ends: no thread is woken for the reply's end (a hop to the generation's thread and
    back was two wake-ups on the last event's way)."""
    h, _ = served
    monkeypatch.setattr(WatchedEngine, "threaded", False)
    WatchedEngine.watches.clear()
    WatchedEngine.closers.clear()
    with httpx.stream("POST", h.url + "/api/generate", timeout=20, json={
            "model": "tiny", "prompt": "z", "stream": True,
            "options": {"num_predict": 5, "temperature": 0}}) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    [watch] = WatchedEngine.watches
    assert lines[-1]["done"] and lines[-1]["eval_count"] == 5
    assert watch.ended.is_set()  # before the response's end
    assert WatchedEngine.closers == [watch.reader]  # on the loop, the events' reader
    r = httpx.get(h.url + "/api/ps", timeout=10)  # its lease and tracking are given back
    assert r.status_code == 200
