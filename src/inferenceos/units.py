"""Human-readable sizes and counts, shared by the CLI and reports, the one parser of
sizes a user writes (`parse_size`), and the one timestamp format of the API
(`iso_time`)."""

from __future__ import annotations

import re
import time

from inferenceos.errors import UsageError

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def iso_time(ts: float | None = None) -> str:
    """RFC 3339 UTC time with microseconds (now when `ts` is None), as Ollama writes it
    and its clients expect."""
    ts = time.time() if ts is None else ts
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e6):06d}Z"


def format_bytes(n: float) -> str:
    """1536 → '1.5 KiB'; binary units, at most one decimal place."""
    value = float(n)
    for unit in _BYTE_UNITS:
        if abs(value) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_count(n: float) -> str:
    """268098176 → '268.1M'."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.1f}{suffix}"
    return str(int(n))


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)B?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'4GiB' → 4294967296, '32GB' → 32e9, '512M' → 512 MiB (no 'B': binary), '1000'
    → 1000 bytes. Raises UsageError on anything else. (The one size parser: `--ram`,
    `--mem`, `host:port=SIZE`, budgets.)"""
    m = _SIZE.match(text)
    if not m:
        raise UsageError(f"not a size: {text!r} (try 4GiB, 512MiB, 32GB)")
    value, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    power = "KMGT".find(unit) + 1 if unit else 0
    decimal = not binary and text.strip().upper().endswith("B") and unit
    return int(value * (1000 if decimal else 1024) ** power)
