"""Reasoning in a model's reply, in every API dialect's spelling.

The splitter, the prompt preparation for thinking off and the budget's close-after-N
logic are the dialect-free core in engine/reasoning.py (`run` and `chat --local` use it
too); this module adds what a request asks of reasoning, whatever its dialect's spelling
(OpenAI / llama-server `chat_template_kwargs.enable_thinking`, `reasoning_effort`,
`reasoning_format`, `reasoning_budget_tokens`; Ollama `think`; Anthropic `thinking`;
the Responses API's `reasoning`): a `Think`. `prepare_prompt` applies it to a rendered
chat prompt (core `apply_thinking`) and answers 400 when thinking is required of a
template without a section. A budget of N > 0 tokens is kept by the generation
(server/generation.py, with the core's `BudgetWatch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferenceos.engine.reasoning import (  # noqa: F401  (the dialects' names for them)
    CLOSE,
    OPEN,
    Reasoning,
    ThinkingSplit,
    apply_thinking,
    has_section,
    reasoning_of,
    split_reasoning,
)

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


def prepare_prompt(template: str | None, prompt: str, think: Think, model: str = ""
                   ) -> tuple[str, Reasoning | None]:
    """The rendered chat `prompt` with `think` applied, and the reasoning its reply has
    (None: no reasoning section, or `split` off; engine/reasoning.apply_thinking).
    APIError 400 when thinking is required of a template without a section."""
    from inferenceos.server.errors import APIError

    if think.required and think.enabled and not has_section(template, prompt):
        raise APIError(400, f'"{model}" does not support thinking', "invalid_request")
    return apply_thinking(template, prompt, think.off, think.split)
