"""Reading the telemetry database: typed rows, filtered by machine and model.

Every reader opens a short connection, reads, and closes it. A missing database reads
as empty; an unreadable one (corrupt, locked for longer than the busy timeout, ...)
also reads as empty, after one warning line: a reader such as the planner must never
fail a run because of its history. The writer is asynchronous, so call
`recorder().flush()` first to read back what this process just recorded. A row type's
fields are its query's columns by name (`_rows`: JSON columns decoded); what every
recorded row carries is `Recorded`'s, a fact about one model `OfModel`'s, and what is
kept or summed per (machine, model) `PerModel`'s.

Filters:
- `machine`: `"kind"` (default: every machine of the same hardware kind as this one,
  which includes knowledge imported from a twin machine), `"current"` (this exact
  fingerprint), `None` or `"all"` (every machine), or a fingerprint.
- `model`: None (every model), a GGUF path (its digest is looked up; hashed once and
  cached), a digest (64 hex digits, or a `q:` quick id), or a model name as recorded
  (any case; `NAME` also matches `NAME:latest`).
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from inferenceos.telemetry import db as dbmod
from inferenceos.telemetry.identity import current_machine, model_digest

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

MachineFilter = str | None
ModelFilter = Path | str | None
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Recorded:
    """What every recorded fact row carries, as its reader joins it in: its `uid`, when
    it was recorded, and the machine's fingerprint."""

    uid: str
    ts: float
    machine: str  # fingerprint


@dataclass(frozen=True)
class OfModel(Recorded):
    """A recorded fact about one model: its digest and recorded name joined in."""

    model_digest: str
    model_name: str


@dataclass(frozen=True)
class GenerationRow(OfModel):
    """One recorded generation with its machine and model facts joined in."""

    source: str  # run, server, benchmark:NAME, optimize, ...
    machine_kind: str
    cpu_count: int
    file_type: str  # quantization family
    parameters: int
    model_size: int
    tensor_types: dict[str, int]
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    prefill_tps: float | None
    decode_tps: float | None
    ttft_s: float | None
    total_s: float | None
    threads: int | None
    n_ctx: int | None
    n_batch: int | None
    n_ubatch: int | None
    concurrency: int
    loadavg: float | None
    stop_reason: str
    load_uid: str | None
    settings: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadRow(OfModel):
    source: str
    load_s: float | None
    settings: dict[str, Any]
    plan: dict[str, Any]
    memory: dict[str, Any]  # {"buffers": {"kind:buft": bytes}, "devices": {dev: bytes}}
    memory_bytes: int | None


@dataclass(frozen=True)
class EventRow(Recorded):
    kind: str
    model_digest: str | None  # None: an event of no model
    model_name: str | None
    detail: dict[str, Any]


@dataclass(frozen=True)
class TrialRow(OfModel):
    search: str
    settings: dict[str, Any]
    prefill_tps: float | None
    decode_tps: float | None
    status: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class PerModel:
    """What is kept or summed per (machine, model): the machine's fingerprint and the
    model's digest."""

    machine: str
    model_digest: str


@dataclass(frozen=True)
class BestSettings(PerModel):
    ts: float
    source: str
    settings: dict[str, Any]
    measured: dict[str, Any]


@dataclass(frozen=True)
class ModelStats(PerModel):
    """What `inferenceos stats` shows for one model on one machine."""

    model_name: str
    runs: int
    decode_tps: dict[str, float | None]  # p50, p90, mean
    prefill_tps: dict[str, float | None]
    ttft_ms: dict[str, float | None]  # p50, p90, p99
    sources: dict[str, int]
    last_ts: float

    def to_json(self) -> dict[str, Any]:
        return {"machine": self.machine, "model": self.model_name,
                "digest": self.model_digest, "runs": self.runs,
                "decode_tps": self.decode_tps, "prefill_tps": self.prefill_tps,
                "ttft_ms": self.ttft_ms, "sources": self.sources, "last_ts": self.last_ts}


@contextlib.contextmanager
def _read(path: Path | None) -> Iterator[sqlite3.Connection | None]:
    """A connection for reading, or None when there is nothing (or nothing usable)."""
    path = path or dbmod.db_path()
    if not path.exists():
        yield None
        return
    try:
        conn = dbmod.open_db(path, dbmod.READ_BUSY_S)
    except (sqlite3.Error, OSError) as exc:
        _unreadable(path, exc)
        yield None
        return
    try:
        yield conn
    finally:
        conn.close()


