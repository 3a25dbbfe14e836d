"""Streams the model worker writes to its clients itself (server/direct_stream.py,
engine/worker/direct.py), through a real uvicorn server, a real worker process and
raw HTTP/1.1 sockets, so every byte of the chunked framing is checked:

- the events are the ones the HTTP process writes with the setting off;
- a kept-alive connection serves the next request after a handed-over stream;
- a client that stops reading gets every event once it reads again;
- a client that leaves mid-stream frees its slot at once;
- a shutdown mid-stream ends the response in good order.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferenceos.server.settings import ServerSettings
from server_harness import SLOW, Harness, serving

LONG = {"temperature": 0, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def server(tiny_wide: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("direct")
    with serving({"wide": tiny_wide}, root, manager_kw={"base": SLOW}) as h:
        yield h


class Raw:
    """One HTTP/1.1 connection, read strictly: a response is its status line,
    headers and chunked body, parsed byte by byte (a framing error fails the test)."""

    def __init__(self, port: int, rcvbuf: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(60)
        self.sock.connect(("127.0.0.1", port))
        self.buf = b""

    def post(self, path: str, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.sock.sendall(b"POST %b HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                          b"application/json\r\nContent-Length: %d\r\n\r\n%b"
                          % (path.encode(), len(data), data))

    def _more(self) -> None:
        got = self.sock.recv(65536)
        if not got:
            raise EOFError("the server closed the connection")
        self.buf += got

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._more()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def head(self) -> dict[str, str]:
        status = self._line()
        assert status.startswith(b"HTTP/1.1 200"), status
        headers = {}
        while line := self._line():
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        assert headers.get("transfer-encoding") == "chunked"
        return headers

    def chunk(self) -> bytes | None:
        """The next chunk's body; None at the last (zero) chunk."""
        size = int(self._line(), 16)
        body = self._exact(size)
        assert self._exact(2) == b"\r\n"
        return None if size == 0 else body

    def body(self) -> bytes:
        """The rest of the response's body (its terminating chunk read)."""
        body = b""
        while (c := self.chunk()) is not None:
            body += c
        return body

    def events(self) -> list[dict[str, Any]]:
        """Every event of the rest of the response (its terminating chunk read)."""
        return _events(self.body())

    def close(self) -> None:
        self.sock.close()


def _direct_tokens(h: Harness) -> float:
    text = httpx.get(h.url + "/metrics").text
    m = re.search(r"^inferenceos:direct_written_tokens_total\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _idle(h: Harness, deadline_s: float = 60) -> None:
    """Until nothing runs in the server (its admission count, read directly)."""
    end = time.monotonic() + deadline_s
    while h.state.admission.running:
        assert time.monotonic() < end, "the stream never ended"
        time.sleep(0.01)


def _response(port: int, path: str, body: dict[str, Any]) -> bytes:
    """The whole body of one streamed response, on a connection of its own."""
    raw = Raw(port)
    try:
        raw.post(path, body)
        raw.head()
        return raw.body()
    finally:
        raw.close()


def _events(body: bytes) -> list[dict[str, Any]]:
    """The `data:` events of a llama.cpp stream's body, each whole."""
    text = body.decode()
    assert text.endswith("\n\n") or not text
    return [json.loads(e[len("data: "):]) for e in text.split("\n\n") if e]


def _stream(port: int, body: dict[str, Any]) -> list[dict[str, Any]]:
    return _events(_response(port, "/completion", body))


def _comparable(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k not in ("timings", "generation_settings")}
            for e in events]


def test_the_worker_writes_the_same_events_the_http_process_does(
        server: Harness, tiny_wide: Path, tmp_path: Path) -> None:
    body = {"prompt": "The quick brown fox", "n_predict": 400, **LONG}
    before = _direct_tokens(server)
    on = _stream(server.port, body)
    assert _direct_tokens(server) - before >= 200  # the worker wrote most of them
    with serving({"wide": tiny_wide}, tmp_path / "off", manager_kw={"base": SLOW},
                 settings=ServerSettings(direct_writes=False)) as off_server:
        off = _stream(off_server.port, body)
        assert _direct_tokens(off_server) == 0
    assert len(on) == 401 and on[-1]["stop"] is True
    assert [e["tokens_predicted"] for e in on[:-1]] == list(range(1, 401))
    assert _comparable(on) == _comparable(off)


