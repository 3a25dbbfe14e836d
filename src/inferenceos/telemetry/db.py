"""The telemetry database file: where it lives, opening it, and what to do when it is
unusable.

Every failure of the file is sorted into one of a few categories (`classify`): a corrupt
file (not a database, malformed, truncated) is moved aside and a fresh one started; a
locked, full, read-only or otherwise failing file costs the record being written. Either
way the caller gets one warning line per category per process (`warn_once`) and never an
exception: telemetry must not fail a run or a request.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path

import inferenceos.sqlite_db as sqlite_db
from inferenceos.paths import data_dir, ensure_dir
from inferenceos.telemetry.schema import MIGRATIONS

log = logging.getLogger("inferenceos.telemetry")

DB_NAME = "telemetry.db"
WRITE_BUSY_S = 2.0  # the writer waits this long for another process's lock, then drops
LOCKED_BACKOFF_S = 10.0  # after a lock timeout, for this long...
LOCKED_RETRY_BUSY_S = 0.1  # ...the writer waits only this long
READ_BUSY_S = 0.5  # WAL readers are blocked only by an exclusive-mode holder or recovery

_warned: set[str] = set()
_warn_lock = threading.Lock()


def db_path() -> Path:
    """`<data dir>/telemetry.db`."""
    return data_dir() / DB_NAME


def open_db(path: Path, busy_timeout_s: float = READ_BUSY_S, *,
            check: bool = False) -> sqlite3.Connection:
    """A migrated connection to `path` (created when missing). With `check`, a quick
    integrity check runs first and a damaged file raises sqlite3.DatabaseError.
    The connection may be used from another thread than the one that opened it."""
    ensure_dir(path.parent)
    conn = sqlite_db.connect(path, busy_timeout_s, check_same_thread=False)
    try:
        if check:
            row = conn.execute("PRAGMA quick_check").fetchone()
            if row is None or row[0] != "ok":
                raise sqlite3.DatabaseError(f"database disk image is malformed ({row[0]})"
                                            if row else "database disk image is malformed")
        sqlite_db.migrate(conn, MIGRATIONS)
        conn.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        conn.close()
        raise
    return conn


def _disk_full(path: Path | None) -> bool:
    """Less than 1 MiB free where `path` lives (SQLite reports a failed write during a
    commit as a generic "disk I/O error", whatever the errno was)."""
    if path is None:
        return False
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


def classify(exc: BaseException, path: Path | None = None) -> str:
    """`corrupt`, `locked`, `full`, `readonly` or `error` for a failure of the file at
    `path`."""
    msg = str(exc).lower()
    code = getattr(exc, "errno", None)
    if any(w in msg for w in ("not a database", "malformed", "corrupt")):
        return "corrupt"
    if "locked" in msg or "busy" in msg:
        return "locked"
    if "full" in msg or code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return "full"
    if ("readonly" in msg or "read-only" in msg or "unable to open" in msg
            or code in (errno.EACCES, errno.EPERM, errno.EROFS)):
        return "readonly"
    if "disk i/o error" in msg and _disk_full(path):
        return "full"
    return "error"


_WHY = {
    "locked": "the database is locked by another process",
    "full": "the disk is full",
    "readonly": "the database cannot be written (read-only file or folder)",
    "error": "the database could not be used",
}


def warn_once(category: str, message: str) -> None:
    """One line on stderr (and in the runtime log) the first time `category` fails in
    this process; later failures of the same category are logged at debug level only."""
    with _warn_lock:
        first = category not in _warned
        _warned.add(category)
    if not first:
        log.debug("telemetry: %s", message)
        return
    line = f"inferenceos: warning: telemetry: {message}"
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: nothing more we can do
        pass
    log.warning("telemetry: %s", message, extra={"shown": True})


def warn_failure(category: str, exc: BaseException, path: Path, what: str) -> None:
    """The warning for a failed write or read of `path`."""
    why = _WHY.get(category, _WHY["error"])
    warn_once(category, f"{why} ({path}: {exc}); {what} (the run itself is unaffected)")


def quarantine(path: Path) -> Path:
    """Move a damaged database (and its -wal / -shm files) aside; returns the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            os.replace(side, target.with_name(target.name + suffix))
    return target


def reset_warnings() -> None:
    """Forget which warnings were shown (tests)."""
    with _warn_lock:
        _warned.clear()


def set_aside(path: Path, exc: BaseException) -> bool:
    """Move a damaged database aside and say so (once); True when `path` is now free
    for a fresh database (also when another thread or process moved it first)."""
    try:
        moved = quarantine(path)
    except FileNotFoundError:
        return True
    except OSError as err:
        warn_failure("readonly", err, path, "it is damaged and could not be moved aside; "
                                            "nothing is recorded")
        return False
    warn_once("corrupt", f"{path} was damaged ({exc}); moved it to {moved.name} and "
                         "started a fresh database")
    return True

