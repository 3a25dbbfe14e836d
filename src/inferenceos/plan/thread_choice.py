"""The thread count as a decision of the cost model (issue 26), not only a rule.

For a plan's placement, every thread count from 1 to the CPU's usable threads is priced
by perf.py for the workload (a prompt, then its output), each slowed by what the other
processes take from those threads (`calibration.core_share`) as measured beside a busy
core (`calibration.contended_speed`: llama.cpp's threads wait for each other at every
operation, so a shared core costs far more than its share). The fastest count wins; the
free-core rule (`threads.pick_threads`) is kept whenever it is within `TIE` of it, so a
flat cost (a model bound by memory or by its accelerators) changes nothing. The planner
asks only when the probe timed two thread counts (`Calibration.threads_timed`): the
uncalibrated defaults' thread response is a guess, and the rule stands on it.

Pure: the load is a `CpuLoad` the caller sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferenceos.hardware.cpu_load import CpuLoad
from inferenceos.plan.calibration import contended_speed, core_share
from inferenceos.plan.devices import Machine
from inferenceos.plan.memory import ContextSettings
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.optimize import Objective
from inferenceos.plan.perf import Calibration
from inferenceos.plan.placement import Placement

TIE = 0.02  # the rule's count stands within 2 % of the fastest (the model's resolution)


@dataclass(frozen=True)
class ThreadChoice:
    """The chosen count, and the predicted seconds of the workload at each count."""

    threads: int
    seconds: dict[int, float]

    def gain_over(self, other: int) -> float:
        """How much faster the choice is predicted than `other` threads (1.0: equal)."""
        return self.seconds[other] / self.seconds[self.threads]


def workload_seconds(
    facts: ModelFacts, placement: Placement, machine: Machine, ctx: ContextSettings,
    cal: Calibration, threads: int, load: CpuLoad | None, obj: Objective,
) -> float:
    """Predicted seconds of `obj` (prefill, then decode at the output's middle) at
    `threads`, beside `load`."""
    pre, dec = obj.costs(facts, machine, ctx, placement, cal, threads)
    pre_speed, dec_speed = contended_speed(core_share(load, threads))
    return obj.seconds(pre / pre_speed, dec / dec_speed)


def choose_threads(
    facts: ModelFacts, placement: Placement, machine: Machine, ctx: ContextSettings,
    cal: Calibration, load: CpuLoad | None, obj: Objective, rule: int,
) -> ThreadChoice:
    """The thread count that the cost model finds fastest for `obj` (see the module
    doc); `rule` (the free-core count) when it is within `TIE` of that."""
    cores = max(1, machine.cpu.threads)
    seconds = {t: workload_seconds(facts, placement, machine, ctx, cal, t, load, obj)
               for t in range(1, cores + 1)}
    best = min(seconds, key=lambda t: (seconds[t], -t))
    rule = min(max(rule, 1), cores)
    if seconds[rule] <= seconds[best] * (1.0 + TIE):
        best = rule
    return ThreadChoice(best, seconds)
