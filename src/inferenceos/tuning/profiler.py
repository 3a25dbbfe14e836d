"""One generation broken down by phase, for `inferenceos profile`.

The run is timed from the outside around `LoadedModel`'s verbs, in the order a
generation calls them: load (the llama.cpp library when this process has
not loaded it yet, the model's weights, then the context),
tokenize, prefill in n_batch chunks, then per token: sample, detokenize (the token's
bytes), decode. The only reach inside is a subclass that times `_load_model` and
`_new_context` separately (when the engine still has those steps; otherwise the load is
one span). Every evaluation ends with `llama_synchronize`, so asynchronous GPU work is
charged to the step that queued it, not to the next sampling call.

Times are seconds from the start of the load (`time.perf_counter()`).
"""

from __future__ import annotations

import codecs
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferenceos.engine.llama_lib import lib
from inferenceos.engine.sampling import SamplerChain, SamplingParams
from inferenceos.engine.session import LoadedModel, LoadSettings
from inferenceos.errors import UsageError

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
        `other` row for the time between timed steps (Python around the verbs)."""
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
        if other > 0:  # Python between the timed steps: the sampler setup, the loop itself
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
    """LoadedModel whose load records a span for the weights and one for the context."""

    def __init__(self, path: Path, settings: LoadSettings, spans: list[Span],
                 origin: float) -> None:
        self._spans, self._origin = spans, origin
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


def profile_run(path: Path, settings: LoadSettings, text: str,
                sampling: SamplingParams) -> Profile:
    """Load `path` with `settings`, generate for the raw prompt `text`, and time every
    step. Raises UsageError when the prompt is empty or does not fit the context."""
    spans: list[Span] = []
    origin = time.perf_counter()
    lib()  # the first call loads the shared library and initialises its backends
    spans.append(Span("load", "llama.cpp library", 0.0, time.perf_counter() - origin))
    hooks = hasattr(LoadedModel, "_load_model") and hasattr(LoadedModel, "_new_context")
    t0 = time.perf_counter()
    lm = _TimedModel(path, settings, spans, origin) if hooks else LoadedModel(path, settings)
    if len(spans) == 1:  # no hooks: one span for model and context
        spans.append(Span("load", "model and context", t0 - origin, time.perf_counter() - t0))
    ll = lib()

    def span(phase: str, name: str, start: float, tokens: int = 0) -> None:
        spans.append(Span(phase, name, start - origin, time.perf_counter() - start, tokens))

    with lm:
        t = time.perf_counter()
        tokens = lm.tokenize(text)
        span("tokenize", f"{len(tokens)} tokens", t, len(tokens))
        if not tokens:
            raise UsageError("the prompt is empty")
        if len(tokens) >= lm.n_ctx:
            raise UsageError(f"the prompt has {len(tokens)} tokens; the context holds {lm.n_ctx}")
        max_new = min(sampling.max_tokens, lm.n_ctx - len(tokens))
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces: list[str] = []
        lm.reset()
        with SamplerChain(sampling, lm.vocab) as sampler:
            step = lm.settings.n_batch
            for i in range(0, len(tokens), step):
                chunk = tokens[i : i + step]
                t = time.perf_counter()
                lm.prefill(chunk)
                ll.llama_synchronize(lm.ctx)
                span("prefill", f"chunk {i // step + 1}: {len(chunk)} tokens", t, len(chunk))
            n = 0
            while True:
                t = time.perf_counter()
                token = sampler.sample(lm.ctx)
                span("sampling", f"token {n + 1}", t)
                if (lm.is_eog(token) and not sampling.ignore_eos) or n >= max_new:
                    break
                t = time.perf_counter()
                pieces.append(utf8.decode(lm.piece(token)))
                span("detokenize", f"token {n + 1}", t)
                n += 1
                if n >= max_new:
                    break
                t = time.perf_counter()
                lm.decode_one(token)
                ll.llama_synchronize(lm.ctx)
                span("decode", f"step {n}", t, 1)
        pieces.append(utf8.decode(b"", final=True))
        s = lm.settings
    used = {k: getattr(s, k) for k in ("n_ctx", "n_batch", "n_ubatch", "n_threads",
                                       "n_threads_batch", "n_gpu_layers", "flash_attn",
                                       "type_k", "type_v") if hasattr(s, k)}
    return Profile(str(path), used, len(tokens), n, "".join(pieces), spans)
