"""A cancel flag that pushes: `CancelEvent`, what `generate(cancel=...)` takes.

A plain `threading.Event` can only be looked at, so a stream blocked waiting for its
next token would have to wake on a timer to notice it was cancelled (every open stream
did, 20 times a second). A `CancelEvent` is a `threading.Event` whose `set()` also runs
the wake-ups registered with `on_set`: the engine registers one that puts a message on
the stream's own reply queue (as vLLM's aborts queue does), so the waiting thread wakes
at once, and no thread ever wakes to find nothing. A leaf: the standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["CancelEvent"]

Wake = Callable[[], None]


class CancelEvent(threading.Event):
    """A `threading.Event` that also runs its registered wake-ups when set.

    Contract: a wake-up registered with `on_set` runs exactly once after the event is
    set (at once, in the registering thread, when it already is), unless it was
    removed first; it runs in the thread that calls `set()` (a server's event loop, a
    signal handler's thread), so it must be quick and must not block: putting an item
    on an unbounded queue, setting another event. `clear()` re-arms nothing: a
    wake-up registered after a `set()` and a `clear()` waits for the next `set()`."""

    def __init__(self) -> None:
        super().__init__()
        self._wakes: list[Wake] = []
        self._wakes_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        # the flag is up before the list is taken: an `on_set` racing with us either
        # finds its wake-up taken here or sees the flag and runs the wake-up itself
        with self._wakes_lock:
            wakes, self._wakes = self._wakes, []
        for wake in wakes:
            wake()

    def on_set(self, wake: Wake) -> Callable[[], None]:
        """Run `wake` once this event is set (now, if it is); returns a function that
        unregisters it (a no-op once it ran), for a stream that ended first."""
        with self._wakes_lock:
            if not self.is_set():
                self._wakes.append(wake)
                return lambda: self._forget(wake)
        wake()
        return lambda: None

    def _forget(self, wake: Wake) -> None:
        with self._wakes_lock:
            if wake in self._wakes:
                self._wakes.remove(wake)
