"""AMD GPUs through `rocm-smi --json`.

rocm-smi's JSON keys changed case across ROCm releases ("Card series" / "Card Series")
and it may print warning lines before the JSON, so keys are matched case-insensitively
and parsing starts at the first "{". (The newer `amdsmi` Python package is not used
yet; rocm-smi ships with every ROCm install.)
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from inferenceos.hardware.gpus.common import read_tool
from inferenceos.hardware.gpus.pci import PciGpu, normalise_bus_id
from inferenceos.hardware.profile import GpuInfo
from inferenceos.hardware.tools import Runner, run_tool

SMI_QUERY = ["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--showbus",
             "--showdriverversion", "--json"]


def detect_amd(pci: list[PciGpu], warnings: list[str],
               runner: Runner = run_tool) -> list[GpuInfo]:
    """AMD GPUs from rocm-smi; warns when it is missing although the bus shows AMD GPUs,
    or when its output cannot be read."""
    return read_tool(
        "amd", runner, SMI_QUERY, partial(parse_rocm_smi_json, pci=pci), pci, warnings,
        "install ROCm (it ships rocm-smi); sysfs figures are used meanwhile",
        "`rocm-smi --json`") or []


def parse_rocm_smi_json(text: str, pci: list[PciGpu] | None = None) -> list[GpuInfo]:
    """GPUs from rocm-smi JSON; PCIe link figures come from the matching sysfs entry."""
    start = text.find("{")
    try:
        data = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict):
        raise ValueError("no JSON object in the output")
    system = _lower_keys(data.get("system", {}))
    driver = system.get("driver version")
    links = {d.slot: d for d in pci or []}
    cards = sorted((k for k in data if k.lower().startswith("card")), key=_card_number)
    return [_card(i, _lower_keys(data[k]), driver, links) for i, k in enumerate(cards)]


def _card(index: int, c: dict[str, Any], driver: str | None,
          links: dict[str, PciGpu]) -> GpuInfo:
    total = _int(c.get("vram total memory (b)"))
    used = _int(c.get("vram total used memory (b)"))
    bus = normalise_bus_id(c["pci bus"]) if c.get("pci bus") else None
    link = links.get(bus or "")
    return GpuInfo(
        vendor="amd", name=str(c.get("card series") or c.get("card model") or "AMD GPU"),
        index=index, memory_total_bytes=total,
        memory_free_bytes=total - used if total is not None and used is not None else None,
        compute=c.get("gfx version"), driver_version=driver, pci_bus_id=bus,
        pcie_gen=link.pcie_gen if link else None, pcie_width=link.pcie_width if link else None,
        source="rocm-smi",
    )


def _lower_keys(d: Any) -> dict[str, Any]:
    return {str(k).lower(): v for k, v in d.items()} if isinstance(d, dict) else {}


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _card_number(key: str) -> int:
    digits = "".join(ch for ch in key if ch.isdigit())
    return int(digits) if digits else 0
