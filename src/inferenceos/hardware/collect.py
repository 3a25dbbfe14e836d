"""Build a HardwareProfile from scratch: probe everything, measure, recommend.

The vendor tools and the llama.cpp probe run in parallel (they mostly wait on child
processes), while the speed probe's child loads its model; the bandwidth tests run
afterwards, alone (the loaded child waits idle), so nothing competes with them; then
the speed probe times llama.cpp, alone too. Loading the probe model ahead took about
1.2 s off a refresh on a 2-core VM, where it had grown past its 5 s.
"""

from __future__ import annotations

import dataclasses
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from inferenceos.hardware.bandwidth import measure_all
from inferenceos.hardware.cpu import detect_cpu
from inferenceos.hardware.fingerprint import current_fingerprint
from inferenceos.hardware.gpus import detect_gpus
from inferenceos.hardware.llama_devices import disagreements, probe_llama
from inferenceos.hardware.memory import detect_memory
from inferenceos.hardware.profile import Bandwidth, HardwareProfile, LlamaInfo
from inferenceos.hardware.recommend import recommend
from inferenceos.paths import cache_dir, data_dir

if TYPE_CHECKING:
    from inferenceos.hardware.llama_speed import SpeedProbe


def collect_profile(models_dir: Path, measure: bool = True) -> HardwareProfile:
    """Probe this machine; `measure=False` skips the bandwidth tests (they stay None)."""
    start = time.perf_counter()
    fingerprint = current_fingerprint(models_dir)
    warnings: list[str] = []
    gpu_warnings: list[str] = []
    cpu = detect_cpu(warnings=warnings)
    mem = detect_memory(warnings=warnings)
    probe = _start_speed_probe(warnings) if measure else None
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
    if probe is not None and not llama.loaded:  # no llama.cpp here: nothing to time
        probe.cancel()
        probe = None
    try:
        if measure:
            if probe is not None:
                probe.wait_ready()  # its model loaded: from here it waits idle
            bandwidth = measure_all(cpu.usable_threads, cpu.cache_bytes.get("l3", 0),
                                    mem.usable_bytes, models_dir, warnings)
            if probe is not None:  # a few seconds: what the perf model calibrates on
                from inferenceos.hardware.cpu_load import free_threads, sample_cpu_load

                # as many threads as are free now, as the planner will pick: a probe
                # whose threads share a core with another program measures the contention
                load = sample_cpu_load()
                threads = free_threads(cpu.usable_threads, load)
                model = probe.model
                speed, probe = probe.finish(threads), None
                if speed is not None:
                    speed = dataclasses.replace(speed, busy_others=round(load.busy_others, 2))
                    llama = _measure_gpu(llama, model, warnings)
    finally:
        if probe is not None:  # something failed before it was timed: no orphan child
            probe.cancel()
    return HardwareProfile(
        fingerprint=fingerprint, created_at=time.time(), cpu=cpu, memory=mem, gpus=gpus,
        llama=llama, bandwidth=bandwidth, recommendation=recommend(gpus, mem, llama),
        platform={"system": platform.system(), "release": platform.release(),
                  "machine": platform.machine(), "python": sys.version.split()[0]},
        warnings=warnings, collect_seconds=round(time.perf_counter() - start, 3),
        llama_speed=speed,
    )


def _start_speed_probe(warnings: list[str]) -> SpeedProbe | None:
    """The llama.cpp speed probe's child, loading the built-in model when it is ready
    (else the stand-in) while the other probes run (llama_speed.SpeedProbe)."""
    from inferenceos.hardware.llama_speed import default_model_if_ready, start_llama_speed

    return start_llama_speed(data_dir() / "hardware", warnings, model_dir=cache_dir() / "probe",
                             model=default_model_if_ready())


def _measure_gpu(llama: LlamaInfo, model: Path, warnings: list[str]) -> LlamaInfo:
    """`llama` with its one GPU's read and host-copy rates measured on the probe's
    model (device_speed.py); unchanged where there is no GPU, or several."""
    gpus = [d for d in llama.devices if d.type in ("gpu", "igpu")]
    if len(gpus) != 1:
        return llama
    from inferenceos.hardware.device_speed import measure_device_speed

    got = measure_device_speed(model, gpus[0].name, warnings, gpus[0].max_tensor_bytes)
    if got is None:
        return llama
    measured = dataclasses.replace(gpus[0], read_gbps=got["read_gbps"],
                                   host_copy_gbps=got["host_copy_gbps"])
    return dataclasses.replace(llama, devices=[measured if d is gpus[0] else d
                                               for d in llama.devices])
