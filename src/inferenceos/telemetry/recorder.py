"""The recorder: every write goes through a queue to one background thread.

Calls like `recorder().generation(...)` only build a small job and put it on a bounded
queue (microseconds; nothing blocks the token path). The writer thread resolves the
machine and model identities (hashing, GGUF header), opens the database on first use
(integrity check, migrations) and writes the jobs queued by the time it wakes in one
transaction (each in its own when that fails). When the file fails, the job in hand is
lost, one warning line is printed per kind of failure, and the next job tries again with
a fresh connection; a corrupt file is moved aside first and the job retried on a fresh
database. A full queue drops jobs (counted) rather than block.
At interpreter exit the queue is flushed (for up to `FLUSH_AT_EXIT_S` seconds) and the
database closed, which folds the WAL back into the file.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferenceos.telemetry import db as dbmod
from inferenceos.telemetry.identity import (
    Machine,
    ModelInfo,
    current_machine,
    model_digest,
    model_info,
)

QUEUE_MAX = 10_000
BATCH_MAX = 64  # queued jobs the writer takes into one transaction
SOURCE_ENV = "INFERENCEOS_TELEMETRY_SOURCE"
FLUSH_AT_EXIT_S = 5.0

ModelRef = Path | str  # a GGUF path, or (with digest=) any name

# GenerationMetrics.to_json() keys -> generations columns
_METRIC_ALIASES = {"prompt_tps": "prefill_tps", "completion_tokens": "output_tokens"}
_GEN_FIELDS = ("prompt_tokens", "cached_tokens", "output_tokens", "prefill_tps", "decode_tps",
               "ttft_s", "total_s", "threads", "n_ctx", "n_batch", "n_ubatch", "stop_reason")
_FROM_SETTINGS = {"threads": "n_threads", "n_ctx": "n_ctx", "n_batch": "n_batch",
                  "n_ubatch": "n_ubatch"}
# speculative decoding's counters, kept in `extra` of a drafted generation (the planner
# learns each model's acceptance from them, plan/speculative.py)
_DRAFT_FIELDS = ("draft", "draft_tokens", "draft_accepted", "decode_steps")


def _json(value: Any) -> str:
    return json.dumps(value if value is not None else {}, default=str, sort_keys=True)


class FrozenSettings(Mapping[str, Any]):
    """A read-only copy of a settings mapping whose JSON is made once (`json`): the
    settings of a loaded model, recorded with every request it serves
    (server/request_telemetry.py makes one per plan)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self._data = dict(settings)
        self._text: str | None = None

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def json(self) -> str:
        """`_json` of the settings (the same text as for a plain dict of them)."""
        if self._text is None:
            self._text = _json(self._data)
        return self._text


def _settings_json(settings: Mapping[str, Any] | None) -> str:
    return settings.json if isinstance(settings, FrozenSettings) else _json(dict(settings or {}))


def _uid() -> str:
    return uuid.uuid4().hex


def device_of(buffer_type: str) -> str:
    """The device a llama.cpp buffer type lives on: `CPU_Mapped`, `CPU_REPACK` and
    `CUDA_Host` (pinned host memory) are RAM; `CUDA0`, `Vulkan1`... are that device."""
    if buffer_type.startswith("CPU") or buffer_type.endswith("_Host"):
        return "CPU"
    return buffer_type.split("_", 1)[0]


def memory_json(memory: Mapping[str, Any] | None) -> tuple[dict[str, Any], int | None]:
    """`{"buffers": {"kind:buft": bytes}, "devices": {device: bytes}}` and the total, from
    either a plain `{"kind:buft": bytes}` mapping or a `BufferReport.to_json()` dict."""
    if not memory:
        return {}, None
    raw = memory.get("buffers", memory)
    buffers = {str(k): int(v) for k, v in raw.items() if isinstance(v, int | float)}
    devices: dict[str, int] = {}
    for key, size in buffers.items():
        dev = device_of(key.split(":", 1)[-1])
        devices[dev] = devices.get(dev, 0) + size
    out: dict[str, Any] = {"buffers": buffers, "devices": devices}
    if isinstance(memory.get("rss_growth"), int):
        out["rss_growth"] = memory["rss_growth"]
    return out, sum(buffers.values())


@dataclass
class _Job:
    """One write: `model` is resolved in the writer thread, then `write` runs."""

    write: Callable[[sqlite3.Connection, int, int | None], None]  # conn, machine, model
    model: ModelRef | None = None
    digest: str | None = None
    name: str = ""


@dataclass(frozen=True)
class _Model:
    """A model as the writer knows it before touching the database."""

    digest: str
    path: Path | None  # None: known by digest only
    name: str  # "" : the file's own name (from its header) when the row is new


