"""Token log-probabilities in each API's shape, from the engine's `TokenEvent`s.

The engine fills `TokenEvent.logprob` (the chosen token) and `.top_logprobs` (the n most
likely, best first) when `SamplingParams.logprobs` is n; the figures are the model's
raw distribution (before temperature, penalties, bias, grammar), as OpenAI's are.

- OpenAI chat and Ollama: one entry per token, `{token, logprob, bytes, top_logprobs:
  [{token, logprob, bytes}]}` (chat under `choices[].logprobs.content`, Ollama under a
  top-level `logprobs`);
- OpenAI legacy completions: parallel lists `{tokens, token_logprobs, top_logprobs:
  [{token: logprob}], text_offset}`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from inferenceos.engine.generation import TokenEvent
from inferenceos.engine.logprobs import TokenLogprob
from inferenceos.server.errors import APIError

FLOOR = -9999.0  # what OpenAI reports for a token too unlikely to have a figure


def chat_top_n(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """SamplingParams.logprobs for OpenAI chat's fields (None: off). top_logprobs
    without logprobs is refused, as OpenAI does."""
    if not logprobs:
        if top_logprobs:
            raise APIError(400, "top_logprobs requires logprobs to be true",
                           "invalid_logprobs")
        return None
    return top_logprobs or 0


def _value(lp: float) -> float:
    return lp if math.isfinite(lp) and lp > FLOOR else FLOOR  # JSON has no -inf


def _text(piece: bytes) -> str:
    # a piece may be part of a UTF-8 character: `bytes` carries it exactly
    return piece.decode("utf-8", errors="replace")


def token_entry(lp: TokenLogprob) -> dict[str, Any]:
    return {"token": _text(lp.piece), "logprob": _value(lp.logprob), "bytes": list(lp.piece)}


def entries(events: Iterable[TokenEvent]) -> list[dict[str, Any]]:
    """OpenAI chat / Ollama entries for the events that carry logprobs."""
    return [{**token_entry(ev.logprob), "top_logprobs": [token_entry(t) for t in ev.top_logprobs]}
            for ev in events if ev.logprob is not None]


class LegacyLogprobs:
    """The legacy completions `logprobs` object, built token by token; `text_offset`
    counts characters from `start` (the echoed prompt's length)."""

    def __init__(self, start: int = 0) -> None:
        self._offset = start

    def chunk(self, events: Iterable[TokenEvent]) -> dict[str, Any]:
        """The object for `events` (the next tokens of the choice)."""
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                               "text_offset": []}
        for ev in events:
            if ev.logprob is None:
                continue
            token = _text(ev.logprob.piece)
            out["tokens"].append(token)
            out["token_logprobs"].append(_value(ev.logprob.logprob))
            top: dict[str, float] = {}
            for t in ev.top_logprobs:  # best first: a repeated text keeps its best figure
                top.setdefault(_text(t.piece), _value(t.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self._offset)
            self._offset += len(token)
        return out