def _openai_chunks(port: int, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of an OpenAI stream, read strictly, less their id, time, timings and
    cached tokens."""
    chunks = _response(port, path, body)
    events = [e[len("data: "):] for e in chunks.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    out = [{k: v for k, v in json.loads(e).items() if k not in ("id", "created", "timings")}
           for e in events[:-1]]
    for e in out:  # what the prefix cache held differs between two servers
        if e.get("usage"):
            e["usage"].pop("prompt_tokens_details", None)
    return out


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_openai_streams_are_written_by_the_worker_the_same(
        server: Harness, tiny_wide: Path, tmp_path: Path, path: str) -> None:
    """The OpenAI routes hand over too (one plain choice): the same chunks, [DONE]
    last; the openai client reads the stream."""
    import openai

    body: dict[str, Any] = {"model": "wide", "max_tokens": 300, "temperature": 0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Tell a story"}]
    else:
        body["prompt"] = "Once upon a time"
    before = _direct_tokens(server)
    on = _openai_chunks(server.port, path, body)
    n = on[-1]["usage"]["completion_tokens"]  # (the tiny model may end on its EOS)
    assert n >= 40 and _direct_tokens(server) - before >= n // 2
    with serving({"wide": tiny_wide}, tmp_path / "off", manager_kw={"base": SLOW},
                 settings=ServerSettings(direct_writes=False)) as off_server:
        off = _openai_chunks(off_server.port, path, body)
    assert on == off
    client = openai.OpenAI(base_url=server.v1, api_key="none")
    if path.endswith("chat/completions"):
        stream = client.chat.completions.create(model="wide", messages=body["messages"],
                                                max_tokens=300, temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        want = "".join(c["choices"][0]["delta"].get("content") or "" for c in on
                       if c["choices"])
    else:
        stream = client.completions.create(model="wide", prompt=body["prompt"],
                                           max_tokens=300, temperature=0, stream=True)
        text = "".join(c.choices[0].text for c in stream if c.choices)
        want = "".join(c["choices"][0]["text"] for c in on if c["choices"])
    assert text == want and text


def _ollama_lines(port: int, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The lines of an Ollama stream, read strictly, less their times and durations."""
    data = _response(port, path, body)
    lines = [json.loads(line) for line in data.decode().splitlines()]
    for line in lines:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", line.pop("created_at"))
        for k in [k for k in line if k.endswith("_duration") or k in ("context",
                  "prompt_eval_cached_count")]:  # (what the prefix cache held differs)
            del line[k]
    return lines


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
def test_ollama_streams_are_written_by_the_worker_the_same(
        server: Harness, tiny_wide: Path, tmp_path: Path, path: str) -> None:
    """Ollama's NDJSON hands over too, each line stamped when the worker writes it:
    the same lines (times aside), and the ollama client reads the stream."""
    import ollama

    body: dict[str, Any] = {"model": "wide", "stream": True,
                            "options": {"temperature": 0, "num_predict": 300}}
    if path == "/api/chat":
        body["messages"] = [{"role": "user", "content": "Tell a story"}]
    else:
        body["prompt"] = "Once upon a time"
    before = _direct_tokens(server)
    on = _ollama_lines(server.port, path, body)
    n = on[-1]["eval_count"]
    assert n >= 40 and _direct_tokens(server) - before >= n // 2
    with serving({"wide": tiny_wide}, tmp_path / "off", manager_kw={"base": SLOW},
                 settings=ServerSettings(direct_writes=False)) as off_server:
        off = _ollama_lines(off_server.port, path, body)
    assert on == off
    client = ollama.Client(host=server.url)
    if path == "/api/chat":
        parts = [p.message.content or "" for p in client.chat(
            model="wide", messages=body["messages"], stream=True, options=body["options"])]
        want = "".join(line["message"]["content"] for line in on)
    else:
        parts = [p.response for p in client.generate(
            model="wide", prompt=body["prompt"], stream=True, options=body["options"])]
        want = "".join(line["response"] for line in on)
    assert "".join(parts) == want and want


def test_a_streamed_request_is_recorded_in_telemetry_by_the_writer_thread(
        server: Harness) -> None:
    from inferenceos import telemetry
    from inferenceos.server import request_telemetry

    for n in (24, 8):
        _stream(server.port, {"prompt": "The quick brown fox", "n_predict": n, **LONG})
    # Run._record queued it as the reply ended (server/request_telemetry.py): the row is
    # built and written by the recorder's thread; a flush waits for both
    assert telemetry.recorder().flush(30)
    row, second = telemetry.generations(source="server")
    assert row.output_tokens == 24 and row.prompt_tokens > 0 and row.concurrency >= 1
    assert row.total_s is not None and row.total_s > 0 and row.threads is not None
    # the model's settings, made once for its plan and recorded with each request
    assert second.output_tokens == 8 and second.settings == row.settings
    memo = [(p, s) for p, s in request_telemetry._SETTINGS.values()
            if json.loads(s.json) == row.settings]
    assert memo and all(dict(s) == dataclasses.asdict(p.params()) for p, s in memo)


def test_a_kept_alive_connection_serves_the_next_request(server: Harness) -> None:
    raw = Raw(server.port)
    try:
        for n in (40, 24):
            raw.post("/completion", {"prompt": "hello", "n_predict": n, **LONG})
            raw.head()
            events = raw.events()
            assert len(events) == n + 1 and events[-1]["tokens_predicted"] == n
        raw.post("/completion", {"prompt": "hello", "n_predict": 3, "stream": False})
        assert raw._line().startswith(b"HTTP/1.1 200")
    finally:
        raw.close()


def test_a_client_that_stops_reading_gets_every_event_later(server: Harness) -> None:
    n = 1500  # far more than the socket buffers hold (~120 kB of events)
    raw = Raw(server.port, rcvbuf=4096)
    try:
        raw.post("/completion", {"prompt": "slow reader", "n_predict": n, **LONG})
        raw.head()
        _idle(server)  # the generation ended while nothing was read
        events = raw.events()
    finally:
        raw.close()
    assert [e["tokens_predicted"] for e in events[:-1]] == list(range(1, n + 1))
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == n


def test_a_client_that_leaves_mid_stream_frees_its_slot(server: Harness) -> None:
    raw = Raw(server.port)
    raw.post("/completion", {"prompt": "leaving", "n_predict": 3500, **LONG})
    raw.head()
    got = b""
    while got.count(b"data: ") < 20:  # handed over by now
        got += raw.chunk() or b""
    t0 = time.monotonic()
    raw.close()
    _idle(server)
    assert time.monotonic() - t0 < 10  # 3,500 tokens would take far longer
    assert len(_stream(server.port, {"prompt": "next", "n_predict": 8, **LONG})) == 9


def test_a_shutdown_mid_stream_ends_the_response_in_order(tiny_wide: Path,
                                                          tmp_path: Path) -> None:
    with serving({"wide": tiny_wide}, tmp_path, manager_kw={"base": SLOW},
                 settings=ServerSettings(shutdown_grace_s=0)) as h:
        raw = Raw(h.port)
        raw.post("/completion", {"prompt": "until shutdown", "n_predict": 3500, **LONG})
        raw.head()
        first = raw.chunk()
        assert first is not None
        h.server.begin_shutdown()  # the grace is 0: the stream is cancelled
        events = raw.events()  # strict framing to the terminating chunk
        raw.close()
    n = [e["tokens_predicted"] for e in events if not e.get("stop")]
    assert n == list(range(n[0], n[0] + len(n))) if n else True
    assert len(n) < 3500


def test_a_stream_the_worker_writes_survives_a_live_migration(server: Harness) -> None:
    """The old worker stops writing (its final report), the new one's tokens come
    through the pipe and this process writes them: one unbroken stream."""
    n = 1200
    raw = Raw(server.port)
    try:
        raw.post("/completion", {"prompt": "moving", "n_predict": n, **LONG})
        raw.head()
        body = b""
        while body.count(b"data: ") < 20:  # handed over by now
            body += raw.chunk() or b""
        [resident] = server.manager.loaded()
        engine: Any = resident.engine
        before = _direct_tokens(server)
        info = engine.migrate(replace(engine.settings, n_ctx=4096, n_batch=32, n_ubatch=32),
                              n_parallel=resident.slots)
        assert info["moved"] == 1, info
        events = [json.loads(e[len("data: "):]) for e in body.decode().split("\n\n") if e]
        events += raw.events()
    finally:
        raw.close()
    assert _direct_tokens(server) > before  # the old worker's report came
    assert [e["tokens_predicted"] for e in events[:-1]] == list(range(1, n + 1))
    assert events[-1]["stop"] is True


def test_an_ollama_stream_with_logprobs_stays_with_the_http_process(server: Harness) -> None:
    """`logprobs` without `top_logprobs` asks for each token's own (sampling.logprobs
    0, not None): no hand-over, every line carries its token's logprob."""
    lines = _ollama_lines(server.port, "/api/generate", {
        "model": "wide", "prompt": "Once upon a time", "stream": True, "logprobs": True,
        "options": {"temperature": 0, "num_predict": 300}})
    n = lines[-1]["eval_count"]
    assert n >= 40 and sum(len(line.get("logprobs") or ()) for line in lines) == n
