"""Moving what was learned: export to a JSON file, import (merge) one, reset, on / off.

The export is one JSON object: `{"format": "inferenceos-telemetry", "schema": N,
"machines": [...], "models": [...], "loads": [...], "generations": [...], "events": [...],
"trials": [...], "best_settings": [...]}`, rows referring to machines by fingerprint and
to models by digest. Importing merges: machines and models are matched by those keys,
fact rows by their uid (so importing the same file twice adds nothing), and the newer of
two best settings wins. Knowledge exported from one machine thus seeds another of the
same kind (readers with `machine="kind"` see it).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from inferenceos.atomic import write_text_atomic
from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.telemetry import db as dbmod
from inferenceos.telemetry.recorder import recorder, set_recorder
from inferenceos.telemetry.schema import SCHEMA_VERSION

FORMAT = "inferenceos-telemetry"
FACT_TABLES = ("loads", "generations", "events", "trials", "best_settings")


class TelemetryError(InferenceOSError):
    """The telemetry database could not be read or written for an explicit command."""


def _open(path: Path | None) -> tuple[Path, sqlite3.Connection]:
    path = path or dbmod.db_path()
    try:
        return path, dbmod.open_db(path, dbmod.READ_BUSY_S, check=True)
    except (sqlite3.Error, OSError) as exc:
        raise TelemetryError(f"cannot open {path}: {exc} (`inferenceos telemetry reset` "
                             "starts a fresh database)") from None


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def export_data(path: Path | None = None) -> dict[str, Any]:
    """The whole database as a JSON-ready dict (see module docstring)."""
    db, conn = _open(path)
    try:
        out: dict[str, Any] = {"format": FORMAT, "schema": SCHEMA_VERSION,
                               "exported_at": time.time()}
        out["machines"] = [{k: v for k, v in dict(r).items() if k != "id"}
                           for r in conn.execute("SELECT * FROM machines ORDER BY id")]
        out["models"] = [{k: v for k, v in dict(r).items() if k != "id"}
                         for r in conn.execute("SELECT * FROM models ORDER BY id")]
        for table in FACT_TABLES:
            rows = conn.execute(
                f"SELECT t.*, ma.fingerprint AS machine, mo.digest AS model FROM {table} t "
                "JOIN machines ma ON ma.id = t.machine_id "
                "LEFT JOIN models mo ON mo.id = t.model_id ORDER BY t.ts").fetchall()
            out[table] = [{k: v for k, v in dict(r).items()
                           if k not in ("id", "machine_id", "model_id")} for r in rows]
        return out
    except sqlite3.Error as exc:
        raise TelemetryError(f"cannot read {db}: {exc}") from None
    finally:
        conn.close()


def export_file(target: Path, path: Path | None = None) -> dict[str, int]:
    """Write the export to `target` (atomically); returns rows per table."""
    data = export_data(path)
    write_text_atomic(Path(target), json.dumps(data, indent=1, sort_keys=True) + "\n")
    return {k: len(v) for k, v in data.items() if isinstance(v, list)}


def _load_export(source: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(source).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{source} is not a telemetry export (not JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(f"{source} is not a telemetry export (no \"format\": \"{FORMAT}\")")
    if not isinstance(data.get("schema"), int) or data["schema"] > SCHEMA_VERSION:
        raise UsageError(f"{source} was exported by a newer InferenceOS "
                         f"(schema {data.get('schema')!r}; this one knows {SCHEMA_VERSION})")
    for key in ("machines", "models", *FACT_TABLES):
        rows = data.get(key, [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise UsageError(f"{source}: \"{key}\" must be a list of objects")
    return data


def import_file(source: Path, path: Path | None = None) -> dict[str, int]:
    """Merge an export into the database; returns rows added per table."""
    data = _load_export(source)
    db, conn = _open(path)
    added: dict[str, int] = {}
    try:
        with conn:
            ids = {"machine": _upsert(conn, "machines", "fingerprint", data.get("machines", [])),
                   "model": _upsert(conn, "models", "digest", data.get("models", []))}
            added["machines"] = sum(1 for _ in data.get("machines", []))
            added["models"] = sum(1 for _ in data.get("models", []))
            for table in FACT_TABLES:
                added[table] = _facts(conn, table, data.get(table, []), ids)
    except sqlite3.Error as exc:
        raise TelemetryError(f"cannot import {source} into {db}: {exc}") from None
    except (KeyError, TypeError) as exc:
        raise UsageError(f"{source}: a row lacks {exc}") from None
    finally:
        conn.close()
    return added


def _upsert(conn: sqlite3.Connection, table: str, key: str,
            rows: list[dict[str, Any]]) -> dict[str, int]:
    cols = [c for c in _columns(conn, table) if c != "id"]
    for row in rows:
        data = {c: row[c] for c in cols if c in row}
        if not isinstance(data.get(key), str):
            raise UsageError(f"a row of \"{table}\" has no \"{key}\"")
        names = ", ".join(data)
        marks = ", ".join("?" for _ in data)
        conn.execute(f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({marks})",
                     tuple(data.values()))
    return {r[1]: r[0] for r in conn.execute(f"SELECT id, {key} FROM {table}")}


def _facts(conn: sqlite3.Connection, table: str, rows: list[dict[str, Any]],
           ids: dict[str, dict[str, int]]) -> int:
    cols = [c for c in _columns(conn, table) if c not in ("id", "machine_id", "model_id")]
    before = conn.total_changes
    for row in rows:
        data: dict[str, Any] = {c: row[c] for c in cols if c in row}
        data["machine_id"] = ids["machine"][row["machine"]]
        model = row.get("model")
        data["model_id"] = ids["model"][model] if model is not None else None
        names = ", ".join(data)
        marks = ", ".join("?" for _ in data)
        if table == "best_settings":
            conn.execute(
                f"INSERT INTO {table} ({names}) VALUES ({marks}) "
                "ON CONFLICT(machine_id, model_id) DO UPDATE SET ts = excluded.ts, "
                "source = excluded.source, settings = excluded.settings, "
                "measured = excluded.measured WHERE excluded.ts > best_settings.ts",
                tuple(data.values()))
        else:
            conn.execute(f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({marks})",
                         tuple(data.values()))
    return conn.total_changes - before


def reset(path: Path | None = None) -> bool:
    """Delete the database (and its -wal / -shm files); False when there was none."""
    path = path or dbmod.db_path()
    if path == dbmod.db_path():
        recorder().flush(2.0)
        set_recorder(None)  # its open connection points at the deleted file
    existed = path.exists()
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise TelemetryError(f"cannot delete {p}: {exc.strerror}") from None
    return existed


def set_enabled(on: bool) -> None:
    """Store `telemetry.enabled` in the config file (the process-wide recorder follows
    from its next creation; this process's is switched now)."""
    from inferenceos.config import set_value

    set_value("telemetry.enabled", "true" if on else "false")
    set_recorder(None)