def _unreadable(path: Path, exc: BaseException) -> None:
    """One warning; a damaged file is moved aside (as the writer would), so the next
    record starts a fresh database."""
    category = dbmod.classify(exc, path)
    if category == "corrupt":
        dbmod.set_aside(path, exc)
    else:
        dbmod.warn_failure(category, exc, path, "reading it as empty")


def _query(sql: str, args: Sequence[Any], path: Path | None) -> list[sqlite3.Row]:
    with _read(path) as conn:
        if conn is None:
            return []
        try:
            return conn.execute(sql, tuple(args)).fetchall()
        except (sqlite3.Error, OSError) as exc:
            _unreadable(path or dbmod.db_path(), exc)
            return []


def _where(machine: MachineFilter, model: ModelFilter) -> tuple[list[str], list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []
    if machine == "kind":
        clauses.append("ma.kind = ?")
        args.append(current_machine().kind)
    elif machine == "current":
        clauses.append("ma.fingerprint = ?")
        args.append(current_machine().fingerprint)
    elif machine not in (None, "all"):
        clauses.append("ma.fingerprint = ?")
        args.append(machine)
    if model is not None:
        key = str(model)
        if isinstance(model, Path) or (not _HEX64.match(key) and not key.startswith("q:")
                                        and Path(key).is_file()):
            clauses.append("mo.digest = ?")
            args.append(model_digest(Path(key)))
        elif _HEX64.match(key) or key.startswith("q:"):
            clauses.append("mo.digest = ?")
            args.append(key)
        else:  # a recorded name, in any case, with or without its :latest tag
            clauses.append("(lower(mo.name) = ? OR lower(mo.name) = ?)")
            args += [key.lower(), key.lower().removesuffix(":latest") + ":latest"]
    return clauses, args


def _sql(table: str, cols: str, machine: MachineFilter, model: ModelFilter,
         extra: list[str] | None = None, extra_args: list[Any] | None = None,
         model_join: str = "JOIN", order: str = "t.ts") -> tuple[str, list[Any]]:
    clauses, args = _where(machine, model)
    clauses += extra or []
    args += extra_args or []
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    sql = (f"SELECT {cols} FROM {table} t JOIN machines ma ON ma.id = t.machine_id "
           f"{model_join} models mo ON mo.id = t.model_id{where} ORDER BY {order}")
    return sql, args


def _j(text: str | None) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


# the columns every reader of a table of facts about one model joins in (OfModel's)
_OF_MODEL = "t.*, ma.fingerprint AS machine, mo.digest AS model_digest, mo.name AS model_name"
# the columns the schema stores as JSON text (read back as dicts, {} when unreadable)
_JSON_COLUMNS = frozenset(
    ("tensor_types", "settings", "extra", "plan", "memory", "detail", "measured"))
_D = TypeVar("_D", bound="DataclassInstance")


def _rows(cls: type[_D], rows: list[sqlite3.Row]) -> list[_D]:
    """`rows` as `cls`es (a row dataclass): each field from the column of its name, a
    JSON column decoded; a field whose column the rows lack keeps its default."""
    if not rows:
        return []
    have = set(rows[0].keys())
    spec = [(f.name, f.name in _JSON_COLUMNS) for f in fields(cls) if f.name in have]
    return [cls(**{n: _j(r[n]) if js else r[n] for n, js in spec}) for r in rows]


def generations(model: ModelFilter = None, machine: MachineFilter = "kind", *,
                source: str | None = None, since: float | None = None,
                limit: int | None = None, path: Path | None = None) -> list[GenerationRow]:
    """Recorded generations, oldest first (the newest `limit` when given). `source`
    matches exactly, or as a prefix when it ends with `*` (e.g. `benchmark:*`)."""
    extra: list[str] = []
    extra_args: list[Any] = []
    if source is not None:
        if source.endswith("*"):
            extra.append("t.source LIKE ?")
            extra_args.append(source[:-1].replace("%", r"\%") + "%")
        else:
            extra.append("t.source = ?")
            extra_args.append(source)
    if since is not None:
        extra.append("t.ts >= ?")
        extra_args.append(since)
    sql, args = _sql("generations", _OF_MODEL + ", ma.kind AS machine_kind, ma.cpu_count,"
                     " mo.file_type, mo.parameters, mo.size_bytes AS model_size,"
                     " mo.tensor_types", machine, model, extra, extra_args,
                     order="t.ts DESC" if limit else "t.ts")
    if limit:
        sql += f" LIMIT {int(limit)}"
    rows = _rows(GenerationRow, _query(sql, args, path))
    return rows[::-1] if limit else rows


runs = generations  # every recorded generation is a run (CLI, server request, benchmark)


def loads(model: ModelFilter = None, machine: MachineFilter = "kind", *,
          limit: int | None = None, path: Path | None = None) -> list[LoadRow]:
    """Recorded model loads, oldest first."""
    sql, args = _sql("loads", _OF_MODEL, machine, model)
    out = _rows(LoadRow, _query(sql, args, path))
    return out[-limit:] if limit else out


def events(kind: str | None = None, model: ModelFilter = None,
           machine: MachineFilter = "kind", *, limit: int | None = None,
           path: Path | None = None) -> list[EventRow]:
    """Recorded events (of one `kind` when given), oldest first."""
    extra, extra_args = ([], []) if kind is None else (["t.kind = ?"], [kind])
    sql, args = _sql("events", _OF_MODEL, machine, model, extra, extra_args,
                     model_join="LEFT JOIN")
    out = _rows(EventRow, _query(sql, args, path))
    return out[-limit:] if limit else out


def trials(model: ModelFilter = None, machine: MachineFilter = "kind", *,
           search: str | None = None, path: Path | None = None) -> list[TrialRow]:
    """Recorded optimizer trials (of one `search` when given), oldest first."""
    extra, extra_args = ([], []) if search is None else (["t.search = ?"], [search])
    sql, args = _sql("trials", _OF_MODEL, machine, model, extra, extra_args)
    return _rows(TrialRow, _query(sql, args, path))


def best_settings(model: ModelFilter, machine: MachineFilter = "kind", *,
                  path: Path | None = None) -> BestSettings | None:
    """The stored best settings for `model`: this exact machine's when it has some, else
    the newest from a machine of the same kind (with the default `machine="kind"`)."""
    sql, args = _sql("best_settings", _OF_MODEL, machine, model, order="t.ts DESC")
    rows = _rows(BestSettings, _query(sql, args, path))
    if not rows:
        return None
    mine = current_machine().fingerprint
    return next((r for r in rows if r.machine == mine), rows[0])


def _pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def stats(model: ModelFilter = None, machine: MachineFilter = None, *,
          source: str | None = None, path: Path | None = None) -> list[ModelStats]:
    """Per (machine, model): how many runs, decode / prefill t/s and TTFT percentiles."""
    groups: dict[tuple[str, str], list[GenerationRow]] = {}
    for g in generations(model, machine, source=source, path=path):
        groups.setdefault((g.machine, g.model_digest), []).append(g)
    out = []
    for (mach, digest), rows in groups.items():
        dec = [g.decode_tps for g in rows if g.decode_tps]
        pre = [g.prefill_tps for g in rows if g.prefill_tps]
        ttft = [g.ttft_s * 1000 for g in rows if g.ttft_s]
        sources: dict[str, int] = {}
        for g in rows:
            sources[g.source] = sources.get(g.source, 0) + 1
        out.append(ModelStats(
            machine=mach, model_digest=digest, model_name=rows[-1].model_name, runs=len(rows),
            decode_tps={"p50": _r(_pct(dec, .5)), "p90": _r(_pct(dec, .9)),
                        "mean": _r(sum(dec) / len(dec) if dec else None)},
            prefill_tps={"p50": _r(_pct(pre, .5)), "p90": _r(_pct(pre, .9)),
                         "mean": _r(sum(pre) / len(pre) if pre else None)},
            ttft_ms={"p50": _r(_pct(ttft, .5), 1), "p90": _r(_pct(ttft, .9), 1),
                     "p99": _r(_pct(ttft, .99), 1)},
            sources=sources, last_ts=rows[-1].ts))
    return sorted(out, key=lambda s: (s.model_name, s.machine))


TABLES = ("machines", "models", "loads", "generations", "events", "trials", "best_settings")


def prompt_cache(path: Path | None = None) -> dict[str, int]:
    """What the KV cache gave the recorded generations: {"generations", "hits" (those
    that reused a cached prefix), "prompt_tokens", "cached_tokens"}; {} without a
    usable database."""
    rows = _query("SELECT COUNT(*), COALESCE(SUM(cached_tokens > 0), 0), "
                  "COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(cached_tokens), 0) "
                  "FROM generations", (), path)
    if not rows:
        return {}
    n, hits, prompt, cached = (int(v) for v in rows[0])
    return {"generations": n, "hits": hits, "prompt_tokens": prompt, "cached_tokens": cached}


def counts(path: Path | None = None) -> dict[str, int]:
    """Rows per table ({} when there is no usable database)."""
    with _read(path) as conn:
        if conn is None:
            return {}
        try:
            return {t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])
                    for t in TABLES}
        except (sqlite3.Error, OSError) as exc:
            _unreadable(path or dbmod.db_path(), exc)
            return {}
