"""What a run in this process (`run`, chat's replies) tells telemetry.

`record_run(lm, metrics)` queues two records, the load (settings, load time, llama.cpp's
own buffer sizes parsed from its log) and the generation, and writes one line to the
runtime log; `record_generation` does the same for one reply of a model already loaded
(chat: the load once, with its first reply). It costs microseconds: the writing
happens in the recorder's thread, and a failure of any kind only prints a warning.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.llama.lib import log as llama_log
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams

log = logging.getLogger("inferenceos.run")


def llama_buffers(mark: int = 0) -> dict[str, int]:
    """llama.cpp's buffer sizes (`"kind:buffer type" -> bytes`) from its log since
    `mark` (0: everything still held, which in a one-model process is its load)."""
    from inferenceos.engine.llama.memory_report import parse_buffer_lines

    return {f"{k}:{b}": v for (k, b), v in parse_buffer_lines(llama_log().since(mark)).items()}


def record_run(lm: LoadedModel, metrics: GenerationMetrics, *, source: str = "run",
               plan: dict[str, Any] | None = None, concurrency: int = 1,
               log_mark: int = 0) -> None:
    """Record one load and one generation of `lm` (see module contract)."""
    record_generation(lm.path, lm.settings, metrics, source=source, plan=plan,
                      concurrency=concurrency, log_mark=log_mark)


def record_generation(
    path: Path, settings: LlamaParams, metrics: GenerationMetrics, *, source: str,
    load_uid: str | None = None, plan: dict[str, Any] | None = None, concurrency: int = 1,
    log_mark: int = 0,
) -> str | None:
    """Queue one generation of the model at `path`, loaded with `settings`; without
    `load_uid`, first the record of its load (chat records the load with its first
    reply, then each reply against it). Returns the load's uid, None when telemetry is
    off or failed (never raises: telemetry must never fail a run)."""
    from inferenceos import telemetry

    try:
        log.info("%s %s: prompt %d tok at %.1f t/s, TTFT %.0f ms, generated %d tok at "
                 "%.1f t/s, stop %s", source, path.name, metrics.prompt_tokens,
                 metrics.prompt_tps, metrics.ttft_s * 1000, metrics.completion_tokens,
                 metrics.decode_tps, metrics.stop_reason)
        rec = telemetry.recorder()
        if not rec.enabled:
            return None
        as_json = dataclasses.asdict(settings)
        if load_uid is None:
            load_uid = rec.load(path, source=source, load_s=metrics.load_s,
                                settings=as_json, plan=plan, memory=llama_buffers(log_mark))
        rec.generation(path, source=source, metrics=metrics.to_json(), settings=as_json,
                       load_uid=load_uid, concurrency=concurrency, contention="sample")
        return load_uid
    except Exception as exc:  # telemetry must never fail a run
        from inferenceos.telemetry.db import warn_once

        warn_once("error", f"could not record this run ({exc!r}); the run itself is "
                           "unaffected")
        return None
