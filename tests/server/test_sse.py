"""server/sse.py: the framings' JSON is json.dumps' own text, and a stream that is
behind its generation writes its waiting events in one chunk (issue 44), the same
bytes in the same order as one chunk per event."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from inferenceos.server.errors import APIError
from inferenceos.server.sse import LLAMACPP_SSE, MAX_COALESCED, NDJSON, OPENAI_SSE, _dumps, framed


def test_dumps_writes_what_json_dumps_writes() -> None:
    for obj in [{"a": 1, "b": [1, 2.5, None, True], "c": "héllo\n\"x\"\u2028"}, [], {},
                "s", float("inf"), {"x": float("nan")}, {1: "int key"}, 10**30,
                {"nested": {"d": [{"e": -0.0}]}}]:
        assert _dumps(obj) == json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class Source:
    """Events as a generation gives them: `waiting` of them are there at once (the
    stream is behind), the rest arrive one by one, each after the reader asked."""

    def __init__(self, n: int, waiting: int, fail_at: int | None = None) -> None:
        self.n, self.waiting, self.fail_at = n, waiting, fail_at
        self.given = 0

    def ready(self) -> bool:
        return self.given < self.waiting

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        while self.given < self.n:
            if self.given == self.fail_at:
                raise APIError(500, "the model worker died", "server_error")
            if self.given >= self.waiting:
                await asyncio.sleep(0)  # one loop turn: the next event "arrives"
            self.given += 1
            yield {"index": 0, "content": f"t{self.given}", "stop": False}


async def _chunks(src: Source, framing: Any, coalesce: bool) -> list[str]:
    return [c async for c in framed(src.events(), framing, src.ready if coalesce else None)]


def test_waiting_events_go_out_in_one_chunk_with_the_same_bytes() -> None:
    for framing in (LLAMACPP_SSE, OPENAI_SSE, NDJSON):
        one_by_one = asyncio.run(_chunks(Source(10, 4), framing, False))
        coalesced = asyncio.run(_chunks(Source(10, 4), framing, True))
        assert "".join(coalesced) == "".join(one_by_one)
        assert len(one_by_one) == 10 + bool(framing.end)
        # the 4 that were waiting in one chunk, then one chunk per event as they come
        assert coalesced[0] == "".join(one_by_one[:4]) and coalesced[1:] == one_by_one[4:]


def test_a_chunk_holds_at_most_max_coalesced_events() -> None:
    n = 2 * MAX_COALESCED + 3
    coalesced = asyncio.run(_chunks(Source(n, n), LLAMACPP_SSE, True))
    assert [c.count("data: ") for c in coalesced] == [MAX_COALESCED, MAX_COALESCED, 3]


def test_events_held_when_the_stream_fails_go_out_before_the_error() -> None:
    coalesced = asyncio.run(_chunks(Source(10, 10, fail_at=3), OPENAI_SSE, True))
    text = "".join(coalesced)
    assert [json.loads(line[6:]).get("content") for line in text.split("\n\n")
            if line.startswith("data: {")][:3] == ["t1", "t2", "t3"]
    assert '"error"' in coalesced[-2] and coalesced[-1] == "data: [DONE]\n\n"
