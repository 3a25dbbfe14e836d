"""The operations routes never wait behind model work (server/ops/reads.py's contract).

While everything a load, a migration or a generation can hold is held (the manager's
load lock, the engine's route and worker locks, a lease, the worker process itself
frozen mid-pipe, and every thread of the event loop's default executor busy), each
operations route still answers, with its usual shape. Nothing here is timed: a route
that took one of those locks or pool slots again would not answer until they are let
go, and the request's timeout (a hang catcher, far above any answer) fails it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from server_harness import Harness, serving

HANG_S = 20.0  # a request not answered by then waits for something it must not


def _fill_default_executor(loop: asyncio.AbstractEventLoop, gate: threading.Event) -> None:
    """Make the server loop's default executor one thread, busy until `gate` is set:
    what a burst of other work does to asyncio's default pool (six threads on two
    cores)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="busy-default")
    busy = threading.Event()

    def block() -> None:
        busy.set()
        gate.wait()

    def install() -> None:
        loop.set_default_executor(pool)
        loop.run_in_executor(None, block)

    loop.call_soon_threadsafe(install)
    assert busy.wait(HANG_S), "the default executor did not take the blocking job"


@contextlib.contextmanager
def _model_work_held(h: Harness) -> Iterator[None]:
    """Hold every lock and slot model work holds, as a load and a migration would, and
    freeze the model's worker process (a question over its pipe gets no answer)."""
    [lm] = h.manager.loaded()
    engine: Any = lm.engine
    current = engine._current  # the worker an engine's requests go to
    gate = threading.Event()
    lease = h.manager.acquire(lm.model.name)  # a request in flight
    pid = engine.worker_pid
    with contextlib.ExitStack() as stack:
        for lock in (h.manager._load_lock, current.route, current._lock):
            lock.acquire()
            stack.callback(lock.release)
        stack.callback(lease.release)
        stack.callback(gate.set)
        _fill_default_executor(h.server.servers[0].get_loop(), gate)
        os.kill(pid, signal.SIGSTOP)
        stack.callback(os.kill, pid, signal.SIGCONT)
        yield


def test_operations_answer_while_model_work_holds_every_lock(tiny_llama: Path,
                                                             tmp_path: Path) -> None:
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        r = httpx.post(h.url + "/api/generate", json={
            "model": "tiny", "prompt": "ab", "stream": False, "options": {"num_predict": 2}},
            timeout=120)
        assert r.status_code == 200
        with _model_work_held(h), httpx.Client(base_url=h.url, timeout=HANG_S) as c:
            health = c.get("/health").json()
            assert health == {"status": "ok", "models_loaded": 1, "workers": None}
            assert c.get("/api/version").json()["version"]
            [ps] = c.get("/api/ps").json()["models"]
            assert ps["name"] == "tiny:latest" and ps["state"] == "hot"
            budget = c.get("/api/budget").json()
            cpu = next(d for d in budget["devices"] if d["name"] == "CPU")
            assert cpu["used_bytes"] > 0 and budget["pressure"]["high"] == 0.95
            metrics = c.get("/metrics").text
            assert 'inferenceos:num_requests_running' in metrics
            assert 'inferenceos:kv_cache_usage_perc{model_name="tiny:latest"}' in metrics
            assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["tiny:latest"]
            assert c.get("/api/events").json()["last_id"] > 0
            # a cap that orders nothing (far above what the model holds), then lifted
            for cap in (1 << 50, None):
                r = c.post("/api/budget", json={"device": "CPU", "bytes": cap})
                assert r.status_code == 200
            assert c.get("/ui/").status_code == 200
        assert h.manager.budget.caps == {}
