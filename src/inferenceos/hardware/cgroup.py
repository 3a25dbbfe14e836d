"""Container limits from cgroups (v2 unified, or v1), read from a sysfs root.

Each function returns None when there is no limit (or no cgroup filesystem), so the
caller can always write `min(real, limit or real)`.
"""

from __future__ import annotations

from pathlib import Path

from inferenceos.hardware.tools import read_int, read_text

# cgroup v1 writes "no limit" as a page-rounded LONG_MAX; anything above this is "none".
_NO_LIMIT = 1 << 60


def _own_cgroup_dir(root: Path, controller: str) -> list[Path]:
    """Candidate directories for this process's cgroup (own path first, then the root)."""
    base = root / "fs" / "cgroup"
    own = read_text(Path("/proc/self/cgroup")) if root == Path("/sys") else None
    found: list[Path] = []
    for line in (own or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[1] == "" or controller in parts[1].split(",")):
            rel = parts[2].lstrip("/")
            found.append(base / rel if parts[1] == "" else base / controller / rel)
    found += [base, base / controller]
    return found


def memory_limit(root: Path = Path("/sys")) -> tuple[int | None, int | None]:
    """(limit_bytes, usage_bytes) of this process's memory cgroup; (None, None) if none."""
    for d in _own_cgroup_dir(root, "memory"):
        v2 = read_text(d / "memory.max")
        if v2 is not None:
            if v2 == "max":
                return None, None
            return _to_int(v2), read_int(d / "memory.current")
        v1 = read_int(d / "memory.limit_in_bytes")
        if v1 is not None:
            if v1 >= _NO_LIMIT:
                return None, None
            return v1, read_int(d / "memory.usage_in_bytes")
    return None, None


def cpu_quota(root: Path = Path("/sys")) -> float | None:
    """CPUs this cgroup may use (quota / period), or None when unlimited."""
    for d in _own_cgroup_dir(root, "cpu"):
        v2 = read_text(d / "cpu.max")
        if v2 is not None:
            quota, _, period = v2.partition(" ")
            q, p = _to_int(quota), _to_int(period or "100000")
            return q / p if q and p else None
        quota_us = read_int(d / "cpu.cfs_quota_us")
        if quota_us is not None:
            if quota_us <= 0:
                return None
            return quota_us / (read_int(d / "cpu.cfs_period_us") or 100000)
    return None


def _to_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
