"""The planner as an optimizer: placement, context, KV type and ubatch chosen together.

Quality is a constraint, not a rung. The settings that change what the model can do —
the context (never below what the request needs) and the KV cache's precision (never
below `kv_floor`) — form levels in a fixed order of preference:

    asked context, f16 → halved contexts down to the floor, f16 → q8_0 → q4_0 (≥ floor)

For each level, from the best, every ubatch (the asked one halved down to 32, or 8 with
accelerators: it only changes speed) gets its best placement over every device from
`optimize_counts` (a MILP over counts of alike layers per device — their attention, FFN
groups, experts — and the output head, with a branch and bound over block boundaries
where layers differ; `optimize_milp`'s per-layer program when that runs long; exact for
perf.py's cost), and the first level
with any placement that fits without leaving weights on disk wins; among its ubatches
the lowest predicted workload time. Only when no level fits does the floor level leave
weights on disk. So a level is given up only when no device or link could hold more,
and every level given up is a `Change` with the numbers, including what keeping the
asked quality would cost (its best plan with weights on disk, when one exists).

The objective is the predicted time of the workload (prefill of the prompt plus decode
of the output), as perf.py computes it; perf.py stays the single judge: every candidate
the MILP returns is re-evaluated with `perf.decode_cost` / `prefill_cost` and re-checked
against each device's budget with `footprint.estimate`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from inferenceos.plan.devices import Machine
from inferenceos.plan.footprint import estimate, stream_room
from inferenceos.plan.memory import ContextSettings, MemoryEstimate
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.optimize_counts import SearchTooLong, best_placement_counts
from inferenceos.plan.optimize_milp import best_placement
from inferenceos.plan.optimize_rows import BYTES_MARGIN, Problem, device_budgets
from inferenceos.plan.optimize_terms import Terms, phases
from inferenceos.plan.perf import Calibration, decode_cost, prefill_cost
from inferenceos.plan.placement import Placement, build_placement, layer_parts
from inferenceos.plan.plan import Change
from inferenceos.units import format_bytes as fb

KV_ORDER = ("f16", "q8_0", "q4_0")  # best first
# The smallest ubatch tried: 32 on the CPU alone; 8 where there are accelerators. The
# compute buffer of the device holding the output head grows with n_vocab x n_ubatch
# logits (Gemma 3 270M: 32 MiB at 32): at 8, two 200 MiB workers hold Gemma's 170 MiB
# head beside a layer, where at 32 the plan was refused. On the CPU alone the smaller
# ubatches only led the search to plans with a thinner margin: under a real cgroup
# limit (tests/engine/test_cgroup_limits.py, 1.2x the file) it then kept every weight
# in RAM instead of streaming, and was OOM-killed (the memory model is not checked
# that close to a limit).
MIN_UBATCH = 32
MIN_UBATCH_ACCELERATED = 8


@dataclass(frozen=True)
class Objective:
    """The workload the plan is judged on (prompt and output tokens of one request)."""

    prompt_tokens: int = 512
    output_tokens: int = 128

    def seconds(self, prefill_s: float, decode_s: float) -> float:
        """The request's time: its prompt once, then a token per decode step after the
        first (which the prompt's evaluation gives)."""
        return prefill_s + max(self.output_tokens - 1, 1) * decode_s

    def costs(self, facts: ModelFacts, machine: Machine, ctx: ContextSettings,
              placement: Placement, cal: Calibration, threads: int) -> tuple[float, float]:
        """(prefill, decode) seconds by perf.py for this workload: the prompt in
        `ctx`'s ubatches, a decode step at the output's middle."""
        pre = prefill_cost(facts, placement, machine, ctx, self.prompt_tokens, ctx.n_ubatch,
                           cal, threads)
        mid = self.prompt_tokens + self.output_tokens // 2
        return pre.seconds, decode_cost(facts, placement, machine, ctx, mid, cal,
                                        threads).seconds


@dataclass(frozen=True)
class Candidate:
    """One evaluated plan: settings, placement, its memory and predicted speed."""

    ctx: ContextSettings
    placement: Placement
    memory: MemoryEstimate
    decode_s: float
    prefill_s: float
    objective_s: float
    prompt_tokens: int

    @property
    def decode_tps(self) -> float:
        return 1.0 / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    def label(self) -> str:
        """One phrase: context, KV, ubatch, where the layers are, disk."""
        c, p = self.ctx, self.placement
        where: dict[str, int] = {}
        for d in p.dense:
            where[d] = where.get(d, 0) + 1
        layers = " + ".join(f"{n} on {d}" for d, n in where.items())
        disk = f", {fb(p.disk_bytes)} on disk" if p.disk_bytes else ""
        return (f"ctx {c.n_ctx}, KV {c.type_k}/{c.type_v}, ubatch {c.n_ubatch}: "
                f"layers {layers}{p.ffn_in_ram}, head on {p.output_device}{disk}")

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label(),
            "n_ctx": self.ctx.n_ctx,
            "type_k": self.ctx.type_k,
            "type_v": self.ctx.type_v,
            "n_ubatch": self.ctx.n_ubatch,
            "decode_tps": round(self.decode_tps, 2),
            "prefill_tps": round(self.prefill_tps, 2),
            "objective_s": round(self.objective_s, 4),
            "disk_bytes": self.placement.disk_bytes,
            "memory_by_device": dict(self.memory.by_device),
            "layers": list(self.placement.dense),
            "ffn_in_ram": list(self.placement.cpu_ffn_layers),
            "output_device": self.placement.output_device,
        }


