"""The thread count for llama.cpp from the CPUs that are actually free (pure).

llama.cpp's CPU backend splits every matrix product evenly over its threads and waits
at a barrier after each: one thread that shares its core with another program holds
all the others back. Measured here while a build ran: Gemma 3 270M decode fell from
~40 t/s to 3-5 t/s with one thread per core. So we take only the cores nobody else is
using — fewer threads at full speed beat more threads that wait for each other.

`free_cpus(load)` = min(affinity, cgroup quota) × (1 − steal) − CPUs busy with other
processes (our other engine workers included); `pick_threads(cores, load)` rounds that
down, counting a CPU as free when at least `FREE_SHARE` of it is, and keeps it within
[1, cores]. The sensor is `inferenceos.hardware.cpu_load.sample_cpu_load()`; this
module is pure, so it is tested without a loaded machine.
"""

from __future__ import annotations

from inferenceos.hardware.cpu_load import FREE_SHARE, CpuLoad, free_cpus, free_threads

__all__ = [
    "FREE_SHARE",
    "explain_threads",
    "fewer_threads_reason",
    "free_cpus",
    "pick_threads",
]


def pick_threads(cores: int, load: CpuLoad | None) -> int:
    """Threads for llama.cpp: the free CPUs, at least 1, at most `cores`.

    `cores` is the most the plan would use on an idle machine (the CPU device's usable
    threads); `load` None (no sensor) keeps it. (The arithmetic lives beside the sensor
    so that `hardware`'s llama.cpp probe can use it too.)
    """
    return free_threads(cores, load)


def fewer_threads_reason(load: CpuLoad) -> str:
    """Why the free cores are fewer than the usable ones (a phrase; "" when idle)."""
    why = []
    if load.busy_others >= 0.05 and load.sampled:
        who = f"{load.busy_others:.1f} CPUs busy with other processes"
        if load.worker_cpus >= 0.05:
            who += f", {load.worker_cpus:.1f} of them by {load.workers} other model worker(s)"
        why.append(who)
    if load.quota_cpus and load.quota_cpus < load.usable_cpus:
        why.append(f"cgroup quota {load.quota_cpus:g} CPUs")
    if load.steal_fraction >= 0.05:
        why.append(f"{load.steal_fraction:.0%} steal time")
    if not load.sampled and load.loadavg_1m:
        why.append(f"load average {load.loadavg_1m:.1f}")
    return "; ".join(why)


def explain_threads(cores: int, load: CpuLoad | None) -> str:
    """One phrase for the plan line: how many threads and why."""
    n = pick_threads(cores, load)
    if load is None or n == cores:
        return f"{n} threads"
    why = fewer_threads_reason(load)
    return f"{n} of {cores} threads" + (f" ({why})" if why else "")
