"""`serve` on a machine its model's compute threads fill: where the HTTP side wakes
per token (direct writes off), its event loop runs at nice +10 and a model worker it
loads on demand (from a lowered request thread) at the priority serve started with
(hardware/cpu_share.py). A real `serve` given every CPU of this machine (the suite pins
each test process to one, where nothing is lowered), the tiny model, one request; the
priorities read back from /proc. With direct writes (the default) the HTTP side wakes
per request and keeps the base priority."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from cli_helpers import start_serve
from tiny_models import write_tiny_model

CPUS = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
pytestmark = pytest.mark.skipif(sys.platform != "linux" or len(CPUS) < 2,
                                reason="per-thread nice on a machine of 2 or more CPUs")


def _nice(pid: int, tid: int | None = None) -> int:
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[16])


def _workers(pid: int) -> list[int]:
    """serve's model worker processes (multiprocessing's spawned children)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit():
                continue
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid and b"spawn_main" in cmd \
                and b"resource_tracker" not in cmd:
            out.append(int(d.name))
    return out


@pytest.mark.parametrize(("yield_cpu", "direct"), [("1", "0"), ("0", "0"), ("1", "1")])
def test_the_http_side_gives_way_and_the_worker_keeps_its_priority(
    tmp_path: Path, yield_cpu: str, direct: str
) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, CPUS)  # serve inherits every CPU
    try:
        proc, url = start_serve(str(model), "--threads", str(len(CPUS)), "--draft", "none",
                                INFERENCEOS_SERVER_YIELD_CPU=yield_cpu,
                                INFERENCEOS_SERVER_DIRECT_WRITES=direct)
    finally:
        os.sched_setaffinity(0, own)
    try:
        r = httpx.post(f"{url}/completion", timeout=120,
                       json={"prompt": "hello", "n_predict": 4})
        assert r.status_code == 200, r.text
        lowered = min(19, base + 10) if (yield_cpu, direct) == ("1", "0") else base
        assert _nice(proc.pid) == lowered  # the event loop's thread
        workers = _workers(proc.pid)
        assert len(workers) == 1, workers
        assert _nice(workers[0]) == base  # loaded from a lowered thread, at base priority
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
