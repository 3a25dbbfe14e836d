"""The parent's end of the worker pipe: one worker process, and which one an engine uses.

- `WorkerClient`: a spawned worker process (engine/worker/main.py), its pipe, the reader
  thread that routes each reply to its request's queue (`pending`, by request id), and
  the death of the process turned into a `Failed("WorkerDiedError")` on every queue
  still waiting. It knows nothing of requests beyond their ids.
- `CurrentWorker`: the worker an `Engine`'s requests go to now. It numbers requests
  (ids stay unique across the workers of one engine, so a migration can move a stream's
  queue to the new worker), asks and waits for one answer (`ask`), starts a fresh
  worker when the last one died, and is closed once for good. Its `route` lock is held
  while a request picks its worker and sends, and while a migration swaps workers
  (engine/worker/swap.py): no request lands on a worker whose sequences are moving.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import queue
import threading
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.reduction import send_handle
from pathlib import Path
from typing import TypeVar, cast

import inferenceos.errors as errors
from inferenceos.engine.messages import (
    Ask,
    Attach,
    Failed,
    FromWorker,
    Ready,
    Result,
    Shutdown,
    ToWorker,
    WorkerInfo,
)
from inferenceos.engine.worker.main import WorkerConfig, unpack_step, worker_main
from inferenceos.hardware import cpu_share

__all__ = ["CurrentWorker", "Replies", "WorkerClient", "WouldWait"]

R = TypeVar("R")
Reply = FromWorker | None


class Replies:
    """A request's replies, in order; None is no reply but a wake-up for the stream
    reading them (its cancel was set: engine.Engine._start).

    They wait in a SimpleQueue (C: a put and a get per token of every stream are its
    path, and queue.Queue's Condition cost ~5 us of Python per token there, issue 44;
    its blocking `get()` still ends on EINTR for Ctrl-C; `get` is the queue's own
    method, so a thread blocked in it is blocked in C) until `divert(sink)`: then
    what waited, and every later reply, goes to `sink` instead (an event loop's
    reader, engine.base.LoopEvents), in the same order."""

    __slots__ = ("_lock", "_queue", "_sink", "get")

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Reply] = queue.SimpleQueue()
        self._sink: Callable[[Reply], None] | None = None
        self._lock = threading.Lock()
        self.get = self._queue.get

    def put(self, item: Reply) -> None:
        """Deliver `item` (any thread; never blocks)."""
        with self._lock:
            if self._sink is None:
                self._queue.put(item)
            else:
                self._sink(item)

    def divert(self, sink: Callable[[Reply], None]) -> None:
        """From now on deliver to `sink` (which must not block), the replies that
        waited first; nothing may `get` afterwards."""
        with self._lock:
            while not self._queue.empty():
                sink(self._queue.get_nowait())
            self._sink = sink


class WouldWait(Exception):
    """A call made with `wait=False` (from an event loop) would have waited for another
    thread; nothing was done."""


class WorkerClient:
    """A running worker process and the thread that routes its replies."""

    def __init__(self, cfg: WorkerConfig, start_timeout: float) -> None:
        """Start the worker and wait up to `start_timeout` s for its `Ready`; a worker
        that fails to load raises what it reported (ModelLoadError otherwise)."""
        ctx = mp.get_context("spawn")  # no fork: the parent may hold threads and locks
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, cfg), daemon=True)
        # at the process's own priority even when asked from a lowered serving thread
        cpu_share.start_at_base(self.proc.start)
        child.close()
        self.pending: dict[int, Replies] = {}
        self.lock = threading.Lock()
        self.alive = True
        if not self.conn.poll(start_timeout):
            self.kill()
            raise errors.ModelLoadError(f"the model worker did not start in {start_timeout:.0f} s")
        try:
            [first] = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            raise errors.ModelLoadError(
                f"the model worker died while loading (exit code {self.proc.exitcode})"
            ) from None
        if not isinstance(first, Ready):
            self.proc.join(5)
            if isinstance(first, Failed):
                raise first.exception()
            raise errors.ModelLoadError(f"the model worker sent {type(first).__name__} first")
        self.info: WorkerInfo = first.info
        threading.Thread(target=self._read, daemon=True, name="engine-reader").start()

    def _read(self) -> None:
        cpu_share.lower_this_thread()  # serve's HTTP side: after the worker's threads
        try:
            while True:
                out: FromWorker
                for out in unpack_step(self.conn.recv()):
                    q = self.pending.get(out.req_id)
                    if q is not None:
                        q.put(out)
        except (EOFError, OSError):
            pass
        self.proc.join(5)
        with self.lock:
            self.alive = False
            from inferenceos.engine.llama.devices import abort_note

            died = (f"the model worker died (exit code {self.proc.exitcode})"
                    + abort_note(self.proc.pid or 0))
            for rid, q in self.pending.items():
                q.put(Failed(rid, "WorkerDiedError", died))

    def send(self, msg: ToWorker, register: bool = False, wait: bool = True
             ) -> Replies | None:
        """Send `msg`; with `register`, return the queue its replies (those of
        `msg.req_id`) go to. `wait` False (an event loop): WouldWait, sending nothing,
        while another thread sends."""
        if not self.lock.acquire(blocking=wait):
            raise WouldWait("another thread is sending to the model worker")
        try:
            if not self.alive:
                raise errors.WorkerDiedError("the model worker is not running")
            q: Replies | None = None
            if register:
                q = self.pending[msg.req_id] = Replies()
            try:
                self.conn.send(msg)
            except (OSError, ValueError):
                self.alive = False
                raise errors.WorkerDiedError("the model worker is not running") from None
            return q
        finally:
            self.lock.release()

    def send_socket(self, msg: Attach, fd: int) -> bool:
        """Send `msg` and then the descriptor `fd` (SCM_RIGHTS, the pipe is a socket
        pair), one after the other under the send lock: the worker reads the descriptor
        right after the message. The worker gets its own copy; `fd` stays ours. False,
        sending nothing, while another thread sends (the caller is an event loop)."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if not self.alive:
                raise errors.WorkerDiedError("the model worker is not running")
            try:
                self.conn.send(msg)
            except (OSError, ValueError):
                self.alive = False
                raise errors.WorkerDiedError("the model worker is not running") from None
            try:
                send_handle(self.conn, fd, self.proc.pid or 0)
            except (OSError, ValueError):
                # the worker waits for the descriptor after the message: it would wait
                # for good, so its requests fail now (the reader sees it die)
                self.alive = False
                self.proc.kill()
                raise errors.WorkerDiedError("the model worker could not take a socket") \
                    from None
            return True
        finally:
            self.lock.release()

    def done(self, req_id: int) -> None:
        """Stop routing `req_id`'s replies (later ones are dropped)."""
        with self.lock:
            self.pending.pop(req_id, None)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)

    def shutdown(self, timeout: float = 10) -> None:
        """Ask the worker to exit; kill it if it has not after `timeout` s."""
        try:
            with self.lock:
                self.conn.send(Shutdown())
        except (OSError, ValueError):
            pass
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.kill()


