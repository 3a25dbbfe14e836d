"""Planning for this machine, now: the one call `run` and `serve` make.

`plan_here(facts, machine, request, policy)` = `plan_load` (the pure planner) fed with
what only this machine knows at this moment:
- the CPU load (`hardware.cpu_load.sample_cpu_load`, 0.1 s) so the thread count follows
  the free cores, unless the request pins `threads`;
- the calibration learned from the probe and the recorded runs
  (`calibration_load.load_calibration`), which sizes the ubatch and predicts speed;
- the policy's objective (`plan/policy.py`; `adaptive` reads the recorded workload).

Raises what `plan_load` raises (PlanRefused, UsageError for an unknown policy).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferenceos.plan.devices import Machine
from inferenceos.plan.entry import LoadRequest, plan_load
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.perf import Calibration
from inferenceos.plan.plan import Plan
from inferenceos.plan.policy import PolicyChoice, apply_to_plan, apply_to_request, choose


@dataclass(frozen=True)
class HerePlan:
    """The plan with what went into it (for the plan line and `--json`)."""

    plan: Plan
    calibration: Calibration
    policy: PolicyChoice


def plan_here(
    facts: ModelFacts,
    machine: Machine,
    req: LoadRequest | None = None,
    policy: str = "balanced",
    sense_load: bool = True,
) -> HerePlan:
    """The plan for `facts` on this machine now (see the module doc)."""
    from inferenceos.plan.calibration_load import load_calibration, recorded_workload

    req = req or LoadRequest()
    if sense_load and not req.threads and req.cpu_load is None:
        from inferenceos.hardware.cpu_load import sample_cpu_load

        req = replace(req, cpu_load=sample_cpu_load())
    history = recorded_workload(facts) if policy.strip().lower() == "adaptive" else None
    choice = choose(policy, facts, history)
    req = apply_to_request(choice, req, facts)
    cal = load_calibration(machine, facts, req.threads)
    plan = apply_to_plan(choice, plan_load(facts, machine, req, cal), facts, machine, cal)
    return HerePlan(plan, cal, choice)
