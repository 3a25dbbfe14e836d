"""NVIDIA GPUs: NVML (the `nvidia-ml-py` package) first, `nvidia-smi -q -x` as fallback.

NVML is optional: without the package, or when the library cannot initialise, we ask
`nvidia-smi`. NVML runs in a helper thread that is abandoned after a few seconds, so a
wedged driver cannot hang the profiler.
"""

from __future__ import annotations

import re
import threading
import xml.etree.ElementTree as ET
from dataclasses import replace
from typing import Any

from inferenceos.hardware.gpus.common import read_tool
from inferenceos.hardware.gpus.pci import PciGpu, normalise_bus_id
from inferenceos.hardware.profile import GpuInfo
from inferenceos.hardware.tools import Runner, run_tool

SMI_QUERY = ["nvidia-smi", "-q", "-x"]
SMI_COMPUTE_CAP = ["nvidia-smi", "--query-gpu=pci.bus_id,compute_cap", "--format=csv,noheader"]
NVML_TIMEOUT_S = 3.0

_MIB = 1 << 20


def detect_nvidia(pci: list[PciGpu], warnings: list[str], runner: Runner = run_tool,
                  use_nvml: bool = True) -> list[GpuInfo]:
    """NVIDIA GPUs from NVML or nvidia-smi; a warning when the kernel sees NVIDIA GPUs on
    the PCI bus but neither tool can describe them, or when a tool's output is broken."""
    if use_nvml:
        gpus = _nvml_with_timeout()
        if gpus:
            return gpus
    smi = read_tool("nvidia", runner, SMI_QUERY, parse_nvidia_smi_xml, pci, warnings,
                    "install the NVIDIA driver (it ships nvidia-smi)", "`nvidia-smi -q -x`")
    if smi is None:
        return []
    caps = parse_compute_caps(runner(SMI_COMPUTE_CAP).stdout or "")
    return [_with_compute(g, caps) for g in smi]


def _with_compute(gpu: GpuInfo, caps: dict[str, str]) -> GpuInfo:
    cap = caps.get(gpu.pci_bus_id or "")
    return replace(gpu, compute=cap) if cap else gpu


def parse_compute_caps(csv: str) -> dict[str, str]:
    """`nvidia-smi --query-gpu=pci.bus_id,compute_cap` CSV → {bus id: "8.9"}."""
    caps: dict[str, str] = {}
    for line in csv.splitlines():
        bus, _, cap = (p.strip() for p in line.partition(","))
        if re.fullmatch(r"\d+\.\d+", cap):
            caps[normalise_bus_id(bus)] = cap
    return caps


def parse_nvidia_smi_xml(text: str) -> list[GpuInfo]:
    """GPUs from `nvidia-smi -q -x` output; raises ValueError when it is not that XML."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise ValueError(f"not XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"root element is <{root.tag}>, expected <nvidia_smi_log>")
    driver = _text(root, "driver_version")
    return [_gpu_from_xml(i, el, driver) for i, el in enumerate(root.findall("gpu"))]


def _gpu_from_xml(index: int, el: ET.Element, driver: str | None) -> GpuInfo:
    link = "pci/pci_gpu_link_info/"
    bus = _text(el, "pci/pci_bus_id") or el.get("id")
    return GpuInfo(
        vendor="nvidia", name=_text(el, "product_name") or "NVIDIA GPU", index=index,
        memory_total_bytes=_mib(_text(el, "fb_memory_usage/total")),
        memory_free_bytes=_mib(_text(el, "fb_memory_usage/free")),
        driver_version=driver, pci_bus_id=normalise_bus_id(bus) if bus else None,
        pcie_gen=_leading_int(_text(el, link + "pcie_gen/max_link_gen")),
        pcie_width=_leading_int(_text(el, link + "link_widths/current_link_width")),
        source="nvidia-smi",
    )


def _text(el: ET.Element, path: str) -> str | None:
    found = el.find(path)
    value = (found.text or "").strip() if found is not None else ""
    return value if value and value != "N/A" else None


def _mib(value: str | None) -> int | None:
    n = _leading_int(value)
    return n * _MIB if n is not None else None


def _leading_int(value: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", value or "")
    return int(m.group(1)) if m else None


def _nvml_with_timeout() -> list[GpuInfo]:
    """NVML's view, or [] when NVML is absent, fails or takes longer than NVML_TIMEOUT_S."""
    result: list[list[GpuInfo]] = []
    thread = threading.Thread(target=lambda: result.append(_nvml_query()), daemon=True)
    thread.start()
    thread.join(NVML_TIMEOUT_S)
    return result[0] if result else []


def _nvml_query() -> list[GpuInfo]:
    try:
        import pynvml  # from the optional nvidia-ml-py package
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return []
    try:
        driver = _str(pynvml.nvmlSystemGetDriverVersion())
        return [_nvml_gpu(pynvml, i, driver) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:
        return []
    finally:
        pynvml.nvmlShutdown()


def _nvml_gpu(nv: Any, i: int, driver: str) -> GpuInfo:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
    return GpuInfo(
        vendor="nvidia", name=_str(nv.nvmlDeviceGetName(h)), index=i,
        memory_total_bytes=int(mem.total), memory_free_bytes=int(mem.free),
        compute=f"{major}.{minor}", driver_version=driver,
        pci_bus_id=normalise_bus_id(_str(nv.nvmlDeviceGetPciInfo(h).busId)),
        pcie_gen=int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        pcie_width=int(nv.nvmlDeviceGetCurrPcieLinkWidth(h)), source="nvml",
    )


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
