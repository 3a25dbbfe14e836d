"""What `inferenceos simulate` and `placement` predict, conducted once.

`predict` reads the model's metadata (no tensor data, no llama.cpp), finds its
projector, chooses the planner's policy (adaptive: from the recorded workload), and
on this machine (`local`) calibrates from what recorded runs taught, slowed by the
cores other processes take now when the thread count is fixed; then plans and
predicts (plan/simulate).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferenceos.plan.devices import Machine
    from inferenceos.plan.simulate import Prediction, Workload


def predict(
    path: Path, machine: Machine, w: Workload, *, cache_type: str, threads: int,
    policy: str = "balanced", local: bool = True, mmproj: str | None = None,
    kv_quality: str | None = None, explain: bool = False,
    draft: Callable[[], str | None] = lambda: None,
) -> Prediction:
    """The prediction for the model at `path` on `machine` (see the module contract).
    The projector is `mmproj`, else one found beside the model ('none': without);
    `draft()` the drafter to plan with, asked for last."""
    from inferenceos.model.projector_files import NONE, check_projector, find_projector
    from inferenceos.plan.calibration_load import load_calibration, recorded_workload
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.policy import choose
    from inferenceos.plan.simulate import simulate as simulate_plan

    if mmproj is not None and mmproj.strip().lower() == NONE:
        projector = None
    else:
        projector = check_projector(mmproj) if mmproj else find_projector(path)
    facts = load_model_facts(path)
    history = recorded_workload(facts) if policy.strip().lower() == "adaptive" else None
    choice = choose(policy, facts, history)
    cal = load_calibration(machine, facts, threads) if local else None
    load = None
    if local:
        from inferenceos.hardware.cpu_load import sample_cpu_load

        load = sample_cpu_load()
        if threads and cal is not None:  # learned for a quiet machine; busy now?
            cal = _busy_now(cal, load, threads)
    return simulate_plan(
        path, machine, w, threads=threads, type_k=cache_type, type_v=cache_type,
        calibration=cal, policy=choice, cpu_load=None if threads else load, mmproj=projector,
        kv_quality=kv_quality, explain=explain, draft=draft(),
    )


def _busy_now(cal: Any, load: Any, threads: int) -> Any:
    """`cal` slowed by the cores other processes take now from a fixed thread count,
    as llama.cpp's barriers lose more than the cores (plan.calibration.contended_speed;
    with automatic threads the plan takes only the free cores instead)."""
    from inferenceos.plan.calibration import contended_speed, core_share

    share = core_share(load, threads)
    if share >= 1.0:
        return cal
    pre, dec = contended_speed(share)
    return replace(cal, decode_scale=cal.decode_scale * dec,
                   prefill_scale=cal.prefill_scale * pre,
                   source=f"{cal.source}; x{dec:.2f} decode, x{pre:.2f} prefill: other "
                   f"processes busy on {load.busy_others:.1f} of {load.usable_cpus} CPUs now")
