"""Tiers and eviction by memory: which loaded model gives way next, and how far.

Pure functions over loaded models' charges (bytes per device, the planner's figures),
the budget per device and what a load needs; the manager applies their answers.

Order (the contract): only idle (unleased), unpinned models give way, least recently
used first; every hot model that could help is demoted to warm (context freed, weights
kept) before any warm model goes cold (unloaded). A demotion only counts as help when
it frees bytes on a device that is short. Never by count alone: `max_models` is an
optional extra cap, applied the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from inferenceos.registry.leases import COLD, HOT, WARM, ResidentModel
from inferenceos.units import format_bytes as fb

TOTAL = "total"  # the key of the --memory-budget cap over all devices


@dataclass(frozen=True)
class Shortfall:
    """Bytes missing per device (and under TOTAL for the overall cap); empty: fits."""

    bytes_by_device: dict[str, int]
    over_count: bool = False

    def __bool__(self) -> bool:
        return bool(self.bytes_by_device) or self.over_count

    def describe(self) -> str:
        parts = [f"{d} short by {fb(b)}" for d, b in self.bytes_by_device.items()]
        if self.over_count:
            parts.append("the --max-models cap is reached")
        return "; ".join(parts)


def is_remote(device: str) -> bool:
    """An RPC worker's device (`RPC[host:port]`): its memory is the worker's own, offered
    to one client at a time and checked by the planner against the worker's `--mem`;
    this machine's budget does not count it."""
    return device.startswith("RPC[")


def used_by(models: Iterable[ResidentModel]) -> dict[str, int]:
    """Bytes charged per device by `models` in their current tiers."""
    used: dict[str, int] = {}
    for m in models:
        for dev, b in m.charge.items():
            used[dev] = used.get(dev, 0) + b
    return used


def shortfall(
    used: Mapping[str, int],
    need: Mapping[str, int],
    capacity: Mapping[str, int],
    total_cap: int | None = None,
    n_models: int = 0,
    max_models: int | None = None,
) -> Shortfall:
    """What is missing for `need` on top of `used`, against `capacity` per device (a
    local device absent from `capacity` has no room; an RPC worker's device absent from
    it is not ours to budget: the planner sized the plan to what the worker offers)
    and the optional overall cap."""
    short = {}
    for dev, b in need.items():
        if b <= 0 or is_remote(dev):
            continue
        missing = used.get(dev, 0) + b - capacity.get(dev, 0)
        if missing > 0:
            short[dev] = missing
    if total_cap is not None:  # the cap is on this machine's memory
        local_used = sum(b for d, b in used.items() if not is_remote(d))
        missing = local_used + sum(b for d, b in need.items() if not is_remote(d)) - total_cap
        if missing > 0:
            short[TOTAL] = missing
    over = max_models is not None and n_models >= max_models
    return Shortfall(short, over)


def _frees(m: ResidentModel, to_tier: str) -> dict[str, int]:
    """Bytes per device `m` gives back by moving to `to_tier`."""
    now = m.charge
    after = m.plan.charge(warm=True) if to_tier == WARM else {}
    return {d: b - after.get(d, 0) for d, b in now.items() if b - after.get(d, 0) > 0}


def _helps(freed: Mapping[str, int], short: Shortfall) -> bool:
    if short.over_count:
        return True
    return any(
        (dev == TOTAL and sum(freed.values()) > 0) or freed.get(dev, 0) > 0
        for dev in short.bytes_by_device
    )


def next_demotion(
    models: Iterable[ResidentModel], short: Shortfall, exclude: str = ""
) -> tuple[ResidentModel, str] | None:
    """(model, new tier) of the next step, or None when nothing idle can help.

    Over the count cap only unloading helps (a warm model still counts)."""
    idle = sorted(
        (m for m in models if m.refs == 0 and not m.pinned and m.model.name != exclude),
        key=lambda m: m.last_used,
    )
    if not short.over_count:
        for m in idle:
            if m.tier == HOT and _helps(_frees(m, WARM), short):
                return m, WARM
    for m in idle:
        if _helps(_frees(m, COLD), short):
            return m, COLD
    return None


def blockers(models: Iterable[ResidentModel], exclude: str = "") -> str:
    """Why the rest cannot give way: pinned and busy models, with their charges."""
    out = []
    for m in models:
        if m.model.name == exclude:
            continue
        why = "pinned" if m.pinned else "in use" if m.refs else ""
        if why:
            out.append(f"{m.model.name} ({why}, {m.tier}, {fb(m.memory_bytes)})")
    return ", ".join(out)
