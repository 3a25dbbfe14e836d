"""Who runs first when the model worker fills the CPUs: its compute threads, then the
HTTP process's threads (issue 44).

On a CPU-only plan whose compute threads take every usable CPU, `serve`'s HTTP process
has no core of its own. At the same priority, each of its wake-ups (a step's tokens,
a client's request) preempts a compute thread in the middle of llama_decode, and the
other compute thread waits for it at the graph's next barrier: on this 2-core machine a
decode of 8 rows took 1.85 ms beside the HTTP process against 1.35 ms without it, for
0.24 cores of HTTP work. With the HTTP threads at a higher nice value they run mostly
in the worker's gaps between steps, and a stream that fell behind writes its waiting
tokens in one frame (benchmarks/overhead.py, docs/engine.md).

The increment is per thread (Linux: a thread's nice value is its own, and the threads
and processes it starts inherit it). Lowering is one way without privilege, so the
threads that start model workers must not be lowered themselves: `start_at_base` runs
the start on a thread kept at the process's own priority. Elsewhere than Linux nothing
here changes anything.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

HTTP_NICE = 10  # figures: docs/engine.md, "Who runs first"

_lock = threading.Lock()
_increment = 0
_base_nice = 0
_base_jobs: queue.SimpleQueue[tuple[Callable[[], object], concurrent.futures.Future[object]]] \
    = queue.SimpleQueue()
_base_thread: threading.Thread | None = None


def http_nice(cpu_threads: int, on_gpu: bool, usable_cpus: int | None = None) -> int:
    """The nice increment for `serve`'s HTTP threads: HTTP_NICE when a CPU-only plan's
    `cpu_threads` (0: llama.cpp's default, every CPU) take every usable CPU, 2 or more,
    else 0. With one CPU the HTTP side would wait for whole steps: it is left as it is."""
    if sys.platform != "linux" or on_gpu:
        return 0
    usable = usable_cpus if usable_cpus is not None else len(os.sched_getaffinity(0))
    return HTTP_NICE if usable >= 2 and (cpu_threads <= 0 or cpu_threads >= usable) else 0


def configure(increment: int) -> None:
    """Give this process's serving threads `increment` (see `lower_this_thread`). Call
    it once, from a thread at the process's own priority, before any is lowered: it
    starts the thread `start_at_base` uses."""
    global _increment, _base_nice, _base_thread
    if increment <= 0 or sys.platform != "linux":
        return
    with _lock:
        if _base_thread is None:
            _base_nice = os.getpriority(os.PRIO_PROCESS, 0)
            _base_thread = threading.Thread(target=_serve_base, name="base-priority",
                                            daemon=True)
            _base_thread.start()
        _increment = increment


def lower_this_thread() -> None:
    """Run the calling thread at the configured increment above the process's own
    priority (and the threads it starts after this); nothing when none is configured.
    Idempotent: the value is absolute, so a thread that inherited it stays there."""
    if not _increment:
        return
    with contextlib.suppress(OSError):  # a sandbox may refuse: the threads keep theirs
        os.setpriority(os.PRIO_PROCESS, 0, min(19, _base_nice + _increment))


def start_at_base(fn: Callable[[], T]) -> T:
    """`fn()`, run on a thread at the process's own priority when serving threads are
    lowered (what it starts, a model worker, inherits that priority), else here."""
    if not _increment or _base_thread is None or threading.current_thread() is _base_thread:
        return fn()
    done: concurrent.futures.Future[object] = concurrent.futures.Future()
    _base_jobs.put((fn, done))
    return done.result()  # type: ignore[return-value]


def _serve_base() -> None:
    while True:
        fn, done = _base_jobs.get()
        try:
            done.set_result(fn())
        except BaseException as exc:  # handed to the caller, whatever it is
            done.set_exception(exc)
