"""GPUs as the kernel sees them on the PCI bus (Linux sysfs), whatever tools exist.

This is the ground truth that tells "no GPU" apart from "a GPU whose tool is missing":
every display-class device of a compute vendor (NVIDIA, AMD, Intel) is listed with its
driver, PCIe link and, for amdgpu, its VRAM counters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from inferenceos.hardware.tools import read_int, read_text

VENDORS = {0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel"}


@dataclass(frozen=True)
class PciGpu:
    """One display controller of a compute vendor found in /sys/bus/pci/devices."""

    slot: str  # "0000:01:00.0"
    vendor: str  # nvidia | amd | intel
    device_id: int
    driver: str | None
    pcie_gen: int | None
    pcie_width: int | None
    vram_total_bytes: int | None  # amdgpu only
    vram_used_bytes: int | None


def normalise_bus_id(bus_id: str) -> str:
    """"00000000:17:00.0" (nvidia-smi) or "0000:17:00.0" (sysfs) → "0000:17:00.0"."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return bus_id.strip().lower()
    try:
        return f"{int(parts[0], 16):04x}:{parts[1][-2:]}:{parts[2]}"
    except ValueError:
        return bus_id.strip().lower()


def pcie_gen_from_speed(speed: str | None) -> int | None:
    """sysfs `current_link_speed` ("16.0 GT/s PCIe") → PCIe generation (4)."""
    m = re.match(r"([\d.]+)\s*GT/s", speed or "")
    if not m:
        return None
    gts = float(m.group(1))
    for gen, rate in ((6, 64.0), (5, 32.0), (4, 16.0), (3, 8.0), (2, 5.0), (1, 2.5)):
        if gts >= rate:
            return gen
    return None


def scan_pci(sys_root: Path = Path("/sys")) -> list[PciGpu]:
    """Every NVIDIA / AMD / Intel display controller under `sys_root`/bus/pci/devices."""
    found: list[PciGpu] = []
    base = sys_root / "bus" / "pci" / "devices"
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return found
    for dev in devices:
        cls, vendor = read_int(dev / "class", 16), read_int(dev / "vendor", 16)
        if cls is None or vendor not in VENDORS or (cls >> 16) != 0x03:
            continue
        uevent = read_text(dev / "uevent") or ""
        driver = re.search(r"^DRIVER=(\S+)", uevent, re.MULTILINE)
        found.append(PciGpu(
            slot=normalise_bus_id(dev.name), vendor=VENDORS[vendor],
            device_id=read_int(dev / "device", 16) or 0,
            driver=driver.group(1) if driver else None,
            pcie_gen=pcie_gen_from_speed(read_text(dev / "max_link_speed")),
            pcie_width=read_int(dev / "current_link_width"),
            vram_total_bytes=read_int(dev / "mem_info_vram_total"),
            vram_used_bytes=read_int(dev / "mem_info_vram_used"),
        ))
    return found
