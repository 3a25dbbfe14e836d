"""Helpers shared by the per-vendor GPU probes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from inferenceos.hardware.gpus.pci import PciGpu
from inferenceos.hardware.tools import Runner, ToolOutput

T = TypeVar("T")


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


def read_tool(vendor: str, runner: Runner, query: list[str], parse: Callable[[str], T],
              pci: list[PciGpu], warnings: list[str], fix: str, label: str) -> T | None:
    """Run a vendor tool's `query` and `parse` its output.

    None, with a warning where one is due, when the tool gave no output
    (`note_tool_problem`, `fix` its advice) or `parse` raised ValueError (the warning
    names the tool as `label`, e.g. "`rocm-smi --json`"). Never raises ValueError.
    """
    out = runner(query)
    if out.stdout is None:
        note_tool_problem(vendor, out, pci, warnings, fix)
        return None
    try:
        return parse(out.stdout)
    except ValueError as exc:
        warnings.append(f"{vendor}: could not read {label} output: {exc}")
        return None


def json_list(text: str, key: str, missing: str) -> list[Any]:
    """The list under `key` of the JSON object `text`.

    Raises ValueError "not JSON (...)" when `text` is not JSON, and `missing` when it is
    not an object holding a list under `key`.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    items = data.get(key) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError(missing)
    return items
