"""CPU and memory probes: on this machine against the kernel's own files, and on
recorded /proc + /sys trees of other machines (an Intel laptop, an ARM server, a
cgroup-v2 container)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from inferenceos.hardware.cgroup import cpu_quota, memory_limit
from inferenceos.hardware.cpu import detect_cpu, normalise_isa, parse_cpuinfo
from inferenceos.hardware.memory import DECODE_CODE_PAGES, detect_memory, parse_meminfo

FIX = Path(__file__).parents[1] / "fixtures" / "hardware"
linux_only = pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux /proc")


def _lscpu() -> dict[str, str]:
    if not shutil.which("lscpu"):
        pytest.skip("lscpu not installed")
    text = subprocess.run(["lscpu"], capture_output=True, text=True, env={"LC_ALL": "C",
                          "PATH": os.environ["PATH"]}).stdout
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


@linux_only
def test_cpu_threads_and_cores_match_nproc_and_lscpu() -> None:
    cpu = detect_cpu()
    info = _lscpu()
    assert cpu.threads == os.cpu_count() == int(info["CPU(s)"])
    sockets = int(info.get("Socket(s)", "1"))
    assert cpu.cores == int(info["Core(s) per socket"]) * sockets
    assert cpu.usable_threads == len(os.sched_getaffinity(0))


@linux_only
def test_cpu_flags_include_everything_proc_cpuinfo_shows() -> None:
    cpu = detect_cpu()
    line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines()
                if x.startswith(("flags", "Features")))
    assert set(line.split(":", 1)[1].split()) <= set(cpu.flags)
    for flag in ("avx2", "fma", "f16c", "avx512f"):
        if flag in line.split():
            assert flag in cpu.isa


@linux_only
def test_ram_total_within_one_percent_of_proc_meminfo() -> None:
    mem = detect_memory()
    kb = int(next(x for x in Path("/proc/meminfo").read_text().splitlines()
                  if x.startswith("MemTotal:")).split()[1])
    assert abs(mem.total_bytes - kb * 1024) <= 0.01 * kb * 1024
    assert 0 < mem.available_bytes <= mem.total_bytes
    assert 0 < mem.usable_bytes <= mem.available_bytes


def test_intel_laptop_recording_hybrid_cores_no_avx512() -> None:
    root = FIX / "intel_igpu_laptop"
    cpu = detect_cpu(root / "proc", root / "sys")
    assert cpu.model == "12th Gen Intel(R) Core(TM) i7-1260P"
    assert (cpu.cores, cpu.threads, cpu.usable_threads) == (12, 16, 16)
    assert {"avx2", "avx_vnni", "fma", "f16c"} <= set(cpu.isa)
    assert not any(f.startswith("avx512") for f in cpu.isa)
    assert cpu.cache_bytes == {"l1d": 48 << 10, "l1i": 32 << 10, "l2": 1280 << 10,
                               "l3": 18 << 20}
    mem = detect_memory(root / "proc", root / "sys")
    assert mem.total_bytes == 16010856 * 1024
    assert mem.swap_total_bytes == 2097148 * 1024
    assert mem.cgroup_limit_bytes is None


def test_arm_graviton_recording_maps_features_to_llama_names() -> None:
    root = FIX / "arm_graviton3"
    cpu = detect_cpu(root / "proc", root / "nonexistent-sys")
    assert cpu.model == "ARM Neoverse-V1"
    assert cpu.arch == "aarch64"
    assert cpu.threads == 4 and cpu.cores == 4
    assert {"neon", "dotprod", "i8mm", "sve", "bf16", "fp16"} <= set(cpu.isa)
    assert "avx2" not in cpu.isa


def test_cgroup_v2_container_recording_limits_usable_memory_and_threads() -> None:
    root = FIX / "cgroup_v2_container" / "sys"
    assert memory_limit(root) == (8 << 30, 1 << 30)
    assert cpu_quota(root) == 4.0
    mem = detect_memory(FIX / "intel_igpu_laptop" / "proc", root)
    assert mem.cgroup_limit_bytes == 8 << 30
    # what is left under the limit, less the decode's own code pages and heap
    assert mem.usable_bytes == min(mem.available_bytes,
                                   (8 << 30) - (1 << 30) - DECODE_CODE_PAGES)
    cpu = detect_cpu(FIX / "intel_igpu_laptop" / "proc", root)
    assert cpu.usable_threads == 4


def test_unreadable_proc_gives_warnings_not_a_crash(tmp_path: Path) -> None:
    warnings: list[str] = []
    cpu = detect_cpu(tmp_path / "proc", tmp_path / "sys", warnings=warnings)
    mem = detect_memory(tmp_path / "proc", tmp_path / "sys", warnings=warnings)
    assert cpu.threads >= 1 and mem.total_bytes == 0
    assert any("cpuinfo" in w for w in warnings) and any("meminfo" in w for w in warnings)


def test_parsers_tolerate_garbage() -> None:
    assert parse_cpuinfo("\x00garbage\nno colon here\n: :\n") == ("", [], 0, 0)
    assert parse_meminfo("MemTotal: lots\nfoo\n") == {}
    assert normalise_isa(["AVX2", "pni", "asimd", "bogus"]) == ["sse3", "avx2", "neon"]
