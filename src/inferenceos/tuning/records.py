"""What the tuning commands write to the telemetry store.

- every optimizer trial → `trials` (status ok / stopped / failed; the phase, dimension,
  token counts and any error in `detail`), grouped by one search id per `optimize` run;
- the search's best → `best_settings` (with the baseline's and the best's confirmed
  rates and their ratios in `measured`), which `plan.tuned.best_settings` reads back;
- every stream of a benchmark point → `generations` (source `benchmark`, with its
  concurrency), so benchmarks teach the performance model too;
- the profiled run → one `generations` row (source `profile`).

All writes are queued (the recorder never blocks or raises); `flush()` waits for them
before a command exits.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import inferenceos.telemetry as telemetry
from inferenceos.tuning.matrix import Row
from inferenceos.tuning.search import SearchResult
from inferenceos.tuning.trials import TrialResult


def new_search_id() -> str:
    return uuid.uuid4().hex[:16]


def trial(path: Path, search: str, res: TrialResult) -> None:
    """Record one optimizer trial."""
    status = "failed" if res.error else "stopped" if res.stopped_early else "ok"
    telemetry.recorder().trial(
        path, search=search, settings=res.knobs.to_json(),
        prefill_tps=res.prefill_tps or None, decode_tps=res.decode_tps or None,
        status=status, phase=res.phase, dimension=res.dimension,
        prompt_tokens=res.prompt_tokens, decode_tokens=res.decode_tokens,
        load_s=round(res.load_s, 4), error=res.error,
    )


def best(path: Path, search: str, result: SearchResult) -> None:
    """Store the search's best for this machine and model."""
    measured: dict[str, Any] = {
        **result.best_measured,
        "baseline": result.baseline_measured,
        "baseline_settings": result.baseline.to_json(),
        "ratios": result.ratios,
        "search": search,
        **result.conditions,
    }
    telemetry.recorder().best(path, settings=result.best.to_json(), measured=measured,
                              source="optimize")


def benchmark_row(path: Path, row: Row, prompt_len: int) -> None:
    """Record each stream of one benchmark point as a generation."""
    if row.error:
        return
    p = row.point
    settings = {"n_ctx": p.n_ctx, "n_batch": p.n_batch, "n_ubatch": p.n_ubatch,
                "n_threads": p.threads, "n_threads_batch": p.threads}
    for m in row.metrics:
        telemetry.recorder().generation(
            path, source="benchmark", metrics=m.to_json(), settings=settings,
            concurrency=p.concurrency, extra={"baseline": p.baseline, "prompt_len": prompt_len},
        )


def profile_run(path: Path, data: dict[str, Any]) -> None:
    """Record the profiled run as a generation."""
    s = data.get("settings", {})
    telemetry.recorder().generation(
        path, source="profile", settings=s, prompt_tokens=data["prompt_tokens"],
        output_tokens=data["completion_tokens"], prefill_tps=data["prefill_tps"] or None,
        decode_tps=data["decode_tps"] or None, total_s=data["total_s"],
        extra={"phases": data["phases"]},
    )


def flush() -> None:
    telemetry.recorder().flush(timeout=10)
