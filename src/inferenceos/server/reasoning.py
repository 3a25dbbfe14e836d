"""Reasoning in a model's reply, once for every dialect.

A chat template "has a reasoning section" when it renders `<think>` (Qwen3, QwQ,
DeepSeek-R1 and their distils): such models write `<think>...</think>` before their
answer. Two spellings exist: the model opens the tag itself (Qwen3), or the template's
generation prompt already ends inside it (`...<think>\\n`, DeepSeek-R1), so the reply
starts with reasoning and only `</think>` is seen. `ThinkingSplit` separates a streamed
reply into reasoning and answer text, holding back only what may still be a tag being
written. Templates without `<think>` get None: the whole reply is text, exactly as the
model wrote it.

What a request asks of reasoning is a `Think`, whatever its dialect's spelling (OpenAI /
llama-server `chat_template_kwargs.enable_thinking`, `reasoning_effort`,
`reasoning_format`, `reasoning_budget_tokens`; Ollama `think`; Anthropic `thinking`;
the Responses API's `reasoning`). `prepare_prompt` applies it to a rendered chat
prompt: thinking off closes the section the way the template allows (an empty
`<think></think>` written after the generation prompt, as Qwen3's own template does with
enable_thinking=false), and it tells which `Reasoning` the reply will have. A budget of
N > 0 tokens is kept by the generation (server/reasoning_budget.py): after N tokens of
reasoning the closing tag is forced, as llama-server's reasoning budget does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


EFFORTS = ("low", "medium", "high")
FORMATS = ("none", "deepseek", "auto")  # llama-server's reasoning_format values served


@dataclass(frozen=True)
class Think:
    """What one request asks of the model's reasoning.

    - `enabled`: None leaves it to the template (and `budget`); False turns thinking
      off; True asks for it (`required`: a model without a reasoning section is then a
      400, as Ollama answers `think: true`).
    - `effort`: a level ("low", "medium", "high"...) given to templates that take one
      (`reasoning_effort`); None for none.
    - `budget`: None, the server's `--reasoning-budget`; -1 unrestricted; 0 thinking
      off; N > 0 the section is closed after N tokens.
    - `message`: text written before the forced closing tag (llama-server's
      `reasoning_budget_message`).
    - `split`: False leaves the reasoning in the reply's text (`reasoning_format: none`).
    - `kwargs`: the client's `chat_template_kwargs`, given to the template as they are.
    """

    enabled: bool | None = None
    effort: str | None = None
    budget: int | None = None
    message: str = ""
    split: bool = True
    required: bool = False
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def with_default_budget(self, budget: int) -> Think:
        """This request with the server's budget where it named none."""
        if self.budget is not None or budget < 0:
            return self
        return Think(self.enabled, self.effort, budget, self.message, self.split,
                     self.required, self.kwargs)

    @property
    def off(self) -> bool:
        """Whether thinking is turned off (enabled False, or a budget of 0)."""
        return self.enabled is False or self.budget == 0

    def template_kwargs(self) -> dict[str, Any]:
        """The template variables: the client's, then `enable_thinking` and
        `reasoning_effort` when this request decides them."""
        out = dict(self.kwargs)
        if self.off:
            out["enable_thinking"] = False
        elif self.enabled is not None:
            out["enable_thinking"] = True
        if self.effort is not None and not self.off:
            out["reasoning_effort"] = self.effort
        return out


def check_budget(value: object, name: str) -> int | None:
    """A budget field of a request: None, -1 (unrestricted) or N >= 0; UsageError else."""
    from inferenceos.errors import UsageError

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise UsageError(f"{name} must be -1 (unrestricted) or a number of tokens >= 0")
    return value


def check_format(value: str | None) -> bool:
    """llama-server's `reasoning_format` → whether reasoning is split off (UsageError
    for values not served)."""
    from inferenceos.errors import UsageError

    if value is None or value in ("deepseek", "auto"):
        return True
    if value == "none":
        return False
    raise UsageError(f"reasoning_format {value[:40]!r} is not supported; use one of "
                     + ", ".join(FORMATS))


def _ends_open(prompt: str) -> bool:
    return prompt.rstrip().endswith(OPEN)


def prepare_prompt(template: str | None, prompt: str, think: Think, model: str = ""
                   ) -> tuple[str, Reasoning | None]:
    """The rendered chat `prompt` with `think` applied, and the reasoning its reply has
    (None: no reasoning section, or `split` off). Off: a prompt that opened the section
    gets it closed at once; one whose model opens it itself gets an empty
    `<think></think>` (unless the template wrote one). APIError 400 when thinking is
    required of a template without a section."""
    from inferenceos.server.errors import APIError

    has = bool(template and OPEN in template) or _ends_open(prompt)
    if not has:
        if think.required and think.enabled:
            raise APIError(400, f'"{model}" does not support thinking', "invalid_request")
        return prompt, None
    if think.off:
        tail = prompt.rstrip()
        if tail.endswith(OPEN):
            prompt = f"{tail}\n\n{CLOSE}\n\n"
        elif not tail.endswith(CLOSE):
            prompt = f"{prompt}{OPEN}\n\n{CLOSE}\n\n"
    return prompt, (Reasoning(_ends_open(prompt)) if think.split else None)


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
