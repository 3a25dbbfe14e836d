"""Models on disk: a content-addressed blob folder and a SQLite index of names.

Layout under the models directory (`models.dir`, default `<data dir>/models`):

    blobs/sha256-<64 hex>     one GGUF file per distinct content
    registry.db               SQLite (WAL): name → digest, size, a few facts from the header

Contract:
- Every name and digest is validated (`names.py`) before a path is built from it; blob
  paths are only ever `blobs/sha256-<hex>` with `hex` checked to be 64 hex digits.
- Blobs are written to a temporary file in `blobs/` and renamed into place only once
  their sha256 is known to match, so a crash never leaves a half-written blob under a
  real name. Index changes are single SQLite transactions.
- There is no network here: `pull` imports a local .gguf file or the built-in model.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from inferenceos.errors import ModelNotFoundError, UsageError
from inferenceos.paths import ensure_dir
from inferenceos.registry.names import canonical, parse_digest

BUILTIN_SOURCE = "builtin"
_CHUNK = 4 * 1024 * 1024

# Numbered migrations: index i brings the schema to user_version i + 1.
_MIGRATIONS = (
    """
    CREATE TABLE models (
        name TEXT PRIMARY KEY,
        digest TEXT NOT NULL,
        size INTEGER NOT NULL,
        source TEXT NOT NULL,
        architecture TEXT NOT NULL,
        file_type TEXT NOT NULL,
        parameters INTEGER NOT NULL,
        context_length INTEGER NOT NULL,
        modified_at REAL NOT NULL
    );
    CREATE INDEX models_digest ON models(digest);
    """,
)


@dataclass(frozen=True)
class ModelEntry:
    """One name in the registry and the facts about its file."""

    name: str
    digest: str  # sha256 hex
    size: int
    source: str  # the path it was imported from, or "builtin"
    architecture: str
    file_type: str
    parameters: int
    context_length: int
    modified_at: float
    path: Path


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def name_for_file(path: Path) -> str:
    """A registry name derived from a file name: `My_Model.Q4.gguf` → `my_model.q4:latest`."""
    stem = re.sub(r"[^a-z0-9._-]+", "-", path.stem.lower()).strip("._-")
    stem = re.sub(r"\.{2,}", ".", stem)[:64].strip("._-") or "model"
    return canonical(stem)


class ModelStore:
    """The registry of named models under `root` (default: the configured models dir)."""

    def __init__(self, root: Path | None = None) -> None:
        if root is None:
            from inferenceos.config import models_dir

            root = models_dir()
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.db_path = self.root / "registry.db"

    # -- database ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A short-lived connection, migrated; commits on success, rolls back on error."""
        ensure_dir(self.root)
        conn = sqlite3.connect(self.db_path, timeout=10)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            self._migrate(conn)
            with conn:
                yield conn
        finally:
            conn.close()

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        for number, script in enumerate(_MIGRATIONS[version:], start=version + 1):
            with conn:
                conn.executescript(script)
                conn.execute(f"PRAGMA user_version = {number}")

    def _entry(self, row: sqlite3.Row) -> ModelEntry:
        data = dict(row)
        return ModelEntry(**data, path=self.blob_path(data["digest"]))

    # -- reading -----------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """`blobs/sha256-<hex>` for a validated digest (InvalidNameError otherwise)."""
        hex_ = parse_digest(digest if digest.startswith("sha256") else f"sha256:{digest}")
        return self.blobs / f"sha256-{hex_}"

    def list(self) -> list[ModelEntry]:
        """Every registered name, sorted."""
        with self._db() as conn:
            rows = conn.execute("SELECT * FROM models ORDER BY name").fetchall()
        return [self._entry(r) for r in rows]

    def find(self, name: str) -> ModelEntry | None:
        """The entry for `name` (validated), or None."""
        key = canonical(name)
        with self._db() as conn:
            row = conn.execute("SELECT * FROM models WHERE name = ?", (key,)).fetchone()
        return self._entry(row) if row else None

    def get(self, name: str) -> ModelEntry:
        """The entry for `name`; ModelNotFoundError when it is not registered."""
        entry = self.find(name)
        if entry is None:
            raise ModelNotFoundError(f"model '{canonical(name)}' not found; pull it first")
        if not entry.path.is_file():
            raise ModelNotFoundError(
                f"model '{entry.name}' is registered but its file {entry.path} is missing"
            )
        return entry

    # -- writing -----------------------------------------------------------------------

    def import_file(
        self,
        source: Path,
        name: str | None = None,
        link: bool = False,
        progress: Progress = _quiet,
        source_label: str | None = None,
    ) -> ModelEntry:
        """Register the GGUF file `source` under `name` (default: from its file name).

        The file is validated as GGUF first (bounded header read), then copied into the
        blob store (or hard-linked when `link` and possible). Re-importing identical
        content is cheap: the blob is shared. Returns the new entry.
        """
        from inferenceos.model.spec import load_spec

        source = Path(source).expanduser()
        if not source.is_file():
            raise ModelNotFoundError(f"no such model file: {source}")
        key = canonical(name) if name else name_for_file(source)
        progress(f"reading {source.name}")
        spec = load_spec(source)
        digest = self._store_blob(source, link, progress)
        entry_values = (
            key, digest, source.stat().st_size, source_label or str(source.resolve()),
            spec.architecture, spec.file_type, spec.parameters, spec.context_length, time.time(),
        )
        with self._db() as conn:
            conn.execute("INSERT OR REPLACE INTO models VALUES (?,?,?,?,?,?,?,?,?)", entry_values)
        progress("success")
        return self.get(key)

    def _store_blob(self, source: Path, link: bool, progress: Progress) -> str:
        """Put `source` into blobs/ under its sha256; return the hex digest."""
        from inferenceos.model.digest import file_digest

        progress("verifying sha256 digest")
        digest = file_digest(source)
        target = self.blob_path(digest)
        if target.is_file() and target.stat().st_size == source.stat().st_size:
            return digest
        ensure_dir(self.blobs)
        tmp = self.blobs / f".partial-{digest[:16]}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            if not (link and _try_link(source, tmp)):
                progress(f"copying {source.name} into the model store")
                copied = _copy_hashing(source, tmp)
                if copied != digest:
                    raise UsageError(f"{source} changed while it was being imported; try again")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return digest

    def pull(self, name: str, progress: Progress = _quiet) -> ModelEntry:
        """Register a model by name. Without network access only the built-in one exists."""
        from inferenceos.model.default_model import ensure_default_model

        key = self.pull_check(name)
        progress("assembling the built-in model (Gemma 3 270M)")
        path = ensure_default_model()
        return self.import_file(
            path, key, link=True, progress=progress, source_label=BUILTIN_SOURCE
        )

    @staticmethod
    def pull_check(name: str) -> str:
        """The canonical name if `pull(name)` can work; ModelNotFoundError otherwise."""
        from inferenceos.model.default_model import DEFAULT_MODEL_NAME

        key = canonical(name)
        if key != canonical(DEFAULT_MODEL_NAME):
            raise ModelNotFoundError(
                f"cannot pull '{key}': InferenceOS has no model hub to download from; only "
                f"the built-in '{DEFAULT_MODEL_NAME}' can be pulled by name. Import a local "
                "file with `inferenceos models pull PATH.gguf`"
            )
        return key

    def copy(self, source: str, destination: str) -> ModelEntry:
        """Give the model `source` a second name (the blob is shared)."""
        src = self.get(source)
        dst = canonical(destination)
        with self._db() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO models VALUES (?,?,?,?,?,?,?,?,?)",
                (dst, src.digest, src.size, src.source, src.architecture, src.file_type,
                 src.parameters, src.context_length, time.time()),
            )
        return self.get(dst)

    def remove(self, name: str) -> None:
        """Forget `name`; delete its blob when no other name refers to it."""
        key = canonical(name)
        with self._db() as conn:
            row = conn.execute("SELECT digest FROM models WHERE name = ?", (key,)).fetchone()
            if row is None:
                raise ModelNotFoundError(f"model '{key}' not found")
            conn.execute("DELETE FROM models WHERE name = ?", (key,))
            others = conn.execute(
                "SELECT COUNT(*) FROM models WHERE digest = ?", (row["digest"],)
            ).fetchone()[0]
        if others == 0:
            self.blob_path(row["digest"]).unlink(missing_ok=True)


def _try_link(source: Path, tmp: Path) -> bool:
    try:
        os.link(source, tmp)
        return True
    except OSError:
        return False


def _copy_hashing(source: Path, target: Path) -> str:
    """Copy `source` to `target` (fsynced) and return the sha256 of what was copied."""
    h = hashlib.sha256()
    with source.open("rb") as src, target.open("wb") as dst:
        while chunk := src.read(_CHUNK):
            h.update(chunk)
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    shutil.copymode(source, target)
    return h.hexdigest()
