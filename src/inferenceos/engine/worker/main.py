"""The worker process: one loaded model, a scheduler, and a message loop.

A crash or abort inside llama.cpp kills this process, never the caller's. Messages are
the frozen dataclasses of engine/messages.py over a multiprocessing Pipe (that module
states the protocol: which request gets which answer); this one dispatches on their
type. Sleep / Wake / Resize run only when no request is in flight; any other request
wakes a sleeping worker, except Stats (a scrape leaves a warm model warm). ExportLive /
ImportLive / LiveNeed / SetThreads serve live migration (engine.migrate): their streams
keep their request ids across workers.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import select
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferenceos.engine.core import EngineCore
from inferenceos.engine.kv.policies import policy_options
from inferenceos.engine.llama.lib import log as llama_log
from inferenceos.engine.llama.memory_report import parse_buffer_lines
from inferenceos.engine.media_encoder import open_encoder
from inferenceos.engine.messages import (
    Attach,
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
    Prefetch,
    Ready,
    Resize,
    Result,
    SetThreads,
    Shutdown,
    Sleep,
    Stats,
    Tokenize,
    TokenOut,
    ToWorker,
    Wake,
    WorkerInfo,
    Wrote,
    unknown,
)
from inferenceos.engine.session import LoadedModel, default_threads
from inferenceos.engine.weights.residency import WeightResidency
from inferenceos.engine.worker.direct import DirectSinks
from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.model.spec import ModelSpec, load_spec
from inferenceos.plan.llama_params import LlamaParams

if TYPE_CHECKING:  # loaded on first use: the parent imports this module for WorkerConfig
    from inferenceos.engine.kv.attention_probe import AttentionProbe
    from inferenceos.engine.kv.store import KVStore
    from inferenceos.engine.scheduler import Scheduler


@dataclass(frozen=True)
class WorkerConfig:
    """What the worker needs to start (picklable)."""

    path: Path
    settings: LlamaParams
    n_slots: int = 4
    token_budget: int = 512
    kv_policy: str = "none"
    slot_policy: str = "lru"
    max_queue: int = 64
    draft: str | None = None  # default drafter (ngram, self, a .gguf path); None: none
    mmproj: Path | None = None  # multimodal projector (media_encoder.py); None: text only
    mmproj_gpu: bool = True  # the encoder may use a GPU backend when there is one
    mmproj_device: str | None = None  # which (a llama.cpp device name); None: mtmd's pick
    # the tiered KV cache (engine/kv/store.py): RAM and disk budgets in bytes (0: no tier) and
    # the folder of the disk tier (None: no disk tier)
    kv_cache_ram: int = 0
    kv_cache_disk: int = 0
    kv_cache_dir: Path | None = None
    # the parent's spec of `path` (Engine read it already) and the file's identity then
    # (`file_identity`): the worker does not parse the header again (~0.15 s of a cold
    # start on a 151k-token vocabulary) while the file is that one; a file changed since
    # (truncated, replaced: often why a worker died) is read again, and refused in its
    # own words. None: read
    spec: ModelSpec | None = None
    spec_of: tuple[int, int, int] | None = None

    @property
    def keeps_kv_cache(self) -> bool:
        """Whether any tier of the tiered KV cache has a budget (and a place)."""
        return self.kv_cache_ram > 0 or (self.kv_cache_disk > 0 and self.kv_cache_dir is not None)


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, modification time in ns) of `path`; None when it cannot be read."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _spec_for(cfg: WorkerConfig) -> ModelSpec:
    """The parent's spec while the file is the one it read, else the file's own."""
    if cfg.spec is not None and cfg.spec_of is not None \
            and file_identity(cfg.path) == cfg.spec_of:
        return cfg.spec
    return load_spec(cfg.path)


def _info(lm: LoadedModel, n_slots: int) -> WorkerInfo:
    return {
        "pid": os.getpid(),
        "n_ctx": lm.n_ctx,
        "n_ctx_slot": lm.n_ctx // n_slots,
        "load_s": lm.load_s,
        "bos_text": lm.token_text(lm.bos_token),
        "eos_text": lm.token_text(lm.eos_token),
    }


def _handle(msg: ToWorker, lm: LoadedModel, sched: Scheduler) -> list[FromWorker]:
    """Apply one request on an awake scheduler; returns what to send back. A failure
    costs that request only (a typed Failed), never the worker."""
    rid = msg.req_id
    try:
        match msg:
            case Generate():
                from inferenceos.engine.scheduler import prompt_request

                sched.submit(prompt_request(rid, msg.prompt, msg.sampling, lm, sched.media,
                                            msg.media, kv_policy=msg.kv_policy,
                                            draft=msg.draft, progress=msg.progress))
                return []
            case Cancel():
                return list(sched.cancel(rid))
            case MediaTokens():
                return [Result(rid, sched.media_tokens(msg.item))]
            case Tokenize():
                return [Result(rid, lm.tokenize(msg.text, add_special=msg.add_special))]
            case Embed():
                return [Result(rid, lm.embed_many(list(msg.texts)))]
            case ExportState() | ImportState():  # server-side sessions
                from inferenceos.engine.kv.slot_state import export_slot, import_slot

                result = (export_slot(sched, list(msg.tokens)) if isinstance(msg, ExportState)
                          else import_slot(sched, list(msg.tokens), msg.data))
                return [Result(rid, result)]
            case Prefetch():  # sessions over the tiered cache: resume
                return [Result(rid, sched.prefetch(list(msg.tokens)))]
    except InferenceOSError as exc:
        return [Failed.of(rid, exc)]
    except Exception as exc:  # a bug must cost one request, not every client's
        return [Failed(rid, "GenerationError", f"internal error: {exc!r}")]
    return [unknown(msg)]


def _attention_setup(cfg: WorkerConfig,
                     spec: ModelSpec) -> tuple[LlamaParams, AttentionProbe | None]:
    """For policies that read attention (h2o): a probe on the full-attention layers,
    flash attention off (llama.cpp has no attention probabilities with it on) and one
    shared KV pool (the probe maps one attention row per token to cells of one pool)."""
    from inferenceos.engine.kv.attention_probe import AttentionProbe
    from inferenceos.engine.kv.policies import load_policy

    if not getattr(load_policy(cfg.kv_policy), "needs_attention", False):
        return cfg.settings, None
    if cfg.settings.flash_attn == 1 or cfg.settings.type_v != "f16":
        raise UsageError(
            f"the {cfg.kv_policy} policy reads attention probabilities, which need flash "
            "attention off; a quantized V cache needs it on: choose one"
        )
    probe = AttentionProbe(layer.index for layer in spec.layers if not layer.is_swa)
    return replace(cfg.settings, flash_attn=0, kv_unified=True), probe


def _open_store(cfg: WorkerConfig, spec: ModelSpec,
                settings: LlamaParams) -> KVStore | None:
    """The tiered KV store for this model and KV layout, or None when both budgets are
    0. Partial prefixes are restored only when every layer keeps all its cells."""
    if not cfg.keeps_kv_cache:
        return None
    from inferenceos.engine.kv.store import KVStore

    windowed = any(layer.is_swa for layer in spec.layers) and not settings.swa_full
    return KVStore(_store_key(cfg, settings), cfg.kv_cache_dir, cfg.kv_cache_ram,
                   cfg.kv_cache_disk, partial=not windowed)


def _store_key(cfg: WorkerConfig, settings: LlamaParams) -> str:
    """The KV cache key of this model loaded with `settings` (engine/kv/key.py)."""
    from inferenceos.engine.kv.key import model_key

    return model_key(cfg.path, settings)


class _Runtime:
    """The worker's model and scheduler; the scheduler is None while asleep (warm)."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        # the header, once: for the probe and policies
        self.spec = _spec_for(cfg)
        settings, self.probe = _attention_setup(cfg, self.spec)
        cb = self.probe.callback if self.probe else None
        mark = llama_log().mark()
        self.lm = LoadedModel(cfg.path, settings, eval_callback=cb)
        # what llama.cpp allocated for this model and context, from its own log lines
        # (before any drafter loads): "kind:buffer type" -> bytes, for telemetry
        self.buffers = {f"{k}:{b}": v for (k, b), v
                        in parse_buffer_lines(llama_log().since(mark)).items()}
        try:
            self.media = open_encoder(self.lm, cfg.mmproj, cfg.mmproj_gpu, cfg.mmproj_device)
        except BaseException:
            self.lm.close()
            raise
        self.kv_store = _open_store(cfg, self.spec, settings)
        # the weights' residency and paging for Stats (LoadedModel keeps its streamer
        # private: a public accessor there would be the better hook)
        self.weights = WeightResidency.of(self.lm, getattr(self.lm, "_streamer", None),
                                         self.spec.tensor_data_size)
        self.sched: Scheduler | None = self._scheduler()

    def _scheduler(self) -> Scheduler:
        from inferenceos.engine.scheduler import Scheduler

        c = self.cfg
        return Scheduler(self.lm, c.n_slots, c.token_budget, c.kv_policy, c.slot_policy,
                         max_queue=c.max_queue, probe=self.probe,
                         policy_options=policy_options(self.spec), draft=c.draft,
                         media=self.media, kv_store=self.kv_store)

    def awake(self) -> Scheduler:
        """The scheduler, opening a context first if the worker sleeps."""
        if self.sched is None:
            self.lm.open_context()
            self.sched = self._scheduler()
        return self.sched

    def info(self) -> WorkerInfo:
        drafts = self.sched.footprint_bytes() if self.sched is not None else 0
        m = self.media
        media: MediaSupport = ({"vision": m.vision, "audio": m.audio, "load_s": m.load_s}
                               if m else {})
        return {**_info(self.lm, self.cfg.n_slots), "asleep": self.sched is None,
                "draft_bytes": drafts, "buffers": self.buffers, "media": media}

    def lifecycle(self, msg: Sleep | Wake | Resize) -> list[FromWorker]:
        """Sleep / Wake / Resize (see the module docstring); only when idle."""
        if self.sched is not None:
            self.sched.store_finished()  # finished replies' KV go to the store first
        if self.sched is not None and self.sched.has_work() and not isinstance(msg, Wake):
            verb = type(msg).__name__.lower()
            raise UsageError(f"cannot {verb} a model with requests in flight")
        t0 = time.perf_counter()
        if isinstance(msg, Sleep):
            if self.sched is not None:
                self.sched.close()
                self.sched = None
            self.lm.free_context()
            return [Result(msg.req_id, {**self.info(), "seconds": time.perf_counter() - t0})]
        if isinstance(msg, Wake):
            self.awake()
            return [Result(msg.req_id, {**self.info(), "seconds": time.perf_counter() - t0})]
        return [Result(msg.req_id, self._resize(msg.settings, msg.n_slots, t0))]

    def _resize(self, settings: LlamaParams, n_slots: int, t0: float) -> WorkerInfo:
        """A new context of `settings` (n_ctx counts all slots) on the same weights;
        each cached slot's conversation continues without prefilling again. Where the
        tiered KV cache is kept and its key stays (the KV layout is unchanged), the
        slots go through it: they become entries, restored when a prompt asks. Else
        (or for a slot the store cannot take) the state is carried into the new
        context; a store whose key changed is reopened under the new one."""
        from inferenceos.engine.kv.slot_state import export_slot, import_slot
        from inferenceos.engine.kv.tiers import store_idle

        sched = self.awake()
        effective = (replace(settings, flash_attn=self.lm.settings.flash_attn)
                     if self.probe else settings)
        store, cached = self.kv_store, [s for s in sched.slots if s.cached]
        same_key = store is not None and _store_key(self.cfg, effective) == store.key
        left = store_idle(sched, store) if same_key and store is not None else cached
        saved = [export_slot(sched, list(slot.cached)) for slot in left]
        sched.close()
        self.sched = None
        self.cfg = replace(self.cfg, settings=settings, n_slots=n_slots)
        self.lm.open_context(effective)
        if store is not None and not same_key:
            store.close()
            self.kv_store = _open_store(self.cfg, self.spec, effective)
        self.sched = self._scheduler()
        carried = len(cached) - len(left)
        for item in saved:
            if item is not None and len(item[0]) < self.sched.n_ctx_slot:
                carried += 1 if import_slot(self.sched, item[0], item[1]) else 0
        return {**self.info(), "carried": carried, "seconds": time.perf_counter() - t0}


