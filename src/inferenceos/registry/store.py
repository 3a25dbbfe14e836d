"""Models on disk: a content-addressed blob folder and a SQLite index of names.

Layout under the models directory (`models.dir`, default `<data dir>/models`):

    blobs/sha256-<64 hex>     one GGUF file per distinct content
    blobs/sha256-<hex>.parts/ a split GGUF (`model-00001-of-0000N.gguf` ...), named by the
                              sha256 of its first part, which is what llama.cpp opens
    registry.db               SQLite (WAL): name → digest, size, a few facts from the header,
                              and the model's projector (below)

A model may also live outside the store (`register_in_place`, used by `models discover`
for files other tools keep): its row holds the file's location, and removing the name
never deletes that file.

Contract:
- Every name and digest is validated (`names.py`) before a path is built from it; blob
  paths are only ever `blobs/sha256-<hex>` with `hex` checked to be 64 hex digits.
- Blobs are written to a temporary file in `blobs/` and renamed into place only once
  their sha256 is known to match, so a crash never leaves a half-written blob under a
  real name. Index changes are single SQLite transactions.
- A download (`registry/hub.py`) hands over a file already verified against its sha256;
  `add_blob` / `add_parts` only rename it into place and index it.
- A model may have a multimodal projector (an `mmproj` GGUF, `general.architecture ==
  "clip"`): a blob of its own (`projector_digest`, pulled or imported with the model) or
  a file left in place (`projector_location`, for models registered in place). Several
  names may share one projector; `remove` deletes its blob with the last name using it,
  never a file in place. `import_file` takes the projector found beside the file
  (`model/projector_files.py` says which) unless told otherwise.
- There is no network here: `pull` registers the built-in model; downloads are
  `registry/hub.py`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import inferenceos.sqlite_db as sqlite_db
from inferenceos.errors import GGUFFormatError, ModelNotFoundError, StorageError, UsageError
from inferenceos.paths import ensure_dir
from inferenceos.registry.names import canonical, did_you_mean, parse_digest

BUILTIN_SOURCE = "builtin"
AUTO = "auto"  # import_file's projector: the one found beside the file
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
    # split GGUFs (`parts` files under blobs/sha256-<hex>.parts/) and models registered
    # in place (`location`: the file's own path; NULL for files in blobs/)
    """
    ALTER TABLE models ADD COLUMN parts INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE models ADD COLUMN location TEXT;
    """,
    # the model's multimodal projector: a blob (`projector_digest`, sha256 hex) or a
    # file in place (`projector_location`); both NULL for a text-only model
    """
    ALTER TABLE models ADD COLUMN projector_digest TEXT;
    ALTER TABLE models ADD COLUMN projector_location TEXT;
    """,
    # a preset (registry/presets.py): the base model's row plus a JSON Preset (system
    # prompt, parameters, template, adapters, messages); NULL for a plain model
    """
    ALTER TABLE models ADD COLUMN preset TEXT;
    """,
)
_COLUMNS = ("name", "digest", "size", "source", "architecture", "file_type", "parameters",
            "context_length", "modified_at", "parts", "location", "projector_digest",
            "projector_location", "preset")
_INSERT = (f"INSERT OR REPLACE INTO models ({', '.join(_COLUMNS)}) "
           f"VALUES ({', '.join('?' * len(_COLUMNS))})")


@dataclass(frozen=True)
class ModelEntry:
    """One name in the registry and the facts about its file.

    `path` is what llama.cpp opens: the blob, the first part of a split model (`parts` >
    1, total `size`), or the file registered in place (`location`).
    """

    name: str
    digest: str  # sha256 hex (of the first part for a split model)
    size: int
    source: str  # the path or URL it came from, or "builtin"
    architecture: str
    file_type: str
    parameters: int
    context_length: int
    modified_at: float
    parts: int
    location: str | None  # registered in place: the file's own path (never deleted)
    path: Path
    projector_digest: str | None = None  # sha256 hex of a projector blob in the store
    projector_location: str | None = None  # a projector file in place (never deleted)
    # the multimodal projector file recorded for this model (it may have gone missing
    # since: check `is_file()`), or None for a text-only model
    projector: Path | None = None
    preset: str | None = None  # a preset's JSON (registry/presets.Preset), else None

    @property
    def in_place(self) -> bool:
        return self.location is not None


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
        try:
            conn = sqlite_db.connect(self.db_path, busy_timeout_s=10)
        except sqlite3.DatabaseError as exc:
            raise self._storage_error(exc) from None
        try:
            sqlite_db.migrate(conn, _MIGRATIONS)
            with conn:
                yield conn
        except sqlite3.IntegrityError:
            raise  # a constraint the caller's statement broke: the caller's to handle
        except sqlite3.DatabaseError as exc:  # corrupt, locked past the wait, disk full
            raise self._storage_error(exc) from None
        finally:
            conn.close()

    def _storage_error(self, exc: sqlite3.DatabaseError) -> StorageError:
        """One line naming the file; the models' files in blobs/ are not touched."""
        hint = ""
        if "not a database" in str(exc) or "malformed" in str(exc):
            hint = " (move it aside to start an empty registry; the model files stay)"
        return StorageError(f"model registry {self.db_path}: {exc}{hint}")

    def _entry(self, row: sqlite3.Row) -> ModelEntry:
        data = dict(row)
        if data["location"]:
            path = Path(data["location"])
        elif data["parts"] > 1:
            path = self.parts_dir(data["digest"]) / split_file_name(1, int(data["parts"]))
        else:
            path = self.blob_path(data["digest"])
        projector = None
        if data["projector_location"]:
            projector = Path(data["projector_location"])
        elif data["projector_digest"]:
            projector = self.blob_path(data["projector_digest"])
        return ModelEntry(**data, path=path, projector=projector)

    def _insert(self, conn: sqlite3.Connection, **values: object) -> None:
        values.setdefault("modified_at", time.time())
        values.setdefault("parts", 1)
        values.setdefault("location", None)
        values.setdefault("projector_digest", None)
        values.setdefault("projector_location", None)
        values.setdefault("preset", None)
        conn.execute(_INSERT, tuple(values[c] for c in _COLUMNS))

    # -- reading -----------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """`blobs/sha256-<hex>` for a validated digest (InvalidNameError otherwise)."""
        hex_ = parse_digest(digest if digest.startswith("sha256") else f"sha256:{digest}")
        return self.blobs / f"sha256-{hex_}"

    def parts_dir(self, digest: str) -> Path:
        """`blobs/sha256-<hex>.parts` for a split model whose first part has `digest`."""
        return self.blob_path(digest).with_name(self.blob_path(digest).name + ".parts")

    def list(self) -> list[ModelEntry]:
        """Every registered name, sorted."""
        with self._db() as conn:
            rows = conn.execute("SELECT * FROM models ORDER BY name").fetchall()
        return [self._entry(r) for r in rows]

    def not_found(self, name: str) -> str:
        """"model 'NAME' not found; did you mean 'X'?" when registered names are close
        to `name` (a typo), else "" (the caller says what to do instead)."""
        try:
            with self._db() as conn:
                names = [r[0] for r in conn.execute("SELECT name FROM models")]
        except (StorageError, sqlite3.Error):
            return ""
        hint = did_you_mean(name, names)
        return f"model '{name}' not found{hint}" if hint else ""

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
            raise ModelNotFoundError(self.not_found(canonical(name)) or
                                     f"model '{canonical(name)}' not found; pull it first")
        if not entry.path.is_file():
            # no path: this message reaches API clients
            where = "its file was moved or deleted" if entry.in_place else "its file is missing"
            raise ModelNotFoundError(
                f"model '{entry.name}' is registered but {where}; pull it again or `rm` it"
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
        check: Callable[[Path], None] | None = None,
        projector: Path | str | None = AUTO,
    ) -> ModelEntry:
        """Register the GGUF file `source` under `name` (default: from its file name).

        The file is validated as GGUF first (bounded header read; a missing file or a
        folder gets the same message as `run`), then by `check` when given (the llama.cpp
        load check of `registry/loadcheck.py`), then copied into the blob store (or
        hard-linked when `link` and possible). The first part of a split GGUF
        (`-00001-of-0000N.gguf`) brings its sibling parts along. Re-importing identical
        content is cheap: the blob is shared. `projector`: AUTO (the projector found
        beside `source`, if any), a projector file (checked: UsageError when it is not
        one), or None (none); it is stored as a blob of its own. Returns the new entry.
        """
        from inferenceos.model.projector_files import (
            check_projector,
            find_projector,
            is_projector,
        )
        from inferenceos.model.spec import load_spec

        source = Path(source).expanduser()
        try:
            spec = load_spec(source)  # raises ModelNotFoundError / GGUFFormatError like `run`
        except GGUFFormatError:
            if is_projector(source):  # a clear word for a common slip
                raise UsageError(
                    f"{source.name} is a multimodal projector (mmproj), not a model: import "
                    "the text model beside it (its projector comes along), or name the "
                    "projector with --mmproj") from None
            raise
        parts = split_parts(source)
        key = canonical(name) if name else name_for_file(split_base(source))
        if isinstance(projector, str) and projector == AUTO:
            mmproj = find_projector(source)
        else:
            mmproj = check_projector(projector) if projector is not None else None
        progress(f"reading {source.name}")
        if check is not None:
            progress("checking that llama.cpp can load it")
            check(source)
        label = source_label or str(source.resolve())
        proj_digest = None
        if mmproj is not None:
            progress(f"projector: {mmproj.name}")
            proj_digest = self._store_blob(mmproj, link, progress)
        try:
            if len(parts) > 1:
                return self._import_parts(parts, key, label, progress, proj_digest)
            digest = self._store_blob(source, link, progress)
            with self._db() as conn:
                self._insert(conn, name=key, digest=digest, size=source.stat().st_size,
                             source=label, architecture=spec.architecture,
                             file_type=spec.file_type, parameters=spec.parameters,
                             context_length=spec.context_length,
                             projector_digest=proj_digest)
        except BaseException:
            with contextlib.suppress(StorageError, OSError):  # the first error matters
                self._drop_unused_projector(proj_digest, None)  # no name uses it: no orphan
            raise
        progress("success")
        return self.get(key)

    def _import_parts(self, parts: Sequence[Path], key: str, label: str,
                      progress: Progress, projector_digest: str | None) -> ModelEntry:
        """Copy every part of a split GGUF into a temporary folder, then add it."""
        ensure_dir(self.blobs)
        tmp = self.blobs / f".partial-parts-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        try:
            digests = []
            for i, part in enumerate(parts, start=1):
                progress(f"copying {part.name} into the model store")
                digests.append(_copy_hashing(part, tmp / split_file_name(i, len(parts))))
            return self.add_parts(tmp, digests[0], key, label,
                                  projector_digest=projector_digest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def add_blob(self, verified: Path, digest: str, name: str, source: str,
                 projector: tuple[Path, str] | None = None) -> ModelEntry:
        """Rename `verified` (a file under `blobs/` whose sha256 is `digest`, already
        checked by the caller) into place and register it under `name`; `projector`
        (a verified projector file under `blobs/`, its sha256) goes into place first."""
        from inferenceos.model.spec import load_spec

        key = canonical(name)
        spec = load_spec(verified)
        proj_digest = self.add_projector_blob(*projector) if projector else None
        target = self.blob_path(digest)
        if verified != target:
            os.replace(verified, target)
        with self._db() as conn:
            self._insert(conn, name=key, digest=parse_digest(f"sha256:{digest}"),
                         size=target.stat().st_size, source=source,
                         architecture=spec.architecture, file_type=spec.file_type,
                         parameters=spec.parameters, context_length=spec.context_length,
                         projector_digest=proj_digest)
        return self.get(key)

    def add_projector_blob(self, verified: Path, digest: str) -> str:
        """Rename `verified` (a projector file under `blobs/` whose sha256 is `digest`,
        checked by the caller) into place; returns the validated digest. A blob already
        there is kept (same content) and `verified` is left to the caller."""
        hex_ = parse_digest(f"sha256:{digest}")
        target = self.blob_path(hex_)
        if verified != target and not target.is_file():
            os.replace(verified, target)
        return hex_

    def set_projector(self, name: str, digest: str | None = None,
                      location: Path | None = None) -> ModelEntry:
        """Record `name`'s projector: a blob already in the store (`digest`), a file
        left in place (`location`), or neither (none). The old projector's blob is
        deleted when no other name uses it."""
        key = canonical(name)
        hex_ = parse_digest(f"sha256:{digest}") if digest else None
        where = str(Path(location).absolute()) if location is not None else None
        with self._db() as conn:
            row = conn.execute("SELECT projector_digest, projector_location FROM models "
                               "WHERE name = ?", (key,)).fetchone()
            if row is None:
                raise ModelNotFoundError(self.not_found(key) or f"model '{key}' not found")
            conn.execute("UPDATE models SET projector_digest = ?, projector_location = ? "
                         "WHERE name = ?", (hex_, where, key))
        self._drop_unused_projector(row["projector_digest"], row["projector_location"])
        return self.get(key)

    def _drop_unused_projector(self, digest: str | None, location: str | None) -> None:
        """Delete the projector blob `digest` when no entry refers to it any more."""
        if not digest or location:
            return
        with self._db() as conn:
            users = conn.execute(
                "SELECT COUNT(*) FROM models WHERE (projector_digest = ? AND "
                "projector_location IS NULL) OR (digest = ? AND parts = 1 AND "
                "location IS NULL)", (digest, digest)).fetchone()[0]
        if not users:
            self.blob_path(digest).unlink(missing_ok=True)

    def add_parts(self, folder: Path, first_digest: str, name: str, source: str,
                  projector: tuple[Path, str] | None = None,
                  projector_digest: str | None = None) -> ModelEntry:
        """Rename `folder` (under `blobs/`, holding `model-0000i-of-0000N.gguf`, every
        part verified by the caller) into place as one split model named `name`, with
        `projector` as `add_blob` takes it (or a projector blob already in place,
        `projector_digest`)."""
        from inferenceos.model.gguf_file import read_gguf
        from inferenceos.model.spec import load_spec

        key = canonical(name)
        files = sorted(folder.glob("model-*-of-*.gguf"))
        n = len(files)
        if n < 2 or [f.name for f in files] != [split_file_name(i, n) for i in range(1, n + 1)]:
            raise UsageError(f"incomplete split model: {n} parts")
        spec = load_spec(files[0])
        if projector:
            projector_digest = self.add_projector_blob(*projector)
        # parameters: every part's tensors (the first part's header only counts its own)
        parameters = sum(t.n_elements for f in files for t in read_gguf(f).tensors)
        size = sum(f.stat().st_size for f in files)
        target = self.parts_dir(first_digest)
        if target.is_dir():  # the same model is already here (folders only appear whole)
            shutil.rmtree(folder, ignore_errors=True)
        else:
            os.replace(folder, target)
        with self._db() as conn:
            self._insert(conn, name=key, digest=parse_digest(f"sha256:{first_digest}"),
                         size=size, source=source, architecture=spec.architecture,
                         file_type=spec.file_type, parameters=parameters,
                         context_length=spec.context_length, parts=n,
                         projector_digest=projector_digest)
        return self.get(key)

    def register_in_place(self, path: Path, name: str, digest: str, source: str,
                          projector: Path | None = None) -> ModelEntry:
        """Register `path` under `name` without copying it (the file stays where it is,
        and `rm` only forgets the name). `digest` is its sha256 hex as the caller knows
        it (from a blob name, or hashed). `projector`: its projector file, also left in
        place (the caller has checked it)."""
        from inferenceos.model.gguf_file import read_gguf
        from inferenceos.model.spec import load_spec

        key = canonical(name)
        path = Path(path).absolute()
        spec = load_spec(path)
        parts = split_parts(path)
        parameters = spec.parameters
        if len(parts) > 1:
            parameters = sum(t.n_elements for f in parts for t in read_gguf(f).tensors)
        with self._db() as conn:
            self._insert(conn, name=key, digest=parse_digest(f"sha256:{digest}"),
                         size=sum(p.stat().st_size for p in parts), source=source,
                         architecture=spec.architecture, file_type=spec.file_type,
                         parameters=parameters, context_length=spec.context_length,
                         parts=len(parts), location=str(path),
                         projector_location=str(Path(projector).absolute())
                         if projector is not None else None)
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
            # resolved: os.link on Linux links a symlink itself, not its target
            if not (link and _try_link(source.resolve(), tmp)):
                progress(f"copying {source.name} into the model store")
                copied = _copy_hashing(source, tmp)
                if copied != digest:
                    raise UsageError(f"{source} changed while it was being imported; try again")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return digest

    def pull(self, name: str, progress: Progress = _quiet) -> ModelEntry:
        """Register the built-in model by name (Hub names go through `registry/hub.py`)."""
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
                f"cannot pull '{key}': not from Ollama's library; pull "
                "hf.co/ORG/REPO[:QUANT] from the Hugging Face Hub, a .gguf file, or the "
                f"built-in '{DEFAULT_MODEL_NAME}' (`inferenceos models discover` registers "
                "the models Ollama already has)"
            )
        return key

    def copy(self, source: str, destination: str) -> ModelEntry:
        """Give the model `source` a second name (the blob is shared)."""
        src = self.get(source)
        dst = canonical(destination)
        with self._db() as conn:
            self._insert(conn, name=dst, digest=src.digest, size=src.size, source=src.source,
                         architecture=src.architecture, file_type=src.file_type,
                         parameters=src.parameters, context_length=src.context_length,
                         parts=src.parts, location=src.location,
                         projector_digest=src.projector_digest,
                         projector_location=src.projector_location, preset=src.preset)
        return self.get(dst)

    def add_preset(self, name: str, base: ModelEntry, preset: str) -> ModelEntry:
        """Register `name` as a preset (`preset`: registry/presets.Preset's JSON) of the
        model `base`: its file, facts and projector, so every listing, `cp` and `rm`
        treat it as a model; removing it never removes the base's blob while the base
        (or any other name) uses it."""
        key = canonical(name)
        with self._db() as conn:
            self._insert(conn, name=key, digest=base.digest, size=base.size,
                         source=base.source, architecture=base.architecture,
                         file_type=base.file_type, parameters=base.parameters,
                         context_length=base.context_length, parts=base.parts,
                         location=base.location, projector_digest=base.projector_digest,
                         projector_location=base.projector_location, preset=preset)
        return self.get(key)

    def remove(self, name: str) -> None:
        """Forget `name`; delete its blob (or parts folder), and its projector's blob,
        when no other name refers to them. A model registered in place keeps its file
        (and a projector in place its file): only the name goes."""
        key = canonical(name)
        with self._db() as conn:
            row = conn.execute("SELECT digest, parts, location, projector_digest, "
                               "projector_location FROM models WHERE name = ?",
                               (key,)).fetchone()
            if row is None:
                raise ModelNotFoundError(self.not_found(key) or f"model '{key}' not found")
            conn.execute("DELETE FROM models WHERE name = ?", (key,))
            others = conn.execute(
                "SELECT COUNT(*) FROM models WHERE digest = ? AND parts = ? "
                "AND location IS NULL", (row["digest"], row["parts"])
            ).fetchone()[0]
        self._drop_unused_projector(row["projector_digest"], row["projector_location"])
        if row["location"] is not None or others:
            return
        if row["parts"] > 1:
            shutil.rmtree(self.parts_dir(row["digest"]), ignore_errors=True)
        else:
            self.blob_path(row["digest"]).unlink(missing_ok=True)


