"""The engine's public face: one loaded model in a worker process, many callers.

`Engine` is what the CLI and the server use. Its contract:
- `generate(...)` returns a `Generation`: iterate it for `TokenEvent`s; afterwards (or at
  any point) `.metrics` describes the run. Closing the iterator early, or setting the
  `cancel` event (an `engine.cancel.CancelEvent`), ends the generation and frees its
  slot in the worker at once: a stream waiting for its next token is woken by a message
  on its reply queue, never by a timer.
- Up to `n_parallel` generations run at the same time (continuous batching in the
  worker); more wait in the worker's queue; past `max_queue` waiting, `generate` raises
  `EngineBusyError`.
- `embed(texts)` returns one mean-pooled, L2-normalised vector per text.
- Safe to call from many threads.
- If the worker dies (a crash inside llama.cpp, OOM, a kill), every in-flight request
  ends with `WorkerDiedError` and the next call starts a fresh worker.

`LlamaParams.n_ctx` is the context of one sequence; the worker's context holds
`n_ctx * n_parallel` cells.

This module is the facade only: the worker process and its pipe are
engine/worker/client.py (`WorkerClient`, and `CurrentWorker`: which one requests go to),
live migration's orchestration is engine/worker/swap.py (`Engine.migrate`), its
mechanism inside the workers engine/worker/migrate.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.reduction import ACKNOWLEDGE
from pathlib import Path
from typing import TypeVar

import inferenceos.errors as errors
from inferenceos.engine.base import (
    EngineBase,
    Events,
    Generation,
    Handover,
    LoopEvents,
    per_slot,
)
from inferenceos.engine.cancel import CancelEvent
from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.engine.messages import (
    Ask,
    Attach,
    Cancel,
    Embed,
    ExportState,
    Generate,
    ImportState,
    LiveNeed,
    MediaSupport,
    MediaTokens,
    Prefetch,
    Resize,
    Sleep,
    Stats,
    StatsReport,
    Tokenize,
    Wake,
    WorkerInfo,
)
from inferenceos.engine.worker.client import CurrentWorker, Replies, WorkerClient, WouldWait
from inferenceos.engine.worker.main import WorkerConfig, file_identity
from inferenceos.engine.worker.swap import MigrateInfo, migrate
from inferenceos.media.item import MediaItem
from inferenceos.model.spec import ModelSpec, load_spec
from inferenceos.plan.llama_params import LlamaParams

# Generation: api.py imports it from here
__all__ = ["Engine", "Generation"]

R = TypeVar("R")


def _nothing() -> None:
    """The wake-up to unregister when a stream has no cancel event."""


class Engine(EngineBase):
    """A model loaded once in a worker process and shared by every caller."""

    def __init__(
        self,
        path: str | Path,
        settings: LlamaParams | None = None,
        n_parallel: int = 4,
        kv_policy: str = "none",
        max_queue: int = 64,
        start_timeout: float = 300,
        draft: str | None = None,
        mmproj: str | Path | None = None,
        mmproj_gpu: bool = True,
        mmproj_device: str | None = None,
        kv_cache_ram: int = 0,
        kv_cache_disk: int = 0,
        kv_cache_dir: str | Path | None = None,
    ) -> None:
        """`draft`: the default drafter for speculative decoding ("ngram", "self" or a
        draft model .gguf path; None: none); its memory is `draft_bytes`. `mmproj`: a
        multimodal projector GGUF (the model then takes `media` in `generate`), its
        encoder on a GPU backend when `mmproj_gpu` and there is one (`mmproj_device`:
        which, by llama.cpp device name, as the plan's projector placement says).
        `kv_cache_ram` / `kv_cache_disk`: budgets in bytes of the tiered KV cache
        (engine/kv/store.py; the disk tier under `kv_cache_dir`), which keeps finished
        conversations' KV state across sleep, worker deaths and restarts; 0: none."""
        identity = file_identity(Path(path))  # before the read: a change after it shows
        self.spec: ModelSpec = load_spec(path)
        total = per_slot(settings or LlamaParams(), n_parallel)
        total.validate()
        cfg = WorkerConfig(self.spec.path, total, n_parallel, total.n_batch, kv_policy,
                           max_queue=max_queue, draft=draft,
                           mmproj=Path(mmproj) if mmproj else None, mmproj_gpu=mmproj_gpu,
                           mmproj_device=mmproj_device, kv_cache_ram=kv_cache_ram,
                           kv_cache_disk=kv_cache_disk,
                           kv_cache_dir=Path(kv_cache_dir) if kv_cache_dir
                           else None, spec=self.spec, spec_of=identity)
        self._current = CurrentWorker(cfg, start_timeout)

    # -- worker lifecycle --------------------------------------------------------------

    @property
    def _worker(self) -> WorkerClient:
        """The worker requests go to now (a migration or a death replaces it)."""
        return self._current.worker

    @property
    def _cfg(self) -> WorkerConfig:
        return self._current.cfg

    @property
    def worker_alive(self) -> bool:
        """False once the worker process died (the next call would start a new one)."""
        return bool(self._worker.alive)

    @property
    def worker_pid(self) -> int:
        return int(self._worker.info["pid"])

    @property
    def n_ctx(self) -> int:
        """Context of one sequence."""
        return int(self._worker.info["n_ctx_slot"])

    @property
    def draft_bytes(self) -> int:
        """Memory the drafters hold in the worker (draft weights and KV), for the planner."""
        return int(self._worker.info.get("draft_bytes", 0))

    @property
    def load_s(self) -> float:
        return float(self._worker.info["load_s"])

    @property
    def media_support(self) -> MediaSupport:
        """{"vision": bool, "audio": bool, "load_s": projector load seconds} when the
        model has a projector, else {}."""
        return MediaSupport(**self._worker.info.get("media", {}))

    def media_tokens(self, item: MediaItem) -> int:
        """Context cells `item` takes in a prompt (UsageError without a projector)."""
        return int(self._ask(MediaTokens(item)))

    @property
    def memory_buffers(self) -> dict[str, int]:
        """llama.cpp's own buffers at load ("kind:buffer type" -> bytes, e.g.
        "model:CPU_Mapped", "KV:CUDA0"), as its log reported them in the worker."""
        return dict(self._worker.info.get("buffers", {}))

    # -- requests ----------------------------------------------------------------------

    def _ask(self, msg: Ask[R], worker: WorkerClient | None = None) -> R:
        """Send `msg` and wait for its one answer (CurrentWorker.ask)."""
        return self._current.ask(msg, worker)

    def _special_texts(self) -> tuple[str, str]:
        info = self._worker.info
        return info["bos_text"], info["eos_text"]

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self._ask(Tokenize(text, add_special))

    def embed(self, texts: Sequence[str | list[int]]) -> list[list[float]]:
        """Mean-pooled, L2-normalised embeddings, one per text (or token ids), in order."""
        return self._ask(Embed(tuple(texts)))

    def stats(self) -> StatsReport:
        """The worker's KV usage per slot, running and waiting requests. Asks the worker
        there is now: a dead one raises WorkerDiedError instead of being started again
        (a read never starts a load; the next request does), as /metrics asks it."""
        return self._ask(Stats(), self._current.current())

    def export_state(self, tokens: Sequence[int]) -> tuple[list[int], bytes] | None:
        """The KV state of the idle slot sharing the longest prefix with `tokens`: (the
        tokens it holds, llama_state_seq bytes), or None (see engine.slot_state)."""
        result = self._ask(ExportState(tuple(tokens)))
        return None if result is None else (list(result[0]), bytes(result[1]))

    def import_state(self, tokens: Sequence[int], data: bytes) -> int:
        """Restore an `export_state` result into an idle slot so a prompt starting with
        `tokens` skips their prefill; returns the tokens now cached (0: no idle slot)."""
        return int(self._ask(ImportState(tuple(tokens), data)))

    @property
    def kv_tiers(self) -> bool:
        """Whether this engine keeps finished conversations in the tiered KV cache."""
        return self._cfg.keeps_kv_cache

    def prefetch(self, tokens: Sequence[int]) -> int:
        """Bring the tiered KV cache's longest prefix of `tokens` into an idle slot now
        (a session's resume); returns how many of `tokens` an idle slot then holds."""
        return int(self._ask(Prefetch(tuple(tokens))))

    # -- tiers: sleep (warm), wake (hot), resize ----------------------------------------

    def sleep(self) -> float:
        """Free the worker's context and keep its weights (a warm model); returns the
        seconds it took. UsageError while requests are in flight."""
        return self._lifecycle(Sleep())

    def wake(self) -> float:
        """Open a context on the kept weights (warm → hot) without reading them again."""
        return self._lifecycle(Wake())

    def resize(self, n_ctx: int, n_parallel: int | None = None) -> WorkerInfo:
        """A context of `n_ctx` per sequence (and `n_parallel` slots) on the same
        weights; cached conversations' KV states are carried over. Returns the worker's
        info plus "carried" (slots restored) and "seconds"."""
        n_par = n_parallel or self._cfg.n_slots
        total = replace(self._cfg.settings, n_ctx=n_ctx * n_par, n_seq_max=n_par)
        total.validate()
        result = self._ask(Resize(total, n_par))
        self._current.cfg = replace(self._cfg, settings=total, n_slots=n_par)
        self._worker.info.update(result)
        return result

    @property
    def asleep(self) -> bool:
        return bool(self._worker.info.get("asleep", False))

    def _lifecycle(self, msg: Sleep | Wake) -> float:
        result = self._ask(msg)
        self._worker.info.update(result)
        return float(result.get("seconds", 0.0))

    # -- generation ----------------------------------------------------------------------

    def _start(self, msg: Generate, cancel: CancelEvent | None) -> Generation:
        """`generate` (EngineBase): errors the worker finds are raised when the
        Generation is first iterated. The stream blocks on its reply queue, which
        brings its events and, once `cancel` is set, a None that wakes it (a
        migration moves the queue itself, so the wake-up follows the request)."""
        with self._current.route:
            worker = self._current.live()
            req_id, q = self._current.submit(worker, msg)
        return self._stream(worker, req_id, q, msg, cancel)

    def _start_now(self, msg: Generate, cancel: CancelEvent | None) -> Generation | None:
        """`_start` without waiting (`generate_now`): None while a migration holds the
        route, a dead worker would start again, or another thread sends."""
        if not self._current.route.acquire(blocking=False):
            return None
        try:
            worker = self._current.live_now()
            if worker is None:
                return None
            req_id, q = self._current.submit(worker, msg, wait=False)
        except WouldWait:
            return None
        finally:
            self._current.route.release()
        return self._stream(worker, req_id, q, msg, cancel)

    def _stream(self, worker: WorkerClient, req_id: int, q: Replies, msg: Generate,
                cancel: CancelEvent | None) -> Generation:
        """The Generation of `msg`, sent to `worker` as `req_id`, whose replies `q`
        brings (see `_start`)."""
        unwake = cancel.on_set(lambda: q.put(None)) if cancel is not None else _nothing
        gen = Generation(iter(()))

        def under_route(fn: Callable[[], None], name: str) -> None:
            """A thread running `fn()` under the route lock: from an event loop, which
            never waits for a migration's hold of it."""
            def run() -> None:
                with self._current.route:
                    fn()
            threading.Thread(target=run, name=name, daemon=True).start()

        def end(finished: bool, wait: bool = True) -> None:
            unwake()
            if not finished:
                gen.metrics.stop_reason = "interrupted"
            if self._current.route.acquire(blocking=wait):
                try:
                    end_routed(finished)
                finally:
                    self._current.route.release()
            else:  # on an event loop (`wait` False), a migration holding the lock
                under_route(lambda: end_routed(finished), "end-stream")

        def end_routed(finished: bool) -> None:
            # under the route lock: a migration may have moved the request, so its
            # worker is the current one now
            current = self._worker
            if not finished:  # closed early or cancelled: free the slot in the worker
                with contextlib.suppress(errors.WorkerDiedError):
                    current.send(Cancel(req_id=req_id))
            current.done(req_id)
            worker.done(req_id)

        def abandon() -> None:
            unwake()
            self._abandon(worker, req_id)

        def attach(frame: FrameSpec, fd: int, written: int) -> bool:
            # on an event loop: never wait for a migration (which holds `route`), and
            # only to the worker that got the Generate (a moved stream's has no record)
            if not self._current.route.acquire(blocking=False):
                return False
            try:
                return self._worker is worker and worker.send_socket(
                    Attach(frame, written, req_id=req_id), fd)
            finally:
                self._current.route.release()

        def stop() -> None:  # on an event loop: the route lock may be held, so a thread
            def send() -> None:
                with contextlib.suppress(errors.WorkerDiedError):
                    self._worker.send(Cancel(req_id=req_id))
            under_route(send, "stop-direct")

        # (where the descriptor's sender waits for an acknowledgement, as on macOS, the
        # reader thread would take it: no hand-over there)
        direct = msg.direct and not ACKNOWLEDGE
        def to_loop(loop: asyncio.AbstractEventLoop) -> LoopEvents:
            events = LoopEvents(loop, gen, cancel, self.load_s,
                                lambda finished: end(finished, wait=False),
                                Handover(attach, stop) if direct else None)
            q.divert(events.put)  # the reader thread delivers to the loop from now on
            return events

        # q.get() without a timeout: a Ctrl-C still interrupts it in the main thread
        # (CPython's lock waits end on EINTR and run the signal handler;
        # tests/engine/test_stream_events.py measures it)
        gen.events = Events(self._follow(q.get, cancel, gen, end), abandon, to_loop)
        return gen

    @staticmethod
    def _abandon(worker: WorkerClient, req_id: int) -> None:
        """Cancel a request whose events nobody will read (closed before its first)."""
        with contextlib.suppress(errors.WorkerDiedError):
            worker.send(Cancel(req_id=req_id))
        worker.done(req_id)

    # -- live migration (engine.worker_swap; inside the workers, engine.migrate) -------

    @property
    def settings(self) -> LlamaParams:
        """The worker's llama parameters (n_ctx counts every slot's cells)."""
        return self._cfg.settings

    def live_need(self) -> int:
        """Context per sequence the live requests need (engine.migrate.live_need)."""
        return int(self._ask(LiveNeed()))

    def migrate(
        self, settings: LlamaParams, n_parallel: int | None = None,
        make_before_break: bool = True,
    ) -> MigrateInfo:
        """Move this engine to a new worker loaded with `settings` (n_ctx per sequence,
        as the constructor takes it), carrying every running and queued request across
        mid-stream; the Engine object stays the same.

        Make before break: the new worker loads while the old one keeps generating, then
        the old pauses at a step boundary, its sequences move, and it stops. Otherwise
        (no memory for both) the old pauses first, its state is saved and it stops, then
        the new one loads and resumes: the pause covers the load. If the new worker
        fails to load, make-before-break leaves the old one serving; break-before-make
        restarts it on the old settings and resumes there. Returns "pause_s"
        (the token stream's gap), "seconds" (the whole migration), "load_s",
        "moved", "restored", "reprefilled", "ended", "kv_bytes" (engine.worker_swap)."""
        return migrate(self._current, settings, n_parallel, make_before_break)

    def close(self) -> None:
        """Stop the worker (waits for it to exit; kills it after 10 s). Final: later
        calls raise WorkerDiedError instead of starting a new worker."""
        self._current.close()
