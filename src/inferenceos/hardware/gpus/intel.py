"""Intel GPUs: `xpu-smi` for data-center GPUs, sysfs for everything else (iGPUs, Arc).

An Intel GPU in PCI slot 00:02.0 is the integrated one: it has no memory of its own and
may use a share of system RAM. We plan with half of RAM (Windows' fixed cap; Linux
drivers allow more through GTT, but the rest of the system needs room too).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from inferenceos.hardware.gpus.common import json_list, read_tool
from inferenceos.hardware.gpus.pci import PciGpu, normalise_bus_id
from inferenceos.hardware.profile import GpuInfo
from inferenceos.hardware.tools import Runner, run_tool

XPU_DISCOVERY = ["xpu-smi", "discovery", "-j"]
IGPU_SLOT = "0000:00:02.0"
IGPU_RAM_FRACTION = 0.5


def detect_intel(pci: list[PciGpu], total_ram: int, available_ram: int,
                 warnings: list[str], runner: Runner = run_tool) -> list[GpuInfo]:
    """Intel GPUs from xpu-smi when present, then every other Intel GPU on the PCI bus."""
    discrete = [d for d in pci if d.vendor == "intel" and d.slot != IGPU_SLOT]
    found = read_tool(
        "intel", runner, XPU_DISCOVERY, partial(parse_xpu_smi_discovery, runner=runner),
        discrete, warnings, "install xpu-smi for memory figures of Intel data-center GPUs",
        "`xpu-smi discovery -j`") or []
    claimed = {g.pci_bus_id for g in found}
    for dev in pci:
        if dev.vendor == "intel" and dev.slot not in claimed:
            found.append(gpu_from_sysfs(dev, len(found), total_ram, available_ram))
    return found


def gpu_from_sysfs(dev: PciGpu, index: int, total_ram: int, available_ram: int) -> GpuInfo:
    """What sysfs alone tells about an Intel GPU; iGPUs get their share of RAM."""
    integrated = dev.slot == IGPU_SLOT
    share = int(total_ram * IGPU_RAM_FRACTION) if integrated else None
    return GpuInfo(
        vendor="intel", index=index,
        name=f"Intel {'integrated ' if integrated else ''}GPU [8086:{dev.device_id:04x}]"
        f" ({f'driver {dev.driver}' if dev.driver else 'no driver bound'})",
        memory_total_bytes=share,
        memory_free_bytes=min(share, available_ram) if share is not None else None,
        pci_bus_id=dev.slot, pcie_gen=dev.pcie_gen,
        pcie_width=dev.pcie_width, integrated=integrated, unified_memory=False,
        shared_memory_fraction=IGPU_RAM_FRACTION if integrated else None, source="sysfs",
    )


def parse_xpu_smi_discovery(text: str, runner: Runner | None = None) -> list[GpuInfo]:
    """GPUs from `xpu-smi discovery -j`; each enriched from `discovery -d ID -j` when a
    `runner` is given. Raises ValueError when the listing is not xpu-smi JSON."""
    devices = json_list(text, "device_list", "no device_list")
    gpus = []
    for i, dev in enumerate(d for d in devices if isinstance(d, dict)):
        detail: dict[str, Any] = {}
        if runner is not None:
            raw = runner(["xpu-smi", "discovery", "-d", str(dev.get("device_id", i)), "-j"])
            detail = _json_object(raw.stdout)
        gpus.append(_xpu_gpu(i, {**dev, **detail}))
    return gpus


def _xpu_gpu(index: int, d: dict[str, Any]) -> GpuInfo:
    bus = d.get("pci_bdf_address")
    return GpuInfo(
        vendor="intel", name=str(d.get("device_name") or "Intel GPU"), index=index,
        memory_total_bytes=_int(d.get("memory_physical_size_byte")),
        memory_free_bytes=_int(d.get("memory_free_size_byte")),
        driver_version=d.get("driver_version"),
        pci_bus_id=normalise_bus_id(bus) if bus else None,
        pcie_gen=_int(d.get("pcie_generation")), pcie_width=_int(d.get("pcie_max_link_width")),
        source="xpu-smi",
    )


def _json_object(text: str | None) -> dict[str, Any]:
    try:
        data = json.loads(text or "")
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None