@dataclass(frozen=True)
class Optimized:
    """The optimizer's answer: the chosen candidate, the changes from what was asked
    (with figures), and the best rejected alternatives (only when asked to explain)."""

    best: Candidate
    changes: tuple[Change, ...]
    disk_bound: bool
    alternatives: tuple[Candidate, ...] = field(default_factory=tuple)


# -- judging one placement (perf.py and footprint.py: the same as everywhere) -----------


def evaluate(
    facts: ModelFacts, machine: Machine, ctx: ContextSettings, placement: Placement,
    cal: Calibration, threads: int, obj: Objective,
) -> Candidate:
    """`placement` judged by perf.py for `obj` (as simulate.predict evaluates a plan)."""
    mem = estimate(facts, placement, machine, ctx)
    pre, dec = obj.costs(facts, machine, ctx, placement, cal, threads)
    return Candidate(ctx, placement, mem, dec, pre, obj.seconds(pre, dec), obj.prompt_tokens)


def fits(c: Candidate, machine: Machine, facts: ModelFacts) -> bool:
    """Every device within its budget; the CPU's RAM after the bytes left on disk, which
    can only be weights."""
    budgets = device_budgets(machine)
    if c.placement.disk_bytes and not _stream_room(c, machine, facts):
        return False
    for dev, used in c.memory.by_device.items():
        if dev == "CPU":
            disk = c.placement.disk_bytes
            if disk > c.memory.weights.get("CPU", 0) or used - disk > budgets["CPU"]:
                return False
        elif used > budgets.get(dev, 0):
            return False
    return True


def _stream_room(c: Candidate, machine: Machine, facts: ModelFacts) -> bool:
    """A disk-bound plan keeps its anonymous bytes and the page cache to stream its
    layers through in RAM (preflight's check, asked here so the search never picks what
    it would refuse)."""
    room = stream_room(facts, head_on_cpu=c.placement.output_device == "CPU")
    return c.memory.anonymous + room <= machine.cpu.memory_bytes


# -- one context setting -------------------------------------------------------------


def solve_context(
    facts: ModelFacts, machine: Machine, ctx: ContextSettings, cal: Calibration,
    threads: int, obj: Objective, allow_disk: bool = False,
) -> Candidate | None:
    """The best placement for `ctx` (None: nothing fits)."""
    if not machine.accelerators:
        parts = layer_parts(facts, ctx)
        experts: list[str | None] = [None if q.expert_bytes == 0 else "CPU" for q in parts]
        p = build_placement(facts, parts, ["CPU"] * len(parts), experts, "CPU")
        c = evaluate(facts, machine, ctx, p, cal, threads, obj)
        over = c.memory.by_device.get("CPU", 0) - machine.cpu.memory_bytes
        if over > 0 and allow_disk:
            p = replace(p, disk_bytes=over)
            c = evaluate(facts, machine, ctx, p, cal, threads, obj)
        return c if fits(c, machine, facts) else None
    try:
        return solve_with(best_placement_counts, facts, machine, ctx, cal, threads, obj,
                          allow_disk)
    except SearchTooLong:  # the boundaries of many unlike layers: the per-layer program
        return solve_with(best_placement, facts, machine, ctx, cal, threads, obj, allow_disk)


def solve_with(
    solver: Callable[[Problem], Placement | None], facts: ModelFacts, machine: Machine,
    ctx: ContextSettings, cal: Calibration, threads: int, obj: Objective, allow_disk: bool,
) -> Candidate | None:
    """`solver`'s (a MILP's) placement for `ctx`, judged by perf.py and re-checked
    against every budget; solved again with a margin (optimize_rows.BYTES_MARGIN) when
    its answer is a few bytes over one, within the solver's tolerance."""
    parts = layer_parts(facts, ctx)
    dec, pre = phases(obj.prompt_tokens, obj.output_tokens, ctx.n_ubatch, cal)
    terms = tuple(Terms(facts, machine, ctx, parts, cal, threads, ph) for ph in (dec, pre))
    for margin in (0.0, BYTES_MARGIN):
        found = solver(Problem(facts, machine, ctx, parts, terms, allow_disk, margin))
        if found is None:
            return None
        c = evaluate(facts, machine, ctx, found, cal, threads, obj)
        if fits(c, machine, facts):
            return c
    return None


