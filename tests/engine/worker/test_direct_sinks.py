"""The worker's direct streams (engine/worker/direct.py) on real sockets: what it writes
is the stream's events in order, framed as the spec says; a slow reader's bytes come
back unsent, never lost or reordered; a reader that left cancels the stream; an Attach
arrives on the real pipe with its descriptor (SCM_RIGHTS). No model needed."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.reduction import send_handle
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest

from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.messages import Attach, Finished, FromWorker, Generate, TokenOut, Wrote
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.worker.direct import DirectSinks
from inferenceos.engine.worker.main import _Inbox

SPEC = FrameSpec(('data: {"c":', ',"t":', ',"n":', "}\n\n"), ("text", "tokens", "n"), 10)
HELD = replace(SPEC, interval_s=0.005)  # a stream written at most every 5 ms
END = Finished(1, GenerationMetrics(stop_reason="length"))


def _frame(token: int, text: str, n: int) -> bytes:
    return SPEC.frame(token, text, n).encode()


def _chunk_list(data: bytes) -> list[bytes]:
    """The bodies of HTTP/1.1 chunks, one each (fails on bad framing)."""
    out: list[bytes] = []
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        assert rest[n:n + 2] == b"\r\n", data[:80]
        out.append(rest[:n])
        data = rest[n + 2:]
    return out


def _chunks(data: bytes) -> bytes:
    """The bodies of HTTP/1.1 chunks, joined (fails on bad framing)."""
    return b"".join(_chunk_list(data))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.setblocking(False)  # as the event loop keeps its sockets
    yield a, b
    a.close()
    b.close()


def _read_all(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    out = b""
    while True:
        try:
            got = sock.recv(1 << 20)
        except BlockingIOError:
            return out
        if not got:
            return out
        out += got


def test_events_before_the_attach_go_through_the_pipe_and_are_written_again(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, client = pair
    sinks = DirectSinks(lambda rid: [])
    sinks.expect(1)
    first = [TokenOut(1, 5, "a"), TokenOut(1, 6, "b"), TokenOut(1, -1, "")]
    assert sinks.route(first) == first  # not attached yet: through the pipe, kept
    # the parent wrote one; the worker writes the others itself (the empty one: nothing)
    assert sinks.attach(1, os.dup(ours.fileno()), SPEC, 1) == []
    other = TokenOut(2, 9, "other stream")
    assert sinks.route([TokenOut(1, 7, 'c"'), other, TokenOut(1, -1, "tail")]) == [other]
    out = sinks.route([END])
    assert isinstance(out[0], Wrote) and out[0].final and out[1] == END
    assert (out[0].ids, out[0].text, out[0].unsent, out[0].error) == ((6, 7), 'bc"tail',
                                                                     b"", "")
    want = _frame(6, "b", 1) + _frame(7, 'c"', 2) + _frame(-1, "tail", 2)
    assert _chunks(_read_all(client)) == want
    assert sinks.route([TokenOut(1, 8, "late")]) == [TokenOut(1, 8, "late")]  # over


def test_a_slow_reader_gets_every_byte_in_order(pair: tuple[socket.socket, socket.socket]
                                                ) -> None:
    ours, client = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sinks = DirectSinks(lambda rid: [])
    sinks.expect(1)
    sinks.attach(1, os.dup(ours.fileno()), SPEC, 0)
    read = b""
    for i in range(2000):  # far more than the buffers hold; the reader reads now and then
        sinks.route([TokenOut(1, i, f"tok{i} ")])
        if i % 500 == 0:
            read += _read_all(client)
    out = sinks.route([END])
    wrote = out[0]
    assert isinstance(wrote, Wrote) and wrote.unsent, "the buffers should have filled"
    assert wrote.ids == tuple(range(2000))[-len(wrote.ids):]  # since the last report
    read += _read_all(client)
    whole = _chunks(read + wrote.unsent)
    assert whole == b"".join(_frame(i, f"tok{i} ", i + 1) for i in range(2000))


def test_progress_reports_carry_what_was_written_since_the_last(
        pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    import inferenceos.engine.worker.direct as direct

    monkeypatch.setattr(direct, "REPORT_S", 0.0)  # every step reports
    ours, _client = pair
    sinks = DirectSinks(lambda rid: [])
    sinks.expect(1)
    sinks.attach(1, os.dup(ours.fileno()), SPEC, 0)
    [r1] = sinks.route([TokenOut(1, 1, "x"), TokenOut(1, 2, "y")])
    [r2] = sinks.route([TokenOut(1, 3, "z")])
    assert (r1.ids, r1.text, r1.final) == ((1, 2), "xy", False)
    assert (r2.ids, r2.text, r2.final) == ((3,), "z", False)
    final, end = sinks.route([END])
    assert isinstance(final, Wrote) and (final.ids, final.text, final.final) == ((), "", True)
    assert end == END


def test_a_reader_that_left_cancels_its_stream(pair: tuple[socket.socket, socket.socket]
                                               ) -> None:
    ours, client = pair
    cancelled: list[int] = []

    def cancel(rid: int) -> list[FromWorker]:
        cancelled.append(rid)
        return [Finished(rid, GenerationMetrics(stop_reason="interrupted"))]

    sinks = DirectSinks(cancel)
    sinks.expect(1)
    sinks.attach(1, os.dup(ours.fileno()), SPEC, 0)
    client.close()
    out: list[FromWorker] = []
    for i in range(3):  # the first send after the close may still be taken
        out = sinks.route([TokenOut(1, i, "x")])
        if out:
            break
    wrote, end = out
    assert isinstance(wrote, Wrote) and wrote.final and wrote.error
    assert isinstance(end, Finished) and end.metrics.stop_reason == "interrupted"
    assert cancelled == [1]
    assert sinks.route([TokenOut(1, 9, "x")]) == [TokenOut(1, 9, "x")]  # no longer ours


def test_an_attach_for_a_stream_that_is_over_is_refused(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, client = pair
    sinks = DirectSinks(lambda rid: [])
    sinks.expect(1)
    sinks.route([TokenOut(1, 5, "a"), END])
    fd = os.dup(ours.fileno())
    [refused] = sinks.attach(1, fd, SPEC, 0)
    assert isinstance(refused, Wrote) and refused.refused and refused.ids == ()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed: the worker keeps no descriptor it does not use
    assert _read_all(client) == b""


def test_a_migration_stops_every_direct_stream(pair: tuple[socket.socket, socket.socket]
                                               ) -> None:
    ours, client = pair
    sinks = DirectSinks(lambda rid: [])
    sinks.expect(1)
    sinks.expect(2)  # never attached: dropped
    sinks.attach(1, os.dup(ours.fileno()), SPEC, 0)
    sinks.route([TokenOut(1, 4, "q")])
    [wrote] = sinks.detach_all()
    assert isinstance(wrote, Wrote) and wrote.final and wrote.ids == (4,)
    assert sinks.route([TokenOut(2, 1, "r")]) == [TokenOut(2, 1, "r")]
    assert _chunks(_read_all(client)) == _frame(4, "q", 1)


def test_the_inbox_takes_an_attach_and_its_descriptor_off_the_pipe(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, client = pair
    parent, child = mp.get_context("spawn").Pipe()
    sched = MagicMock()  # a stand-in scheduler: the inbox is under test
    sched.cancel.return_value = []
    rt = SimpleNamespace(sched=sched, awake=lambda: sched, lm=MagicMock())
    inbox = _Inbox(child, rt)  # type: ignore[arg-type]
    gen = Generate([1, 2], SamplingParams(max_tokens=4), direct=True, req_id=1)
    assert inbox._handle(gen) == []
    inbox.sinks.route([TokenOut(1, 3, "s")])
    parent.send(Attach(SPEC, 0, req_id=1))
    send_handle(parent, ours.fileno(), os.getpid())
    assert inbox._handle(child.recv()) == []
    assert _chunks(_read_all(client)) == _frame(3, "s", 1)
    parent.close()
    child.close()


def test_an_attach_of_what_is_not_a_socket_is_refused(tmp_path: Path) -> None:
    sinks = DirectSinks(lambda rid: [])
    sinks.expect(1)
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    [refused] = sinks.attach(1, fd, SPEC, 0)
    assert isinstance(refused, Wrote) and refused.refused
    with pytest.raises(OSError):
        os.fstat(fd)
    assert sinks.route([TokenOut(1, 2, "x")]) == [TokenOut(1, 2, "x")]  # still kept


class _Clock:
    """time.monotonic for direct.py, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    import inferenceos.engine.worker.direct as direct

    c = _Clock()
    monkeypatch.setattr(direct.time, "monotonic", c)
    return c


