"""The engine's public face: one loaded model, many callers.

`Engine` is what the CLI and the server use. Its contract:
- `generate(...)` returns a `Generation`: iterate it for `TokenEvent`s; afterwards (or
  at any point) `.metrics` describes the run. Closing the iterator early, or setting
  the `cancel` event, ends the generation and frees its slot.
- `embed(texts)` returns one pooled, L2-normalised vector per text.
- It is safe to call from several threads. This version serves one generation at a time
  (callers queue on a lock, in arrival order); the continuous-batching scheduler keeps
  this same interface.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inferenceos.engine.chat_template import ChatMessage, render_chat
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.session import GenerationMetrics, LoadedModel, LoadSettings, TokenEvent
from inferenceos.model.spec import ModelSpec, load_spec


@dataclass
class Generation:
    """An in-progress generation: an iterator of TokenEvents with live metrics."""

    events: Iterator[TokenEvent]
    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)

    def __iter__(self) -> Iterator[TokenEvent]:
        return self.events

    def text(self) -> str:
        """Consume the rest of the generation and return its text."""
        return "".join(ev.text for ev in self.events)

    def close(self) -> None:
        close = getattr(self.events, "close", None)
        if close:
            close()


class Engine:
    """A model loaded once and shared by every caller."""

    def __init__(self, path: str | Path, settings: LoadSettings | None = None) -> None:
        self.spec: ModelSpec = load_spec(path)
        self._model = LoadedModel(self.spec.path, settings)
        self._lock = threading.Lock()

    @property
    def n_ctx(self) -> int:
        return self._model.n_ctx

    @property
    def load_s(self) -> float:
        return self._model.load_s

    def chat_prompt(self, messages: Sequence[ChatMessage], template: str | None = None) -> str:
        """The prompt text for `messages` under the model's (or the named) template."""
        m = self._model
        text, _ = render_chat(
            self.spec.chat_template,
            messages,
            bos_token=m.token_text(m.bos_token),
            eos_token=m.token_text(m.eos_token),
            builtin=template,
        )
        return text

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        with self._lock:
            return self._model.tokenize(text, add_special=add_special)

    def generate(
        self,
        prompt: str | list[int],
        sampling: SamplingParams,
        cancel: threading.Event | None = None,
    ) -> Generation:
        """Start generating for `prompt` (text or token ids); see the module contract."""
        sampling.validate()
        gen = Generation(iter(()))
        gen.events = self._run(prompt, sampling, cancel, gen)
        return gen

    def _run(
        self,
        prompt: str | list[int],
        sampling: SamplingParams,
        cancel: threading.Event | None,
        gen: Generation,
    ) -> Iterator[TokenEvent]:
        with self._lock:
            m = self._model
            tokens = m.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
            inner = m.generate(tokens, sampling)
            try:
                for ev in inner:
                    gen.metrics = m.metrics
                    if cancel is not None and cancel.is_set():
                        break
                    yield ev
            finally:
                inner.close()
                gen.metrics = m.metrics

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Mean-pooled, L2-normalised embeddings, one per text, in order."""
        with self._lock:
            return [self._model.embed(t) for t in texts]

    def close(self) -> None:
        with self._lock:
            self._model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