# -- the levels -----------------------------------------------------------------------


def quality_levels(
    ctx: ContextSettings, pinned_ctx: bool, floor_ctx: int, kv_types: tuple[str, ...]
) -> list[ContextSettings]:
    """Context and KV settings, best first (see the module docstring)."""
    out = [ctx]
    n = ctx.n_ctx
    while not pinned_ctx and n // 2 >= floor_ctx:
        n //= 2
        out.append(replace(ctx, n_ctx=n))
    last = out[-1]
    for t in kv_types:
        if KV_ORDER.index(t) > KV_ORDER.index(_worst(last)):
            out.append(replace(last, type_k=t, type_v=t, flash_attn=True))
    return out


def _worst(ctx: ContextSettings) -> str:
    known = [t for t in (ctx.type_k, ctx.type_v) if t in KV_ORDER]
    return max(known, key=KV_ORDER.index) if known else "q4_0"


def kv_types_allowed(facts: ModelFacts, kv_floor: str, quantize: bool) -> tuple[str, ...]:
    """The KV types the optimizer may lower to: none when the user pinned the types or
    the head dims rule quantized caches out; else down to `kv_floor`."""
    s = facts.spec
    if not quantize or s.key_length % 32 or s.value_length % 32:
        return ()
    return KV_ORDER[1 : KV_ORDER.index(kv_floor) + 1]


def min_ubatch(accelerated: bool) -> int:
    """The smallest ubatch the optimizer tries (see MIN_UBATCH)."""
    return MIN_UBATCH_ACCELERATED if accelerated else MIN_UBATCH


def ubatches(ctx: ContextSettings, accelerated: bool = False) -> list[ContextSettings]:
    """`ctx` and its ubatch halved down to `min_ubatch(accelerated)`."""
    floor = min_ubatch(accelerated)
    out, n = [ctx], ctx.n_ubatch
    while n // 2 >= floor:
        n //= 2
        out.append(replace(ctx, n_ubatch=n))
    return out


def best_of_level(
    facts: ModelFacts, machine: Machine, level: ContextSettings, cal: Calibration,
    threads: int, obj: Objective, allow_disk: bool, seen: list[Candidate],
) -> Candidate | None:
    """The best candidate over the level's ubatches (each one appended to `seen`).

    Pruned exactly: a smaller ubatch makes every placement's prefill slower (more
    ubatches, each term non-decreasing) and decode no different, so its objective is
    pointwise at least the largest ubatch's; once the best found equals the largest
    ubatch's optimum without any memory limit, no smaller ubatch can beat it."""
    best: Candidate | None = None
    bound: float | None = None
    for ctx in ubatches(level, bool(machine.accelerators)):
        if best is not None and bound is not None and best.objective_s <= bound * (1 + 1e-9):
            break
        c = solve_context(facts, machine, ctx, cal, threads, obj, allow_disk)
        if bound is None:  # worth a program only when memory looks slack (else no prune)
            slack = c is not None and _slack(c, machine)
            free = _unbounded(solve_context(facts, _unlimited(machine), ctx, cal, threads, obj)
                              ) if slack else None
            bound = free if free is not None else float("inf")
        if c is None:
            continue
        seen.append(c)
        if best is None or c.objective_s < best.objective_s - 1e-12:
            best = c
    return best


def _slack(c: Candidate, machine: Machine) -> bool:
    """No device filled to within 2 % of its budget (the bound may then be reached)."""
    budgets = device_budgets(machine)
    return all(used < 0.98 * budgets.get(dev, 0) for dev, used in c.memory.by_device.items())


def _unbounded(c: Candidate | None) -> float | None:
    return c.objective_s if c is not None else None


def _unlimited(machine: Machine) -> Machine:
    """`machine` with memory no plan can fill (the bound of `best_of_level`)."""
    big = 1 << 60
    return replace(machine, devices=tuple(replace(d, memory_bytes=big) for d in machine.devices))


# -- the whole search ------------------------------------------------------------------


