"""The telemetry store: migrations, the recorder, the readers, export / import / reset."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from pathlib import Path

import pytest

from inferenceos import sqlite_db, telemetry
from inferenceos.telemetry import db as dbmod
from inferenceos.telemetry.recorder import (
    FrozenSettings,
    Recorder,
    _insert,
    _Job,
    device_of,
    memory_json,
)
from inferenceos.telemetry.schema import MIGRATIONS, SCHEMA_VERSION

V1_SQL = Path(__file__).parents[1] / "fixtures" / "telemetry_v1.sql"


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _record_one(rec: Recorder, model: Path, decode: float = 50.0, source: str = "run") -> None:
    rec.generation(model, source=source, settings={"n_threads": 2, "n_ctx": 256},
                   metrics={"prompt_tokens": 5, "prompt_tps": 200.0, "ttft_s": 0.02,
                            "completion_tokens": 8, "decode_tps": decode,
                            "stop_reason": "eos", "load_s": 0.1})


def test_migrations_from_an_empty_file(tmp_path: Path) -> None:
    conn = dbmod.open_db(tmp_path / "t.db")
    assert sqlite_db.schema_version(conn) == SCHEMA_VERSION == len(MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert set(telemetry.queries.TABLES) <= _tables(conn)
    conn.close()


def test_migrations_from_the_v1_schema_keep_the_data(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(V1_SQL.read_text())
    old.close()
    conn = dbmod.open_db(path)
    assert sqlite_db.schema_version(conn) == SCHEMA_VERSION
    assert {"trials", "best_settings"} <= _tables(conn)
    conn.close()
    rows = telemetry.generations(machine=None, path=path)
    assert [r.uid for r in rows] == ["gen-v1-a", "gen-v1-b"]
    assert rows[1].decode_tps == 42.0 and rows[1].concurrency == 2 and rows[1].extra == {}
    assert rows[0].tensor_types == {"Q4_K": 500000, "F32": 100000}
    assert telemetry.loads(machine=None, path=path)[0].memory["devices"] == {"CPU": 600000}
    assert telemetry.events("eviction", machine=None, path=path)[0].detail == {"reason": "memory"}


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "new.db")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(sqlite_db.SchemaTooNewError):
        sqlite_db.migrate(conn, MIGRATIONS)


def test_recorder_round_trip(tiny_llama: Path) -> None:
    rec = telemetry.recorder()
    uid = rec.load(tiny_llama, source="run", load_s=0.2, settings={"n_ctx": 256},
                   memory={"buffers": {"model:CPU_Mapped": 1000, "KV:CPU": 24,
                                       "compute:CUDA0": 50}, "rss_growth": 9})
    _record_one(rec, tiny_llama)
    rec.generation(tiny_llama, source="server", load_uid=uid, concurrency=3, prompt_tokens=4,
                   output_tokens=2, decode_tps=30.0, threads=1)
    rec.event("eviction", tiny_llama, reason="memory", freed=123)
    rec.event("worker_death")  # no model
    rec.trial(tiny_llama, search="s1", settings={"n_threads": 1}, prefill_tps=10.0,
              decode_tps=20.0, status="stopped", why="hopeless")
    rec.best(tiny_llama, settings={"n_threads": 1}, measured={"decode_tps": 20.0})
    rec.best(tiny_llama, settings={"n_threads": 2}, measured={"decode_tps": 25.0})
    assert rec.flush(30) and rec.lost == 0

    gens = telemetry.generations(tiny_llama)
    assert [g.source for g in gens] == ["run", "server"]
    first, second = gens
    assert first.prefill_tps == 200.0 and first.output_tokens == 8 and first.threads == 2
    assert first.n_ctx == 256 and first.model_name == "tiny-llama" and first.file_type
    assert first.machine == telemetry.current_machine().fingerprint and first.cpu_count >= 1
    assert second.load_uid == uid and second.concurrency == 3 and second.threads == 1
    assert len(first.model_digest) == 64
    load = telemetry.loads(tiny_llama)[0]
    assert load.memory["devices"] == {"CPU": 1024, "CUDA0": 50}
    assert load.memory_bytes == 1074 and load.memory["rss_growth"] == 9
    ev = telemetry.events()
    assert [e.kind for e in ev] == ["eviction", "worker_death"]
    assert ev[0].detail == {"reason": "memory", "freed": 123} and ev[1].model_digest is None
    trial = telemetry.trials(tiny_llama, search="s1")[0]
    assert trial.status == "stopped" and trial.detail == {"why": "hopeless"}
    best = telemetry.best_settings(tiny_llama)
    assert best is not None and best.settings == {"n_threads": 2}
    # filters: source prefix, by digest, by name, by machine
    assert len(telemetry.generations(source="serv*")) == 1
    assert len(telemetry.generations(first.model_digest)) == 2
    assert len(telemetry.generations("tiny-llama")) == 2
    assert telemetry.generations(machine="0000000000000000") == []
    assert len(telemetry.runs(machine="current")) == 2
    assert [g.source for g in telemetry.generations(limit=1)] == ["server"]


def test_recording_is_off_the_token_path(tiny_llama: Path) -> None:
    import time

    rec = telemetry.recorder()
    _record_one(rec, tiny_llama)
    rec.flush(30)
    took = []
    for _ in range(200):
        t0 = time.perf_counter()
        _record_one(rec, tiny_llama)
        took.append(time.perf_counter() - t0)
    # the median call: a write done in the caller's thread costs milliseconds every
    # time, while a queued one is tens of microseconds unless the writer thread holds
    # the GIL (up to its 5 ms switch interval: the mean was 3.1 ms once on a busy
    # machine in a full suite)
    per_call = sorted(took)[len(took) // 2]
    assert rec.flush(60)
    assert per_call < 0.002, f"{per_call * 1e6:.0f} us per record call (median)"
    assert len(telemetry.generations()) == 201


def _held_writer(rec: Recorder) -> threading.Event:
    """Keep `rec`'s writer thread inside a job until the returned event is set (what
    is queued meanwhile is there when it wakes again)."""
    started, release = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection, machine_id: int, model_id: int | None) -> None:
        started.set()
        release.wait(30)

    rec._submit(_Job(hold))
    assert started.wait(30)
    return release


def test_records_queued_together_are_written_in_one_transaction(tiny_llama: Path) -> None:
    rec = telemetry.recorder()
    _record_one(rec, tiny_llama)
    assert rec.flush(30)
    seen: list[bool] = []  # per job: a transaction was open before it wrote

    def probe(conn: sqlite3.Connection, machine_id: int, model_id: int | None) -> None:
        seen.append(conn.in_transaction)
        row = {"uid": f"probe{len(seen)}", "ts": 0.0, "kind": "probe", "detail": "{}"}
        _insert("events", row, model_optional=True)(conn, machine_id, model_id)

    release = _held_writer(rec)
    for _ in range(3):
        rec._submit(_Job(probe))
    release.set()
    assert rec.flush(30) and rec.lost == 0
    assert seen == [False, True, True]  # (one commit for the three, not three)
    assert [e.kind for e in telemetry.events()] == ["probe"] * 3


def test_a_bad_record_in_a_batch_loses_only_itself(tiny_llama: Path, tmp_path: Path) -> None:
    rec = telemetry.recorder()
    _record_one(rec, tiny_llama)
    assert rec.flush(30)
    release = _held_writer(rec)
    _record_one(rec, tiny_llama, decode=11.0)
    _record_one(rec, tmp_path / "gone.gguf")  # no file, no digest: cannot be identified
    _record_one(rec, tiny_llama, decode=12.0)
    release.set()
    assert rec.flush(30)
    assert rec.lost == 1
    assert sorted(g.decode_tps for g in telemetry.generations()) == [11.0, 12.0, 50.0]


def test_frozen_settings_are_recorded_like_a_dict(tiny_llama: Path) -> None:
    rec = telemetry.recorder()
    frozen = FrozenSettings({"n_threads": 3, "n_ctx": 128})
    rec.generation(tiny_llama, source="server", settings=frozen, prompt_tokens=1)
    rec.generation(tiny_llama, source="server", settings=frozen, prompt_tokens=2)
    assert rec.flush(30) and rec.lost == 0
    gens = telemetry.generations(tiny_llama)
    assert [(g.threads, g.n_ctx, g.settings) for g in gens] == [
        (3, 128, {"n_ctx": 128, "n_threads": 3})] * 2
    assert frozen.json == json.dumps({"n_ctx": 128, "n_threads": 3}, sort_keys=True)


def test_disabled_recorder_writes_nothing(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setenv("INFERENCEOS_TELEMETRY_ENABLED", "false")
    telemetry.set_recorder(None)
    rec = telemetry.recorder()
    assert not rec.enabled
    _record_one(rec, tiny_llama)
    assert rec.flush(5)
    assert not telemetry.db_path().exists()
    telemetry.set_recorder(None)


def test_stats_percentiles(tiny_llama: Path) -> None:
    rec = telemetry.recorder()
    for decode in (10.0, 20.0, 30.0, 40.0, 50.0):
        _record_one(rec, tiny_llama, decode)
    rec.flush(30)
    (s,) = telemetry.stats()
    assert s.runs == 5 and s.decode_tps["p50"] == 30.0 and s.decode_tps["p90"] == 46.0
    assert s.ttft_ms["p50"] == 20.0 and s.sources == {"run": 5}


def test_export_reset_import_round_trip(tiny_llama: Path, tmp_path: Path) -> None:
    rec = telemetry.recorder()
    _record_one(rec, tiny_llama)
    rec.event("oom_refusal", tiny_llama, need=1 << 30)
    rec.best(tiny_llama, settings={"n_threads": 1}, measured={"decode_tps": 5.0})
    rec.flush(30)
    before = telemetry.counts()
    out = tmp_path / "export.json"
    telemetry.export_file(out)
    data = json.loads(out.read_text())
    assert data["format"] == "inferenceos-telemetry" and len(data["generations"]) == 1
    assert telemetry.reset() and telemetry.counts() == {}
    telemetry.import_file(out)
    assert telemetry.counts() == before
    again = telemetry.import_file(out)  # idempotent
    assert again["generations"] == 0 and telemetry.counts() == before
    assert telemetry.generations()[0].uid == data["generations"][0]["uid"]


def test_import_rejects_other_files(tmp_path: Path) -> None:
    from inferenceos.errors import UsageError

    bad = tmp_path / "bad.json"
    for text in ("not json", "[]", '{"format": "x"}',
                 '{"format": "inferenceos-telemetry", "schema": 99}',
                 '{"format": "inferenceos-telemetry", "schema": 1, "generations": [1]}'):
        bad.write_text(text)
        with pytest.raises(UsageError):
            telemetry.import_file(bad)
    with pytest.raises(UsageError, match="no such file"):
        telemetry.import_file(tmp_path / "missing.json")


def test_device_of_buffer_types() -> None:
    assert [device_of(b) for b in ("CPU_Mapped", "CPU_REPACK", "CPU", "CUDA_Host", "CUDA0",
                                   "Vulkan1", "ROCm0")] == \
        ["CPU", "CPU", "CPU", "CPU", "CUDA0", "Vulkan1", "ROCm0"]
    assert memory_json(None) == ({}, None)
    assert memory_json({"model:CUDA0": 5})[0]["devices"] == {"CUDA0": 5}


def test_a_registry_blob_is_known_by_its_name(tiny_llama: Path, tmp_path: Path) -> None:
    blob = tmp_path / ("sha256-" + "cd" * 32)
    blob.write_bytes(tiny_llama.read_bytes())
    assert telemetry.model_info(blob).digest == "cd" * 32  # no hashing needed
    rec = telemetry.recorder()
    rec.generation(blob, source="server", name="tiny:latest", output_tokens=1)
    rec.flush(30)
    (row,) = telemetry.generations(blob)
    assert row.model_digest == "cd" * 32 and row.model_name == "tiny:latest"


def test_telemetry_imports_only_lower_layers() -> None:
    """telemetry/ sits between hardware/ and plan/: it never imports plan/, engine/,
    registry/, server/ or cli/ (the planner reads it, not the other way round)."""
    import ast

    allowed = ("inferenceos.telemetry", "inferenceos.model", "inferenceos.hardware",
               "inferenceos.errors", "inferenceos.paths", "inferenceos.config",
               "inferenceos.atomic", "inferenceos.sqlite_db", "inferenceos.units")
    root = Path(telemetry.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "inferenceos":
                names = [f"inferenceos.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("inferenceos"):
                    assert name.startswith(allowed), (path.name, name)


def test_a_reader_moves_a_garbage_file_aside(tiny_llama: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    dbmod.reset_warnings()
    path = telemetry.db_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x13" * 8192)
    assert telemetry.generations() == [] and telemetry.counts() == {}
    err = capsys.readouterr().err
    assert err.count("warning: telemetry:") == 1 and "moved it to" in err
    assert len(list(path.parent.glob("telemetry.db.corrupt-*"))) == 1
    rec = telemetry.recorder()
    _record_one(rec, tiny_llama)
    rec.flush(30)
    assert len(telemetry.generations()) == 1 and "warning" not in capsys.readouterr().err
    dbmod.reset_warnings()


def test_the_engine_reports_llama_cpp_buffers_for_load_records(tiny_llama: Path) -> None:
    """What a server load hands to `recorder().load(memory=...)`: the worker's own
    llama.cpp buffer lines, per kind and buffer type."""
    from inferenceos.engine.engine import Engine
    from inferenceos.plan.llama_params import LlamaParams

    settings = LlamaParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with Engine(tiny_llama, settings, n_parallel=2) as engine:
        buffers = engine.memory_buffers
    assert buffers["model:CPU_Mapped"] > 400_000 and buffers["KV:CPU"] > 0
    mem, total = memory_json(buffers)
    assert mem["devices"]["CPU"] == total == sum(buffers.values())


def test_a_worker_death_is_recorded(tiny_llama: Path) -> None:
    import os
    import signal

    from inferenceos.engine.engine import Engine
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.errors import WorkerDiedError
    from inferenceos.plan.llama_params import LlamaParams

    settings = LlamaParams(n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    greedy = SamplingParams(temperature=0, max_tokens=2)
    with Engine(tiny_llama, settings, n_parallel=1) as engine:
        os.kill(engine.worker_pid, signal.SIGKILL)
        with contextlib.suppress(WorkerDiedError):  # the call that finds it dead
            engine.generate("abc", greedy).text()
        assert engine.generate("abc", greedy).text() is not None
    telemetry.recorder().flush(30)
    (ev,) = telemetry.events("worker_death")
    assert ev.detail == {"exit_code": -signal.SIGKILL, "restarted": True}
    assert ev.model_name == "tiny-llama"
