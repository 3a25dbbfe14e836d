"""How the operations routes read what they report without waiting behind model work.

The operations routes (/health, /api/version, /api/ps, /api/budget, /metrics,
/v1/models, and /api/events, the dashboard's and `monitor`'s feed) answer while models
load, migrate, generate or lose their worker. The contract (tests/server/
test_ops_never_wait.py holds every model-work lock and fills the default executor while
it asks them):

- they read snapshots: the manager's loaded models (under its `_lock`, which nothing
  holds across a load, a migration or any I/O), the pressure reactor's last sample and
  signals, the event ring; never `_load_lock`, an engine's `route` lock or a worker's
  pipe directly;
- what they must compute from the file system (the budget's machine: the cached
  hardware profile, /proc) runs on `OPS_POOL`, an executor of their own: asyncio's
  default one has only min(32, CPUs + 4) threads (six on two cores) and other work may
  fill it;
- a question to another process (an engine worker's KV figures, a cluster worker's
  state) goes through a `Latest`: at most one probe in flight per key, on a thread of
  its own; the route waits for it at most a bound and otherwise does without (or with
  the last answer). A probe stuck behind a load, a migration or a frozen worker blocks
  only itself, and no second one piles up behind it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# a few threads: every job on it is short (a file read, a /proc read, a SQLite listing)
OPS_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="ops")


async def ops_call(fn: Callable[[], T]) -> T:
    """Run the short blocking read `fn` on the operations' own executor (never the
    default one, which other work may fill) and return its result."""
    return await asyncio.get_running_loop().run_in_executor(OPS_POOL, fn)


class Latest(Generic[K, V]):
    """One probe in flight per key, each on its own daemon thread, and the last answer
    per key (thread-safe).

    `fresh(key, fn, wait_s)` starts `fn` for `key` unless a probe of `key` is already
    running (then it waits for that one), and returns its answer if it comes within
    `wait_s` (None: however long it takes); otherwise TimeoutError, and the probe goes
    on: its answer becomes `last(key)` when it lands. A probe's exception is raised to
    whoever waits for it and leaves `last(key)` as it was."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._last: dict[K, V] = {}
        self._running: dict[K, concurrent.futures.Future[V]] = {}

    def last(self, key: K) -> V | None:
        """The last answer a probe of `key` gave (None before the first)."""
        with self._lock:
            return self._last.get(key)

    def pending(self, key: K) -> concurrent.futures.Future[V] | None:
        """The probe of `key` in flight, if any."""
        with self._lock:
            return self._running.get(key)

    def start(self, key: K, fn: Callable[[], V]) -> concurrent.futures.Future[V]:
        """The probe of `key` in flight, started with `fn` if none is."""
        with self._lock:
            running = self._running.get(key)
            if running is not None:
                return running
            future: concurrent.futures.Future[V] = concurrent.futures.Future()
            future.set_running_or_notify_cancel()  # nobody may cancel it: it reports
            self._running[key] = future
        threading.Thread(target=self._probe, args=(key, fn, future), daemon=True,
                         name=f"probe-{self._name}").start()
        return future

    def _probe(self, key: K, fn: Callable[[], V], future: concurrent.futures.Future[V]) -> None:
        try:
            value = fn()
        except BaseException as exc:  # handed to the waiters, whatever it is
            with self._lock:
                self._running.pop(key, None)
            future.set_exception(exc)
            return
        with self._lock:
            self._last[key] = value
            self._running.pop(key, None)
        future.set_result(value)

    async def fresh(self, key: K, fn: Callable[[], V], wait_s: float | None) -> V:
        """A new answer for `key` within `wait_s` seconds (see the class doc)."""
        waiting = asyncio.wrap_future(self.start(key, fn))
        # an answer nobody waits for any more is still read (no "never retrieved" log)
        waiting.add_done_callback(_consume)
        # shielded: a timeout stops the wait, not the probe (its answer is still kept)
        return await asyncio.wait_for(asyncio.shield(waiting), wait_s)

    def forget(self, keep: set[K]) -> None:
        """Drop the last answers of keys not in `keep` (engines unloaded since)."""
        with self._lock:
            for key in [k for k in self._last if k not in keep]:
                del self._last[key]


def _consume(future: asyncio.Future[V]) -> None:
    if not future.cancelled():
        future.exception()
