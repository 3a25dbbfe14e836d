"""Build a HardwareProfile from scratch: probe everything, measure, recommend.

The vendor tools and the llama.cpp probe run in parallel (they mostly wait on child
processes); the bandwidth tests run afterwards, alone, so nothing competes with them.
"""

from __future__ import annotations

import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from inferenceos.hardware.bandwidth import measure_all
from inferenceos.hardware.cpu import detect_cpu
from inferenceos.hardware.fingerprint import current_fingerprint
from inferenceos.hardware.gpus import detect_gpus
from inferenceos.hardware.llama_devices import disagreements, probe_llama
from inferenceos.hardware.memory import detect_memory
from inferenceos.hardware.profile import Bandwidth, HardwareProfile
from inferenceos.hardware.recommend import recommend


def collect_profile(models_dir: Path, measure: bool = True) -> HardwareProfile:
    """Probe this machine; `measure=False` skips the bandwidth tests (they stay None)."""
    start = time.perf_counter()
    fingerprint = current_fingerprint(models_dir)
    warnings: list[str] = []
    gpu_warnings: list[str] = []
    cpu = detect_cpu(warnings=warnings)
    mem = detect_memory(warnings=warnings)
    with ThreadPoolExecutor(2) as pool:
        llama_f = pool.submit(probe_llama)
        gpus_f = pool.submit(detect_gpus, mem.total_bytes, mem.available_bytes, gpu_warnings)
        llama, gpus = llama_f.result(), gpus_f.result()
    warnings += gpu_warnings
    if llama.error:
        warnings.append(llama.error)
    warnings += disagreements(llama, gpus)
    bandwidth = Bandwidth()
    speed = None
    if measure:
        bandwidth = measure_all(cpu.usable_threads, cpu.cache_bytes.get("l3", 0),
                                mem.usable_bytes, models_dir, warnings)
        if llama.loaded:  # a few seconds: what the perf model calibrates on
            from inferenceos.hardware.cpu_load import free_threads, sample_cpu_load
            from inferenceos.hardware.llama_speed import (
                default_model_if_ready,
                measure_llama_speed,
            )
            from inferenceos.paths import cache_dir, data_dir

            # as many threads as are free now, as the planner will pick: a probe whose
            # threads share a core with another program measures the contention
            threads = free_threads(cpu.usable_threads, sample_cpu_load())
            speed = measure_llama_speed(data_dir() / "hardware", threads, warnings,
                                        model_dir=cache_dir() / "probe",
                                        model=default_model_if_ready())
    return HardwareProfile(
        fingerprint=fingerprint, created_at=time.time(), cpu=cpu, memory=mem, gpus=gpus,
        llama=llama, bandwidth=bandwidth, recommendation=recommend(gpus, mem, llama),
        platform={"system": platform.system(), "release": platform.release(),
                  "machine": platform.machine(), "python": sys.version.split()[0]},
        warnings=warnings, collect_seconds=round(time.perf_counter() - start, 3),
        llama_speed=speed,
    )
