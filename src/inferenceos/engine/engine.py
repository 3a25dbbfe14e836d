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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import inferenceos.errors as errors
from inferenceos.engine.chat_template import ChatMessage, render_chat
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.session import GenerationMetrics, LoadSettings, TokenEvent
from inferenceos.engine.worker import WorkerConfig, worker_main
from inferenceos.media.item import MediaItem
from inferenceos.model.spec import ModelSpec, load_spec

_POLL_S = 0.05  # how often a waiting generation looks at its cancel event


def _error(payload: Any) -> errors.InferenceOSError:
    """Rebuild the exception a worker reported as (class name, message)."""
    name, message = payload if isinstance(payload, tuple) else ("GenerationError", payload)
    cls = getattr(errors, name, errors.GenerationError)
    if not (isinstance(cls, type) and issubclass(cls, errors.InferenceOSError)):
        cls = errors.GenerationError
    return cls(message)


def stream_event(kind: str, payload: Any, gen: Generation, load_s: float) -> TokenEvent | None:
    """One worker event of `gen`'s request: the TokenEvent to yield for "token" (and
    "progress": token -1, no text, `progress` set); None
    for "done" (the final metrics are then in `gen.metrics`); raises for "error"."""
    if kind == "token":
        gen.metrics.completion_tokens += 1 if payload[0] >= 0 else 0
        return TokenEvent(*payload)
    if kind == "progress":
        return TokenEvent(-1, "", progress=tuple(payload))
    if kind == "done":
        gen.metrics = GenerationMetrics.from_json(payload)
        gen.metrics.load_s = load_s
        return None
    raise _error(payload)


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


class Events:
    """A generation's event iterator whose `close()` also ends a request that was never
    iterated: a generator closed before its first `next` runs no `finally`, so without
    this a stream opened and dropped unread would keep its slot until it finished."""

    def __init__(self, it: Iterator[TokenEvent], abandon: Callable[[], None]) -> None:
        self._it, self._abandon = it, abandon
        self._started = False

    def __iter__(self) -> Events:
        return self

    def __next__(self) -> TokenEvent:
        self._started = True
        return next(self._it)

    def close(self) -> None:
        if not self._started:
            self._started = True
            self._abandon()
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


class _Worker:
    """A running worker process and the thread that routes its replies."""

    def __init__(self, cfg: WorkerConfig, start_timeout: float) -> None:
        ctx = mp.get_context("spawn")  # no fork: the parent may hold threads and locks
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, cfg), daemon=True)
        self.proc.start()
        child.close()
        self.pending: dict[int, queue.Queue[tuple[str, Any]]] = {}
        self.lock = threading.Lock()
        self.alive = True
        if not self.conn.poll(start_timeout):
            self.kill()
            raise errors.ModelLoadError(f"the model worker did not start in {start_timeout:.0f} s")
        try:
            [(_, kind, payload)] = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            raise errors.ModelLoadError(
                f"the model worker died while loading (exit code {self.proc.exitcode})"
            ) from None
        if kind == "error":
            self.proc.join(5)
            raise _error(payload)
        self.info: dict[str, Any] = payload
        threading.Thread(target=self._read, daemon=True, name="engine-reader").start()

    def _read(self) -> None:
        try:
            while True:
                for req_id, kind, payload in self.conn.recv():
                    q = self.pending.get(req_id)
                    if q is not None:
                        q.put((kind, payload))
        except (EOFError, OSError):
            pass
        self.proc.join(5)
        with self.lock:
            self.alive = False
            from inferenceos.engine.devices import abort_note

            died = ("WorkerDiedError", f"the model worker died (exit code {self.proc.exitcode})"
                    + abort_note(self.proc.pid or 0))  # fmt: skip
            for q in self.pending.values():
                q.put(("error", died))

    def send(self, msg: tuple[Any, ...], req_id: int | None = None) -> queue.Queue[Any] | None:
        """Send `msg`; with `req_id`, register and return the queue its replies go to."""
        with self.lock:
            if not self.alive:
                raise errors.WorkerDiedError("the model worker is not running")
            q: queue.Queue[Any] | None = None
            if req_id is not None:
                q = self.pending[req_id] = queue.Queue()
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
                self.conn.send(("shutdown",))
        except (OSError, ValueError):
            pass
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.kill()