_SPLIT_RE = re.compile(r"^(?P<base>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


def split_file_name(index: int, count: int) -> str:
    """llama.cpp's name for part `index` (1-based) of `count` in the store."""
    return f"model-{index:05d}-of-{count:05d}.gguf"


def split_info(file_name: str) -> tuple[str, int, int] | None:
    """(base, index, count) when `file_name` is a split GGUF part, else None."""
    m = _SPLIT_RE.match(file_name)
    if m is None:
        return None
    i, n = int(m["i"]), int(m["n"])
    return (m["base"], i, n) if 1 <= i <= n else None


def split_base(path: Path) -> Path:
    """`x-00001-of-00003.gguf` → `x.gguf` (other paths unchanged), for naming."""
    info = split_info(path.name)
    return path.with_name(info[0] + ".gguf") if info else path


def split_parts(path: Path) -> list[Path]:
    """Every part of the split GGUF whose first part is `path` (just `[path]` otherwise).

    Raises ModelNotFoundError when a part is missing and UsageError when `path` is a
    later part (llama.cpp opens a split model by its first part).
    """
    info = split_info(path.name)
    if info is None:
        return [path]
    base, index, count = info
    if index != 1:
        raise UsageError(f"{path.name} is part {index} of {count}; name the first part")
    parts = [path.with_name(f"{base}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ModelNotFoundError(f"split model {base}: missing part(s) {', '.join(missing[:3])}")
    return parts


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
