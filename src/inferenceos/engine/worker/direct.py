"""Streams the worker writes to their clients' sockets itself (issue 44).

Through the pipe, every token of every stream woke the HTTP process, which framed it
and wrote it to its client: on a small machine that process took a core from the
compute threads once per step, mid-graph. A stream sent with `Generate.direct` can be
handed over instead (`Attach`, engine/messages.py): the parent passes the client's
socket and the stream's `FrameSpec`, and from then on the worker frames each step's
tokens of that stream and writes them in one `send` right after the step, while no
graph runs. The HTTP process does not wake for them at all.

Until its Attach, a direct stream's token events go through the pipe as any other's,
and are kept: the parent hands over after writing the first `written` of them, and
the worker writes the rest itself (the parent drops what it reads of them after its
Attach). When the worker stops writing, it says what it wrote in one `Wrote`.

The socket is the parent's, shared: non-blocking (the event loop's), so a client that
reads slowly never holds a step; what it did not take waits in `unsent` and goes with
the next write, or back to the parent in the final `Wrote`. A socket that fails (the
client left) cancels its stream. While it writes, a `Wrote` every `REPORT_S` at most
tells the parent what it wrote (live token counts, /metrics), not every token.

A stream whose tokens come faster than its spec's `interval_s` (a tiny model, a fast
GPU) is written less often than every step: its framed events wait for the next step
while that step's write would still come within `interval_s` of the last one, then go
in one send. Each event stays an event of its own; only the sends are fewer (each
costs this loop ~10 µs between two steps and wakes the client once). A held stream is
written at its end, when it moves, and by the first step that finds it due, whether
or not that step gave it a token.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Sequence

from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.engine.messages import Failed, Finished, FromWorker, TokenOut, Wrote
from inferenceos.units import iso_time

REPORT_S = 0.5  # a written stream's progress goes to the parent this often at most


class _Sink:
    """One direct stream: its kept events until attached, then its socket and what
    was written."""

    __slots__ = ("count", "frames", "history", "ids", "reported", "sent_at", "sock", "spec",
                 "text", "unsent")

    def __init__(self) -> None:
        self.history: list[TokenOut] = []
        self.sock: socket.socket | None = None
        self.spec: FrameSpec | None = None
        self.frames: list[str] = []
        self.ids: list[int] = []
        self.text: list[str] = []
        self.count = 0
        self.unsent = bytearray()
        self.reported = 0.0  # when the last report went (time.monotonic)
        self.sent_at = 0.0  # when the last write went (time.monotonic)

    def add(self, ev: TokenOut, at: str = "") -> None:
        """Count `ev` and frame it for the next write, if its dialect writes it
        (`at`: the step's time, for a dialect that stamps its events)."""
        if ev.token >= 0:
            self.ids.append(ev.token)
            self.count += 1
        if ev.text:
            self.text.append(ev.text)
        assert self.spec is not None
        if self.spec.writes(ev.token, ev.text):
            self.frames.append(self.spec.frame(ev.token, ev.text, self.count, at))

    def flush(self) -> str:
        """Write the framed events and what waited before them; "" or why it failed."""
        data: bytes | bytearray = self.unsent
        if self.frames:
            assert self.spec is not None
            wire = self.spec.wire(self.frames[0] if len(self.frames) == 1
                                  else "".join(self.frames))
            self.frames.clear()
            if data:
                data += wire
            else:  # the usual case: nothing waited, these bytes go as they are
                data = wire
        sent, error = 0, ""
        if data and self.sock is not None:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:  # the client's buffer is full: next time
                pass
            except OSError as exc:  # gone (EPIPE, ECONNRESET)
                error = exc.strerror or type(exc).__name__
        if data is self.unsent:  # what was not sent waits in `unsent` for the next write
            del self.unsent[:sent]
        elif sent < len(data):
            self.unsent += memoryview(data)[sent:]
        return error

    def stop(self, req_id: int) -> Wrote:
        """Write what is framed, then the final report (its error if the write failed)."""
        return self.report(req_id, error=self.flush())

    def report(self, req_id: int, final: bool = True, error: str = "") -> Wrote:
        """The `Wrote` of what was written since the last report; `final`: writing
        stops now, and the worker's descriptor is closed (the connection stays: the
        parent holds its own)."""
        ids, text = tuple(self.ids), "".join(self.text)
        self.ids.clear()
        self.text.clear()
        if not final:
            return Wrote(req_id, ids, text, final=False)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        return Wrote(req_id, ids, text, b"" if error else bytes(self.unsent), error)


class DirectSinks:
    """The worker's direct streams. `cancel(req_id)` ends a stream whose socket failed
    and returns its events (the scheduler's `cancel`)."""

    def __init__(self, cancel: Callable[[int], list[FromWorker]]) -> None:
        self._sinks: dict[int, _Sink] = {}
        self._cancel = cancel
        self._held: dict[int, _Sink] = {}  # attached streams whose framed events wait
        self._routed = 0.0  # when route last ran: a step's length is the time between

    @property
    def holding(self) -> bool:
        """Whether some stream's framed events wait for a later write (see `route`)."""
        return bool(self._held)

    def expect(self, req_id: int) -> None:
        """Keep `req_id`'s token events: an Attach may follow (`Generate.direct`)."""
        self._sinks[req_id] = _Sink()

    def attach(self, req_id: int, fd: int, spec: FrameSpec, written: int
               ) -> list[FromWorker]:
        """Write stream `req_id` to the socket `fd` (now this object's) from its
        `written`-th token event on; the events to send the parent (a failed socket's).
        A stream that is over, was never direct or moved here, or a socket that cannot
        be used, is left to the parent: a refused Wrote."""
        sink = self._sinks.get(req_id)
        refused: list[FromWorker] = [Wrote(req_id, (), "", refused=True)]
        if sink is None or sink.sock is not None or written > len(sink.history):
            os.close(fd)
            return refused
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # not a socket
            os.close(fd)
            return refused
        sink.sock = sock
        sock.setblocking(False)
        sink.spec = spec
        sink.reported = time.monotonic()
        for ev in sink.history[written:]:
            sink.add(ev)
        sink.history.clear()
        sink.sent_at = sink.reported
        error = sink.flush()
        return self._failed(req_id, sink, error) if error else []

    def route(self, events: Sequence[FromWorker], step: bool = True) -> list[FromWorker]:
        """`events` (a step's, or with `step` False a message's answer) less the tokens
        written here, with a `Wrote` before the end of each stream written here; writes
        each attached stream's new events in one send, or holds them (module docstring:
        the time between two steps' calls is what the next step is expected to take)."""
        if not self._sinks:
            return list(events)
        out: list[FromWorker] = []
        touched: dict[int, _Sink] = {}
        at = ""  # one time for the step's events, made when a dialect stamps them
        for ev in events:
            sink = self._sinks.get(ev.req_id)
            if sink is None:
                out.append(ev)
            elif type(ev) is TokenOut:
                if sink.sock is None:
                    sink.history.append(ev)
                    out.append(ev)
                else:
                    if not at and sink.spec is not None and sink.spec.stamped:
                        at = iso_time()
                    sink.add(ev, at)
                    touched[ev.req_id] = sink
            else:
                if isinstance(ev, (Finished, Failed)):
                    del self._sinks[ev.req_id]
                    self._held.pop(ev.req_id, None)
                    if sink.sock is not None:
                        out.append(sink.stop(ev.req_id))
                out.append(ev)
        now = time.monotonic()
        ahead = now - self._routed  # the next step's write, expected this much later
        if step:
            self._routed = now
        self._held.update(touched)
        for req_id, sink in list(self._held.items()):
            if sink.sock is None or req_id not in self._sinks:
                del self._held[req_id]  # ended (its stop wrote what it held)
                continue
            assert sink.spec is not None
            if now + ahead - sink.sent_at < sink.spec.interval_s and not sink.unsent:
                continue  # the next step's write is soon enough: one send for both
            del self._held[req_id]
            sink.sent_at = now
            error = sink.flush()
            if error:
                out.extend(self._failed(req_id, sink, error))
            elif now - sink.reported >= REPORT_S and (sink.ids or sink.text):
                sink.reported = now
                out.append(sink.report(req_id, final=False))
        return out

    def detach_all(self) -> list[FromWorker]:
        """Stop writing every stream (they move to another worker): a `Wrote` for each
        attached one; the kept events of the others are dropped (their Attach, if one
        comes, goes to the new worker, which leaves those streams to the parent)."""
        out: list[FromWorker] = []
        for req_id, sink in self._sinks.items():
            if sink.sock is not None:
                out.append(sink.stop(req_id))
        self._sinks.clear()
        self._held.clear()
        return out

    def close(self) -> None:
        """Close every descriptor held (the worker exits)."""
        for sink in self._sinks.values():
            if sink.sock is not None:
                with contextlib.suppress(OSError):
                    sink.sock.close()
        self._sinks.clear()
        self._held.clear()

    def _failed(self, req_id: int, sink: _Sink, error: str) -> list[FromWorker]:
        """A stream whose socket failed: its Wrote, then its end (cancelled)."""
        del self._sinks[req_id]
        return [sink.report(req_id, error=error), *self._cancel(req_id)]
