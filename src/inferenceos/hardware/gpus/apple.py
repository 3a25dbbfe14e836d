"""Apple GPUs through `system_profiler SPDisplaysDataType -json`.

Apple silicon GPUs share the machine's unified memory. Metal lets one process keep about
2/3 of RAM resident on machines up to 36 GiB and about 3/4 above
(`recommendedMaxWorkingSetSize`, which llama.cpp's Metal backend reports as the device's
memory); that share is what `memory_total_bytes` holds here.
"""

from __future__ import annotations

from typing import Any

from inferenceos.hardware.gpus.common import json_list
from inferenceos.hardware.profile import GpuInfo
from inferenceos.hardware.tools import Runner, run_tool

SP_QUERY = ["system_profiler", "SPDisplaysDataType", "-json"]
_GIB = 1 << 30


def metal_working_set_fraction(total_ram: int) -> float:
    """Share of RAM Metal lets the GPU keep resident (2/3 up to 36 GiB, else 3/4)."""
    return 2 / 3 if total_ram <= 36 * _GIB else 3 / 4


def detect_apple(total_ram: int, available_ram: int, warnings: list[str],
                 runner: Runner = run_tool) -> list[GpuInfo]:
    """GPUs from system_profiler (only meaningful on macOS); warns on any failure."""
    out = runner(SP_QUERY)
    if out.stdout is None:
        warnings.append(f"apple: {out.problem}; GPU unknown")
        return []
    try:
        return parse_system_profiler_json(out.stdout, total_ram, available_ram)
    except ValueError as exc:
        warnings.append(f"apple: could not read system_profiler output: {exc}")
        return []


def parse_system_profiler_json(text: str, total_ram: int, available_ram: int) -> list[GpuInfo]:
    """GPUs from SPDisplaysDataType JSON; raises ValueError when it is not that JSON."""
    items = json_list(text, "SPDisplaysDataType", "no SPDisplaysDataType list")
    return [_gpu(i, item, total_ram, available_ram) for i, item in enumerate(items)
            if isinstance(item, dict)]


def _gpu(index: int, item: dict[str, Any], total_ram: int, available_ram: int) -> GpuInfo:
    vendor_raw = str(item.get("spdisplays_vendor", "")).lower()
    name = str(item.get("sppci_model") or item.get("_name") or "GPU")
    apple = "apple" in vendor_raw or name.startswith("Apple")
    if apple:
        frac = metal_working_set_fraction(total_ram)
        cores = item.get("sppci_cores")
        return GpuInfo(
            vendor="apple", name=f"{name} ({cores}-core GPU)" if cores else name, index=index,
            memory_total_bytes=int(total_ram * frac),
            memory_free_bytes=min(int(total_ram * frac), available_ram),
            compute=_metal_family(item), integrated=True, unified_memory=True,
            shared_memory_fraction=round(frac, 3), source="system_profiler",
        )
    vendor = "amd" if "amd" in vendor_raw or "ati" in vendor_raw else (
        "intel" if "intel" in vendor_raw else "other")
    return GpuInfo(vendor=vendor, name=name, index=index,
                   memory_total_bytes=_vram(item.get("spdisplays_vram") or
                                            item.get("_spdisplays_vram")),
                   compute=_metal_family(item), integrated=vendor == "intel",
                   source="system_profiler")


def _metal_family(item: dict[str, Any]) -> str | None:
    raw = item.get("spdisplays_mtlgpufamilysupport") or item.get("spdisplays_metal")
    return str(raw).replace("spdisplays_", "") if raw else None


def _vram(text: Any) -> int | None:
    parts = str(text or "").split()
    if len(parts) == 2 and parts[0].isdigit():
        return int(parts[0]) * {"MB": 1 << 20, "GB": _GIB}.get(parts[1], 0) or None
    return None
