"""Every GPU of the machine, from each vendor's own tool, checked against the PCI bus.

`detect_gpus()` asks NVIDIA, AMD and Intel tools (and `system_profiler` on macOS), then
adds any NVIDIA / AMD GPU the kernel shows on the PCI bus that no tool described, with
what sysfs tells (amdgpu exposes VRAM counters there). Tools that are missing or broken
add warnings; nothing here raises.
"""

from __future__ import annotations

import sys
from pathlib import Path

from inferenceos.hardware.gpus.pci import PciGpu, scan_pci
from inferenceos.hardware.profile import GpuInfo
from inferenceos.hardware.tools import Runner, run_tool

__all__ = ["detect_gpus", "gpu_from_pci"]


def detect_gpus(total_ram: int, available_ram: int, warnings: list[str],
                sys_root: Path = Path("/sys"), runner: Runner = run_tool,
                platform: str = sys.platform, use_nvml: bool = True) -> list[GpuInfo]:
    """All GPUs, vendor by vendor; `runner` runs the vendor tools (tests replay them)."""
    # imported here so that `gpus.pci` (used by the cheap fingerprint) stays light
    from inferenceos.hardware.gpus.amd import detect_amd
    from inferenceos.hardware.gpus.apple import detect_apple
    from inferenceos.hardware.gpus.intel import detect_intel
    from inferenceos.hardware.gpus.nvidia import detect_nvidia

    pci = scan_pci(sys_root) if platform.startswith("linux") else []
    gpus = detect_nvidia(pci, warnings, runner, use_nvml=use_nvml)
    gpus += detect_amd(pci, warnings, runner)
    if platform == "darwin":
        gpus += detect_apple(total_ram, available_ram, warnings, runner)
    else:
        gpus += detect_intel(pci, total_ram, available_ram, warnings, runner)
    claimed = {g.pci_bus_id for g in gpus if g.pci_bus_id}
    for dev in pci:
        if dev.vendor in ("nvidia", "amd") and dev.slot not in claimed:
            gpus.append(gpu_from_pci(dev, sum(g.vendor == dev.vendor for g in gpus)))
    return gpus


def gpu_from_pci(dev: PciGpu, index: int) -> GpuInfo:
    """A GPU known only from sysfs: vendor, device id, driver, link, amdgpu VRAM."""
    free = None
    if dev.vram_total_bytes is not None and dev.vram_used_bytes is not None:
        free = dev.vram_total_bytes - dev.vram_used_bytes
    return GpuInfo(
        vendor=dev.vendor, index=index,
        name=f"{dev.vendor.upper()} GPU [{_VENDOR_IDS[dev.vendor]}:{dev.device_id:04x}]"
        f" ({f'driver {dev.driver}' if dev.driver else 'no driver bound'})",
        memory_total_bytes=dev.vram_total_bytes, memory_free_bytes=free,
        pci_bus_id=dev.slot, pcie_gen=dev.pcie_gen,
        pcie_width=dev.pcie_width, source="sysfs",
    )


_VENDOR_IDS = {"nvidia": "10de", "amd": "1002", "intel": "8086"}
