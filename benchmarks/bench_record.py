"""What the benchmarks tell telemetry: every run they make is recorded.

Runs made in this process are recorded with `record(...)` under the source
`benchmark:NAME`; processes a benchmark starts (`inferenceos run`, a server) are tagged
the same way through `child_env(NAME)` (the INFERENCEOS_TELEMETRY_SOURCE variable).
llama.cpp's own tools (llama-bench, llama-server) used as baselines are not recorded.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from inferenceos import telemetry
from inferenceos.telemetry.recorder import SOURCE_ENV


def child_env(name: str) -> dict[str, str]:
    """The environment for a child process whose runs count as benchmark `name`."""
    return {**os.environ, SOURCE_ENV: f"benchmark:{name}"}


def record(name: str, model: Path, *, metrics: Any = None, settings: Any = None,
           concurrency: int = 1, **fields: Any) -> None:
    """Queue one generation of benchmark `name` (metrics: a GenerationMetrics or its
    JSON; settings: a dataclass or dict)."""
    if metrics is not None and hasattr(metrics, "to_json"):
        metrics = metrics.to_json()
    if settings is not None and dataclasses.is_dataclass(settings):
        settings = dataclasses.asdict(settings)  # type: ignore[arg-type]
    telemetry.recorder().generation(model, source=f"benchmark:{name}", metrics=metrics,
                                    settings=settings, concurrency=concurrency, **fields)


def finish(name: str) -> None:
    """Write what was queued and say where it went (and how many runs it now holds)."""
    rec = telemetry.recorder()
    if not rec.enabled:
        print("telemetry: off (nothing recorded)")
        return
    rec.flush(60)
    n = len(telemetry.generations(source=f"benchmark:{name}", machine="current"))
    print(f"telemetry: {n} benchmark:{name} runs recorded on this machine "
          f"({telemetry.db_path()})")
