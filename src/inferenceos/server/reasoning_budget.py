"""A reasoning budget of N > 0 tokens, kept by stopping and continuing.

llama-server keeps `--reasoning-budget N` / `reasoning_budget_tokens` with a sampler
that, once N tokens of reasoning were sampled, forces the closing tag (after an optional
`reasoning_budget_message`). Here the same is done above the engine, with no sampler
of its own: `BudgetWatch` counts the reply's tokens inside its reasoning section; when
the N-th is written and the section is still open, the generation is stopped and a
second one continues from the prompt, the N tokens and the forced text (the message and
`</think>`), given as token ids so that the model sees exactly what it wrote. Its KV
prefix is the first one's, so the continuation re-reads only the forced tokens.

The client sees one reply: the N tokens of reasoning, the forced text as one event
(token -1), then the answer; `merged_metrics` counts both parts as one generation.
"""

from __future__ import annotations

import dataclasses

from inferenceos.engine.generation import GenerationMetrics, TokenEvent
from inferenceos.server.reasoning import CLOSE, Reasoning, ThinkingSplit

FORCED_CLOSE = f"\n{CLOSE}\n\n"  # the section's end as Qwen3's template writes it


class BudgetWatch:
    """Counts the tokens of a streamed reply that fall inside its reasoning section.
    `feed(event)` returns True once `budget` of them were written and the section is
    still open: time to force its end."""

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
        return self.spent >= self.budget and self._split.inside


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
