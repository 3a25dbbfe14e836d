"""n_batch / n_ubatch: the largest useful ubatch the memory headroom allows.

A bigger ubatch amortises reading the weights over more tokens (prefill speeds up until
compute dominates) but the compute buffer grows linearly with it. We walk the candidate
sizes upwards and keep the last one that (a) fits the headroom and (b) still improves
predicted prefill throughput by at least `MIN_GAIN`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from inferenceos.plan.memory import ContextSettings, compute_terms
from inferenceos.plan.model_facts import ModelFacts

if TYPE_CHECKING:
    from inferenceos.plan.devices import Machine
    from inferenceos.plan.perf import Calibration
    from inferenceos.plan.plan import Plan

CANDIDATES = (32, 64, 128, 256, 512, 1024, 2048)
MIN_GAIN = 0.05
DEFAULT_BATCH = 512
# Without flash attention on the CPU, each layer writes, soft-maxes and reads back the
# K·Q scores of the whole ubatch (n_kv × ubatch × heads × 4 B: 57 MB for Qwen 0.5B at
# 2,000 cells and 512 tokens, past a 32 MB L3). Halving the ubatch kept them closer:
# `run --flash-attn off`, 4,130-token prompt, 2 threads, 2 rounds (2026-12-05): Qwen
# 0.5B 143.6 t/s at 512, 154.7 at 256, 149 at 128 (158.4 with flash attention at 512);
# the 1.5B 73.2 at 512, 75.3 at 256; a 520-token prompt no slower at 256 (0.5B 214 /
# 225, Gemma 3 270M 631 / 639). The cost model has no cache term, so this is a cap.
MAX_UBATCH_WITHOUT_FA = 256


def choose_ubatch(
    facts: ModelFacts,
    ctx: ContextSettings,
    headroom: int,
    prefill_tps: Callable[[int], float],
    max_ubatch: int = 512,
) -> ContextSettings:
    """`ctx` with n_batch and n_ubatch chosen.

    Up to `DEFAULT_BATCH` (llama.cpp's default, where CPU prefill has plateaued) the
    largest size whose compute buffer fits `headroom` (bytes) is taken; beyond it, up to
    `max_ubatch`, a size is taken only if `prefill_tps(n_ubatch)` (measured or modelled
    throughput) improves by at least MIN_GAIN.
    """

    def fits(n: int) -> bool:
        trial = replace(ctx, n_ubatch=n, n_batch=max(n, ctx.n_batch))
        return compute_terms(facts, trial).total <= headroom

    sizes = [n for n in CANDIDATES if n <= max(max_ubatch, CANDIDATES[0]) and n <= ctx.n_ctx]
    base = [n for n in sizes if n <= DEFAULT_BATCH and fits(n)]
    best = base[-1] if base else CANDIDATES[0]
    best_tps = prefill_tps(best)
    for n in (n for n in sizes if n > best):
        if not fits(n):
            break
        tps = prefill_tps(n)
        if tps < best_tps * (1 + MIN_GAIN):
            break
        best, best_tps = n, tps
    return replace(ctx, n_ubatch=best, n_batch=max(best, min(DEFAULT_BATCH, ctx.n_ctx)))


def size_ubatch(facts: ModelFacts, machine: Machine, plan: Plan, cal: Calibration) -> Plan:
    """`plan` with the ubatch `choose_ubatch` picks from the RAM headroom the plan
    leaves and the predicted prefill curve (a disk-bound plan keeps its own)."""
    from inferenceos.plan.footprint import estimate
    from inferenceos.plan.perf import prefill_cost

    if plan.disk_bound:
        return plan
    headroom = machine.cpu.memory_bytes - plan.memory.by_device.get("CPU", 0)
    headroom += plan.memory.compute.get("CPU", 0)

    def tps(n_ub: int) -> float:
        c = prefill_cost(facts, plan.placement, machine, plan.ctx, n_ub, n_ub, cal, plan.threads)
        return n_ub / c.seconds

    cap = 512 if plan.ctx.flash_attn or plan.accelerators else MAX_UBATCH_WITHOUT_FA
    ctx = choose_ubatch(facts, plan.ctx, headroom, tps, max_ubatch=cap)
    if ctx == plan.ctx:
        return plan
    memory = estimate(facts, plan.placement, machine, ctx)
    if not _accelerators_fit(memory.by_device, plan.memory.by_device, machine):
        return plan  # the optimizer's smaller ubatch is what let an accelerator hold it
    return replace(plan, ctx=ctx, memory=memory)


def _accelerators_fit(new: dict[str, int], old: dict[str, int], machine: Machine) -> bool:
    """Whether no accelerator grows past its budget (the headroom above is the CPU's
    only: a larger ubatch also grows every accelerator's compute buffer)."""
    from inferenceos.plan.optimize_rows import device_budgets

    budgets = device_budgets(machine)
    return all(used <= max(budgets.get(dev, 0), old.get(dev, 0))
               for dev, used in new.items() if dev != "CPU")
