"""Live migration, the orchestration in the parent: swap an engine's worker for one on
another placement while its streams run (what `Engine.migrate` does).

engine/worker/migrate.py is the mechanism inside the workers (every live sequence exported at
a step boundary, imported into another scheduler); this module drives it from the
engine's side: it starts the new worker, pauses the old one, moves the streams' reply
queues with their requests, and makes the new worker the `CurrentWorker`.

Make before break: the new worker loads (and warms up) while the old one keeps
generating, on a share of the cores each when both would not fit (`_core_shares`);
then the old pauses at a step boundary, its sequences move, and it stops. Break before
make (no memory for both): the old pauses first, its state is saved and it stops, then
the new one loads and resumes; the pause covers the load. A failure never leaves a
stream hanging: make-before-break keeps the old worker serving, break-before-make
restarts it on the old settings, and if that fails too the moved streams end with the
error.
"""

from __future__ import annotations

import contextlib
import queue
import time
from dataclasses import replace
from typing import TYPE_CHECKING, TypedDict

import inferenceos.errors as errors
from inferenceos.engine.base import per_slot
from inferenceos.engine.messages import (
    ExportLive,
    Failed,
    Finished,
    Generate,
    ImportLive,
    SetThreads,
)
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.session import default_threads
from inferenceos.engine.worker.client import CurrentWorker, Replies, WorkerClient
from inferenceos.engine.worker.main import WorkerConfig
from inferenceos.plan.llama_params import LlamaParams

if TYPE_CHECKING:  # the scheduler's modules stay out of the parent process
    from inferenceos.engine.worker.migrate import LiveState

__all__ = ["MigrateInfo", "migrate"]


class MigrateInfo(TypedDict):
    """What `migrate` reports (see there)."""

    restored: int
    reprefilled: int
    ended: int
    prefixes: int
    pause_s: float
    seconds: float
    load_s: float
    moved: int
    kv_bytes: int


def migrate(
    current: CurrentWorker, settings: LlamaParams, n_parallel: int | None = None,
    make_before_break: bool = True,
) -> MigrateInfo:
    """Move `current`'s requests to a new worker loaded with `settings` (n_ctx per
    sequence) and `n_parallel` slots (by default as many as now), mid-stream; see the
    module doc. Returns "pause_s" (the token stream's gap), "seconds" (the whole
    migration), "load_s", "moved", "restored", "reprefilled", "ended", "prefixes",
    "kv_bytes"."""
    t0 = time.perf_counter()
    n_par = n_parallel or current.cfg.n_slots
    total = per_slot(settings, n_par)
    total.validate()
    cfg = replace(current.cfg, settings=total, n_slots=n_par)
    shares = _core_shares(current.cfg.settings, total) if make_before_break else None
    new = _make(current, cfg, shares) if make_before_break else None
    with current.route:
        old = current.live()
        t_pause = time.perf_counter()
        try:
            state = current.ask(ExportLive(), old)
        except BaseException:
            _abort_make(current, new, shares)
            raise
        new, counts = _hand_over(current, old, new, cfg, state)
        pause = time.perf_counter() - t_pause
    if make_before_break:
        old.shutdown()
        if shares is not None:  # the cores are the new worker's alone now
            with contextlib.suppress(errors.InferenceOSError):
                current.ask(SetThreads(None), new)
    return MigrateInfo(restored=counts.get("restored", 0),
                       reprefilled=counts.get("reprefilled", 0),
                       ended=counts.get("ended", 0), prefixes=counts.get("prefixes", 0),
                       pause_s=pause, seconds=time.perf_counter() - t0,
                       load_s=float(new.info["load_s"]), moved=len(state.ids),
                       kv_bytes=state.kv_bytes)