def _exit_on_sigterm(signum: int, _frame: Any) -> None:
    """SIGTERM in the worker: exit as after a Shutdown (Python runs the handler
    between bytecodes, so a llama_decode in progress finishes its step first)."""
    raise SystemExit(128 + signum)


def _idle_wait(rt: _Runtime) -> float | None:
    """How long the idle loop may block on the pipe: until the scheduler's next finished
    turn is due for the store, else for good (None)."""
    return rt.sched.store_due_in() if rt.sched is not None else None


def worker_main(conn: Connection, cfg: WorkerConfig) -> None:
    """Process entry point: load, report ready, then serve until shutdown or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # a SIGTERM to the whole process group (systemd's stop, `timeout`, a container's
    # stop) reaches the worker beside its parent: leave through the cleanup below (the
    # KV store's disk writes, the streamer's last heat record), not mid-air
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        rt = _Runtime(cfg)
    except InferenceOSError as exc:
        with contextlib.suppress(OSError):  # the parent may be gone (a Ctrl-C in it)
            conn.send([Failed.of(0, exc)])
        return
    try:
        # inside the try: a parent stopped while this worker loaded (Ctrl-C in `serve`
        # during a pinned model's load) has closed the pipe; that is its goodbye, not a
        # traceback on the terminal they share
        conn.send([Ready(rt.info())])
        _serve(conn, rt)
    except (EOFError, BrokenPipeError):  # the parent went away
        return
    finally:
        if rt.sched is not None:
            rt.sched.close()
        if rt.kv_store is not None:  # finish the disk writes: the next worker reads them
            rt.kv_store.close(timeout=8.0)
        if rt.media is not None:
            rt.media.close()
        rt.lm.close()


def _serve(conn: Connection, rt: _Runtime) -> None:
    """The worker's loop until Shutdown: the pipe's messages between the engine loop's
    steps (core.py; a bug in a step fails the requests in flight, not the worker),
    each step's events sent back as one message."""
    core = EngineCore(lambda: rt.sched, contain=True)
    inbox = _Inbox(conn, rt)
    try:
        # block when idle (until a message, or a finished turn's store is due); when
        # busy, take what has arrived before each step
        while inbox.take(block=not core.has_work()):
            ended, step_s, last = 0, 0.0, time.monotonic()
            for events in core.steps(lambda: inbox.take(block=False)):
                now = time.monotonic()  # (a step, with what ran between two steps)
                if finished := sum(type(e) is Finished for e in events):
                    ended, step_s = finished, now - last
                last = now
                if not events and not inbox.sinks.holding:
                    continue  # (a step without events still writes a held stream due)
                rt.weights.count(sum(isinstance(e, TokenOut) and e.token >= 0
                                     for e in events))
                out = inbox.sinks.route(events)  # a direct stream's tokens: written here
                if out:
                    conn.send_bytes(pack_step(out))
            if ended:  # the last step that ended streams (a store's after it: not one)
                inbox.returned(ended, step_s)
    finally:
        inbox.sinks.close()


