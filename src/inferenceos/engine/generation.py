"""What one generation hands its caller: a `TokenEvent` per token and its `GenerationMetrics`.

A leaf of the engine (it imports only `engine.logprobs`), so the scheduler, the worker
pipe's messages, the engines and the servers share these records without importing the
session that loads a model. The output processor (`engine.output.OutputStream`) fills a
request's `GenerationMetrics`, and `engine.messages.Finished` carries a snapshot of them;
`TokenOut.event()` / `Progress.event()` turn the pipe's events into the `TokenEvent`s the
engines' `generate` yields. `GenerationMetrics.to_json` is what `run --json` prints and
the telemetry recorder stores (rounded); `from_json` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferenceos.engine.logprobs import TokenLogprob

__all__ = ["GenerationMetrics", "TokenEvent"]


@dataclass
class GenerationMetrics:
    """What `inferenceos run --json` reports under "metrics"."""

    load_s: float = 0.0
    prompt_tokens: int = 0
    prompt_tps: float = 0.0
    ttft_s: float = 0.0
    completion_tokens: int = 0
    decode_tps: float = 0.0
    stop_reason: str = ""  # eos, length, stop, interrupted
    cached_tokens: int = 0  # prompt tokens reused from the KV cache (prefix reuse)
    # speculative decoding (engine.speculative): the drafter, draft tokens proposed and
    # accepted, and decode steps (each verifies 1 + accepted tokens)
    draft: str = ""
    draft_tokens: int = 0
    draft_accepted: int = 0
    decode_steps: int = 0
    # what the ngram drafter would have recorded on this generation replayed on its
    # tokens (draft_tokens, draft_accepted, decode_steps: engine.ngram_replay)
    ngram_replay: dict[str, int] | None = None

    @property
    def acceptance_rate(self) -> float:
        """Share of draft tokens the target accepted (0 when nothing was drafted)."""
        return self.draft_accepted / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens each decode (verification) step produced on average (1 without drafts)."""
        if not self.decode_steps:
            return 0.0
        return (self.decode_steps + self.draft_accepted) / self.decode_steps

    def to_json(self) -> dict[str, Any]:
        return {
            "load_s": round(self.load_s, 4),
            "prompt_tokens": self.prompt_tokens,
            "prompt_tps": round(self.prompt_tps, 2),
            "ttft_s": round(self.ttft_s, 4),
            "completion_tokens": self.completion_tokens,
            "decode_tps": round(self.decode_tps, 2),
            "stop_reason": self.stop_reason,
            "cached_tokens": self.cached_tokens,
            "draft": self.draft,
            "draft_tokens": self.draft_tokens,
            "draft_accepted": self.draft_accepted,
            "decode_steps": self.decode_steps,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_step": round(self.tokens_per_step, 3),
            "ngram_replay": self.ngram_replay,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GenerationMetrics:
        """Inverse of `to_json` (unknown keys ignored)."""
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclass(frozen=True)
class TokenEvent:
    """One generated token and the text it made safe to emit (may be empty)."""

    token: int
    text: str
    logprob: TokenLogprob | None = None  # when SamplingParams.logprobs is set
    top_logprobs: tuple[TokenLogprob, ...] = ()  # the n most likely, best first
    # prompt processing so far (token -1, no text), only for requests that asked for it:
    # (prompt tokens in all, of them from the cache, processed incl. the cached, ms)
    progress: tuple[int, int, int, float] | None = None
    # a direct stream's report (engine/worker/direct.py), never a token to send: the
    # tokens the worker already wrote to the client itself (token -1, `text` theirs);
    # None for every other event
    written: tuple[int, ...] | None = None
