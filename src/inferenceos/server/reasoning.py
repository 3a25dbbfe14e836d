"""Reasoning in a model's reply as Anthropic `thinking` blocks.

A chat template "has a reasoning section" when it renders `<think>` (Qwen3, QwQ,
DeepSeek-R1 and their distils): such models write `<think>...</think>` before their
answer. Two spellings exist: the model opens the tag itself (Qwen3), or the template's
generation prompt already ends inside it (`...<think>\\n`, DeepSeek-R1), so the reply
starts with reasoning and only `</think>` is seen. `reasoning_of(template)` tells which;
`ThinkingSplit` separates a streamed reply into reasoning and answer text, holding back
only what may still be a tag being written. Templates without `<think>` get None: the
whole reply is text, exactly as the model wrote it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"
# a generation prompt that ends inside the reasoning: a literal ending in "<think>\n"
# (or "<think>") printed by the template, e.g. {{'<｜Assistant｜><think>\n'}}
_OPENS_IN_PROMPT = re.compile(r"""<think>(?:\\n|\n)?['"]\s*-?\}\}""")


@dataclass(frozen=True)
class Reasoning:
    """How one template's models write reasoning: `starts_inside` when the prompt
    itself opened the `<think>` section."""

    starts_inside: bool


def reasoning_of(template: str | None) -> Reasoning | None:
    """The reasoning format `template` teaches, or None when it has no `<think>`."""
    if not template or OPEN not in template:
        return None
    return Reasoning(bool(_OPENS_IN_PROMPT.search(template)))


def _partial(text: str, tag: str) -> int:
    """How many characters at the end of `text` may be the start of `tag`."""
    for keep in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-keep:]):
            return keep
    return 0


class ThinkingSplit:
    """Feeds a reply piece by piece; each `feed` returns (reasoning, text) safe to send
    now. Reasoning is what lies between `<think>` (or the reply's start, when the
    prompt opened it) and `</think>`; a reply that does not open with `<think>`
    (after whitespace) has none. `finish()` returns what was held back. Whitespace
    between `</think>` and the answer is dropped, as the templates add it."""

    def __init__(self, reasoning: Reasoning) -> None:
        self._state = "thinking" if reasoning.starts_inside else "start"
        self._buf = ""
        self.thinking = ""  # all reasoning so far
        self.text = ""  # all answer text so far

    def feed(self, piece: str) -> tuple[str, str]:
        self._buf += piece
        think_out, text_out = "", ""
        while True:
            if self._state == "start":
                head = self._buf.lstrip()
                if head.startswith(OPEN):
                    self._buf, self._state = head[len(OPEN):], "thinking"
                    continue
                if OPEN.startswith(head):  # still may be the tag (or only whitespace)
                    break
                self._state = "text"
                continue
            if self._state == "thinking":
                at = self._buf.find(CLOSE)
                if at >= 0:
                    think_out += self._buf[:at]
                    self._buf, self._state = self._buf[at + len(CLOSE):], "after"
                    continue
                keep = _partial(self._buf, CLOSE)
                cut = len(self._buf) - keep
                think_out, self._buf = think_out + self._buf[:cut], self._buf[cut:]
                break
            if self._state == "after":
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self._state = "text"
                continue
            text_out, self._buf = text_out + self._buf, ""
            break
        self.thinking += think_out
        self.text += text_out
        return think_out, text_out

    def finish(self) -> tuple[str, str]:
        """What is left: unfinished reasoning stays reasoning; a lone start is text."""
        rest, self._buf = self._buf, ""
        if self._state == "thinking":
            self.thinking += rest
            return rest, ""
        if self._state == "after":
            rest = rest.strip()
        self.text += rest
        return "", rest


def split_reasoning(text: str, reasoning: Reasoning | None) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply."""
    if reasoning is None:
        return "", text
    split = ThinkingSplit(reasoning)
    split.feed(text)
    split.finish()
    return split.thinking, split.text