def _held_stream(ours: socket.socket) -> DirectSinks:
    """Stream 1 attached to `ours` with a 5 ms interval, after a step at 100.000 (the
    clock's start): the cadence the next route's step is measured from."""
    sinks = DirectSinks(lambda rid: [])
    sinks.expect(1)
    sinks.attach(1, os.dup(ours.fileno()), HELD, 0)  # written at 100.000 (nothing yet)
    sinks.route([])
    return sinks


def test_a_fast_streams_events_share_one_send_within_the_interval(
        pair: tuple[socket.socket, socket.socket], clock: _Clock) -> None:
    """Steps 1 ms apart with a 5 ms interval: the events wait while the next step's
    write would still come within 5 ms of the last, then go in one send (one chunk),
    each still an event of its own, in order."""
    ours, client = pair
    sinks = _held_stream(ours)  # the next steps come 1 ms apart
    for t, tok in ((0.001, 1), (0.002, 2)):
        clock.now = 100 + t
        assert sinks.route([TokenOut(1, tok, f"t{tok}")]) == []
        assert _read_all(client) == b"", "held: the next step's write is soon enough"
    clock.now = 100.0035  # the next step would land past 5 ms: written now
    assert sinks.route([TokenOut(1, 3, "t3")]) == []
    got = _read_all(client)
    assert len(_chunk_list(got)) == 1
    assert _chunks(got) == b"".join(_frame(i, f"t{i}", i) for i in (1, 2, 3))


