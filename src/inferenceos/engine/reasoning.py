"""Reasoning in a model's reply: the dialect-free core every front end shares.

A chat template "has a reasoning section" when it renders `<think>` (Qwen3, QwQ,
DeepSeek-R1 and their distils): such models write `<think>...</think>` before their
answer. Two spellings exist: the model opens the tag itself (Qwen3), or the template's
generation prompt already ends inside it (`...<think>\\n`, DeepSeek-R1), so the reply
starts with reasoning and only `</think>` is seen. `ThinkingSplit` separates a streamed
reply into reasoning and answer text, holding back only what may still be a tag being
written. Templates without `<think>` get None: the whole reply is text, exactly as the
model wrote it.

- `apply_thinking` turns thinking off in a rendered chat prompt the way the template
  allows (an empty `<think></think>` written after the generation prompt, as Qwen3's own
  template does with enable_thinking=false) and tells which `Reasoning` the reply has.
- A budget of N > 0 tokens is kept by stopping and continuing, with no sampler of its
  own: `BudgetWatch` counts the reply's tokens inside its reasoning section; when the
  N-th is written and the section is still open, the generation is stopped and a second
  one continues from the prompt, the N tokens and `forced_text` (an optional message
  and `</think>`), given as token ids so that the model sees exactly what it wrote, as
  llama-server's reasoning budget forces the closing tag. `merged_metrics` counts both
  parts as one generation.

What a request asks, in each API dialect's spelling, is server/reasoning.py's `Think`;
`run`, `chat --local` and the Python API use this module directly.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from inferenceos.engine.generation import GenerationMetrics, TokenEvent

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


def has_section(template: str | None, prompt: str) -> bool:
    """Whether replies to `prompt` (rendered with `template`) have a reasoning section."""
    return bool(template and OPEN in template) or _ends_open(prompt)


def _ends_open(prompt: str) -> bool:
    return prompt.rstrip().endswith(OPEN)


def apply_thinking(template: str | None, prompt: str, off: bool, split: bool = True
                   ) -> tuple[str, Reasoning | None]:
    """The rendered chat `prompt` with thinking turned off when `off`, and the reasoning
    its reply has (None: no reasoning section, or `split` False). Off: a prompt that
    opened the section gets it closed at once; one whose model opens it itself gets an
    empty `<think></think>` (unless the template wrote one). A template without a
    section leaves the prompt as it is."""
    if not has_section(template, prompt):
        return prompt, None
    if off:
        tail = prompt.rstrip()
        if tail.endswith(OPEN):
            prompt = f"{tail}\n\n{CLOSE}\n\n"
        elif not tail.endswith(CLOSE):
            prompt = f"{prompt}{OPEN}\n\n{CLOSE}\n\n"
    return prompt, (Reasoning(_ends_open(prompt)) if split else None)


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

    @property
    def inside(self) -> bool:
        """Whether the reply is in its reasoning section now."""
        return self._state == "thinking"

    @property
    def holding(self) -> bool:
        """Whether text is held back (what may be the start of a tag being written)."""
        return bool(self._buf)

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


FORCED_CLOSE = f"\n{CLOSE}\n\n"  # the section's end as Qwen3's template writes it


class BudgetWatch:
    """Counts the tokens of a streamed reply that fall inside its reasoning section.
    `feed(event)` returns True once `budget` of them were written and the section is
    still open (and no closing tag is being written): time to force its end."""

    def __init__(self, reasoning: Reasoning, budget: int) -> None:
        self._split = ThinkingSplit(reasoning)
        self.budget = budget
        self.spent = 0
        self.text = ""  # the reply so far

    def feed(self, event: TokenEvent) -> bool:
        if event.token < 0:
            return False
        self.text += event.text
        was_inside = self._split.inside
        self._split.feed(event.text)
        if was_inside and self._split.inside:
            self.spent += 1
        # not while the model is writing the closing tag itself ("</" held back)
        return self.spent >= self.budget and self._split.inside and not self._split.holding


def forced_text(message: str) -> str:
    """What is written when the budget runs out: the message, then the closing tag."""
    return (message.rstrip() if message else "") + FORCED_CLOSE


def merged_metrics(first: GenerationMetrics, second: GenerationMetrics,
                   completion_tokens: int) -> GenerationMetrics:
    """One generation's figures from the stopped part and its continuation: the
    prompt, its cache and time to first token from the first, the ending from the
    second, `completion_tokens` for the whole reply (forced tokens included)."""
    return dataclasses.replace(
        second, prompt_tokens=first.prompt_tokens, cached_tokens=first.cached_tokens,
        ttft_s=first.ttft_s, prompt_tps=first.prompt_tps,
        completion_tokens=completion_tokens,
        decode_steps=first.decode_steps + second.decode_steps)