@dataclass
class _Flush:
    done: threading.Event


class _Stop:
    """Ends the writer thread (`Recorder.close`)."""


class Recorder:
    """Records runs into the telemetry database at `path` (see module contract)."""

    def __init__(self, path: Path | None = None, enabled: bool = True) -> None:
        self.path = Path(path) if path is not None else dbmod.db_path()
        self.enabled = enabled
        # a benchmark tags the runs of the processes it starts (`inferenceos run`, a
        # server) with its own name: INFERENCEOS_TELEMETRY_SOURCE=benchmark:NAME
        self.source_override = os.environ.get(SOURCE_ENV) or None
        self.written = 0  # jobs committed
        self.lost = 0  # jobs dropped: failed file, full queue, unknown model
        self._lock = threading.Lock()
        self._pid = -1
        self._queue: queue.Queue[_Job | _Flush | _Stop] = queue.Queue(QUEUE_MAX)
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._ids: dict[str, int] = {}
        self._locked_until = 0.0  # monotonic: until then, wait briefly for locks

    # -- public writes ------------------------------------------------------------------

    def generation(self, model: ModelRef, *, source: str,
                   metrics: Mapping[str, Any] | None = None,
                   settings: Mapping[str, Any] | None = None,
                   digest: str | None = None, name: str = "",
                   load_uid: str | None = None, concurrency: int = 1,
                   loadavg: float | None = None, extra: Mapping[str, Any] | None = None,
                   contention: Mapping[str, Any] | str | None = None,
                   **fields: Any) -> None:
        """One finished generation. `metrics` may be `GenerationMetrics.to_json()`;
        `fields` (prompt_tokens, cached_tokens, output_tokens, prefill_tps, decode_tps,
        ttft_s, total_s, threads, n_ctx, n_batch, n_ubatch, stop_reason) override it;
        threads and the batch shape default to `settings` (n_threads, n_batch...); a
        drafted generation's draft counters go to `extra`.
        `loadavg` defaults to the 1-minute load average now. `contention` (what the
        other processes took from the CPUs: `contention_now()`'s keys) goes to `extra`;
        "sample": the writer thread samples the CPUs right after the run, off the
        run's own path (`CONTENTION_WINDOW_S`): a neighbour busy through the run is
        still busy then, and the fit discounts what it cost (plan/calibration_load).
        None: not recorded (a synthetic record: its speed has no machine state)."""
        if not self.enabled:
            return
        unknown = set(fields) - set(_GEN_FIELDS)
        if unknown:
            raise TypeError(f"unknown generation fields: {', '.join(sorted(unknown))}")
        row: dict[str, Any] = {}
        for key, value in (metrics or {}).items():
            key = _METRIC_ALIASES.get(key, key)
            if key in _GEN_FIELDS:
                row[key] = value
        for col, skey in _FROM_SETTINGS.items():
            if settings and row.get(col) is None and isinstance(settings.get(skey), int):
                row[col] = settings[skey]
        if row.get("threads") == 0:  # "0: every core this process may run on"
            row["threads"] = _usable_cores()
        row.update(fields)
        extra = dict(extra or {})
        # where the model was, so the fit can re-read its header when another model is
        # predicted (plan/calibration_load: a run teaches every model on this machine)
        if isinstance(model, Path) or digest is None or os.path.isfile(model):
            extra.setdefault("model_path", os.path.abspath(model))
        if metrics and metrics.get("draft"):
            for key in _DRAFT_FIELDS:
                if key in metrics:
                    extra.setdefault(key, metrics[key])
        if metrics and isinstance(metrics.get("ngram_replay"), Mapping):
            # what n-gram drafting would have done here: how the planner learns that it
            # pays for a model that never drafted (plan/draft_choice.py)
            extra.setdefault("ngram_replay", dict(metrics["ngram_replay"]))
        row.update(uid=_uid(), ts=time.time(), load_uid=load_uid,
                   source=self.source_override or source,
                   concurrency=int(concurrency), settings=_settings_json(settings),
                   loadavg=_loadavg() if loadavg is None else loadavg)
        if isinstance(contention, Mapping):
            extra["contention"] = dict(contention)
        row.update(extra=_json(extra))
        write = _insert("generations", row)
        if contention == "sample":
            write = _with_contention(row, write)
        self._submit(_Job(write, model, digest, name))

    def load(self, model: ModelRef, *, source: str, load_s: float | None = None,
             settings: Mapping[str, Any] | None = None, plan: Mapping[str, Any] | None = None,
             memory: Mapping[str, Any] | None = None, digest: str | None = None,
             name: str = "") -> str:
        """One model load; returns its uid (pass it to `generation(load_uid=...)`).
        `memory` is llama.cpp's own buffers: `{"kind:buft": bytes}` or a
        `BufferReport.to_json()`; per-device totals are derived from it."""
        uid = _uid()
        if not self.enabled:
            return uid
        mem, total = memory_json(memory)
        row = dict(uid=uid, ts=time.time(), source=self.source_override or source,
                   load_s=load_s,
                   plan=_json(dict(plan or {})), settings=_json(dict(settings or {})),
                   memory=_json(mem), memory_bytes=total)
        self._submit(_Job(_insert("loads", row), model, digest, name))
        return uid

    def event(self, kind: str, model: ModelRef | None = None, *, digest: str | None = None,
              name: str = "", **detail: Any) -> None:
        """Something that happened: `oom_refusal`, `eviction`, `reload`, `worker_death`,
        `migration`... with free-form JSON `detail`."""
        if not self.enabled:
            return
        row = dict(uid=_uid(), ts=time.time(), kind=kind, detail=_json(detail))
        self._submit(_Job(_insert("events", row, model_optional=True), model, digest, name))

    def trial(self, model: ModelRef, *, search: str, settings: Mapping[str, Any],
              prefill_tps: float | None, decode_tps: float | None, status: str = "ok",
              digest: str | None = None, name: str = "", **detail: Any) -> None:
        """One optimizer trial (`status`: ok, stopped, failed)."""
        if not self.enabled:
            return
        row = dict(uid=_uid(), ts=time.time(), search=search, settings=_json(dict(settings)),
                   prefill_tps=prefill_tps, decode_tps=decode_tps, status=status,
                   detail=_json(detail))
        self._submit(_Job(_insert("trials", row), model, digest, name))

    def best(self, model: ModelRef, *, settings: Mapping[str, Any],
             measured: Mapping[str, Any], source: str = "optimize",
             digest: str | None = None, name: str = "") -> None:
        """Store the best settings for this machine and model (replaces earlier ones)."""
        if not self.enabled:
            return
        row = dict(ts=time.time(), source=source, settings=_json(dict(settings)),
                   measured=_json(dict(measured)))
        self._submit(_Job(_insert("best_settings", row, replace=True), model, digest, name))

    def expert_heat(self, model: ModelRef, picks: Mapping[int, Any],
                    tokens: float | Mapping[int, float], digest: str | None = None) -> None:
        """Add a streamed MoE run's router picks (layer -> picks per expert) over
        `tokens` tokens (every layer's, or per layer) to the model's heat
        (telemetry/expert_heat.py)."""
        if not self.enabled or not picks:
            return
        from inferenceos.telemetry.expert_heat import write_heat

        copied = {int(k): list(map(float, v)) for k, v in picks.items()}
        counts = ({int(k): float(v) for k, v in tokens.items()}
                  if isinstance(tokens, Mapping) else float(tokens))

        def write(conn: sqlite3.Connection, _machine: int, model_id: int | None) -> None:
            if model_id is None:
                raise ValueError("an expert_heat record needs a model")
            write_heat(conn, model_id, copied, counts)

        self._submit(_Job(write, model, digest))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every job queued so far is written (or lost); False on timeout."""
        if not self.enabled or self._thread is None or self._pid != os.getpid():
            return True
        marker = _Flush(threading.Event())
        try:
            self._queue.put(marker, timeout=timeout)
        except queue.Full:
            return False
        return marker.done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Flush, stop the writer thread and close the database; later records start a
        new thread."""
        if self._thread is None or self._pid != os.getpid():
            return
        if not self.flush(timeout):
            return  # stuck on a slow file: the daemon thread ends with the process
        thread = self._thread
        try:
            self._queue.put(_Stop(), timeout=timeout)
        except queue.Full:
            return
        thread.join(timeout)
        with self._lock:
            self._thread = None

    # -- the writer thread ---------------------------------------------------------------

    def _submit(self, job: _Job) -> None:
        self._ensure_thread()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.lost += 1
            dbmod.warn_once("queue", "the write queue is full; dropping records until "
                                     "it drains (the run itself is unaffected)")

    def _ensure_thread(self) -> None:
        pid = os.getpid()
        if self._pid == pid and self._thread is not None:
            return
        with self._lock:
            if self._pid == pid and self._thread is not None:
                return
            if self._pid != pid:  # forked: the parent's thread and queue are not ours
                self._queue = queue.Queue(QUEUE_MAX)
                self._conn, self._ids = None, {}
            self._pid = pid
            self._thread = threading.Thread(target=self._loop, name="telemetry-writer",
                                            daemon=True)
            self._thread.start()
            atexit.register(self.close, FLUSH_AT_EXIT_S)

    def _loop(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < BATCH_MAX:  # what is queued already (never waited for)
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            jobs: list[_Job] = []
            for item in items:
                if isinstance(item, _Job):
                    jobs.append(item)
                    continue
                self._write_all(jobs)  # a marker: the jobs before it are written first
                jobs = []
                if isinstance(item, _Stop):
                    self._close()
                    return
                item.done.set()
            self._write_all(jobs)

    def _write_all(self, jobs: list[_Job]) -> None:
        """`jobs` in one transaction: a burst of records (a busy server's requests end
        together) costs one commit and one wake-up of this thread, not one each. When
        that fails (rolled back), each again on its own: a bad job loses only itself."""
        if len(jobs) > 1:
            try:
                self._write_batch(jobs)
                return
            except Exception:
                self._close()  # (drops the ids cached inside the rolled-back transaction)
        for job in jobs:
            try:
                self._write(job)
            except Exception as exc:  # the writer must never die
                self.lost += 1
                dbmod.warn_once("error", f"could not record ({exc!r}); the run itself "
                                         "is unaffected")

    def _write_batch(self, jobs: list[_Job]) -> None:
        identities = [self._identify(job) for job in jobs]
        conn = self._connection()
        with conn:
            for job, identity in zip(jobs, identities, strict=True):
                self._put(conn, job, identity)
        self.written += len(jobs)

    def _put(self, conn: sqlite3.Connection, job: _Job,
             identity: tuple[Machine, _Model | None]) -> None:
        """`job`'s write inside the caller's transaction, with its machine and model ids."""
        machine, model = identity
        machine_id = self._machine_id(conn, machine)
        job.write(conn, machine_id, self._model_id(conn, model) if model else None)

    def _identify(self, job: _Job) -> tuple[Machine, _Model | None]:
        machine = current_machine()
        if job.model is None:
            return machine, None
        path = Path(job.model)
        if path.is_file():
            return machine, _Model(job.digest or model_digest(path), path, job.name)
        if job.digest:
            return machine, _Model(job.digest, None, job.name or str(job.model))
        raise FileNotFoundError(f"model file {job.model} not found and no digest given")

    def _write(self, job: _Job) -> None:
        identity = self._identify(job)
        for attempt in (1, 2):
            try:
                conn = self._connection()
                with conn:
                    self._put(conn, job, identity)
                self.written += 1
                return
            except (sqlite3.Error, OSError) as exc:
                category = dbmod.classify(exc, self.path)
                self._close()
                if category == "locked":
                    self._locked_until = time.monotonic() + dbmod.LOCKED_BACKOFF_S
                if category == "corrupt" and attempt == 1 and dbmod.set_aside(self.path, exc):
                    continue
                self.lost += 1
                dbmod.warn_failure(category, exc, self.path, "this record was not saved")
                return

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            # right after a lock timeout, do not wait the full time again for every
            # queued record: a backlog would otherwise take 2 s a record to drain
            recent = time.monotonic() < self._locked_until
            busy = dbmod.LOCKED_RETRY_BUSY_S if recent else dbmod.WRITE_BUSY_S
            self._conn = dbmod.open_db(self.path, busy, check=True)
            self._ids = {}
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        self._conn, self._ids = None, {}

    def _machine_id(self, conn: sqlite3.Connection, m: Machine) -> int:
        key = "machine:" + m.fingerprint
        if key not in self._ids:
            now = time.time()
            conn.execute(
                "INSERT INTO machines (fingerprint, kind, cpu_model, cpu_count, mem_bytes,"
                " detail, first_seen, last_seen) VALUES (?,?,?,?,?,?,?,?)"
                " ON CONFLICT(fingerprint) DO UPDATE SET last_seen = excluded.last_seen",
                (m.fingerprint, m.kind, m.cpu_model, m.cpu_count, m.mem_bytes,
                 _json(m.detail), now, now))
            row = conn.execute("SELECT id FROM machines WHERE fingerprint = ?",
                               (m.fingerprint,)).fetchone()
            self._ids[key] = int(row[0])
        return self._ids[key]

    def _model_id(self, conn: sqlite3.Connection, m: _Model) -> int:
        """The model's row id. Its facts (GGUF header) are read only for a new row; a
        name the caller gave (a served or registry name) replaces the recorded one."""
        key = f"model:{m.digest}:{m.name}"
        if key in self._ids:
            return self._ids[key]
        row = conn.execute("SELECT id, name FROM models WHERE digest = ?",
                           (m.digest,)).fetchone()
        if row is None:
            info = (model_info(m.path, m.digest, m.name) if m.path is not None
                    else ModelInfo(m.digest, m.name))
            conn.execute(
                "INSERT INTO models (digest, name, architecture, file_type, parameters,"
                " size_bytes, tensor_types, first_seen) VALUES (?,?,?,?,?,?,?,?)"
                " ON CONFLICT(digest) DO NOTHING",
                (info.digest, info.name, info.architecture, info.file_type, info.parameters,
                 info.size_bytes, _json(info.tensor_types), time.time()))
            row = conn.execute("SELECT id, name FROM models WHERE digest = ?",
                               (m.digest,)).fetchone()
        elif m.name and row[1] != m.name:
            conn.execute("UPDATE models SET name = ? WHERE id = ?", (m.name, row[0]))
        self._ids[key] = int(row[0])
        return self._ids[key]


def _insert(table: str, row: dict[str, Any], *, model_optional: bool = False,
            replace: bool = False) -> Callable[[sqlite3.Connection, int, int | None], None]:
    def write(conn: sqlite3.Connection, machine_id: int, model_id: int | None) -> None:
        if model_id is None and not model_optional:
            raise ValueError(f"a {table} record needs a model")
        data = {**row, "machine_id": machine_id, "model_id": model_id}
        cols = ", ".join(data)
        marks = ", ".join("?" for _ in data)
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        conn.execute(f"{verb} INTO {table} ({cols}) VALUES ({marks})", tuple(data.values()))
    return write


CONTENTION_WINDOW_S = 0.1  # the writer thread's CPU sample after each generation


def contention_now(threads: int | None, window_s: float = CONTENTION_WINDOW_S) -> dict[str, Any]:
    """What other processes take from the CPUs now (hardware.cpu_load), with the run's
    thread count: {"busy_others", "steal", "usable_cpus", "threads"}."""
    from inferenceos.hardware.cpu_load import sample_cpu_load

    load = sample_cpu_load(window_s)
    return {"busy_others": round(load.busy_others, 2), "steal": round(load.steal_fraction, 3),
            "usable_cpus": load.usable_cpus, "threads": threads,
            "sampled": load.sampled}


_last_sample: list[tuple[float, dict[str, Any]]] = []  # (monotonic time, sample)
SAMPLE_REUSE_S = 1.0  # records written within a second share one sample


def _recent_contention(threads: Any) -> dict[str, Any]:
    """`contention_now`, reusing a sample under `SAMPLE_REUSE_S` old (a burst of
    records, as a test or a busy server writes, costs one sample, not one each)."""
    now = time.monotonic()
    if _last_sample and now - _last_sample[0][0] < SAMPLE_REUSE_S:
        return {**_last_sample[0][1], "threads": threads}
    sample = contention_now(threads if isinstance(threads, int) else None)
    _last_sample[:] = [(now, sample)]
    return sample


def _with_contention(
    row: dict[str, Any], write: Callable[[sqlite3.Connection, int, int | None], None]
) -> Callable[[sqlite3.Connection, int, int | None], None]:
    """`write` after adding the CPU contention sampled in the writer thread to `extra`."""

    def run(conn: sqlite3.Connection, machine_id: int, model_id: int | None) -> None:
        try:
            extra = json.loads(row["extra"])
            extra.setdefault("contention", _recent_contention(row.get("threads")))
            row["extra"] = _json(extra)
        except Exception:  # a sample that fails must not lose the record
            pass
        write(conn, machine_id, model_id)

    return run


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


_recorder: Recorder | None = None
_recorder_lock = threading.Lock()


def enabled_in_config() -> bool:
    """The `telemetry.enabled` setting (True when the config cannot be read: a broken
    config file is reported by the commands that use it, not by telemetry)."""
    from inferenceos.config import ConfigError, load_config

    try:
        return bool(load_config().get("telemetry.enabled"))
    except ConfigError:
        return True


def recorder() -> Recorder:
    """The process-wide recorder for the current data dir (a new one when the data dir
    changed, e.g. between tests); disabled when `telemetry.enabled` is false."""
    global _recorder
    path = dbmod.db_path()
    with _recorder_lock:
        if _recorder is None or _recorder.path != path:
            _recorder = Recorder(path, enabled=enabled_in_config())
        return _recorder


def set_recorder(rec: Recorder | None) -> None:
    """Replace the process-wide recorder (None: build it again on next use); the one
    replaced is flushed and closed."""
    global _recorder
    with _recorder_lock:
        old, _recorder = _recorder, rec
    if old is not None and old is not rec:
        old.close()