def _make(current: CurrentWorker, cfg: WorkerConfig,
          shares: tuple[int, int] | None) -> WorkerClient:
    """Make before break's first half, while the old worker keeps generating: the new
    worker on `cfg`, loaded and warmed up on its share of the cores (`shares`: old,
    new; None: no sharing). On any failure the old worker is left as it was."""
    new = None
    try:
        if shares is not None:  # the old worker makes room before the load starts
            current.ask(SetThreads(shares[0]))
        new = current.start(cfg)
        if shares is not None:
            current.ask(SetThreads(shares[1]), new)
        _warm(current, new)  # its first decode (thread pool, page-ins) off the stream
    except BaseException:
        _abort_make(current, new, shares)
        raise
    return new


def _hand_over(current: CurrentWorker, old: WorkerClient, new: WorkerClient | None,
               cfg: WorkerConfig, state: LiveState) -> tuple[WorkerClient, dict[str, int]]:
    """The switch, under the route lock once `old` has exported `state`: the streams'
    reply queues follow their requests to `new` (break before make, `new` is None: the
    old worker stops first and the new one starts now), which imports `state` and
    becomes the current worker. Returns it and its import counts."""
    with old.lock:  # the streams' queues follow their requests
        moved = {rid: q for rid in state.ids
                 if (q := old.pending.pop(rid, None)) is not None}
    if new is None:
        old.shutdown()
        new, cfg = _restart(current, cfg, moved)
    with new.lock:
        new.pending.update(moved)
    counts = current.ask(ImportLive(state), new)
    current.swap(new, cfg)
    return new, counts


def _abort_make(current: CurrentWorker, new: WorkerClient | None,
                shares: tuple[int, int] | None) -> None:
    """A make-before-break that failed before the switch: the new worker goes, the
    old one (still serving) gets its threads back."""
    if new is not None:
        new.shutdown()
    if shares is not None:
        with contextlib.suppress(errors.InferenceOSError):
            current.ask(SetThreads(None))


def _warm(current: CurrentWorker, worker: WorkerClient) -> None:
    """One short greedy generation on a new worker before it takes over: a fresh
    process's first decode is slower than the next ones (thread pool start, pages
    of the weights; on Gemma here 1.2 s against 0.4-0.5 s), and that cost should
    not land in the moved streams."""
    req_id, q = current.submit(worker, Generate(
        "Hello", SamplingParams(temperature=0, max_tokens=2), None, "none"))
    try:
        while True:
            if isinstance(q.get(timeout=current.start_timeout), (Finished, Failed)):
                return
    except queue.Empty:
        return
    finally:
        worker.done(req_id)


def _restart(current: CurrentWorker, cfg: WorkerConfig,
             moved: dict[int, Replies]) -> tuple[WorkerClient, WorkerConfig]:
    """Break before make: a worker on `cfg`, else on the old settings again; if both
    fail, the moved streams end with the error (never a hang)."""
    try:
        return current.start(cfg), cfg
    except errors.InferenceOSError:
        try:
            return current.start(current.cfg), current.cfg
        except errors.InferenceOSError as exc:
            for rid, q in moved.items():
                q.put(Failed(rid, type(exc).__name__, f"migration failed: {exc}"))
            raise


def _core_shares(old: LlamaParams, new: LlamaParams,
                 cores: int | None = None) -> tuple[int, int] | None:
    """Threads for (the old worker, the new one) while the new one loads and warms up
    beside the generating one, or None when the cores hold both as they are.

    Two workers computing on more threads than there are cores stall each other:
    ggml's threads spin at every barrier of the graph (hundreds per token) waiting for
    a thread that has no core, and on 2 cores a 2-thread stream beside a loading worker
    took up to 2.2 s for one token (benchmarks/migration.py). The old worker keeps all
    but one core, the new one loads and warms up on what is left, and each gets its
    own thread count back once the other is out of the way (`cores`: those this
    process may run on, by default)."""
    cores = cores or default_threads()
    old_n, new_n = old.n_threads or cores, new.n_threads or cores
    if old_n + new_n <= cores:
        return None
    old_share = min(old_n, max(1, cores - 1))
    return old_share, max(1, min(new_n, cores - old_share))
