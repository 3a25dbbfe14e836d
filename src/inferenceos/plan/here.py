"""Planning for this machine, now: the one call `run` and `serve` make.

`plan_here(facts, machine, request)` = `plan_load` (the pure planner) fed with
what only this machine knows at this moment:
- the CPU load (`hardware.cpu_load.sample_cpu_load`, 0.1 s) so the thread count follows
  the free cores, unless the request pins `threads`;
- the calibration learned from the probe and the recorded runs
  (`calibration_load.load_calibration`), which sizes the ubatch and predicts speed;
- the policy's objective (`req.policy`, `plan/policy.py`; `adaptive` reads the recorded
  workload);
- the best settings `inferenceos optimize` stored for this model (`plan/tuned.py`),
  named in the plan's changes (the plan line says so).

Raises what `plan_load` raises (PlanRefused, UsageError for an unknown policy).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferenceos.plan.calibration_load import load_calibration, recorded_workload
from inferenceos.plan.devices import Machine
from inferenceos.plan.entry import LoadRequest, plan_load
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.perf import Calibration
from inferenceos.plan.plan import Change, Plan
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
    policy: str | None = None,
    sense_load: bool = True,
    tuned: bool = True,
) -> HerePlan:
    """The plan for `facts` on this machine now (see the module doc)."""
    req = req or LoadRequest()
    policy = policy or req.policy
    if sense_load and not req.threads and req.cpu_load is None:
        from inferenceos.hardware.cpu_load import sample_cpu_load

        req = replace(req, cpu_load=sample_cpu_load())
    history = recorded_workload(facts) if policy.strip().lower() == "adaptive" else None
    choice = choose(policy, facts, history)
    req = apply_to_request(choice, req, facts)
    cal = load_calibration(machine, facts, req.threads)
    plan = apply_to_plan(choice, plan_load(facts, machine, req, cal), facts, machine, cal)
    if tuned:
        plan = _with_tuned(plan, req)
    return HerePlan(plan, cal, choice)


def _with_tuned(plan: Plan, req: LoadRequest) -> Plan:
    """`optimize`'s stored best for this model applied (plan/tuned.py's rules); what
    the request set explicitly is never touched."""
    from inferenceos.plan.tuned import apply_tuned

    pinned = [name for name, asked in (
        ("n_threads", req.threads), ("n_threads_batch", req.threads),
        ("n_batch", req.n_batch), ("n_ubatch", req.n_batch),
        ("type_k", req.type_k), ("type_v", req.type_v),
        ("flash_attn", req.flash_attn is not None),
        ("n_gpu_layers", req.gpu_layers is not None)) if asked]
    before = plan.params()
    after, phrase = apply_tuned(plan.model_path, before, pinned)
    changed = tuple((k, v) for k, v in vars(after).items() if getattr(before, k) != v)
    if not phrase:
        return plan
    return replace(plan, param_overrides=changed,
                   changes=(*plan.changes, Change(phrase, "the stored best of this model")))
