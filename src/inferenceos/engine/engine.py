"""The engine's public face: one loaded model in a worker process, many callers.

`Engine` is what the CLI and the server use. Its contract:
- `generate(...)` returns a `Generation`: iterate it for `TokenEvent`s; afterwards (or at
  any point) `.metrics` describes the run. Closing the iterator early, or setting the
  `cancel` event, ends the generation and frees its slot in the worker at once.
- Up to `n_parallel` generations run at the same time (continuous batching in the
  worker); more wait in the worker's queue; past `max_queue` waiting, `generate` raises
  `EngineBusyError`.
- `embed(texts)` returns one mean-pooled, L2-normalised vector per text.
- Safe to call from many threads.
- If the worker dies (a crash inside llama.cpp, OOM, a kill), every in-flight request
  ends with `WorkerDiedError` and the next call starts a fresh worker.

`LoadSettings.n_ctx` is the context of one sequence; the worker's context holds
`n_ctx * n_parallel` cells.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar, cast

import inferenceos.errors as errors
from inferenceos.engine.base import EngineBase, Events, Generation, per_slot, stream_event
from inferenceos.engine.messages import (
    Ask,
    Cancel,
    Embed,
    ExportLive,
    ExportState,
    Failed,
    Finished,
    FromWorker,
    Generate,
    ImportLive,
    ImportState,
    LiveNeed,
    MediaSupport,
    MediaTokens,
    Ready,
    Resize,
    Result,
    SetThreads,
    Shutdown,
    Sleep,
    Stats,
    StatsReport,
    Tokenize,
    ToWorker,
    Wake,
    WorkerInfo,
)
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.session import LoadSettings
from inferenceos.engine.worker import WorkerConfig, worker_main
from inferenceos.media.item import MediaItem
from inferenceos.model.spec import ModelSpec, load_spec

if TYPE_CHECKING:
    from inferenceos.engine.client import EngineClient

__all__ = ["Engine", "Events", "Generation", "MigrateInfo", "stream_event"]

_POLL_S = 0.05  # how often a waiting generation looks at its cancel event
R = TypeVar("R")
Replies = queue.Queue[FromWorker]


class MigrateInfo(TypedDict):
    """What `Engine.migrate` reports (see there)."""

    restored: int
    reprefilled: int
    ended: int
    prefixes: int
    pause_s: float
    seconds: float
    load_s: float
    moved: int
    kv_bytes: int


class _Worker:
    """A running worker process and the thread that routes its replies."""

    def __init__(self, cfg: WorkerConfig, start_timeout: float) -> None:
        ctx = mp.get_context("spawn")  # no fork: the parent may hold threads and locks
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, cfg), daemon=True)
        self.proc.start()
        child.close()
        self.pending: dict[int, Replies] = {}
        self.lock = threading.Lock()
        self.alive = True
        if not self.conn.poll(start_timeout):
            self.kill()
            raise errors.ModelLoadError(f"the model worker did not start in {start_timeout:.0f} s")
        try:
            [first] = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            raise errors.ModelLoadError(
                f"the model worker died while loading (exit code {self.proc.exitcode})"
            ) from None
        if not isinstance(first, Ready):
            self.proc.join(5)
            if isinstance(first, Failed):
                raise first.exception()
            raise errors.ModelLoadError(f"the model worker sent {type(first).__name__} first")
        self.info: WorkerInfo = first.info
        threading.Thread(target=self._read, daemon=True, name="engine-reader").start()

    def _read(self) -> None:
        try:
            while True:
                out: FromWorker
                for out in self.conn.recv():
                    q = self.pending.get(out.req_id)
                    if q is not None:
                        q.put(out)
        except (EOFError, OSError):
            pass
        self.proc.join(5)
        with self.lock:
            self.alive = False
            from inferenceos.engine.devices import abort_note

            died = (f"the model worker died (exit code {self.proc.exitcode})"
                    + abort_note(self.proc.pid or 0))  # fmt: skip
            for rid, q in self.pending.items():
                q.put(Failed(rid, "WorkerDiedError", died))

    def send(self, msg: ToWorker, register: bool = False) -> Replies | None:
        """Send `msg`; with `register`, return the queue its replies (those of
        `msg.req_id`) go to."""
        with self.lock:
            if not self.alive:
                raise errors.WorkerDiedError("the model worker is not running")
            q: Replies | None = None
            if register:
                q = self.pending[msg.req_id] = queue.Queue()
            try:
                self.conn.send(msg)
            except (OSError, ValueError):
                self.alive = False
                raise errors.WorkerDiedError("the model worker is not running") from None
            return q

    def done(self, req_id: int) -> None:
        with self.lock:
            self.pending.pop(req_id, None)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)

    def shutdown(self, timeout: float = 10) -> None:
        try:
            with self.lock:
                self.conn.send(Shutdown())
        except (OSError, ValueError):
            pass
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.kill()


class Engine(EngineBase):
    """A model loaded once in a worker process and shared by every caller."""

    def __init__(
        self,
        path: str | Path,
        settings: LoadSettings | None = None,
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
        (engine/kv_store.py; the disk tier under `kv_cache_dir`), which keeps finished
        conversations' KV state across sleep, worker deaths and restarts; 0: none."""
        self.spec: ModelSpec = load_spec(path)
        total = per_slot(settings or LoadSettings(), n_parallel)
        total.validate()
        self._cfg = WorkerConfig(self.spec.path, total, n_parallel, total.n_batch,
                                 kv_policy, max_queue=max_queue, draft=draft,
                                 mmproj=Path(mmproj) if mmproj else None,
                                 mmproj_gpu=mmproj_gpu,
                                 mmproj_device=mmproj_device, kv_cache_ram=kv_cache_ram,
                                 kv_cache_disk=kv_cache_disk,
                                 kv_cache_dir=Path(kv_cache_dir) if kv_cache_dir
                                 else None)  # fmt: skip
        self._start_timeout = start_timeout
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False  # set by close(): no call may start a worker again
        # held while a request picks its worker and sends, and while a migration swaps
        # workers: no request lands on a worker whose sequences are being moved
        self._route = threading.RLock()
        self._worker = _Worker(self._cfg, start_timeout)

    # -- worker lifecycle --------------------------------------------------------------

    def _live_worker(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise errors.WorkerDiedError("the engine was closed (the model is unloaded)")
            if not self._worker.alive:
                self._worker.proc.join(1)  # dead: returns at once, with its exit code
                _record_death(self._cfg.path, self._worker.proc.exitcode)
                self._worker = _Worker(self._cfg, self._start_timeout)
            return self._worker

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

    def _send(self, worker: _Worker, msg: ToWorker) -> tuple[int, Replies]:
        """Number `msg` and send it to `worker`; (its request id, its replies' queue)."""
        req_id = next(self._ids)
        q = worker.send(replace(msg, req_id=req_id), register=True)
        assert q is not None
        return req_id, q

    def _ask(self, msg: Ask[R], worker: _Worker | None = None) -> R:
        """Send `msg` and wait for its one answer; raises the error the worker reported.
        To `worker` (a migration's old or new one), or by default to the live worker,
        picked and sent to under the route lock (no migration swaps it in between)."""
        if worker is None:
            with self._route:
                worker = self._live_worker()
                req_id, q = self._send(worker, msg)
        else:
            req_id, q = self._send(worker, msg)
        try:
            reply = q.get()
        finally:
            worker.done(req_id)
        if isinstance(reply, Failed):
            raise reply.exception()
        if not isinstance(reply, Result):
            raise errors.GenerationError(
                f"the model worker answered {type(msg).__name__} with {type(reply).__name__}")
        # the worker answers an Ask[R] with an R (engine.messages): the pipe is untyped
        return cast(R, reply.value)

    def _special_texts(self) -> tuple[str, str]:
        info = self._worker.info
        return info["bos_text"], info["eos_text"]

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self._ask(Tokenize(text, add_special))

    def embed(self, texts: Sequence[str | list[int]]) -> list[list[float]]:
        """Mean-pooled, L2-normalised embeddings, one per text (or token ids), in order."""
        return self._ask(Embed(tuple(texts)))

    def stats(self) -> StatsReport:
        """The worker's KV usage per slot, running and waiting requests."""
        return self._ask(Stats())

    def export_state(self, tokens: Sequence[int]) -> tuple[list[int], bytes] | None:
        """The KV state of the idle slot sharing the longest prefix with `tokens`: (the
        tokens it holds, llama_state_seq bytes), or None (see engine.slot_state)."""
        result = self._ask(ExportState(tuple(tokens)))
        return None if result is None else (list(result[0]), bytes(result[1]))

    def import_state(self, tokens: Sequence[int], data: bytes) -> int:
        """Restore an `export_state` result into an idle slot so a prompt starting with
        `tokens` skips their prefill; returns the tokens now cached (0: no idle slot)."""
        return int(self._ask(ImportState(tuple(tokens), data)))

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
        self._cfg = replace(self._cfg, settings=total, n_slots=n_par)
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

    def _start(self, msg: Generate, cancel: threading.Event | None) -> Generation:
        """`generate` (EngineBase): errors the worker finds are raised when the
        Generation is first iterated."""
        with self._route:
            worker = self._live_worker()
            req_id, q = self._send(worker, msg)
        gen = Generation(iter(()))

        def next_event() -> FromWorker | None:
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                return None

        def end(finished: bool) -> None:
            with self._route:  # a migration may have moved the request: its worker now
                current = self._worker
                if not finished:  # closed early or cancelled: free the slot in the worker
                    gen.metrics.stop_reason = "interrupted"
                    with contextlib.suppress(errors.WorkerDiedError):
                        current.send(Cancel(req_id=req_id))
                current.done(req_id)
            worker.done(req_id)

        gen.events = Events(self._follow(next_event, cancel, gen, end),
                            lambda: self._abandon(worker, req_id))
        return gen

    @staticmethod
    def _abandon(worker: _Worker, req_id: int) -> None:
        """Cancel a request whose events nobody will read (closed before its first)."""
        with contextlib.suppress(errors.WorkerDiedError):
            worker.send(Cancel(req_id=req_id))
        worker.done(req_id)

    # -- live migration (engine.migrate) ------------------------------------------------

    @property
    def settings(self) -> LoadSettings:
        """The worker's llama parameters (n_ctx counts every slot's cells)."""
        return self._cfg.settings

    def live_need(self) -> int:
        """Context per sequence the live requests need (engine.migrate.live_need)."""
        return int(self._ask(LiveNeed()))

    def migrate(
        self, settings: LoadSettings, n_parallel: int | None = None,
        make_before_break: bool = True,
    ) -> MigrateInfo:  # fmt: skip
        """Move this engine to a new worker loaded with `settings` (n_ctx per sequence,
        as the constructor takes it), carrying every running and queued request across
        mid-stream (see engine.migrate); the Engine object stays the same.

        Make before break: the new worker loads while the old one keeps generating, then
        the old pauses at a step boundary, its sequences move, and it stops. Otherwise
        (no memory for both) the old pauses first, its state is saved and it stops, then
        the new one loads and resumes: the pause covers the load. If the new worker
        fails to load, make-before-break leaves the old one serving; break-before-make
        restarts it on the old settings and resumes there. Returns "pause_s"
        (the token stream's gap), "seconds" (the whole migration), "load_s",
        "moved", "restored", "reprefilled", "ended", "kv_bytes"."""
        t0 = time.perf_counter()
        n_par = n_parallel or self._cfg.n_slots
        total = per_slot(settings, n_par)
        total.validate()
        cfg = replace(self._cfg, settings=total, n_slots=n_par)
        shares = _core_shares(self._cfg.settings, total) if make_before_break else None
        new = None
        try:
            if make_before_break:
                if shares is not None:  # the old worker makes room before the load starts
                    self._ask(SetThreads(shares[0]))
                new = _Worker(cfg, self._start_timeout)
                if shares is not None:
                    self._ask(SetThreads(shares[1]), new)
                self._warm(new)  # its first decode (thread pool, page-ins) off the stream
        except BaseException:
            self._abort_make(new, shares)
            raise
        with self._route:
            old = self._live_worker()
            t_pause = time.perf_counter()
            try:
                state = self._ask(ExportLive(), old)
            except BaseException:
                self._abort_make(new, shares)
                raise
            with old.lock:  # the streams' queues follow their requests
                moved = {rid: q for rid in state.ids
                         if (q := old.pending.pop(rid, None)) is not None}  # fmt: skip
            if new is None:
                old.shutdown()
                new, cfg = self._restart(cfg, moved)
            with new.lock:
                new.pending.update(moved)
            counts = self._ask(ImportLive(state), new)
            self._worker, self._cfg = new, cfg
            pause = time.perf_counter() - t_pause
        if make_before_break:
            old.shutdown()
            if shares is not None:  # the cores are the new worker's alone now
                with contextlib.suppress(errors.InferenceOSError):
                    self._ask(SetThreads(None), new)
        return MigrateInfo(restored=counts.get("restored", 0),
                           reprefilled=counts.get("reprefilled", 0),
                           ended=counts.get("ended", 0), prefixes=counts.get("prefixes", 0),
                           pause_s=pause, seconds=time.perf_counter() - t0,
                           load_s=float(new.info["load_s"]), moved=len(state.ids),
                           kv_bytes=state.kv_bytes)  # fmt: skip

    def _abort_make(self, new: _Worker | None, shares: tuple[int, int] | None) -> None:
        """A make-before-break that failed before the switch: the new worker goes, the
        old one (still serving) gets its threads back."""
        if new is not None:
            new.shutdown()
        if shares is not None:
            with contextlib.suppress(errors.InferenceOSError):
                self._ask(SetThreads(None))

    def _warm(self, worker: _Worker) -> None:
        """One short greedy generation on a new worker before it takes over: a fresh
        process's first decode is slower than the next ones (thread pool start, pages
        of the weights; on Gemma here 1.2 s against 0.4-0.5 s), and that cost should
        not land in the moved streams."""
        req_id, q = self._send(worker, Generate(
            "Hello", SamplingParams(temperature=0, max_tokens=2), None, "none"))
        try:
            while True:
                if isinstance(q.get(timeout=self._start_timeout), (Finished, Failed)):
                    return
        except queue.Empty:
            return
        finally:
            worker.done(req_id)

    def _restart(self, cfg: WorkerConfig,
                 moved: dict[int, Replies]) -> tuple[_Worker, WorkerConfig]:  # fmt: skip
        """Break before make: a worker on `cfg`, else on the old settings again; if both
        fail, the moved streams end with the error (never a hang)."""
        try:
            return _Worker(cfg, self._start_timeout), cfg
        except errors.InferenceOSError:
            try:
                return _Worker(self._cfg, self._start_timeout), self._cfg
            except errors.InferenceOSError as exc:
                for rid, q in moved.items():
                    q.put(Failed(rid, type(exc).__name__, f"migration failed: {exc}"))
                raise

    def close(self) -> None:
        """Stop the worker (waits for it to exit; kills it after 10 s). Final: later
        calls raise WorkerDiedError instead of starting a new worker."""
        with self._lock:
            self._closed = True
        self._worker.shutdown()


def _core_shares(old: LoadSettings, new: LoadSettings,
                 cores: int | None = None) -> tuple[int, int] | None:  # fmt: skip
    """Threads for (the old worker, the new one) while the new one loads and warms up
    beside the generating one, or None when the cores hold both as they are.

    Two workers computing on more threads than there are cores stall each other:
    ggml's threads spin at every barrier of the graph (hundreds per token) waiting for
    a thread that has no core, and on 2 cores a 2-thread stream beside a loading worker
    took up to 2.2 s for one token (benchmarks/migration.py). The old worker keeps all
    but one core, the new one loads and warms up on what is left, and each gets its
    own thread count back once the other is out of the way (`cores`: those this
    process may run on, by default)."""
    from inferenceos.engine.session import default_threads

    cores = cores or default_threads()
    old_n, new_n = old.n_threads or cores, new.n_threads or cores
    if old_n + new_n <= cores:
        return None
    old_share = min(old_n, max(1, cores - 1))
    return old_share, max(1, min(new_n, cores - old_share))


def _record_death(path: Path, exit_code: int | None) -> None:
    """A `worker_death` telemetry event (the worker is being restarted); never raises."""
    try:
        import inferenceos.telemetry as telemetry

        telemetry.recorder().event("worker_death", path, exit_code=exit_code, restarted=True)
    except Exception:  # telemetry never fails a request
        pass


if TYPE_CHECKING:  # mypy checks that Engine is an EngineClient
    _engine_is_a_client: type[EngineClient] = Engine
