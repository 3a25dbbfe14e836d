"""How many CPUs are free right now: the sensor behind load-aware thread counts.

`sample_cpu_load()` reads the kernel's counters twice, `window_s` apart (0.1 s by
default, short enough for `run`'s start-up): per-CPU busy and steal time from
/proc/stat over the CPUs this process may run on (its affinity mask), this process's own
CPU time from /proc/self/stat (so our own work never counts as "someone else"), the CPU
time of our other llama.cpp processes (engine workers: `_our_workers`), the 1-minute
load average and the cgroup CPU quota. It never raises: on a system without /proc
(macOS) it returns `CpuLoad.unknown()`, which the planner treats as "all idle".

Why sampled and not the load average alone: the load average lags by about a minute
(after a build finishes it still says "busy"), while a competing busy loop shows at once
in the per-CPU counters. The load average is kept as a fallback and for reports.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from inferenceos.hardware.cgroup import cpu_quota

WORKER_MARK = b"inferenceos.engine.worker.main"
FREE_SHARE = 0.7  # a CPU whose time is ≥ 70 % ours counts as a whole free core
# /proc/stat columns: user nice system idle iowait irq softirq steal (guest is in user)
_BUSY_COLS = (0, 1, 2, 5, 6)
_IDLE_COLS = (3, 4)
_STEAL_COL = 7


@dataclass(frozen=True)
class CpuLoad:
    """What the other programs on this machine take from the CPUs we may use.

    `usable_cpus`: CPUs in our affinity mask; `quota_cpus`: the cgroup's CPU quota
    (None: none); `busy_others`: CPUs (a float) kept busy by processes other than this
    one during the sample, our own engine workers included; `worker_cpus`: the part of
    `busy_others` that our other engine workers used, `workers` how many there are;
    `steal_fraction`: share of time the hypervisor gave to other guests; `loadavg_1m`:
    the kernel's 1-minute load average; `window_s`: 0 when nothing was sampled.
    """

    usable_cpus: int = 1
    quota_cpus: float | None = None
    busy_others: float = 0.0
    worker_cpus: float = 0.0
    workers: int = 0
    steal_fraction: float = 0.0
    loadavg_1m: float = 0.0
    window_s: float = 0.0

    @classmethod
    def unknown(cls, usable_cpus: int = 1) -> CpuLoad:
        """No counters (non-Linux): an idle machine as far as we can tell."""
        return cls(usable_cpus=usable_cpus)

    @property
    def sampled(self) -> bool:
        return self.window_s > 0

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "usable_cpus": self.usable_cpus,
            "quota_cpus": self.quota_cpus,
            "busy_others": round(self.busy_others, 2),
            "worker_cpus": round(self.worker_cpus, 2),
            "workers": self.workers,
            "steal_fraction": round(self.steal_fraction, 3),
            "loadavg_1m": self.loadavg_1m,
            "window_s": self.window_s,
        }


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _cpu_counters(proc: Path, cpus: set[int] | None) -> tuple[int, int, int] | None:
    """(busy, total, steal) clock ticks summed over `cpus` (all when None)."""
    try:
        lines = (proc / "stat").read_text().splitlines()
    except OSError:
        return None
    busy = total = steal = 0
    found = False
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            idx = int(name[3:])
            vals = [int(v) for v in rest.split()[:8]]
        except ValueError:
            continue
        if (cpus is not None and idx not in cpus) or len(vals) < 8:
            continue
        found = True
        busy += sum(vals[i] for i in _BUSY_COLS)
        steal += vals[_STEAL_COL]
        total += sum(vals)
    return (busy, total, steal) if found else None


def _proc_ticks(stat: Path) -> int:
    """utime + stime of one process, in clock ticks (0 when unreadable)."""
    try:
        text = stat.read_text()
    except OSError:
        return 0
    fields = text[text.rfind(")") + 2 :].split()  # the name may hold spaces
    try:
        return int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return 0


def _our_workers(proc: Path) -> list[Path]:
    """/proc/PID dirs of our llama.cpp processes other than this one: a command line
    naming the engine worker, or an `inferenceos` / multiprocessing-spawn Python process
    (how the engine starts its workers) that has libllama mapped."""
    me = os.getpid()
    found = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for d in entries:
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            if WORKER_MARK in cmd or (
                (b"inferenceos" in cmd or b"multiprocessing.spawn" in cmd)
                and b"libllama" in (d / "maps").read_bytes()
            ):
                found.append(d)
        except OSError:
            continue
    return found


def _loadavg(proc: Path) -> float:
    try:
        return float((proc / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def sample_cpu_load(window_s: float = 0.1, proc: Path = Path("/proc")) -> CpuLoad:
    """Sample the CPUs for `window_s` seconds; never raises (see the module doc)."""
    cpus = _affinity()
    usable = len(cpus) if cpus else (os.cpu_count() or 1)
    quota = cpu_quota()
    first = _cpu_counters(proc, cpus)
    if first is None:
        return CpuLoad(usable_cpus=usable, quota_cpus=quota, loadavg_1m=_loadavg(proc))
    workers = _our_workers(proc)
    own0 = _proc_ticks(proc / "self" / "stat")
    w0 = [_proc_ticks(w / "stat") for w in workers]
    t0 = time.monotonic()
    time.sleep(window_s)
    second = _cpu_counters(proc, cpus)
    own1 = _proc_ticks(proc / "self" / "stat")
    w1 = [_proc_ticks(w / "stat") for w in workers]
    wall = time.monotonic() - t0
    if second is None or wall <= 0:
        return CpuLoad(usable_cpus=usable, quota_cpus=quota, loadavg_1m=_loadavg(proc))
    d_busy, d_total, d_steal = (b - a for a, b in zip(first, second, strict=True))
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    # the per-CPU counters tick in the same unit; d_total / n_cpus ≈ wall × hz
    cpu_seconds = d_total / hz if d_total > 0 else wall * usable
    n_cpus = max(1, round(cpu_seconds / wall)) if d_total > 0 else usable
    busy_cpus = d_busy / max(d_total, 1) * n_cpus
    own_cpus = max(0, own1 - own0) / hz / wall
    worker_cpus = sum(max(0, b - a) for a, b in zip(w0, w1, strict=True)) / hz / wall
    return CpuLoad(
        usable_cpus=usable,
        quota_cpus=quota,
        busy_others=max(0.0, busy_cpus - own_cpus),
        worker_cpus=min(worker_cpus, max(0.0, busy_cpus - own_cpus)),
        workers=len(workers),
        steal_fraction=max(0.0, d_steal / max(d_total, 1)),
        loadavg_1m=_loadavg(proc),
        window_s=round(wall, 3),
    )


def free_cpus(load: CpuLoad) -> float:
    """CPUs (a float) left to us: capacity after quota and steal, minus others' use.
    Without a sample, the load average less one (this process, running now)."""
    cap = float(load.usable_cpus)
    if load.quota_cpus:
        cap = min(cap, load.quota_cpus)
    cap *= 1.0 - min(max(load.steal_fraction, 0.0), 0.9)
    busy = load.busy_others if load.sampled else max(0.0, load.loadavg_1m - 1.0)
    return max(0.0, cap - busy)


def free_threads(cores: int, load: CpuLoad | None) -> int:
    """Free CPUs rounded down (a CPU ≥ FREE_SHARE free counts), within [1, cores]."""
    cores = max(1, cores)
    if load is None:
        return cores
    n = math.floor(free_cpus(load) + (1.0 - FREE_SHARE) + 1e-9)
    return max(1, min(cores, n))