def pack_step(events: Sequence[FromWorker]) -> bytes:
    """One step's events as the bytes of one pipe message (`WorkerClient._read` reads
    them with `unpack_step`): each TokenOut without logprobs as a (req_id, token,
    text) tuple, the rest as they are, pickled by the C pickler. A list of frozen
    dataclasses through multiprocessing's ForkingPickler cost ~13 us per 8 tokens
    to pickle and ~10 to unpickle; the tuples ~4 and ~1 (issue 44)."""
    return pickle.dumps([(e.req_id, e.token, e.text)
                         if type(e) is TokenOut and e.logprob is None and not e.top_logprobs
                         else e for e in events], pickle.HIGHEST_PROTOCOL)


def unpack_step(items: list[Any]) -> list[FromWorker]:
    """The events `pack_step` packed (any other message's list as it is)."""
    return [TokenOut(*e) if type(e) is tuple else e for e in items]


# How long an idle worker whose last step ended several streams together waits, after
# the first of their next requests, for the rest of them (`_Inbox.returned`): clients
# that got their ends in the same step send again together, but the first to reach an
# idle worker started a step of its own, which held both cores while the server parsed
# the others (a step later to their first tokens: docs/engine.md, "The burst,
# gathered"). With the cores free the server hands over a request in ~1 ms. Only a
# first request within RETURN_S of those ends is taken for the start of such a burst,
# and only where that step took STEP_S or more: a lone step shorter than that costs the
# others less than the wait would (the tiny llama's 2 ms steps at 8 streams).
GATHER_S = 0.005
RETURN_S = 0.1
STEP_S = 4 * GATHER_S


