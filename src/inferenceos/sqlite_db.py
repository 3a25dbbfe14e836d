"""One way to open the project's SQLite databases: WAL mode, a busy timeout, numbered
migrations. The model registry (`registry/store.py`) and the telemetry store
(`telemetry/`) both use it.

Contract:
- `connect(path)` returns a connection in WAL mode (readers never block the writer and a
  killed process never leaves a half-written transaction behind) whose writes wait up
  to `busy_timeout_s` for another connection's lock before raising "database is locked".
- `migrate(conn, migrations)` brings the schema forward: migration `i` (0-based) moves
  `PRAGMA user_version` from `i` to `i + 1`, each in its own transaction, so a database at
  any earlier version (including a new, empty file) ends at `len(migrations)`. A database
  newer than the code knows is refused (`SchemaTooNewError`), never downgraded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from inferenceos.errors import InferenceOSError


class SchemaTooNewError(InferenceOSError):
    """The database was written by a newer InferenceOS (its user_version is higher)."""


def connect(path: Path | str, busy_timeout_s: float = 10.0, *,
            check_same_thread: bool = True) -> sqlite3.Connection:
    """A connection to `path` in WAL mode with rows as `sqlite3.Row`.

    Raises sqlite3.Error when the file cannot be opened or is not a database (the WAL
    pragma is the first statement that reads the header).
    """
    conn = sqlite3.connect(str(path), timeout=busy_timeout_s,
                           check_same_thread=check_same_thread)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        _wal(conn, busy_timeout_s)
        # with WAL, NORMAL loses at most the last commits on power loss, never corrupts
        conn.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


def _wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switch to WAL. On a new file another opener may hold the lock for its own switch;
    that pragma does not always wait on the busy timeout, so retry within it."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def schema_version(conn: sqlite3.Connection) -> int:
    """The database's `PRAGMA user_version` (0 for a new file)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, migrations: Sequence[str]) -> int:
    """Run the migrations the database has not seen yet; returns the final version."""
    version = schema_version(conn)
    if version > len(migrations):
        raise SchemaTooNewError(
            f"database schema version {version} is newer than this InferenceOS knows "
            f"({len(migrations)}); upgrade InferenceOS")
    for number, script in enumerate(migrations[version:], start=version + 1):
        try:
            with conn:
                # executescript commits first; BEGIN makes the script and the version bump
                # one transaction, so a crash between them cannot leave a half-migrated file
                # IMMEDIATE takes the write lock first, so a concurrent opener waits
                # (busy timeout) instead of failing its read-to-write upgrade at once
                conn.executescript(
                    f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")
        except sqlite3.OperationalError:
            # two first opens at once (concurrent pulls on a new store): the other
            # connection ran this migration while we waited for its lock ("table ...
            # already exists"); its commit is visible now
            if conn.in_transaction:
                conn.rollback()
            if schema_version(conn) >= number:
                continue
            raise
    return len(migrations)
