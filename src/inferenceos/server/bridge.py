"""Run blocking engine work in a thread and consume its results on the event loop.

`ThreadStream(job)` starts `job(cancel)` — a generator function doing blocking work
(lease a model, generate tokens) — in its own thread, and yields what it yields, in
order, as an async iterator. Exceptions raised in the job re-raise in the consumer.

Cancellation: `aclose()` (or the consumer being cancelled, e.g. when the client
disconnects) sets `cancel`, a `CancelEvent`: its `set()` wakes the engine's stream
waiting for its next token (no timer), which ends the generation, so the job finishes
soon after (its last items, e.g. the final metrics, still arrive
for a consumer that is still listening, as during a graceful shutdown). The job's own
`finally` blocks (releasing the lease, closing the generation) always run in the worker
thread, never on the event loop.

Delivery: the items of every stream on one event loop go through one `_Waker`, which
wakes the loop once for all that arrived while it was busy (one self-pipe write and
one callback per burst), not once per item: a scheduler step gives every stream its
token at the same moment, and `call_soon_threadsafe` per token per stream was a
syscall and a loop wake-up each (issue 44: 8 and 32 streams of the tiny model).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

from inferenceos.engine.cancel import CancelEvent

T = TypeVar("T")
_DONE = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Waker:
    """One event loop's inbox from the job threads (see the module docstring).

    `put` appends (stream queue, item) and schedules `_drain` unless one is scheduled
    already; `_drain` clears that mark before it takes the items, so an item appended
    after the mark was cleared schedules another drain: none is ever left behind."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: collections.deque[tuple[asyncio.Queue[Any], Any]] = collections.deque()
        self._scheduled = False

    def put(self, queue: asyncio.Queue[Any], item: Any) -> bool:
        """Hand `item` to `queue` on the loop; False when the loop is gone."""
        self._items.append((queue, item))
        if self._scheduled:
            return not self._loop.is_closed()
        self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is gone (shutdown): nobody is listening
            return False
        return True

    def _drain(self) -> None:
        self._scheduled = False
        items = self._items
        while items:
            queue, item = items.popleft()
            queue.put_nowait(item)


_WAKERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waker] = (
    weakref.WeakKeyDictionary())
_WAKERS_LOCK = threading.Lock()


def _waker(loop: asyncio.AbstractEventLoop) -> _Waker:
    with _WAKERS_LOCK:
        waker = _WAKERS.get(loop)
        if waker is None:
            waker = _WAKERS[loop] = _Waker(loop)
        return waker


class ThreadStream(Generic[T]):
    """An async iterator over the items of a generator run in a dedicated thread."""

    def __init__(self, job: Callable[[CancelEvent], Iterator[T]],
                 cancel: CancelEvent | None = None, name: str = "generation") -> None:
        self.cancel = cancel or CancelEvent()
        self._loop = asyncio.get_running_loop()
        self._waker = _waker(self._loop)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._finished = False
        self._thread = threading.Thread(target=self._work, args=(job,), name=name, daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> None:
        if not self._waker.put(self._queue, item):  # the loop is gone: nobody listens
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

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)