class CurrentWorker:
    """The worker one engine's requests go to (see the module doc). `cfg` is what that
    worker was started with; a restart after a death starts the same again."""

    def __init__(self, cfg: WorkerConfig, start_timeout: float) -> None:
        self.cfg = cfg
        self.start_timeout = start_timeout
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False  # set by close(): no call may start a worker again
        self.route = threading.RLock()
        self.worker = WorkerClient(cfg, start_timeout)

    def start(self, cfg: WorkerConfig) -> WorkerClient:
        """A new worker on `cfg` (not yet the current one: see `swap`)."""
        return WorkerClient(cfg, self.start_timeout)

    def live(self) -> WorkerClient:
        """The current worker, started again first if it died; WorkerDiedError once
        closed."""
        with self._lock:
            if self._closed:
                raise errors.WorkerDiedError("the engine was closed (the model is unloaded)")
            if not self.worker.alive:
                self.worker.proc.join(1)  # dead: returns at once, with its exit code
                _record_death(self.cfg.path, self.worker.proc.exitcode)
                self.worker = WorkerClient(self.cfg, self.start_timeout)
            return self.worker

    def live_now(self) -> WorkerClient | None:
        """`live()` for an event loop: None where it would wait (a restart holds the
        lock) or start a worker (the last one died)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed:
                raise errors.WorkerDiedError("the engine was closed (the model is unloaded)")
            return self.worker if self.worker.alive else None
        finally:
            self._lock.release()

    def current(self) -> WorkerClient:
        """The current worker as it is, dead or alive (WorkerDiedError once closed):
        for a question that must not start a worker (a read, such as stats). Without
        `_lock`, which a restart holds while the new worker loads: a read does not wait
        for a load (it asks the dead worker and fails at once)."""
        if self._closed:
            raise errors.WorkerDiedError("the engine was closed (the model is unloaded)")
        return self.worker

    def swap(self, worker: WorkerClient, cfg: WorkerConfig) -> None:
        """Make `worker` (started on `cfg`) the current one; call it under `route`."""
        self.worker, self.cfg = worker, cfg

    def submit(self, worker: WorkerClient, msg: ToWorker, wait: bool = True
               ) -> tuple[int, Replies]:
        """Number `msg` and send it to `worker`; (its request id, its replies' queue).
        `wait` False: WouldWait while another thread sends (`WorkerClient.send`)."""
        req_id = next(self._ids)
        q = worker.send(replace(msg, req_id=req_id), register=True, wait=wait)
        assert q is not None
        return req_id, q

    def ask(self, msg: Ask[R], worker: WorkerClient | None = None) -> R:
        """Send `msg` and wait for its one answer; raises the error the worker reported.
        To `worker` (a migration's old or new one), or by default to the live worker,
        picked and sent to under the route lock (no migration swaps it in between)."""
        if worker is None:
            with self.route:
                worker = self.live()
                req_id, q = self.submit(worker, msg)
        else:
            req_id, q = self.submit(worker, msg)
        try:
            reply = q.get()
        finally:
            worker.done(req_id)
        if isinstance(reply, Failed):
            raise reply.exception()
        if not isinstance(reply, Result):
            raise errors.GenerationError(
                f"the model worker answered {type(msg).__name__} with {type(reply).__name__}")
        # the worker answers an Ask[R] with an R (engine.messages): the pipe is untyped
        return cast(R, reply.value)

    def close(self) -> None:
        """Stop the worker (waits for it to exit; kills it after 10 s). Final: later
        calls to `live` raise WorkerDiedError instead of starting a new worker."""
        with self._lock:
            self._closed = True
        self.worker.shutdown()


def _record_death(path: Path, exit_code: int | None) -> None:
    """A `worker_death` telemetry event (the worker is being restarted); never raises."""
    try:
        import inferenceos.telemetry as telemetry

        telemetry.recorder().event("worker_death", path, exit_code=exit_code, restarted=True)
    except Exception:  # telemetry never fails a request
        pass