def test_held_events_go_with_the_streams_end_or_once_due(
        pair: tuple[socket.socket, socket.socket], clock: _Clock) -> None:
    """A held event is written by the next step that is due even without a token of
    its own (another stream's step), and whatever is held goes before the final report."""
    ours, client = pair
    sinks = _held_stream(ours)
    clock.now = 100.001
    sinks.route([TokenOut(1, 1, "a")])
    assert _read_all(client) == b""
    other = TokenOut(2, 9, "other stream")
    clock.now = 100.006
    assert sinks.route([other]) == [other]
    assert _chunks(_read_all(client)) == _frame(1, "a", 1)
    clock.now = 100.0061
    sinks.route([TokenOut(1, 2, "b")])  # held again
    wrote, end = sinks.route([END])
    assert isinstance(wrote, Wrote) and wrote.final and wrote.ids == (1, 2) and end == END
    assert _chunks(_read_all(client)) == _frame(2, "b", 2)


def test_a_step_without_events_writes_a_held_stream_that_is_due(
        pair: tuple[socket.socket, socket.socket], clock: _Clock) -> None:
    """The worker routes a step without events while a stream is held (`holding`): a
    long step (a media chunk, a prefill) does not hold its events past the next one."""
    ours, client = pair
    sinks = _held_stream(ours)
    clock.now = 100.001
    sinks.route([TokenOut(1, 1, "a")])
    assert sinks.holding and _read_all(client) == b""
    clock.now = 100.05  # a long step, no events of its own
    assert sinks.route([]) == []
    assert not sinks.holding
    assert _chunks(_read_all(client)) == _frame(1, "a", 1)


def test_a_messages_answer_does_not_shorten_the_expected_step(
        pair: tuple[socket.socket, socket.socket], clock: _Clock) -> None:
    """Steps 4 ms apart with a 5 ms interval: each step's events go at once (holding them
    would make the next write 8 ms late), also when a message was answered just before
    the step (`route(step=False)`: not a step, so not the cadence)."""
    ours, client = pair
    sinks = _held_stream(ours)
    clock.now = 100.0039
    assert sinks.route([TokenOut(2, 9, "other")], step=False) == [TokenOut(2, 9, "other")]
    clock.now = 100.004
    sinks.route([TokenOut(1, 1, "a")])
    assert not sinks.holding
    assert _chunks(_read_all(client)) == _frame(1, "a", 1)
