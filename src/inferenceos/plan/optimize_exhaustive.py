"""Every placement of the optimizer's space, judged by perf.py itself: the reference the
MILP is tested against (tests/plan/test_plan_optimizer.py) on models small enough to list.

The space (as `optimize_milp` defines it): contiguous blocks of layers in device order,
the CPU's first; each layer on a local accelerator keeps its FFN group and routed
experts there, its experts alone in RAM, or both in RAM (on an RPC device they follow
the layer); the head on the CPU or on the device of
the last layer; the fewest weight bytes on disk that let the CPU's RAM hold the rest
(more only costs time), when disk is allowed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

from inferenceos.plan.devices import Machine
from inferenceos.plan.memory import ContextSettings
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.optimize import Candidate, Objective, evaluate, fits
from inferenceos.plan.perf import Calibration
from inferenceos.plan.placement import LayerParts, Placement, build_placement, layer_parts

MAX_PLACEMENTS = 200_000  # refuse to list more (a test on a model too big to enumerate)


def _blocks(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """Layer counts per device (k devices, in order) summing to n."""
    for cuts in itertools.combinations_with_replacement(range(n + 1), k - 1):
        bounds = (0, *cuts, n)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(k))


def placements(
    facts: ModelFacts, machine: Machine, parts: list[LayerParts]
) -> Iterator[tuple[list[str], list[str], list[str | None], str]]:
    """(dense, ffn, experts, head) for every placement of the space, disk not yet
    decided."""
    devs = list(machine.devices)
    by_name = {d.name: d for d in devs}
    n = len(parts)
    for counts in _blocks(n, len(devs)):
        dense = [d.name for d, c in zip(devs, counts, strict=True) for _ in range(c)]
        free = [i for i in range(n) if dense[i] != "CPU" and not by_name[dense[i]].is_remote
                and (parts[i].ffn_bytes or parts[i].expert_bytes)]
        heads = ["CPU"] + ([dense[-1]] if n and dense[-1] != "CPU" else [])
        for choice in itertools.product(*(_sides(parts[i]) for i in free)):
            ffn = list(dense)
            experts: list[str | None] = [
                None if not p.expert_bytes else dense[i] for i, p in enumerate(parts)]
            for i, (keep_ffn, keep_experts) in zip(free, choice, strict=True):
                ffn[i] = dense[i] if keep_ffn else "CPU"
                if parts[i].expert_bytes:
                    experts[i] = dense[i] if keep_experts else "CPU"
            for head in heads:
                yield dense, ffn, experts, head


def _sides(p: LayerParts) -> list[tuple[bool, bool]]:
    """(FFN group kept, experts kept) with the layer on a local accelerator: experts
    only beside their FFN group; a group of no bytes is not a choice."""
    if not p.ffn_bytes:
        return [(True, True), (True, False)]
    if not p.expert_bytes:
        return [(True, True), (False, False)]
    return [(True, True), (True, False), (False, False)]


def best_exhaustive(
    facts: ModelFacts, machine: Machine, ctx: ContextSettings, cal: Calibration,
    threads: int, obj: Objective, allow_disk: bool = False,
) -> Candidate | None:
    """The lowest-objective placement that fits, by listing them all (None: none fits).
    Raises ValueError past MAX_PLACEMENTS."""
    parts = layer_parts(facts, ctx)
    best: Candidate | None = None
    for count, (dense, ffn, experts, head) in enumerate(placements(facts, machine, parts)):
        if count > MAX_PLACEMENTS:
            raise ValueError(f"more than {MAX_PLACEMENTS} placements: too big to enumerate")
        p = build_placement(facts, parts, dense, experts, head, ffn=ffn)
        c = _with_disk(facts, machine, ctx, p, cal, threads, obj, allow_disk)
        if c is not None and (best is None or c.objective_s < best.objective_s):
            best = c
    return best


def _with_disk(
    facts: ModelFacts, machine: Machine, ctx: ContextSettings, p: Placement,
    cal: Calibration, threads: int, obj: Objective, allow_disk: bool,
) -> Candidate | None:
    c = evaluate(facts, machine, ctx, p, cal, threads, obj)
    over = c.memory.by_device.get("CPU", 0) - machine.cpu.memory_bytes
    if over > 0 and allow_disk:
        c = evaluate(facts, machine, ctx, replace(p, disk_bytes=over), cal, threads, obj)
    return c if fits(c, machine, facts) else None
