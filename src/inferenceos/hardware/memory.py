"""System RAM, swap, huge pages and container limits.

Linux reads /proc/meminfo (root is a parameter for recorded trees); macOS asks `sysctl`
and `vm_stat`. `usable_bytes` folds in the cgroup limit, because inside a container
/proc/meminfo shows the host's RAM, not what the container may use.
"""

from __future__ import annotations

import re
from pathlib import Path

from inferenceos.hardware.cgroup import memory_limit
from inferenceos.hardware.profile import MemoryInfo
from inferenceos.hardware.tools import probe_proc, run_tool

# Memory a process charges to its cgroup after it has read its budget, whatever it
# loads: the code pages a decode step executes (llama.cpp's CPU kernels, its graph code,
# sqlite's and the C++ runtime's) and the heap's growth. Measured on tests/tiny_q4.py
# (x86_64, AVX2) over an 8-token decode: +3.2 MiB of executable mappings, +1.5 MiB of
# heap. Left out of an enforced limit's budget, plans the kernel had to OOM-kill were
# accepted: disk-bound ones leaving one layer of page cache (2026-12-03), and an
# all-in-RAM one at 1.25x the file, where the anonymous bytes were estimated within 1 %
# (2026-12-04). Only an enforced limit reserves it: `--ram` is the planner's figure.
DECODE_CODE_PAGES = 4 << 20


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as {key: bytes} ("kB" values scaled; counts such as
    HugePages_Total kept as they are)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"(\S+):\s+(\d+)(\s+kB)?", line)
        if m:
            values[m.group(1)] = int(m.group(2)) * (1024 if m.group(3) else 1)
    return values


def detect_memory(proc: Path = Path("/proc"), sys_root: Path = Path("/sys"),
                  warnings: list[str] | None = None) -> MemoryInfo:
    """Describe RAM on this machine (or in the recorded `proc` / `sys_root` trees)."""
    return probe_proc(proc, "meminfo", warnings, "memory", "RAM size unknown",
                      lambda text: _detect_linux(text, sys_root), _detect_macos, MemoryInfo)


def _detect_linux(meminfo: str, sys_root: Path) -> MemoryInfo:
    """From /proc/meminfo text and the cgroup limit under `sys_root`."""
    mi = parse_meminfo(meminfo)
    total = mi.get("MemTotal", 0)
    available = mi.get("MemAvailable", mi.get("MemFree", 0) + mi.get("Cached", 0))
    limit, usage = memory_limit(sys_root)
    usable = available
    if limit is not None:  # what is left under the limit, less the decode's own pages
        usable = min(available, max(0, limit - (usage or 0) - DECODE_CODE_PAGES))
    return MemoryInfo(
        total_bytes=total, available_bytes=available, usable_bytes=usable,
        swap_total_bytes=mi.get("SwapTotal", 0), swap_free_bytes=mi.get("SwapFree", 0),
        hugepages_total=mi.get("HugePages_Total", 0),
        hugepage_size_bytes=mi.get("Hugepagesize", 0),
        cgroup_limit_bytes=limit, cgroup_usage_bytes=usage,
    )


def _detect_macos(warns: list[str]) -> MemoryInfo:
    out = run_tool(["sysctl", "-n", "hw.memsize"], timeout=2.0)
    if out.stdout is None or not out.stdout.strip().isdigit():
        warns.append(f"memory: {out.problem or 'sysctl hw.memsize gave no number'}")
        return MemoryInfo()
    total = int(out.stdout.strip())
    available = _macos_available(run_tool(["vm_stat"], timeout=2.0).stdout or "")
    swap = run_tool(["sysctl", "-n", "vm.swapusage"], timeout=2.0).stdout or ""
    swap_total, swap_free = _parse_swapusage(swap)
    avail = available if available is not None else total
    return MemoryInfo(total_bytes=total, available_bytes=avail, usable_bytes=avail,
                      swap_total_bytes=swap_total, swap_free_bytes=swap_free)


def _macos_available(vm_stat: str) -> int | None:
    """Free + inactive + speculative + purgeable pages from `vm_stat`, in bytes."""
    page = re.search(r"page size of (\d+) bytes", vm_stat)
    if not page:
        return None
    pages = {k.strip(): int(v.strip().rstrip(".")) for k, _, v in
             (line.partition(":") for line in vm_stat.splitlines()[1:])
             if v.strip().rstrip(".").isdigit()}
    keys = ("Pages free", "Pages inactive", "Pages speculative", "Pages purgeable")
    return sum(pages.get(k, 0) for k in keys) * int(page.group(1))


def _parse_swapusage(text: str) -> tuple[int, int]:
    """(total, free) bytes from "total = 2048.00M  used = 1024.00M  free = 1024.00M"."""
    def grab(key: str) -> int:
        m = re.search(key + r" = ([\d.]+)([KMG])", text)
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        return int(float(m.group(1)) * scale[m.group(2)]) if m else 0
    return grab("total"), grab("free")
