"""Run blocking engine work in a thread and consume its results on the event loop.

`ThreadStream(job)` starts `job(cancel)` — a generator function doing blocking work
(lease a model, generate tokens) — in a thread of its own, and yields what it yields,
in order, as an async iterator. Exceptions raised in the job re-raise in the consumer.
The threads are reused (`_Threads`): a job never waits for a thread to be made, and
the event loop is never held in `Thread.start()`, which waits until the new thread
runs (on a busy 2-core machine, milliseconds of every stream's time, per request).

Cancellation: `aclose()` (or the consumer being cancelled, e.g. when the client
disconnects) sets `cancel`, a `CancelEvent`: its `set()` wakes the engine's stream
waiting for its next token (no timer), which ends the generation, so the job finishes
soon after (its last items, e.g. the final metrics, still arrive
for a consumer that is still listening, as during a graceful shutdown). The job's own
`finally` blocks (releasing the lease, closing the generation) always run in the worker
thread, never on the event loop.

`ReadyStream(items, cancel)` is the same iterator over items a job made at once on the
event loop: a small request on a hot model starts there, with no thread
(server/generation.py, `_started_now`).

Delivery: the items of every stream on one event loop go through the loop's one
`engine.base.LoopInbox`, which wakes the loop once for all that arrived while it was
busy (one self-pipe write and one callback per burst), not once per item (issue 44).
A generation's tokens do not pass through here at all when the engine can deliver them
to the loop itself (server/generation.py, `engine.base.LoopEvents`).
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

from inferenceos.engine.base import loop_inbox
from inferenceos.engine.cancel import CancelEvent

T = TypeVar("T")
_DONE = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Threads:
    """Threads that run jobs one after the other: a job goes to an idle thread, or to
    a new one when none is idle (never queued behind a running job: a generation's job
    runs as long as its generation). At most `keep` stay idle; an idle thread blocks in
    its queue's get() (no timer) until the next job."""

    def __init__(self, keep: int = 64) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], str]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._keep = keep

    def run(self, fn: Callable[[], None], name: str) -> None:
        """Run `fn()` in a thread named `name` (fn must not raise)."""
        with self._lock:
            new = self._idle == 0  # else an idle thread is spoken for: it takes this job
            if not new:
                self._idle -= 1
        if new:  # started first: a thread that cannot start leaves no job queued
            threading.Thread(target=self._serve, name=name, daemon=True).start()
        self._jobs.put((fn, name))

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            fn, me.name = self._jobs.get()
            fn()
            with self._lock:
                if self._idle >= self._keep:
                    return
                self._idle += 1


_THREADS = _Threads()


class ThreadStream(Generic[T]):
    """An async iterator over the items of a generator run in a thread of its own."""

    def __init__(self, job: Callable[[CancelEvent], Iterator[T]],
                 cancel: CancelEvent | None = None, name: str = "generation") -> None:
        self.cancel = cancel or CancelEvent()
        self._loop = asyncio.get_running_loop()
        self._inbox = loop_inbox(self._loop)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._finished = False
        _THREADS.run(lambda: self._work(job), name)

    def _put(self, item: Any) -> None:
        if not self._inbox.put(self._queue.put_nowait, item):  # the loop is gone
            self.cancel.set()

    def _work(self, job: Callable[[CancelEvent], Iterator[T]]) -> None:
        it: Iterator[T] | None = None
        try:
            it = job(self.cancel)
            for item in it:  # the job itself watches `cancel` (the engine does)
                self._put(item)
        except BaseException as exc:
            self._put(_Failure(exc))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:
                    self._put(_Failure(exc))
            self._put(_DONE)

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        if self._finished:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:
            self.cancel.set()
            raise
        if item is _DONE:
            self._finished = True
            raise StopAsyncIteration
        if isinstance(item, _Failure):
            self._finished = True
            self.cancel.set()
            raise item.exc
        return item

    async def aclose(self) -> None:
        """Stop the job (it ends at its next item); does not wait for the thread."""
        self.cancel.set()
        self._finished = True


class ReadyStream(Generic[T]):
    """ThreadStream's counterpart for a job that ran at once on the event loop (one
    that never waits: server/generation.py, `_started_now`): its items, as the same
    async iterator. `aclose()` sets `cancel`, as ThreadStream's does: what an item
    not taken holds ends by it (a generation's `_OnLoop` does)."""

    def __init__(self, items: list[T], cancel: CancelEvent) -> None:
        self.cancel = cancel
        self._items = collections.deque(items)

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        if not self._items:
            raise StopAsyncIteration
        return self._items.popleft()

    async def aclose(self) -> None:
        self.cancel.set()
        self._items.clear()
