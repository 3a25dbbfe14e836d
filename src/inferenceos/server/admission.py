"""A bounded queue in front of the engines: N requests run, M wait, the rest get 429.

`Admission.enter()` returns a `Ticket` once the request may run (waiting first if all
running slots are taken) or raises `APIError(429)` with `Retry-After` when the queue is
full. `Ticket.leave()` frees the slot; it is idempotent, so both a stream's `finally`
and an error path may call it. Everything runs on the event loop: no locks needed.
"""

from __future__ import annotations

import asyncio
from collections import deque

from inferenceos.server.errors import APIError


class Ticket:
    """A running slot held by one request."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._held = True

    def leave(self) -> None:
        if self._held:
            self._held = False
            self._admission._leave()


class Admission:
    """`max_running` concurrent requests, `max_waiting` more in FIFO order."""

    def __init__(self, max_running: int, max_waiting: int, retry_after_s: int = 2) -> None:
        self.max_running = max(1, max_running)
        self.max_waiting = max(0, max_waiting)
        self.retry_after_s = retry_after_s
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def enter(self) -> Ticket:
        """Wait for a running slot; APIError 429 when the queue is full."""
        if self.running < self.max_running and not self._waiters:
            self.running += 1
            return Ticket(self)
        if len(self._waiters) >= self.max_waiting:
            raise APIError(429, f"server busy: {self.running} requests running and "
                           f"{self.waiting} queued; retry later", "queue_full",
                           {"Retry-After": str(self.retry_after_s)})
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # _leave() hands us its slot (running is not decremented)
        except BaseException:
            if fut in self._waiters:
                self._waiters.remove(fut)
            elif fut.done() and not fut.cancelled():
                self._leave()  # we were handed a slot but are going away: pass it on
            raise
        return Ticket(self)

    def _leave(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.running -= 1
