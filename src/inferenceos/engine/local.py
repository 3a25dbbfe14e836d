"""The engine in the caller's process: the same scheduler as the worker, no subprocess.

`LocalEngine` is an `engine.client.EngineClient` as `Engine` is (generate / embed /
tokenize / chat_prompt / stats / export_state / import_state / close, sharing
engine.base with it) but runs llama.cpp in this process. It is what the
Python API and `chat` use by default: it starts in a fraction of the worker's time and
needs no `if __name__ == "__main__"` guard in user scripts (the worker is spawned, and a
spawned child re-imports the caller's main module). The price: a crash inside llama.cpp
takes the caller down, which `Engine` prevents.

There is no thread of its own: whoever waits for an event runs scheduler steps (under a
lock) until one arrives, and hands the events of other requests to their queues. So
several threads can generate at once and share batches, as the worker's clients do.
An exception during a step (Ctrl-C included) ends the running requests and clears their
KV cells, so the prefix cache never claims tokens that were not evaluated.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import inferenceos.errors as errors
from inferenceos.engine.base import EngineBase, Events, Generation, per_slot
from inferenceos.engine.cancel import CancelEvent
from inferenceos.engine.core import EngineCore
from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.messages import (
    Event,
    Failed,
    Finished,
    Generate,
    MediaSupport,
    StatsReport,
)
from inferenceos.engine.session import LoadedModel
from inferenceos.media.item import MediaItem
from inferenceos.model.spec import ModelSpec, load_spec
from inferenceos.plan.llama_params import LlamaParams


class LocalEngine(EngineBase):
    """A model loaded in this process, served by the continuous-batching scheduler."""

    def __init__(
        self,
        path: str | Path,
        settings: LlamaParams | None = None,
        n_parallel: int = 1,
        kv_policy: str = "none",
        max_queue: int = 64,
        draft: str | None = None,
        mmproj: str | Path | None = None,
        mmproj_gpu: bool = True,
        mmproj_device: str | None = None,
    ) -> None:
        """`draft`, `mmproj`, `mmproj_gpu`, `mmproj_device`: as for `Engine`."""
        from inferenceos.engine.kv.policies import policy_options
        from inferenceos.engine.media_encoder import open_encoder
        from inferenceos.engine.scheduler import Scheduler

        self.spec: ModelSpec = load_spec(path)
        total = per_slot(settings or LlamaParams(), n_parallel)
        if kv_policy == "h2o":
            raise errors.UsageError("the h2o policy needs the worker engine (Engine)")
        self._lm = LoadedModel(self.spec.path, total)
        self._media = None
        try:
            self._media = open_encoder(self._lm, Path(mmproj) if mmproj else None,
                                       mmproj_gpu, mmproj_device)
            self._sched = Scheduler(self._lm, n_parallel, total.n_batch, kv_policy,
                                    max_queue=max_queue,
                                    policy_options=policy_options(self.spec),
                                    draft=draft, media=self._media)
        except BaseException:
            if self._media is not None:
                self._media.close()
            self._lm.close()
            raise
        self._core = EngineCore(lambda: self._sched)  # the engine loop (core.py)
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._inbox: dict[int, collections.deque[Event]] = {}
        self._cut: dict[int, GenerationMetrics] = {}  # metrics of requests a failed step ended
        self._closed = False

    # -- facts ---------------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        """Context of one sequence."""
        return int(self._sched.n_ctx_slot)

    @property
    def load_s(self) -> float:
        return float(self._lm.load_s)

    @property
    def settings(self) -> LlamaParams:
        """The llama parameters it was loaded with (n_ctx counts every slot's cells)."""
        return self._lm.settings

    @property
    def media_support(self) -> MediaSupport:
        """As `Engine.media_support`."""
        m = self._media
        return {"vision": m.vision, "audio": m.audio, "load_s": m.load_s} if m else {}

    def media_tokens(self, item: MediaItem) -> int:
        """As `Engine.media_tokens`."""
        with self._lock:
            self._model()
            return int(self._sched.media_tokens(item))

    def _model(self) -> LoadedModel:
        if self._closed:
            raise errors.WorkerDiedError("the engine was closed (the model is unloaded)")
        return self._lm

    def _special_texts(self) -> tuple[str, str]:
        lm = self._model()
        return lm.token_text(lm.bos_token), lm.token_text(lm.eos_token)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        with self._lock:
            return self._model().tokenize(text, add_special=add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        with self._lock:
            lm = self._model()
            return b"".join(lm.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def embed(self, texts: Sequence[str | list[int]]) -> list[list[float]]:
        """As `Engine.embed`."""
        with self._lock:
            return self._model().embed_many(list(texts))

    def stats(self) -> StatsReport:
        with self._lock:
            self._model()
            return dict(self._sched.stats())

    def export_state(self, tokens: Sequence[int]) -> tuple[list[int], bytes] | None:
        """As `Engine.export_state`."""
        from inferenceos.engine.kv.slot_state import export_slot

        with self._lock:
            self._model()
            return export_slot(self._sched, list(tokens))

    def import_state(self, tokens: Sequence[int], data: bytes) -> int:
        """As `Engine.import_state`."""
        from inferenceos.engine.kv.slot_state import import_slot

        with self._lock:
            self._model()
            return import_slot(self._sched, list(tokens), data)

    @property
    def kv_tiers(self) -> bool:
        """As `Engine.kv_tiers`."""
        return self._sched.kv_store is not None

    def prefetch(self, tokens: Sequence[int]) -> int:
        """As `Engine.prefetch`."""
        with self._lock:
            self._model()
            return self._sched.prefetch(list(tokens))

    # -- generation ------------------------------------------------------------------------

    def _start(self, msg: Generate, cancel: CancelEvent | None) -> Generation:
        """`generate` (EngineBase): errors the scheduler finds at submission (prompt
        too long, queue full) are raised here, at once."""
        from inferenceos.engine.scheduler import prompt_request

        with self._lock:
            lm = self._model()
            req_id = next(self._ids)
            req = prompt_request(req_id, msg.prompt, msg.sampling, lm, self._media, msg.media,
                                 kv_policy=msg.kv_policy, draft=msg.draft,
                                 progress=msg.progress)
            try:
                self._sched.submit(req)
            except BaseException:
                if self._media is not None:
                    self._media.release(req.media.values())
                raise
            self._inbox[req_id] = collections.deque()
        gen = Generation(iter(()))

        def end(finished: bool) -> None:
            with self._lock:
                if not finished and not self._closed:  # closed early or cancelled
                    ended = [ev.metrics for ev in self._sched.cancel(req_id)
                             if isinstance(ev, Finished)]
                    cut = self._cut.get(req_id) or (ended[0] if ended else None)
                    if cut is not None:
                        _keep_measured(gen, cut, self.load_s)
                    gen.metrics.stop_reason = "interrupted"
                self._cut.pop(req_id, None)
                self._inbox.pop(req_id, None)

        gen.events = Events(self._follow(lambda: self._next(req_id, cancel), cancel, gen, end),
                            lambda: self._abandon(req_id))
        return gen

    def _abandon(self, req_id: int) -> None:
        """Drop a request whose events nobody will read (closed before its first)."""
        with self._lock:
            if not self._closed:
                self._sched.cancel(req_id)
            self._inbox.pop(req_id, None)

    def _next(self, req_id: int, cancel: CancelEvent | None) -> Event | None:
        """The request's next event, stepping the scheduler (the engine loop, core.py)
        until there is one; None once `cancel` is set. No wake-up is needed for it: the
        waiting thread is stepping, or blocked on the lock of the thread that is, and
        looks at the flag before each step (a step is never cut short for one
        request's cancel)."""
        with self._lock:
            box = self._inbox[req_id]

            def waiting() -> bool:
                return not box and not self._closed and not (cancel and cancel.is_set())

            try:
                for events in self._core.steps(waiting):
                    self._dispatch(events)
            except BaseException:
                # what the cut step's requests measured so far (TTFT, t/s) stays for
                # their streams' metrics; they end with the step's Failed events
                self._cut.update(self._core.cut)
                self._dispatch(self._core.failed)
                raise
            if box:
                return box.popleft()
            if cancel is not None and cancel.is_set():
                return None
            return Failed(req_id, "GenerationError", "the engine stopped this request")

    def _dispatch(self, events: Sequence[Event]) -> None:
        for ev in events:
            box = self._inbox.get(ev.req_id)
            if box is not None:
                box.append(ev)

    def close(self) -> None:
        """Free the model; later calls raise WorkerDiedError."""
        # (requests still running end: their streams see "the engine stopped")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._sched.close()
            if self._media is not None:
                self._media.close()
            self._lm.close()


def _keep_measured(gen: Generation, measured: GenerationMetrics, load_s: float) -> None:
    """The metrics of a request ended early: the scheduler's figures of the part that ran
    (prompt, TTFT, decode t/s), over the tokens the caller was given."""
    gen.metrics = replace(measured, load_s=load_s,
                          completion_tokens=gen.metrics.completion_tokens)
