"""Who ran what: this machine's fingerprint and kind, a model file's digest and facts.

Both are computed in the recorder's writer thread (never on the token path) and cached
for the life of the process. A model's key is its sha256 (`model/digest.py`, itself
cached by path, mtime and size), so a file renamed or served from the registry is still
the same model (a registry blob, `blobs/sha256-<hex>`, is known by its name). Hashing a
large file takes minutes the first time, so for a file bigger
than `QUICK_ID_BYTES` whose digest is not cached yet the key is a quick id
(`q:` + sha256 of size, first and last MiB): stable for that file, cheap, and documented.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from inferenceos.atomic import read_json
from inferenceos.errors import InferenceOSError
from inferenceos.paths import data_dir

QUICK_ID_BYTES = 2 << 30  # 2 GiB
_MIB = 1 << 20
_lock = threading.Lock()
_machine: Machine | None = None
_models: dict[tuple[str, int, int], ModelInfo] = {}


@dataclass(frozen=True)
class Machine:
    """This machine as the store knows it. `fingerprint` changes with any hardware,
    driver, kernel or llama.cpp build change; `kind` only with the hardware itself (CPU
    model and count, RAM, GPUs), so knowledge can seed another machine of the same kind."""

    fingerprint: str
    kind: str
    cpu_model: str = ""
    cpu_count: int = 0
    mem_bytes: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelInfo:
    """A model file's identity and the facts a performance model needs."""

    digest: str
    name: str = ""
    architecture: str = ""
    file_type: str = ""  # quantization family, e.g. Q4_K_M
    parameters: int = 0
    size_bytes: int = 0
    tensor_types: dict[str, int] = field(default_factory=dict)  # ggml type -> bytes


def _kind(ident: dict[str, Any]) -> str:
    facts = {k: ident.get(k) for k in ("platform", "machine", "cpu_model", "cpu_count",
                                       "mem_total_kb")}
    facts["gpus"] = [g[1:3] for g in ident.get("pci_gpus") or []]  # vendor, device id
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def current_machine() -> Machine:
    """This machine (computed once per process: a few ms of procfs and sysfs reads)."""
    global _machine
    with _lock:
        if _machine is None:
            from inferenceos.hardware.fingerprint import fingerprint_of, identity

            ident = identity(_models_dir())
            mem_kb = str(ident.get("mem_total_kb") or "0")
            _machine = Machine(
                fingerprint=fingerprint_of(ident), kind=_kind(ident),
                cpu_model=str(ident.get("cpu_model") or ""),
                cpu_count=int(ident.get("cpu_count") or 0),
                mem_bytes=int(mem_kb) * 1024 if mem_kb.isdigit() else 0,
                detail=json.loads(json.dumps(ident, default=str)))
        return _machine


def _models_dir() -> Path:
    from inferenceos.config import ConfigError, load_config

    try:
        return load_config().models_dir
    except ConfigError:  # a broken config must not stop recording
        return data_dir() / "models"


def _quick_id(path: Path, size: int) -> str:
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as fh:
        h.update(fh.read(_MIB))
        fh.seek(max(0, size - _MIB))
        h.update(fh.read(_MIB))
    return "q:" + h.hexdigest()


_BLOB_NAME = re.compile(r"^sha256-([0-9a-f]{64})$")


def _digest(path: Path, size: int) -> str:
    from inferenceos.model.digest import _cache_file, file_digest

    blob = _BLOB_NAME.match(path.name)
    if blob:  # a registry blob is named by its verified sha256
        return blob.group(1)
    if size > QUICK_ID_BYTES:
        cache = read_json(_cache_file(), {})
        hit = cache.get(str(path.resolve())) if isinstance(cache, dict) else None
        if not (isinstance(hit, dict) and hit.get("size") == size):
            return _quick_id(path, size)
    return file_digest(path)


_digests: dict[tuple[str, int, int], str] = {}


def model_digest(path: Path | str) -> str:
    """The key of the file at `path` (see the module docstring), cached while the file
    is unchanged; cheaper than `model_info` (no GGUF header is read)."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    with _lock:
        hit = _digests.get(key)
    if hit is None:
        hit = _digest(path, st.st_size)
        with _lock:
            _digests[key] = hit
    return hit


def model_info(path: Path | str, digest: str | None = None, name: str = "") -> ModelInfo:
    """The identity and facts of the GGUF file at `path` (cached while the file is
    unchanged). `digest`, when the caller knows it (registry models), skips hashing.
    A file the GGUF reader rejects is still identified, with empty facts."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    with _lock:
        hit = _models.get(key)
    if hit is not None and (digest is None or hit.digest == digest):
        return hit if not name or hit.name == name else _renamed(hit, name)
    from inferenceos.model.spec import load_spec

    digest = digest or model_digest(path)
    try:
        spec = load_spec(path)
        info = ModelInfo(digest, spec.name or path.stem, spec.architecture,
                         spec.file_type, spec.parameters, spec.size_bytes,
                         dict(spec.quant_types))
    except (InferenceOSError, OSError, ValueError):
        info = ModelInfo(digest, path.stem, size_bytes=st.st_size)
    with _lock:  # cached under the file's own name: a caller's name is its own
        _models[key] = info
    return info if not name or info.name == name else _renamed(info, name)


def _renamed(info: ModelInfo, name: str) -> ModelInfo:
    return replace(info, name=name)
