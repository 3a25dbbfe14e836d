"""A generation's reply as every dialect renders it: the text a client may see, the
reasoning, and the tool calls read from it.

With tools offered (`Run.tool_format`), text that may still be a call is held back
while streaming (`tool_calls.ToolCallStream`) and the calls are read once the reply is
complete; with a reasoning section (`Run.reasoning`, server/reasoning.py, for chats
whose template renders `<think>`), the reasoning is split off first, so calls are only
read from the answer.

- `read_reply(text, ...)`: a whole reply → (reasoning, answer, calls).
- `reply_events(run, ...)`: the one loop over a streamed run: a `Delta` per engine
  event (its text cut to what may be sent now), then one `Final` (what was held back,
  and the calls). It closes the run's events and the run however it ends; a consumer
  that may stop early closes it in turn (`contextlib.aclosing`), so that nothing is
  left to the garbage collector.

The dialects differ only in how they render these (chunks, lines, content blocks,
output items), never in how a reply is read.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from inferenceos.engine.generation import TokenEvent
from inferenceos.server.generation import Done, Run
from inferenceos.server.reasoning import Reasoning, ThinkingSplit, split_reasoning
from inferenceos.server.tool_calls import ParsedCall, ToolCallStream, ToolFormat, parse_tool_calls


def read_reply(text: str, tool_format: ToolFormat | None,
               reasoning: Reasoning | None = None) -> tuple[str, str, list[ParsedCall]]:
    """(reasoning, answer, calls) of a whole reply; without tools no calls, without a
    reasoning section no reasoning."""
    thought, answer = split_reasoning(text, reasoning)
    calls: list[ParsedCall] = []
    if tool_format is not None:
        answer, calls = parse_tool_calls(answer, tool_format)
    return thought, answer, calls


class ReplyText:
    """A streamed reply's text, piece by piece: `feed` gives the (reasoning, answer)
    text that may be sent now, `finish` what was held back and the calls."""

    def __init__(self, tool_format: ToolFormat | None,
                 reasoning: Reasoning | None = None) -> None:
        self._split = ThinkingSplit(reasoning) if reasoning else None
        self._held = ToolCallStream(tool_format) if tool_format else None

    def feed(self, piece: str) -> tuple[str, str]:
        thought, text = self._split.feed(piece) if self._split else ("", piece)
        if self._held is not None and text:
            text = self._held.feed(text)
        return thought, text

    def finish(self) -> tuple[str, str, list[ParsedCall]]:
        thought, text = self._split.finish() if self._split else ("", "")
        if self._held is None:
            return thought, text, []
        if text:
            text = self._held.feed(text)
        rest, calls = self._held.finish()
        return thought, text + rest, calls


@dataclass(frozen=True)
class Delta:
    """One engine event (token, flush or prompt progress) and the text it lets the
    client see now (none while a call may be being written)."""

    event: TokenEvent
    text: str = ""
    thought: str = ""


@dataclass(frozen=True)
class Final:
    """The end of the reply: its Done, the text held back until now, the calls."""

    done: Done
    text: str = ""
    thought: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


async def reply_events(run: Run) -> AsyncGenerator[Delta | Final, None]:
    """Every event of `run` as a Delta, then one Final (see the module contract); the
    reasoning is split off as `run.reasoning` says."""
    reply = ReplyText(run.tool_format, run.reasoning)
    events = run.events()
    try:
        async for item in events:
            if isinstance(item, Done):
                thought, text, calls = reply.finish()
                yield Final(item, text, thought, calls)
            else:
                thought, text = reply.feed(item.text) if item.text else ("", "")
                yield Delta(item, text, thought)
    finally:
        await events.aclose()
        await run.close()
