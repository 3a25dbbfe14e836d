"""The telemetry database's schema as numbered migrations (see `sqlite_db.migrate`).

Never edit a migration that has shipped: add a new one. `tests/fixtures/telemetry_v1.sql`
keeps version 1 as it was, so the step from it to the newest version stays tested.

Machines and models are referenced by row id inside one file; exports replace ids by
the machine's fingerprint and the model's digest, so files from different machines can
be merged. Every fact row carries a `uid` (random hex) so an import is idempotent.
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: machines, models, loads, generations, events
    """
    CREATE TABLE machines (
        id INTEGER PRIMARY KEY,
        fingerprint TEXT NOT NULL UNIQUE,   -- hardware/fingerprint.py: this exact machine
        kind TEXT NOT NULL,                 -- CPU model, cores, RAM, GPUs: same hardware
        cpu_model TEXT NOT NULL DEFAULT '',
        cpu_count INTEGER NOT NULL DEFAULT 0,
        mem_bytes INTEGER NOT NULL DEFAULT 0,
        detail TEXT NOT NULL DEFAULT '{}',  -- JSON: the facts the fingerprint hashes
        first_seen REAL NOT NULL,
        last_seen REAL NOT NULL
    );
    CREATE TABLE models (
        id INTEGER PRIMARY KEY,
        digest TEXT NOT NULL UNIQUE,        -- sha256 hex of the file ('q:' prefix: quick id)
        name TEXT NOT NULL DEFAULT '',
        architecture TEXT NOT NULL DEFAULT '',
        file_type TEXT NOT NULL DEFAULT '', -- quantization family, e.g. Q4_K_M
        parameters INTEGER NOT NULL DEFAULT 0,
        size_bytes INTEGER NOT NULL DEFAULT 0,
        tensor_types TEXT NOT NULL DEFAULT '{}',  -- JSON: ggml type -> bytes of tensors
        first_seen REAL NOT NULL
    );
    CREATE TABLE loads (
        id INTEGER PRIMARY KEY,
        uid TEXT NOT NULL UNIQUE,
        ts REAL NOT NULL,
        machine_id INTEGER NOT NULL REFERENCES machines(id),
        model_id INTEGER NOT NULL REFERENCES models(id),
        source TEXT NOT NULL DEFAULT '',    -- run, server, benchmark:NAME, optimize, ...
        load_s REAL,
        plan TEXT NOT NULL DEFAULT '{}',      -- JSON
        settings TEXT NOT NULL DEFAULT '{}',  -- JSON: the llama.cpp parameters
        memory TEXT NOT NULL DEFAULT '{}',    -- JSON: {"buffers": {...}, "devices": {...}}
        memory_bytes INTEGER                  -- total of llama.cpp's buffers
    );
    CREATE TABLE generations (
        id INTEGER PRIMARY KEY,
        uid TEXT NOT NULL UNIQUE,
        ts REAL NOT NULL,
        machine_id INTEGER NOT NULL REFERENCES machines(id),
        model_id INTEGER NOT NULL REFERENCES models(id),
        load_uid TEXT,
        source TEXT NOT NULL DEFAULT '',
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        cached_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        prefill_tps REAL,
        decode_tps REAL,
        ttft_s REAL,
        total_s REAL,
        threads INTEGER,
        n_ctx INTEGER,
        n_batch INTEGER,
        n_ubatch INTEGER,
        concurrency INTEGER NOT NULL DEFAULT 1,
        loadavg REAL,                       -- 1-minute load average when it finished
        stop_reason TEXT NOT NULL DEFAULT '',
        settings TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX generations_machine_model ON generations(machine_id, model_id, ts);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        uid TEXT NOT NULL UNIQUE,
        ts REAL NOT NULL,
        machine_id INTEGER NOT NULL REFERENCES machines(id),
        model_id INTEGER REFERENCES models(id),
        kind TEXT NOT NULL,                 -- oom_refusal, eviction, reload, worker_death, ...
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_kind ON events(kind, ts);
    """,
    # 2: the optimizer's trials and best settings; free-form extras on generations
    """
    CREATE TABLE trials (
        id INTEGER PRIMARY KEY,
        uid TEXT NOT NULL UNIQUE,
        ts REAL NOT NULL,
        machine_id INTEGER NOT NULL REFERENCES machines(id),
        model_id INTEGER NOT NULL REFERENCES models(id),
        search TEXT NOT NULL DEFAULT '',    -- groups the trials of one optimize run
        settings TEXT NOT NULL DEFAULT '{}',
        prefill_tps REAL,
        decode_tps REAL,
        status TEXT NOT NULL DEFAULT 'ok',  -- ok, stopped, failed
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX trials_machine_model ON trials(machine_id, model_id, ts);
    CREATE TABLE best_settings (
        machine_id INTEGER NOT NULL REFERENCES machines(id),
        model_id INTEGER NOT NULL REFERENCES models(id),
        ts REAL NOT NULL,
        source TEXT NOT NULL DEFAULT '',
        settings TEXT NOT NULL DEFAULT '{}',
        measured TEXT NOT NULL DEFAULT '{}', -- e.g. {"prefill_tps": .., "decode_tps": ..}
        PRIMARY KEY (machine_id, model_id)
    );
    ALTER TABLE generations ADD COLUMN extra TEXT NOT NULL DEFAULT '{}';
    """,
    # 3: which routed experts a model's tokens picked (the workload's, not a machine's:
    # no machine_id), decayed by tokens (telemetry/expert_heat.py)
    """
    CREATE TABLE expert_heat (
        model_id INTEGER NOT NULL REFERENCES models(id),
        layer INTEGER NOT NULL,
        picks TEXT NOT NULL DEFAULT '[]',   -- JSON: decayed picks per expert
        tokens REAL NOT NULL DEFAULT 0,     -- decayed tokens routed through the layer
        ts REAL NOT NULL,
        PRIMARY KEY (model_id, layer)
    );
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)
