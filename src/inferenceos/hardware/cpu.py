"""CPU model, cores, threads, ISA flags, NUMA nodes and caches.

Linux reads /proc/cpuinfo and /sys/devices/system (roots are parameters so tests can
point them at recordings); macOS asks `sysctl`; anything else falls back to `platform`.
`isa` keeps only the flags llama.cpp's kernels care about, under one spelling across
x86 and ARM (e.g. ARM's `asimd` becomes `neon`).
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from inferenceos.errors import UsageError
from inferenceos.hardware.cgroup import cpu_quota
from inferenceos.hardware.profile import CpuInfo
from inferenceos.hardware.tools import probe_proc, read_text, run_tool
from inferenceos.units import parse_size

# OS spelling → our spelling, in the order we show them.
_ISA_ALIASES: dict[str, str] = {
    "pni": "sse3", "sse3": "sse3", "ssse3": "ssse3", "avx": "avx", "avx2": "avx2",
    "f16c": "f16c", "fma": "fma", "avx_vnni": "avx_vnni", "avx512f": "avx512f",
    "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512_vnni": "avx512_vnni",
    "avx512vnni": "avx512_vnni", "avx512_bf16": "avx512_bf16", "avx512_fp16": "avx512_fp16",
    "amx_tile": "amx_tile", "amx_int8": "amx_int8", "amx_bf16": "amx_bf16",
    "asimd": "neon", "neon": "neon", "asimddp": "dotprod", "dotprod": "dotprod",
    "i8mm": "i8mm", "sve": "sve", "sve2": "sve2", "bf16": "bf16", "asimdhp": "fp16",
    "fp16": "fp16",
    # macOS sysctl spellings
    "avx1.0": "avx", "feat_dotprod": "dotprod",
    "feat_i8mm": "i8mm", "feat_bf16": "bf16", "feat_fp16": "fp16", "feat_sve": "sve",
    "feat_sme": "sme", "advsimd": "neon",
}
_ISA_ORDER = list(dict.fromkeys(_ISA_ALIASES.values()))


def normalise_isa(flags: list[str]) -> list[str]:
    """The llama.cpp-relevant subset of `flags`, in canonical names and order."""
    have = {_ISA_ALIASES[f.lower()] for f in flags if f.lower() in _ISA_ALIASES}
    return [name for name in _ISA_ORDER if name in have]


def detect_cpu(proc: Path = Path("/proc"), sys_root: Path = Path("/sys"),
               warnings: list[str] | None = None) -> CpuInfo:
    """Describe the CPU of this machine (or of the recorded `proc`/`sys_root` trees)."""
    recorded = proc != Path("/proc")
    return probe_proc(proc, "cpuinfo", warnings, "cpu", "CPU features unknown",
                      lambda text: _detect_linux(text, sys_root, recorded=recorded),
                      _detect_macos, _fallback_cpu)


def _fallback_cpu() -> CpuInfo:
    n = os.cpu_count() or 1
    return CpuInfo(model=platform.processor() or platform.machine(), arch=platform.machine(),
                   cores=n, threads=n, usable_threads=_usable_threads(n, Path("/sys")))


# ARM "CPU part" numbers (implementer 0x41) of common server and SBC cores.
_ARM_PARTS = {
    "0xd03": "Cortex-A53", "0xd05": "Cortex-A55", "0xd08": "Cortex-A72", "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1", "0xd40": "Neoverse-V1", "0xd49": "Neoverse-N2",
    "0xd4f": "Neoverse-V2",
}


def parse_cpuinfo(text: str) -> tuple[str, list[str], int, int]:
    """(model, flags, logical CPUs, physical cores) from /proc/cpuinfo text.

    Physical cores come from distinct (physical id, core id) pairs; 0 when the file
    does not say (ARM), letting the caller fall back to sysfs. ARM cores without a
    model name are named from their "CPU part" number.
    """
    model, logical, part = "", 0, ""
    flags: list[str] = []
    pairs: set[tuple[str, str]] = set()
    phys = "0"
    for line in text.splitlines():
        key, _, value = (p.strip() for p in line.partition(":"))
        if key == "processor":
            logical += 1
        elif key in ("model name", "Model", "cpu model", "Hardware") and not model:
            model = value
        elif key in ("flags", "Features") and not flags:
            flags = sorted(set(value.split()))
        elif key == "CPU part" and not part:
            part = value
        elif key == "physical id":
            phys = value
        elif key == "core id":
            pairs.add((phys, value))
    if not model and part:
        model = f"ARM {_ARM_PARTS.get(part, 'core ' + part)}"
    return model, flags, logical, len(pairs)


def _detect_linux(cpuinfo: str, sys_root: Path, recorded: bool = False) -> CpuInfo:
    """From /proc/cpuinfo text and sysfs; a `recorded` tree is not this process's
    machine, so its arch comes from the text and affinity does not apply."""
    model, flags, logical, cores = parse_cpuinfo(cpuinfo)
    arch = platform.machine()
    if recorded:
        arch = "aarch64" if "CPU implementer" in cpuinfo else "x86_64"
    cpu_dir = sys_root / "devices" / "system" / "cpu"
    online = _online_cpus(cpu_dir) or list(range(logical or (os.cpu_count() or 1)))
    topo = {(read_text(cpu_dir / f"cpu{i}/topology/physical_package_id"),
             read_text(cpu_dir / f"cpu{i}/topology/core_id")) for i in online}
    if all(a is not None and b is not None for a, b in topo):
        cores = len(topo)
    threads = len(online)
    return CpuInfo(
        model=model or platform.processor() or platform.machine(),
        arch=arch, cores=cores or threads, threads=threads,
        usable_threads=_usable_threads(threads, sys_root, affinity=not recorded),
        sockets=max(1, len({a for a, _ in topo if a is not None})),
        numa_nodes=_numa_nodes(sys_root), flags=flags, isa=normalise_isa(flags),
        cache_bytes=_caches(cpu_dir / "cpu0" / "cache"),
    )


def _online_cpus(cpu_dir: Path) -> list[int]:
    """CPU numbers from sysfs `online` ("0-3,6" style); [] when unreadable."""
    text = read_text(cpu_dir / "online")
    cpus: list[int] = []
    for part in (text or "").split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _numa_nodes(sys_root: Path) -> int:
    nodes = sys_root / "devices" / "system" / "node"
    try:
        return max(1, sum(1 for p in nodes.iterdir() if re.fullmatch(r"node\d+", p.name)))
    except OSError:
        return 1


def _caches(cache_dir: Path) -> dict[str, int]:
    """{"l1d": bytes, "l1i": ..., "l2": ..., "l3": ...} as seen by cpu0."""
    caches: dict[str, int] = {}
    for idx in sorted(cache_dir.glob("index*")):
        level, kind = read_text(idx / "level"), read_text(idx / "type") or ""
        try:  # the kernel writes "%uK" (KiB), parse_size's binary "32K"
            size = parse_size(read_text(idx / "size") or "")
        except UsageError:
            continue
        if level and size:
            suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
            caches[f"l{level}{suffix}"] = size
    return caches


def _usable_threads(threads: int, sys_root: Path, affinity: bool = True) -> int:
    """Threads this process may run: affinity mask, then the cgroup CPU quota."""
    usable = threads
    if affinity and hasattr(os, "sched_getaffinity"):
        usable = min(threads, len(os.sched_getaffinity(0)))
    quota = cpu_quota(sys_root)
    if quota is not None:
        usable = min(usable, max(1, int(quota)))
    return max(1, usable)


def _sysctl(*names: str) -> dict[str, str]:
    out = run_tool(["sysctl", *names], timeout=2.0).stdout or ""
    pairs = (line.partition(":") for line in out.splitlines())
    return {k.strip(): v.strip() for k, _, v in pairs}


def _detect_macos(warns: list[str]) -> CpuInfo:
    keys = ("machdep.cpu.brand_string", "hw.physicalcpu", "hw.logicalcpu",
            "machdep.cpu.features", "machdep.cpu.leaf7_features", "hw.l1dcachesize",
            "hw.l2cachesize", "hw.l3cachesize", "hw.packages")
    info = _sysctl(*keys)
    if not info:
        warns.append("cpu: sysctl gave no answer; CPU features unknown")
        return _fallback_cpu()
    flags = (info.get("machdep.cpu.features", "") + " "
             + info.get("machdep.cpu.leaf7_features", "")).lower().split()
    opt = _sysctl("hw.optional")
    flags += [k.rsplit(".", 1)[-1].lower() for k, v in opt.items() if v == "1"]
    threads = int(info.get("hw.logicalcpu") or os.cpu_count() or 1)
    caches = {name: int(info[key]) for name, key in
              (("l1d", "hw.l1dcachesize"), ("l2", "hw.l2cachesize"), ("l3", "hw.l3cachesize"))
              if info.get(key, "").isdigit() and int(info[key]) > 0}
    flags = sorted(set(flags))
    return CpuInfo(
        model=info.get("machdep.cpu.brand_string") or platform.processor(),
        arch=platform.machine(), cores=int(info.get("hw.physicalcpu") or threads),
        threads=threads, usable_threads=threads, sockets=int(info.get("hw.packages") or 1),
        numa_nodes=1, flags=flags, isa=normalise_isa(flags), cache_bytes=caches,
    )