class _Inbox:
    """The worker's end of the pipe: each arrived message handled, its answer sent;
    `sinks`: the streams this worker writes to their clients (engine/worker/direct.py).
    `returned(n, step_s)`: the step that left the scheduler idle ended `n` streams and
    took `step_s` (the loop says so); when two or more did, in STEP_S or more, and the
    next Generate comes within RETURN_S, it waits up to GATHER_S for as many more
    before the next step."""

    def __init__(self, conn: Connection, rt: _Runtime) -> None:
        self.conn, self.rt = conn, rt
        self.closed = False  # a Shutdown arrived
        self._returning, self._ended_at = 0, 0.0
        self.sinks = DirectSinks(self._cancel)
        # asked between every two steps: one poll object, where Connection.poll builds
        # and drops a selector per call (~10 µs a step). The pipe's Connection keeps no
        # buffer of its own, so the descriptor's readiness is the message's (an EOF
        # reads as ready too, and recv then raises it, as Connection.poll would).
        self._poller = select.poll()
        self._poller.register(conn.fileno(), select.POLLIN)

    def returned(self, n: int, step_s: float) -> None:
        self._returning = n if step_s >= STEP_S else 0
        self._ended_at = time.monotonic()

    def _ready(self, wait: float | None) -> bool:
        """Whether a message (or EOF) can be read, waiting up to `wait` s (None: for good)."""
        ms = None if wait is None else max(0, math.ceil(wait * 1000))
        return bool(self._poller.poll(ms))

    def _cancel(self, req_id: int) -> list[FromWorker]:
        return list(self.rt.sched.cancel(req_id)) if self.rt.sched is not None else []

    def _handle(self, msg: ToWorker) -> list[FromWorker] | None:
        """One message's answer (None: Shutdown), direct streams' parts done here."""
        if isinstance(msg, Attach):  # the socket's descriptor follows it on the pipe
            return self._attach(msg)
        if isinstance(msg, Generate) and msg.direct:
            self.sinks.expect(msg.req_id)
        before = self.sinks.detach_all() if isinstance(msg, ExportLive) else []
        events = _dispatch(msg, self.rt)
        return None if events is None else self.sinks.route([*before, *events], step=False)

    def _attach(self, msg: Attach) -> list[FromWorker]:
        """Take the descriptor that follows `msg` and the stream; a descriptor that
        cannot be read or used refuses the stream (never the worker's end)."""
        try:
            fd = recv_handle(self.conn)  # (an EOFError, the parent gone, ends the worker)
        except (OSError, RuntimeError) as exc:
            return [Wrote(msg.req_id, (), "", refused=True, error=str(exc))]
        return self.sinks.attach(msg.req_id, fd, msg.frame, msg.written)

    def take(self, block: bool) -> bool:
        """Handle every message that has arrived (with `block`, first wait for one, or
        until the store is due); False once a Shutdown is read."""
        wait = _idle_wait(self.rt) if block else 0
        expect, until = 0, 0.0  # the rest of a returning burst, and till when
        while not self.closed and self._ready(wait):
            msg = self.conn.recv()
            events = self._handle(msg)
            if events is None:
                self.closed = True
            elif events:
                self.conn.send(events)
            busy = self.rt.sched is not None and self.rt.sched.has_work()
            wait = _idle_wait(self.rt) if block and not busy else 0
            if block and busy and isinstance(msg, Generate):
                now = time.monotonic()
                if self._returning > 1 and now - self._ended_at < RETURN_S:
                    expect, until = self._returning, now + GATHER_S  # the rest of a burst
                self._returning = 0
                expect -= 1
                wait = max(0.0, until - now) if expect > 0 else 0
        return not self.closed


