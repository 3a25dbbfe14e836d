"""One generation broken down by phase, for `inferenceos profile`.

The generation is `run`'s: it goes through `generate_one` (engine/scheduler.py), the
one decode path of a single sequence, so end-of-generation, max_tokens (capped by the
context left after the prompt) and UTF-8 are the scheduler's output processor's, not
this module's. Its steps, in the order a generation takes them: load (the llama.cpp
library when this process has not loaded it yet, the model's weights, then the
context), tokenize, prefill in n_batch chunks (the prompt's last token in a chunk of
its own, as engine/step_plan.py evaluates it), then per token: sample, detokenize (the
token's bytes), decode.

Load, tokenize and detokenize are timed from the outside around `LoadedModel`'s verbs:
a subclass times `_load_model` and `_new_context` separately (when the engine still has
those steps; otherwise the load is one span) and `piece`. Batch evaluations (prefill
chunks, decode steps) and sampler calls happen inside the scheduler, which reports
each through generate_one's `trace` hook (scheduler.StepTrace). With a trace, every
evaluation ends with `llama_synchronize`, so asynchronous GPU work is charged to the
step that queued it, not to the next sampling call.

Times are seconds from the start of the load (`time.perf_counter()`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferenceos.engine.llama.lib import lib
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams

# the phases in timeline order; the report draws one lane per phase
PHASES = ("load", "tokenize", "prefill", "decode", "sampling", "detokenize")


@dataclass(frozen=True)
class Span:
    """One timed step: `phase` (one of PHASES), what it was, when it started and how
    long it took (seconds from the start of the load), and tokens it evaluated."""

    phase: str
    name: str
    start_s: float
    duration_s: float
    tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "name": self.name, "start_s": round(self.start_s, 6),
                "duration_s": round(self.duration_s, 6), "tokens": self.tokens}


@dataclass
class Profile:
    """A profiled run: its spans, the settings it ran with, and its text."""

    model: str
    settings: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    text: str
    spans: list[Span] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return max((s.start_s + s.duration_s for s in self.spans), default=0.0)

    def summary(self) -> list[dict[str, Any]]:
        """Per phase: steps, total, mean and longest step, share of the run; last an
        `other` row for the time between timed steps (the scheduler's planning and batch
        filling, the output processor's UTF-8 and stop handling, Python around them)."""
        total = self.total_s or 1.0
        rows = []
        for phase in PHASES:
            spans = [s for s in self.spans if s.phase == phase]
            if not spans:
                continue
            durations = [s.duration_s for s in spans]
            rows.append({
                "phase": phase,
                "steps": len(spans),
                "total_s": round(sum(durations), 6),
                "mean_ms": round(statistics.mean(durations) * 1000, 3),
                "max_ms": round(max(durations) * 1000, 3),
                "share": round(sum(durations) / total, 4),
                "tokens": sum(s.tokens for s in spans),
            })
        other = self.total_s - sum(s.duration_s for s in self.spans)
        if other > 0:  # between the timed steps: scheduler and output processing, Python
            rows.append({"phase": "other", "steps": 0, "total_s": round(other, 6),
                         "mean_ms": 0.0, "max_ms": 0.0, "share": round(other / total, 4),
                         "tokens": 0})
        return rows

    def rates(self) -> dict[str, float]:
        """Prefill and decode t/s as the spans give them."""
        pre = [s for s in self.spans if s.phase == "prefill"]
        dec = [s for s in self.spans if s.phase == "decode"]
        pre_s = sum(s.duration_s for s in pre)
        dec_s = sum(s.duration_s for s in dec)
        return {
            "prefill_tps": round(sum(s.tokens for s in pre) / pre_s, 2) if pre_s else 0.0,
            "decode_tps": round(len(dec) / dec_s, 2) if dec_s else 0.0,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "settings": self.settings,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_s": round(self.total_s, 6),
            **self.rates(),
            "phases": self.summary(),
            "spans": [s.to_json() for s in self.spans],
            "text": self.text,
        }


class _TimedModel(LoadedModel):
    """LoadedModel whose load records a span for the weights and one for the context,
    and whose `piece` records a detokenize span per call (the output processor calls it
    once per emitted token; never for the end-of-generation token, nor past max_tokens)."""

    def __init__(self, path: Path, settings: LlamaParams, spans: list[Span],
                 origin: float) -> None:
        self._spans, self._origin = spans, origin
        self._pieces = 0  # detokenize spans so far, for their names
        super().__init__(path, settings)

    def _timed(self, name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self._spans.append(Span("load", name, t0 - self._origin, time.perf_counter() - t0))

    def _load_model(self) -> Any:
        return self._timed("model (weights)", super()._load_model)

    def _new_context(self) -> Any:
        return self._timed("context (KV cache, compute buffers)", super()._new_context)

    def piece(self, token: int) -> bytes:
        t0 = time.perf_counter()
        try:
            return super().piece(token)
        finally:
            self._pieces += 1
            self._spans.append(Span("detokenize", f"token {self._pieces}", t0 - self._origin,
                                    time.perf_counter() - t0))


def profile_run(path: Path, settings: LlamaParams, text: str,
                sampling: SamplingParams) -> Profile:
    """Load `path` with `settings`, generate for the raw prompt `text` through
    `generate_one` (without the thread governor, so the threads reported are the ones
    that computed), and time every step. Raises UsageError when the prompt is empty or
    does not fit the context (generate_one's checks)."""
    spans: list[Span] = []
    origin = time.perf_counter()
    lib()  # the first call loads the shared library and initialises its backends
    spans.append(Span("load", "llama.cpp library", 0.0, time.perf_counter() - origin))
    t0 = time.perf_counter()
    lm = _TimedModel(path, settings, spans, origin)
    if len(spans) == 1:  # the engine has no load hooks: one span for model and context
        spans.append(Span("load", "model and context", t0 - origin, time.perf_counter() - t0))
    steps = dict.fromkeys(("prefill", "decode", "sampling"), 0)

    def trace(phase: str, start: float, end: float, tokens: int) -> None:
        """The scheduler's StepTrace: one span per evaluation or sampler call."""
        steps[phase] += 1
        k = steps[phase]
        name = {"prefill": f"chunk {k}: {tokens} tokens", "decode": f"step {k}"}.get(
            phase, f"token {k}")
        spans.append(Span(phase, name, start - origin, end - start, tokens))

    with lm:
        t = time.perf_counter()
        tokens = lm.tokenize(text)
        spans.append(Span("tokenize", f"{len(tokens)} tokens", t - origin,
                          time.perf_counter() - t, len(tokens)))
        # ids, not text: the tokenize span above is the only tokenization
        pieces = [ev.text for ev in generate_one(lm, tokens, sampling,
                                                 adaptive_threads=False, trace=trace)]
        n = lm.metrics.completion_tokens
        s = lm.settings
    used = {k: getattr(s, k) for k in ("n_ctx", "n_batch", "n_ubatch", "n_threads",
                                       "n_threads_batch", "n_gpu_layers", "flash_attn",
                                       "type_k", "type_v") if hasattr(s, k)}
    return Profile(str(path), used, len(tokens), n, "".join(pieces), spans)
