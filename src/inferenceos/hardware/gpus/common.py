"""Helpers shared by the per-vendor GPU probes."""

from __future__ import annotations

from inferenceos.hardware.gpus.pci import PciGpu
from inferenceos.hardware.tools import ToolOutput


def note_tool_problem(vendor: str, out: ToolOutput, pci: list[PciGpu],
                      warnings: list[str], fix: str) -> None:
    """Add a warning for a vendor tool that gave no output.

    A tool that is simply not installed is only worth a warning when the PCI bus shows
    that vendor's GPU (otherwise every CPU-only machine would warn about four tools);
    a tool that is installed but fails always warns.
    """
    on_bus = [d.slot for d in pci if d.vendor == vendor]
    if out.missing and not on_bus:
        return
    where = f" although the PCI bus shows {vendor} GPU(s) at {', '.join(on_bus)}" if on_bus else ""
    warnings.append(f"{vendor}: {out.problem}{where}; {fix}")
