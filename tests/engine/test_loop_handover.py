"""A stream handed to its worker, on the event loop's side (engine/base.py
`LoopEvents.attach`): which events the reader gets, whatever the worker answers. The
engine's hand-over is a recording stand-in here (what reaches a real worker is
tests/engine/worker/test_direct_sinks.py and tests/server/test_direct_stream.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferenceos.engine.base import Generation, Handover, LoopEvents
from inferenceos.engine.cancel import CancelEvent
from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.engine.generation import GenerationMetrics, TokenEvent
from inferenceos.engine.messages import Failed, Finished, TokenOut, Wrote
from inferenceos.errors import WorkerDiedError

SPEC = FrameSpec(("data: ", "\n\n"), ("text",))
END = Finished(1, GenerationMetrics(stop_reason="length"))


class Side:
    """The loop's side of one stream: its LoopEvents, and what it attached."""

    def __init__(self, loop: asyncio.AbstractEventLoop, accept: bool = True) -> None:
        self.cancel = CancelEvent()
        self.sent: list[tuple[int, int]] = []
        self.stops = 0
        self.unsent: list[bytes] = []
        self.ended: list[bool] = []

        def attach(frame: FrameSpec, fd: int, written: int) -> bool:
            self.sent.append((fd, written))
            return accept

        def stop() -> None:
            self.stops += 1

        self.events = LoopEvents(loop, Generation(iter(())), self.cancel, 0.0,
                                 self.ended.append, Handover(attach, stop))

    def attach(self) -> bool:
        return self.events.attach(SPEC, 7, self.unsent.append)

    def feed(self, *items: Any) -> None:
        for item in items:
            self.events._feed(item)

    async def handed(self, *tokens: TokenOut) -> None:
        """`tokens` delivered, the first read (and written), then the hand-over."""
        self.feed(*tokens)
        await self.read(1)
        assert self.attach()

    async def read(self, n: int) -> list[TokenEvent]:
        return [await self.events.__anext__() for _ in range(n)]

    async def rest(self) -> list[TokenEvent]:
        return [ev async for ev in self.events]


def test_what_the_worker_wrote_comes_as_reports_and_the_rest_is_dropped() -> None:
    async def main() -> None:
        side = Side(asyncio.get_running_loop())
        side.feed(TokenOut(1, 5, "a"), TokenOut(1, 6, "b"))
        [first] = await side.read(1)
        assert side.attach() and side.sent == [(7, 1)]
        side.feed(TokenOut(1, 7, "c"),  # the worker writes b and c itself
                  Wrote(1, (6,), "b", final=False), Wrote(1, (7,), "c", b"3\r\nabc\r\n"),
                  END)
        rest = await side.rest()
        assert [(e.token, e.text, e.written) for e in [first, *rest]] == [
            (5, "a", None), (-1, "b", (6,)), (-1, "c", (7,))]
        assert side.unsent == [b"3\r\nabc\r\n"]

    asyncio.run(main())


def test_a_refused_or_late_attach_leaves_every_token_to_the_reader() -> None:
    async def main() -> None:
        for answer in (Wrote(1, (), "", refused=True), END):
            side = Side(asyncio.get_running_loop())
            await side.handed(TokenOut(1, 5, "a"), TokenOut(1, 6, "b"))
            side.feed(TokenOut(1, 7, "c"), answer, *([END] if answer is not END else []))
            assert [e.text for e in await side.rest()] == ["b", "c"]

    asyncio.run(main())


def test_a_worker_that_dies_handed_over_leaves_its_error_not_its_tokens() -> None:
    async def main() -> None:
        side = Side(asyncio.get_running_loop())
        await side.handed(TokenOut(1, 5, "a"))
        side.feed(TokenOut(1, 6, "b"), Failed(1, "WorkerDiedError", "gone"))
        # "b" may have been written by the worker already: never a second time
        with pytest.raises(WorkerDiedError, match="gone"):
            await side.read(1)

    asyncio.run(main())


def test_a_cancel_waits_for_the_workers_report_and_never_attaches_after_it() -> None:
    async def main() -> None:
        side = Side(asyncio.get_running_loop())
        await side.handed(TokenOut(1, 5, "a"))
        side.cancel.set()
        side.feed(None)  # the cancel's wake-up
        reading = asyncio.ensure_future(side.rest())
        await asyncio.sleep(0)
        assert not reading.done() and side.stops == 1  # waits for the report
        side.feed(Wrote(1, (6,), "b", b"tail"), END)
        assert [e.written for e in await reading] == [(6,)]
        assert side.unsent == [b"tail"]
        late = Side(asyncio.get_running_loop())
        late.feed(TokenOut(1, 5, "a"))
        await late.read(1)
        late.cancel.set()
        assert not late.attach() and late.sent == []  # a cancelled stream stays ours
        assert late.events.handed_over is False

    asyncio.run(main())


def test_an_attach_the_engine_cannot_send_now_is_tried_again() -> None:
    async def main() -> None:
        side = Side(asyncio.get_running_loop(), accept=False)
        side.feed(TokenOut(1, 5, "a"), TokenOut(1, 6, "b"))
        await side.read(1)
        assert not side.attach() and not side.events.handed_over
        assert [e.text for e in await side.read(1)] == ["b"]  # still ours, in order

    asyncio.run(main())
