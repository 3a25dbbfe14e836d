"""Hostile clients against a real server on loopback: slow-loris connections, thousands
of connections opened and dropped, streams and plain requests abandoned mid-way, huge
and deeply nested JSON, invalid UTF-8, concurrent pulls of the same name. Never a 5xx,
never a stuck worker (the admission count returns to 0 and a normal request answers at
once), file descriptors and memory bounded. Loopback only; counts kept small enough for
CI (a few thousand connections)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from fake_hub import FakeHub, tiny_gguf
from faults.helpers import generate, tags
from inferenceos.server.settings import ServerSettings
from server_harness import Harness, serving
from tiny_models import write_tiny_model

CHAT = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
REPO = "TheOrg/Tiny-GGUF"


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """Model a never stops on its own (letters only), so streams are long."""
    root = tmp_path_factory.mktemp("hostile")
    a = write_tiny_model(root / "a.gguf", "llama", letters_only=True)
    settings = ServerSettings(max_body_bytes=1 << 20, max_running=2, max_waiting=8)
    with serving({"a": a}, root, settings=settings) as h:
        assert generate(h, "a").status_code == 200
        yield h


@contextlib.contextmanager
def error_log() -> Iterator[list[logging.LogRecord]]:
    """Records at WARNING and above from uvicorn and the server (tracebacks land there)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.WARNING)
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "inferenceos.server")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield records
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


def _idle(h: Harness, timeout: float = 10) -> None:
    """No request left inside the engine, and a normal one answers promptly."""
    deadline = time.monotonic() + timeout
    while h.state.admission.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert h.state.admission.running == 0, "a request is stuck in the engine"
    t0 = time.monotonic()
    assert generate(h, "a", 2).status_code == 200
    assert time.monotonic() - t0 < 10


def test_slow_loris_does_not_starve_others(server: Harness) -> None:
    """200 connections each sending a header line now and then never finish a request;
    meanwhile real requests are answered, and the server is fine once they go."""
    fds0 = _fds()
    socks = []
    for _ in range(200):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(s)
    try:
        for i in range(3):
            for s in socks:
                with contextlib.suppress(OSError):
                    s.sendall(f"X-Slow-{i}: 1\r\n".encode())
            r = httpx.post(server.v1 + "/chat/completions", json=CHAT, timeout=30)
            assert r.status_code == 200
    finally:
        for s in socks:
            s.close()
    _idle(server)
    deadline = time.monotonic() + 10
    while _fds() > fds0 + 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _fds() <= fds0 + 10  # every dropped connection's descriptor was closed


def test_thousands_of_connections_opened_and_dropped(server: Harness) -> None:
    fds0, rss0 = _fds(), _rss_mb()
    partials = [b"", b"GET /health HTTP/1.1\r\n", b"POST /api/generate HTTP/1.1\r\n"
                b"Host: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{\"model\"", b"\x16\x03\x01junk"]

    def burst(i: int) -> None:
        with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(partials[i % len(partials)])
            if i % 7 == 0:  # a reset instead of a close
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    with error_log() as errors, ThreadPoolExecutor(16) as pool:
        list(pool.map(burst, range(3000)))
    assert not [e for e in errors if e.levelno >= logging.ERROR], errors[:3]
    _idle(server)
    deadline = time.monotonic() + 15
    while _fds() > fds0 + 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _fds() <= fds0 + 10
    assert _rss_mb() - rss0 < 60, (rss0, _rss_mb())  # nothing kept per connection


def test_abandoned_streams_free_their_slots(server: Harness) -> None:
    with error_log() as errors:
        for route, body in [("/v1/chat/completions", {**CHAT, "max_tokens": 10_000,
                                                      "stream": True}),
                            ("/api/generate", {"model": "a", "prompt": "x",
                                               "options": {"num_predict": 10_000}})]:
            for _ in range(4):
                with httpx.stream("POST", server.url + route, json=body, timeout=30) as r:
                    assert r.status_code == 200
                    it = r.iter_lines()
                    next(it)
                    next(it)
        _idle(server)
    assert not errors, [e.getMessage() for e in errors]


def test_abandoned_plain_request_is_one_quiet_line(server: Harness,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A client gone before its non-streamed answer: the generation is cancelled and
    one line is logged (INFO), no traceback."""
    body = json.dumps({"model": "a", "prompt": "x", "stream": False, "options": {
        "num_predict": 100_000, "kv_policy": "streaming"}}).encode()  # endless
    with error_log() as errors, caplog.at_level(logging.INFO, "inferenceos.server"):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 10
        while not server.state.admission.running and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
        assert server.state.admission.running  # still generating: the client leaves
        s.close()
        _idle(server)
    assert not errors, [e.getMessage() for e in errors]
    lines = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0].getMessage()


@pytest.mark.parametrize("kind", ["huge", "nested", "bad-utf8", "wrong-types", "not-json"])
def test_hostile_bodies_are_4xx(kind: str, server: Harness) -> None:
    body = {
        "huge": json.dumps({**CHAT, "messages": [{"role": "user",
                                                  "content": "x" * (2 << 20)}]}).encode(),
        "nested": b'{"model": "a", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "bad-utf8": b'{"model": "a", "messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}',
        "wrong-types": json.dumps({"model": ["a"], "messages": {"role": 5},
                                   "max_tokens": "lots"}).encode(),
        "not-json": b"\x00\x01\x02 definitely { not json",
    }[kind]
    for route in ("/v1/chat/completions", "/api/chat", "/api/generate", "/v1/embeddings"):
        r = httpx.post(server.url + route, content=body, timeout=30,
                       headers={"Content-Type": "application/json"})
        assert 400 <= r.status_code < 500, (route, r.status_code, r.text[:200])
        assert "error" in r.json()
    _idle(server)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    h = FakeHub(repos={REPO: {"Tiny-Q8_0.gguf": tiny_gguf(tmp_path, "llama", seed=7)}},
                slow_s=0.01).start()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    yield h
    h.stop()


def test_concurrent_pulls_of_the_same_name(server: Harness, hub: FakeHub) -> None:
    """Eight clients pull the same model at once: each gets a clear answer (success,
    or busy while another pull of it runs: never a 5xx); one model is registered,
    with the Hub's bytes."""
    name = f"hf.co/{REPO}:Q8_0"
    go = threading.Barrier(8)

    def pull(_: int) -> httpx.Response:
        go.wait(10)
        return httpx.post(server.url + "/api/pull", json={"model": name, "stream": False},
                          timeout=120)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(pull, range(8)))
    codes = sorted(r.status_code for r in answers)
    assert all(c < 500 or c == 503 for c in codes), [r.text for r in answers]
    assert 200 in codes
    registered = [t for t in tags(server) if t.startswith("hf.co/")]
    assert registered == ["hf.co/theorg/tiny-gguf:Q8_0"]
    entry = server.catalog.store.get("hf.co/theorg/tiny-gguf:Q8_0")
    assert entry.path.read_bytes() == hub.repos[REPO]["Tiny-Q8_0.gguf"]
    assert not [p for p in server.catalog.store.blobs.iterdir() if p.name.startswith(".")]
    assert generate(server, "hf.co/theorg/tiny-gguf:Q8_0", 2).status_code == 200