class Engine:
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
        base = settings or LoadSettings()
        # one shared KV pool (unified): with one stream per slot each sequence would
        # attend over its own cells only (8 lockstep Gemma streams 10 % faster), but
        # llama.cpp then splits a batch into micro-batches of consecutive, increasing
        # sequence ids, and a mixed serving load (slots busy in any order, prefill next
        # to decode) ran 20 % slower (benchmarks/serve_load.py, docs/engine.md)
        total = replace(base, n_ctx=base.n_ctx * n_parallel, n_seq_max=n_parallel,
                        kv_unified=True)  # fmt: skip
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
    def media_support(self) -> dict[str, Any]:
        """{"vision": bool, "audio": bool, "load_s": projector load seconds} when the
        model has a projector, else {}."""
        return dict(self._worker.info.get("media") or {})

    def media_tokens(self, item: MediaItem) -> int:
        """Context cells `item` takes in a prompt (UsageError without a projector)."""
        return int(self._call("media_tokens", item))

    @property
    def memory_buffers(self) -> dict[str, int]:
        """llama.cpp's own buffers at load ("kind:buffer type" -> bytes, e.g.
        "model:CPU_Mapped", "KV:CUDA0"), as its log reported them in the worker."""
        return dict(self._worker.info.get("buffers", {}))

    # -- requests ----------------------------------------------------------------------

    def _call(self, msg_kind: str, *args: Any) -> Any:
        with self._route:
            worker = self._live_worker()
            req_id = next(self._ids)
            q = worker.send((msg_kind, req_id, *args), req_id)
        assert q is not None
        try:
            kind, payload = q.get()
        finally:
            worker.done(req_id)
        if kind == "error":
            raise _error(payload)
        return payload

    def chat_prompt(
        self,
        messages: Sequence[ChatMessage],
        template: str | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text for `messages` (and `tools`, OpenAI-style definitions) under
        the model's template, or the named built-in one (which takes no tools)."""
        info = self._worker.info
        text, _ = render_chat(self.spec.chat_template, messages, bos_token=info["bos_text"],
                              eos_token=info["eos_text"], builtin=template,
                              tools=tools)  # fmt: skip
        return text

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return list(self._call("tokenize", text, add_special))

    def embed(self, texts: Sequence[str | list[int]]) -> list[list[float]]:
        """Mean-pooled, L2-normalised embeddings, one per text (or token ids), in order."""
        return list(self._call("embed", list(texts)))

    def stats(self) -> dict[str, Any]:
        """The worker's KV usage per slot, running and waiting requests."""
        return dict(self._call("stats"))

    def export_state(self, tokens: Sequence[int]) -> tuple[list[int], bytes] | None:
        """The KV state of the idle slot sharing the longest prefix with `tokens`: (the
        tokens it holds, llama_state_seq bytes), or None (see engine.slot_state)."""
        result = self._call("export_state", list(tokens))
        return None if result is None else (list(result[0]), bytes(result[1]))

    def import_state(self, tokens: Sequence[int], data: bytes) -> int:
        """Restore an `export_state` result into an idle slot so a prompt starting with
        `tokens` skips their prefill; returns the tokens now cached (0: no idle slot)."""
        return int(self._call("import_state", list(tokens), data))

    # -- tiers: sleep (warm), wake (hot), resize ----------------------------------------

    def sleep(self) -> float:
        """Free the worker's context and keep its weights (a warm model); returns the
        seconds it took. UsageError while requests are in flight."""
        return self._lifecycle("sleep")

    def wake(self) -> float:
        """Open a context on the kept weights (warm → hot) without reading them again."""
        return self._lifecycle("wake")

    def resize(self, n_ctx: int, n_parallel: int | None = None) -> dict[str, Any]:
        """A context of `n_ctx` per sequence (and `n_parallel` slots) on the same
        weights; cached conversations' KV states are carried over. Returns the worker's
        info plus "carried" (slots restored) and "seconds"."""
        n_par = n_parallel or self._cfg.n_slots
        total = replace(self._cfg.settings, n_ctx=n_ctx * n_par, n_seq_max=n_par)
        total.validate()
        result = dict(self._call("resize", total, n_par))
        self._cfg = replace(self._cfg, settings=total, n_slots=n_par)
        self._worker.info.update(result)
        return result

    @property
    def asleep(self) -> bool:
        return bool(self._worker.info.get("asleep", False))

    def _lifecycle(self, kind: str) -> float:
        result = dict(self._call(kind))
        self._worker.info.update(result)
        return float(result.get("seconds", 0.0))

    def generate(
        self,
        prompt: str | list[int],
        sampling: SamplingParams,
        cancel: threading.Event | None = None,
        kv_policy: str | None = None,
        draft: str | None = None,
        media: Sequence[MediaItem] = (),
        progress: bool = False,
    ) -> Generation:
        """Start generating for `prompt` (text or token ids); see the module contract.

        `media`: images / audio for a text prompt holding one `MEDIA_MARKER` per item,
        in order (the model needs a projector: UsageError otherwise, at first iteration).
        `progress`: also yield TokenEvents of token -1 carrying `progress` (prompt
        tokens, cached, processed, ms) as the prompt is processed, llama-server's
        `return_progress`.

        `draft` overrides the engine's drafter for this request ("ngram", "self",
        "none"; a draft model file only when it is the engine's own).

        `kv_policy` overrides the engine's KV policy for this request ("none",
        "streaming", or "h2o" when the engine was started with it). Raises UsageError
        for bad sampling settings; errors found by the worker (prompt too long, queue
        full, unknown policy) are raised when the Generation is first iterated.
        """
        sampling.validate()
        with self._route:
            worker = self._live_worker()
            req_id = next(self._ids)
            msg: tuple[Any, ...] = ("generate", req_id, prompt, sampling, kv_policy, draft)
            if media or progress:
                msg = (*msg, tuple(media), progress)
            q = worker.send(msg, req_id)
        assert q is not None
        gen = Generation(iter(()))
        gen.events = Events(self._stream(worker, req_id, q, cancel, gen),
                            lambda: self._abandon(worker, req_id))
        return gen

    @staticmethod
    def _abandon(worker: _Worker, req_id: int) -> None:
        """Cancel a request whose events nobody will read (closed before its first)."""
        with contextlib.suppress(errors.WorkerDiedError):
            worker.send(("cancel", req_id))
        worker.done(req_id)

    def _stream(
        self,
        worker: _Worker,
        req_id: int,
        q: queue.Queue[tuple[str, Any]],
        cancel: threading.Event | None,
        gen: Generation,
    ) -> Iterator[TokenEvent]:
        finished = False
        try:
            while not (cancel is not None and cancel.is_set()):
                try:
                    kind, payload = q.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                finished = kind != "token"
                event = stream_event(kind, payload, gen, self.load_s)
                if event is None:
                    return
                yield event
        finally:
            with self._route:  # a migration may have moved the request: its worker now
                current = self._worker
                if not finished:  # closed early or cancelled: free the slot in the worker
                    gen.metrics.stop_reason = "interrupted"
                    with contextlib.suppress(errors.WorkerDiedError):
                        current.send(("cancel", req_id))
                current.done(req_id)
            worker.done(req_id)

    # -- live migration (engine.migrate) ------------------------------------------------

    @property
    def settings(self) -> LoadSettings:
        """The worker's llama parameters (n_ctx counts every slot's cells)."""
        return self._cfg.settings

    def live_need(self) -> int:
        """Context per sequence the live requests need (engine.migrate.live_need)."""
        return int(self._call("live_need"))

    def migrate(
        self, settings: LoadSettings, n_parallel: int | None = None,
        make_before_break: bool = True,
    ) -> dict[str, Any]:  # fmt: skip
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
        total = replace(settings, n_ctx=settings.n_ctx * n_par, n_seq_max=n_par,
                        kv_unified=True)  # fmt: skip
        total.validate()
        cfg = replace(self._cfg, settings=total, n_slots=n_par)
        shares = _core_shares(self._cfg.settings, total) if make_before_break else None
        new = None
        try:
            if make_before_break:
                if shares is not None:  # the old worker makes room before the load starts
                    self._call("threads", shares[0])
                new = _Worker(cfg, self._start_timeout)
                if shares is not None:
                    self._ask(new, "threads", shares[1])
                self._warm(new)  # its first decode (thread pool, page-ins) off the stream
        except BaseException:
            self._abort_make(new, shares)
            raise
        with self._route:
            old = self._live_worker()
            t_pause = time.perf_counter()
            try:
                state = self._ask(old, "export_live")
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
            result = dict(self._ask(new, "import_live", state))
            self._worker, self._cfg = new, cfg
            pause = time.perf_counter() - t_pause
        if make_before_break:
            old.shutdown()
            if shares is not None:  # the cores are the new worker's alone now
                with contextlib.suppress(errors.InferenceOSError):
                    self._ask(new, "threads", None)
        return {**result, "pause_s": pause, "seconds": time.perf_counter() - t0,
                "load_s": float(new.info["load_s"]), "moved": len(state.ids),
                "kv_bytes": state.kv_bytes}  # fmt: skip

    def _abort_make(self, new: _Worker | None, shares: tuple[int, int] | None) -> None:
        """A make-before-break that failed before the switch: the new worker goes, the
        old one (still serving) gets its threads back."""
        if new is not None:
            new.shutdown()
        if shares is not None:
            with contextlib.suppress(errors.InferenceOSError):
                self._call("threads", None)

    def _warm(self, worker: _Worker) -> None:
        """One short greedy generation on a new worker before it takes over: a fresh
        process's first decode is slower than the next ones (thread pool start, pages
        of the weights; on Gemma here 1.2 s against 0.4-0.5 s), and that cost should
        not land in the moved streams."""
        req_id = next(self._ids)
        q = worker.send(("generate", req_id, "Hello", SamplingParams(temperature=0, max_tokens=2),
                         None, "none"), req_id)  # fmt: skip
        assert q is not None
        try:
            while True:
                kind, _ = q.get(timeout=self._start_timeout)
                if kind in ("done", "error"):
                    return
        except queue.Empty:
            return
        finally:
            worker.done(req_id)

    def _restart(self, cfg: WorkerConfig, moved: dict[int, Any]) -> tuple[_Worker, WorkerConfig]:
        """Break before make: a worker on `cfg`, else on the old settings again; if both
        fail, the moved streams end with the error (never a hang)."""
        try:
            return _Worker(cfg, self._start_timeout), cfg
        except errors.InferenceOSError:
            try:
                return _Worker(self._cfg, self._start_timeout), self._cfg
            except errors.InferenceOSError as exc:
                for q in moved.values():
                    q.put(("error", (type(exc).__name__, f"migration failed: {exc}")))
                raise

    def _ask(self, worker: _Worker, kind: str, *args: Any) -> Any:
        req_id = next(self._ids)
        q = worker.send((kind, req_id, *args), req_id)
        assert q is not None
        try:
            kind, payload = q.get()
        finally:
            worker.done(req_id)
        if kind == "error":
            raise _error(payload)
        return payload

    def close(self) -> None:
        """Stop the worker (waits for it to exit; kills it after 10 s). Final: later
        calls raise WorkerDiedError instead of starting a new worker."""
        with self._lock:
            self._closed = True
        self._worker.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