def _dispatch(msg: ToWorker, rt: _Runtime) -> list[FromWorker] | None:
    """Shutdown (None), lifecycle and migration requests here; every other one to
    `_handle` on an awake scheduler."""
    match msg:
        case Shutdown():
            return None
        case Sleep() | Wake() | Resize():
            try:
                return rt.lifecycle(msg)
            except InferenceOSError as exc:
                return [Failed.of(msg.req_id, exc)]
        case ExportLive() | ImportLive() | LiveNeed() | SetThreads():
            return _migrate(msg, rt)
        case Stats():
            return [_stats(msg.req_id, rt)]
        case ToWorker():
            try:
                sched = rt.awake()
            except InferenceOSError as exc:
                return [Failed.of(msg.req_id, exc)]
            return _handle(msg, rt.lm, sched)
    return [unknown(msg)]  # not a request at all (a parent of another version)


def _stats(rid: int, rt: _Runtime) -> FromWorker:
    """The Stats answer: the scheduler's figures (a warm model's without waking it: a
    scrape leaves it warm) and the weights' residency ("weights", a WeightStats)."""
    try:
        if rt.sched is None:
            kv = {"kv_cache": rt.kv_store.stats()} if rt.kv_store is not None else {}
            report: dict[str, object] = {"asleep": True, "running": 0, "waiting": 0, **kv}
        else:
            report = rt.sched.stats()
        return Result(rid, {**report, "weights": rt.weights.report()})
    except InferenceOSError as exc:
        return Failed.of(rid, exc)
    except Exception as exc:  # a bug must cost one request, not every client's
        return Failed(rid, "GenerationError", f"internal error: {exc!r}")


