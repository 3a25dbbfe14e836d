"""Sampling settings and the llama.cpp sampler chain built from them.

Sampling runs inside llama.cpp (`llama_sampler_sample` reads the logits in C); Python
never copies the vocabulary-sized logits array on the normal path.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from inferenceos.engine.llama_lib import lib
from inferenceos.errors import UsageError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. temperature 0 means greedy (deterministic)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None  # None: a fresh random seed per request
    max_tokens: int = 512
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False  # generate max_tokens even past end-of-generation (benchmarks)

    def validate(self) -> None:
        """Raise UsageError for values llama.cpp would misbehave on."""
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (self.top_k >= 0, f"top-k must be >= 0, got {self.top_k}"),
            (0 < self.top_p <= 1, f"top-p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min-p must be in [0, 1], got {self.min_p}"),
            (self.max_tokens >= 0, f"max-tokens must be >= 0, got {self.max_tokens}"),
            (self.repeat_penalty > 0, f"repeat penalty must be > 0, got {self.repeat_penalty}"),
            (all(self.stop), "stop strings must not be empty"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)


class SamplerChain:
    """An owned llama.cpp sampler chain; call `close()` (or use `with`) to free it."""

    def __init__(self, params: SamplingParams) -> None:
        params.validate()
        ll = lib()
        self._ll = ll
        self.seed = params.seed if params.seed is not None else random.randrange(2**32 - 1)
        self.ptr: Any = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        for s in self._stages(params):
            ll.llama_sampler_chain_add(self.ptr, s)

    def _stages(self, p: SamplingParams) -> list[Any]:
        ll = self._ll
        stages = []
        if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
            stages.append(
                ll.llama_sampler_init_penalties(
                    p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
                )
            )
        if p.temperature == 0:
            stages.append(ll.llama_sampler_init_greedy())
            return stages
        # llama.cpp's own default order: top-k, top-p, min-p, temperature, then draw
        if p.top_k > 0:
            stages.append(ll.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1:
            stages.append(ll.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0:
            stages.append(ll.llama_sampler_init_min_p(p.min_p, 1))
        stages.append(ll.llama_sampler_init_temp(p.temperature))
        stages.append(ll.llama_sampler_init_dist(self.seed))
        return stages

    def sample(self, ctx: Any, idx: int = -1) -> int:
        """Sample (and accept) the next token from the logits of batch row `idx`."""
        return int(self._ll.llama_sampler_sample(self.ptr, ctx, idx))

    def close(self) -> None:
        if self.ptr is not None:
            self._ll.llama_sampler_free(self.ptr)
            self.ptr = None

    def __enter__(self) -> SamplerChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
