"""The runtime log: one rotating file in the data dir that the server and the CLI write.

`setup(component)` sends the `inferenceos.*` loggers (INFO and above) to
`<data dir>/logs/inferenceos.log`, one line per record:

    2026-11-30 23:40:01,123 INFO    server[4242] inferenceos.access: {"method": ...}

The file rotates at `MAX_BYTES` keeping `BACKUPS` old files (`inferenceos.log.1` ...);
several processes append to it (lines stay whole: each is one write in append mode),
and when two rotate at the same moment a few lines may land in the older file.
It is opened on the first record, and a file that cannot be written (full disk,
read-only folder) silently stops the file logging for this process: logging must never
fail a command. Warnings and errors still reach stderr as before (the handler Python
would otherwise use when nothing is configured), except records marked
`extra={"shown": True}` whose caller already printed them. `inferenceos logs [-f]`
reads the file.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import sys
import threading
from pathlib import Path

from inferenceos.paths import data_dir

MAX_BYTES = 5 * 1024 * 1024
BACKUPS = 3
FORMAT = "%(asctime)s %(levelname)-7s %(component)s[%(process)d] %(name)s: %(message)s"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_lock = threading.Lock()
_handler: _SafeFileHandler | None = None
_component = "cli"


def log_dir() -> Path:
    return data_dir() / "logs"


def log_path() -> Path:
    """`<data dir>/logs/inferenceos.log`."""
    return log_dir() / "inferenceos.log"


class _SafeFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating file handler that gives up quietly when the file cannot be written."""

    broken = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.broken:
            return
        record.component = _component
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        self.broken = True  # a full disk or a read-only folder: stop, say nothing


class _Stderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time (as Python's last-resort handler
    does), so a replaced stderr (pytest, a redirect) is honoured."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _: object) -> None:
        pass


class _NotShown(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "shown", False)


def setup(component: str, level: int = logging.INFO) -> Path:
    """Log `inferenceos.*` records of `level` and above to the runtime log file, tagged
    with `component` ("cli", "server", ...). Idempotent; a second call only changes the
    component (and moves to a new file when the data dir changed). Returns the path."""
    global _handler, _component
    path = log_path()
    with _lock:
        _component = component
        logger = logging.getLogger("inferenceos")
        if _handler is not None and Path(_handler.baseFilename) == path.absolute():
            return path
        if _handler is not None:
            logger.removeHandler(_handler)
            _handler.close()
        with contextlib.suppress(OSError):  # the handler will find out and go quiet
            path.parent.mkdir(parents=True, exist_ok=True)
        _handler = _SafeFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS,
                                    encoding="utf-8", delay=True)
        _handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(_handler)
        if logger.level == logging.NOTSET or logger.level > level:
            logger.setLevel(level)
        if not any(getattr(h, "_ios_stderr", False) for h in logger.handlers):
            # keep what Python's last-resort handler did before a handler existed
            err = _Stderr()
            err.setLevel(logging.WARNING)
            err.addFilter(_NotShown())
            err._ios_stderr = True  # type: ignore[attr-defined]
            logger.addHandler(err)
    return path


def read_tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of `path` (reads at most the last 4 MiB)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 4 * 1024 * 1024))
            data = fh.read()
    except FileNotFoundError:
        return []
    text = data.decode("utf-8", errors="replace").splitlines()
    return text[-lines:] if lines > 0 else []


def level_of(line: str) -> str | None:
    """The level name of a log line written with `FORMAT`, None for other lines."""
    parts = line.split(None, 3)
    return parts[2] if len(parts) >= 3 and parts[2] in LEVELS else None
