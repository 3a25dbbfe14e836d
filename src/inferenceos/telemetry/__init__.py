"""The telemetry store: what every run, request, load and benchmark teaches the runtime.

A layer between `hardware/` and `plan/`: the engine, server, CLI and benchmarks write to
it, the planner reads from it. It imports only `model/`, `hardware/`, `errors`, `paths`,
`config` and `sqlite_db`. The database is `<data dir>/telemetry.db` (SQLite, WAL mode,
numbered migrations in `schema.py`; docs/telemetry.md has the schema).

Writing (asynchronous: a bounded queue and one writer thread; never raises for a bad
file, prints one warning line per kind of failure and loses at most that record)::

    from inferenceos import telemetry

    rec = telemetry.recorder()        # process-wide; a no-op when telemetry.enabled=false
    uid = rec.load(path, source="server", load_s=1.2, settings={...}, plan={...},
                   memory=buffer_report.to_json())        # -> load uid (str)
    rec.generation(path, source="run", metrics=m.to_json(), settings=asdict(settings),
                   load_uid=uid, concurrency=1)           # + prompt_tokens=..., etc.
    rec.event("eviction", path, reason="memory", freed_bytes=123)
    rec.trial(path, search=sid, settings={...}, prefill_tps=600.0, decode_tps=50.0,
              status="ok")                                # optimizer trials
    rec.best(path, settings={...}, measured={"prefill_tps": .., "decode_tps": ..})
    rec.flush(timeout=10)             # wait until everything queued so far is written

`model` arguments are a GGUF path (identified by its sha256, cached) or, with
`digest=`, any label. `source` says who ran it: "run", "server", "benchmark:NAME",
"optimize", ... Event kinds in use: oom_refusal, eviction, reload, worker_death,
migration.

Reading (synchronous; an unusable file reads as empty after one warning)::

    telemetry.generations(model=None, machine="kind", source=None, since=None, limit=None)
    telemetry.runs(...)               # the same as generations()
    telemetry.loads(model, machine), telemetry.events(kind, model, machine)
    telemetry.trials(model, machine, search=None)
    telemetry.best_settings(model, machine="kind") -> BestSettings | None
    telemetry.stats(model=None, machine=None) -> list[ModelStats]
    telemetry.counts() -> {table: rows}
    telemetry.current_machine() -> Machine (fingerprint, kind, cpu_count, ...)
    telemetry.model_info(path) -> ModelInfo (digest, file_type, tensor_types, ...)
    telemetry.model_digest(path) -> str (the key alone: no GGUF header read)

`machine` is "kind" (every machine with this one's hardware: CPU model and count, RAM,
GPUs; includes imported knowledge), "current" (this exact fingerprint), None (all), or a
fingerprint. `model` is a path, a digest or a recorded name. Rows are frozen dataclasses
(`GenerationRow`, `LoadRow`, `EventRow`, `TrialRow`, `BestSettings`, `ModelStats`).

Moving knowledge: `export_file(path)`, `import_file(path)` (idempotent merge),
`reset()` (delete the database), `set_enabled(bool)` (the config key).
"""

from __future__ import annotations

from inferenceos.telemetry.db import db_path
from inferenceos.telemetry.identity import (
    Machine,
    ModelInfo,
    current_machine,
    model_digest,
    model_info,
)
from inferenceos.telemetry.queries import (
    BestSettings,
    EventRow,
    GenerationRow,
    LoadRow,
    ModelStats,
    TrialRow,
    best_settings,
    counts,
    events,
    generations,
    loads,
    runs,
    stats,
    trials,
)
from inferenceos.telemetry.recorder import Recorder, recorder, set_recorder
from inferenceos.telemetry.transfer import export_file, import_file, reset, set_enabled

__all__ = [
    "BestSettings", "EventRow", "GenerationRow", "LoadRow", "Machine", "ModelInfo",
    "ModelStats", "Recorder", "TrialRow", "best_settings", "counts", "current_machine",
    "db_path", "events", "export_file", "generations", "import_file", "loads", "model_digest",
    "model_info",
    "recorder", "reset", "runs", "set_enabled", "set_recorder", "stats", "trials",
]