def _migrate(msg: ExportLive | ImportLive | LiveNeed | SetThreads,
             rt: _Runtime) -> list[FromWorker]:
    """ExportLive / ImportLive / LiveNeed / SetThreads (engine.migrate), between two
    scheduler steps."""
    from inferenceos.engine.worker.migrate import LiveState, export_live, import_live, live_need

    rid = msg.req_id
    try:
        match msg:
            case SetThreads():
                return [Result(rid, _set_threads(rt, msg.n))]
            case LiveNeed():
                return [Result(rid, live_need(rt.sched) if rt.sched is not None else 0)]
            case ExportLive():  # idle prefixes through a store the next worker reads
                store = rt.kv_store if rt.kv_store is not None and rt.kv_store.dir else None
                return [Result(rid, export_live(rt.sched, store=store)
                               if rt.sched is not None else LiveState())]
        result = import_live(rt.awake(), msg.state)
        events: list[FromWorker] = result.pop("events")
        return [*events, Result(rid, result)]
    except InferenceOSError as exc:
        return [Failed.of(rid, exc)]
    except Exception as exc:  # a bug must not kill the worker that holds the streams
        return [Failed(rid, "GenerationError", f"migration failed: {exc!r}")]


def _set_threads(rt: _Runtime, n: int | None) -> int:
    """Compute with `n` threads (prefill too), or the settings' own with None; returns
    the decode thread count now in force. A context-wide setting of llama.cpp's, taken
    at the next decode: no reload, no state lost."""
    s = rt.lm.settings
    full = s.n_threads or default_threads()
    n_dec, n_batch = (full, s.n_threads_batch or full) if n is None else (n, n)
    if rt.lm.ctx:  # none while asleep: the next context opens with the settings' own
        rt.lm._ll.llama_set_n_threads(rt.lm.ctx, max(1, n_dec), max(1, n_batch))
    return max(1, n_dec)