def optimize(
    facts: ModelFacts, machine: Machine, ctx: ContextSettings, *, cal: Calibration,
    threads: int, obj: Objective, pinned_ctx: bool, floor_ctx: int, kv_floor: str = "q4_0",
    quantize_kv: bool = True, allow_disk: bool = True, explain: bool = False,
) -> Optimized | None:
    """The best plan (see the module docstring); None when nothing fits even with
    weights on disk (or disk not allowed)."""
    kv = kv_types_allowed(facts, kv_floor, quantize_kv)
    levels = quality_levels(ctx, pinned_ctx, min(floor_ctx, ctx.n_ctx), kv)
    seen: list[Candidate] = []

    def first_fit(disk: bool) -> tuple[int, Candidate | None]:
        for i, level in enumerate(levels):
            c = best_of_level(facts, machine, level, cal, threads, obj, disk, seen)
            if c is not None:
                return i, c
        return len(levels), None

    given_up, best = first_fit(False)
    disk_bound = False
    if best is None:  # disk is unavoidable: the best quality that fits with it
        if not allow_disk:
            return None
        given_up, best = first_fit(True)
        if best is None:
            return None
        disk_bound = best.placement.disk_bytes > 0
    changes = _changes(facts, machine, levels, given_up, best, cal, threads, obj, allow_disk,
                       seen)
    alts = _alternatives(facts, machine, best, seen, cal, threads, obj) if explain else ()
    return Optimized(best, tuple(changes), disk_bound, alts)


def _changes(
    facts: ModelFacts, machine: Machine, levels: list[ContextSettings], given_up: int,
    best: Candidate, cal: Calibration, threads: int, obj: Objective, allow_disk: bool,
    seen: list[Candidate],
) -> list[Change]:
    """What differs from the asked level, each with why and what keeping it would cost
    (that plan joins `seen`, among the alternatives)."""
    out: list[Change] = []
    cost = ""
    if given_up and allow_disk and best.placement.disk_bytes == 0:
        kept = best_of_level(facts, machine, levels[0], cal, threads, obj, True, seen)
        if kept is not None:
            cost = (f"; keeping it would leave {fb(kept.placement.disk_bytes)} of weights on "
                    f"disk: decode {kept.decode_tps:.1f} t/s predicted against "
                    f"{best.decode_tps:.1f}")
    devices = ", ".join(d.name for d in machine.devices)
    for prev, cur in itertools.pairwise(levels[: given_up + 1]):
        why = f"no split over {devices} holds {_quality(prev)}{cost}"
        cost = ""  # said once, at the first step
        out.append(Change(_step(prev, cur), why))
    asked = levels[given_up]
    if best.ctx.n_ubatch != asked.n_ubatch:
        out.append(Change(
            f"ubatch {asked.n_ubatch} → {best.ctx.n_ubatch}",
            f"a smaller compute buffer (prefill {best.prefill_tps:.0f} t/s predicted)",
        ))
    if best.placement.disk_bytes:
        ram = machine.cpu.memory_bytes
        out.append(Change(
            f"{fb(best.placement.disk_bytes)} of weights left on disk (mmap)",
            f"RAM holds {fb(ram)}; the model needs {fb(best.memory.by_device['CPU'])} there "
            f"with every device full",
        ))
    return out


def _quality(c: ContextSettings) -> str:
    return f"context {c.n_ctx} with a {c.type_k}/{c.type_v} KV cache"


def _step(prev: ContextSettings, cur: ContextSettings) -> str:
    if cur.n_ctx != prev.n_ctx:
        return f"context {prev.n_ctx} → {cur.n_ctx}"
    fa = " with flash attention" if cur.flash_attn and not prev.flash_attn else ""
    return f"KV cache {prev.type_k}/{prev.type_v} → {cur.type_k}/{cur.type_v}{fa}"


def _alternatives(
    facts: ModelFacts, machine: Machine, best: Candidate, seen: list[Candidate],
    cal: Calibration, threads: int, obj: Objective, keep: int = 5,
) -> tuple[Candidate, ...]:
    """The best rejected plans: other ubatches and levels tried, the chosen settings
    without each device the plan uses, and all on the CPU (with disk if need be)."""
    pool = [c for c in seen if c is not best]
    used = {d for d in best.placement.dense} | {best.placement.output_device}
    for dev in machine.accelerators:
        if dev.name not in used:
            continue
        fewer = replace(machine, devices=tuple(d for d in machine.devices if d is not dev))
        c = solve_context(facts, fewer, best.ctx, cal, threads, obj, allow_disk=True)
        if c is not None:
            pool.append(c)
    if used != {"CPU"}:
        cpu = replace(machine, devices=(machine.cpu,))
        c = solve_context(facts, cpu, best.ctx, cal, threads, obj, allow_disk=True)
        if c is not None:
            pool.append(c)
    uniq: dict[str, Candidate] = {}
    for c in sorted(pool, key=lambda c: c.objective_s):
        uniq.setdefault(c.label(), c)
    uniq.pop(best.label(), None)
    return tuple(list(uniq.values())[:keep])
