"""chat's view of a thinking model's reply: reasoning pieces (`Thought`) folded into one
dimmed line that closes when the answer begins, left out of the history, kept for
`/think show`; `/think on|off` and `/set reasoning_budget` reach the request options."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from inferenceos.cli.chat_cmd import THEMES, _Fold
from inferenceos.cli.chat_session import ChatSession, ReplyStats, Thought
from inferenceos.errors import UsageError


class _Thinker:
    """A backend whose reply reasons, then answers; it records the options it got."""

    name, where, has_template, sees_images = "thinker", "test", True, False

    def __init__(self) -> None:
        self.stats = ReplyStats()
        self.options: dict[str, Any] = {}

    def reply(self, messages: list[dict[str, Any]], options: dict[str, Any]) -> Iterator[str]:
        self.options = dict(options)
        yield from (Thought("plan the "), Thought("answer"), "Paris", ".")

    def close(self) -> None:
        pass


def test_reasoning_is_folded_and_left_out_of_the_history() -> None:
    session = ChatSession(_Thinker())  # type: ignore[arg-type]
    pieces = list(session.ask("capital of France?"))
    assert [p for p in pieces if isinstance(p, Thought)] == ["plan the ", "answer"]
    assert session.history[-1] == {"role": "assistant", "content": "Paris."}
    assert session.thinking == "plan the answer"
    fold = _Fold(THEMES["none"], tty=False)
    assert fold.feed("plan the ") == "" and fold.feed("answer") == ""
    assert fold.close() == "[thinking: 3 words ... plan the answer] (/think show)\n"
    assert fold.close() == ""  # once
    live = _Fold(THEMES["dark"], tty=True)
    assert live.feed("a b").startswith("\r\033[2K\033[2m[thinking: 2 words")


def test_think_and_budget_options_reach_the_backend() -> None:
    backend = _Thinker()
    session = ChatSession(backend)  # type: ignore[arg-type]
    assert session.think("off") == "thinking off"
    assert session.set_option("reasoning_budget", "16") == "reasoning_budget = 16"
    list(session.ask("hi"))
    assert backend.options == {"think": False, "reasoning_budget": 16}
    with pytest.raises(UsageError):
        session.think("maybe")
    with pytest.raises(UsageError):
        session.set_option("reasoning_budget", "-2")
