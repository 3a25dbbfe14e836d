"""hardware/cpu_share.py: serve's HTTP threads give way to the worker's on a machine
its compute threads fill, and what a lowered thread starts at base priority (a model
worker) runs at the process's own priority. Real threads and processes; the priorities
are read back from the kernel."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from inferenceos.hardware import cpu_share

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")


@linux_only
def test_lowered_only_where_the_compute_threads_fill_two_or_more_cpus() -> None:
    assert cpu_share.http_nice(2, on_gpu=False, usable_cpus=2) == cpu_share.HTTP_NICE
    assert cpu_share.http_nice(0, on_gpu=False, usable_cpus=4) == cpu_share.HTTP_NICE
    assert cpu_share.http_nice(8, on_gpu=False, usable_cpus=16) == 0  # cores to spare
    assert cpu_share.http_nice(2, on_gpu=True, usable_cpus=2) == 0  # the GPU computes
    assert cpu_share.http_nice(1, on_gpu=False, usable_cpus=1) == 0  # no gaps to run in


# in a process of its own: configure() changes the process for good
_SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, threading
    from inferenceos.hardware import cpu_share

    def nice_of(cmd_start):
        p = cmd_start()
        out = p.communicate()[0].split()[0]
        return int(out)

    child = lambda: subprocess.Popen([sys.executable, "-c",
        "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"], stdout=subprocess.PIPE,
        text=True)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    cpu_share.configure(10)
    cpu_share.lower_this_thread()
    cpu_share.lower_this_thread()  # idempotent: the value is absolute
    seen = {}
    t = threading.Thread(target=lambda: seen.update(
        inherited=os.getpriority(os.PRIO_PROCESS, 0)))
    t.start(); t.join()
    print(base, os.getpriority(os.PRIO_PROCESS, 0), seen["inherited"],
          nice_of(child), cpu_share.start_at_base(lambda: nice_of(child)))
""")


@linux_only
def test_a_lowered_thread_starts_a_worker_at_the_process_priority() -> None:
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    base, lowered, inherited, direct, at_base = map(int, r.stdout.split())
    want = min(19, base + 10)
    assert (lowered, inherited, direct) == (want, want, want)
    assert at_base == base  # a model worker keeps the priority the user gave serve
