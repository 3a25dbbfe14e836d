"""A cheap identity of the machine's hardware and llama.cpp build.

The cached profile is reused while `current_fingerprint()` matches the one stored in it.
Everything read here is fast (a few small procfs / sysfs files, `stat` of the llama.cpp
libraries, PATH look-ups; no vendor tool runs), so the check costs a few milliseconds.
It changes when the CPU, RAM size, GPUs on the PCI bus, GPU driver version, vendor tools,
llama.cpp libraries, kernel or the measured models directory change.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from inferenceos.hardware.gpus.pci import scan_pci
from inferenceos.hardware.llama_devices import lib_signature, llama_lib_dir
from inferenceos.hardware.profile import SCHEMA_VERSION
from inferenceos.hardware.tools import read_text

_TOOLS = ("nvidia-smi", "rocm-smi", "xpu-smi", "system_profiler")


def identity(models_dir: Path) -> dict[str, Any]:
    """The facts the fingerprint hashes (shown by `hardware --json` for debugging)."""
    cpuinfo = read_text(Path("/proc/cpuinfo")) or ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.startswith(("model name", "Hardware"))), platform.processor())
    meminfo = read_text(Path("/proc/meminfo")) or ""
    mem_total = next((line.split()[1] for line in meminfo.splitlines()
                      if line.startswith("MemTotal:")), "")
    return {
        "schema": SCHEMA_VERSION, "platform": sys.platform, "machine": platform.machine(),
        "kernel": platform.release(), "cpu_model": model, "cpu_count": os.cpu_count(),
        "mem_total_kb": mem_total, "node": platform.node(),
        "pci_gpus": [[d.slot, d.vendor, d.device_id, d.driver] for d in scan_pci()],
        "nvidia_driver": read_text(Path("/proc/driver/nvidia/version")),
        "tools": {t: shutil.which(t) for t in _TOOLS},
        "nvml": importlib.util.find_spec("pynvml") is not None,
        "llama_libs": lib_signature(llama_lib_dir()),
        "models_dir": str(models_dir),
    }


def fingerprint_of(ident: dict[str, Any]) -> str:
    """The short hash of facts from `identity()` (for callers that keep the facts too)."""
    blob = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def current_fingerprint(models_dir: Path) -> str:
    """A short hash of `identity(models_dir)`."""
    return fingerprint_of(identity(models_dir))
