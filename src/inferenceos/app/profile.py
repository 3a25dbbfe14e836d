"""One generation profiled phase by phase: what `inferenceos profile` does.

`profile_prompt` plans the run as `run` would (the request's context, threads and
batch, else the plan's), profiles one generation (tuning/profiler), writes the HTML
report, and records the profile in telemetry; the plan goes out through the caller's
`on_plan`. Ctrl-C propagates (nothing is recorded).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.plan.plan import Plan


def profile_prompt(
    path: Path, text: str, sampling: SamplingParams, output: Path, *, ctx: int = 0,
    threads: int = 0, batch: int = 0, on_plan: Callable[[Plan], None],
) -> dict[str, Any]:
    """Profile one generation of `text` by the model at `path` and write the report to
    `output`; returns the profile as JSON (the phases, every step, the rates)."""
    from inferenceos.app.run import plan_for
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.tuning import records
    from inferenceos.tuning.html_report import write_report
    from inferenceos.tuning.profiler import profile_run

    need = len(text.encode()) + sampling.max_tokens + 64
    req = LoadRequest(n_ctx=ctx, threads=threads, n_batch=batch, need_tokens=need)
    plan = plan_for(path, req)
    on_plan(plan)
    prof = profile_run(path, plan.params(), text, sampling)
    write_report(prof, output)
    data = prof.to_json()
    records.profile_run(path, data)
    records.flush()
    return data
