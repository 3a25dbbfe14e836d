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


def ram_gbps() -> float | None:
    """The machine's measured RAM read bandwidth (hardware profile), if measured."""
    try:
        from inferenceos.hardware.cache import get_profile

        return get_profile(measure=True).profile.bandwidth.ram_read_gbps
    except Exception:  # a benchmark prints what it can
        return None


def bandwidth(passes_per_s: float, weight_bytes: int, ram: float | None) -> str:
    """'X GB/s = Y % of RAM': the memory bandwidth a decode achieves when it makes
    `passes_per_s` passes over `weight_bytes` of weights a second (one pass per decode
    step, whatever the step's rows: one token, a batch of streams, a verified draft),
    against the machine's measured RAM read bandwidth `ram` (GB/s), the physical limit."""
    gbps = passes_per_s * weight_bytes / 1e9
    return f"{gbps:5.1f} GB/s" + (f" = {gbps / ram:.0%} of RAM" if ram else "")
