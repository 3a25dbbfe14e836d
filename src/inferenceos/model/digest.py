"""sha256 of model files, streamed, and cached by (path, mtime, size).

Hashing a 30 GB model takes minutes; the cache makes the second `inspect` instant. The
cache key changes whenever the file is rewritten (mtime or size), so a stale digest is
never reported for a modified file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from inferenceos.atomic import read_json, write_json_atomic
from inferenceos.paths import cache_dir

_CHUNK = 4 * 1024 * 1024


def sha256_file(path: Path) -> str:
    """Stream `path` through sha256 in 4 MiB chunks (constant memory)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _cache_file() -> Path:
    return cache_dir() / "digests.json"


def file_digest(path: Path) -> str:
    """The sha256 hex digest of `path`, from the cache when the file is unchanged."""
    path = path.resolve()
    st = path.stat()
    key = str(path)
    cache = read_json(_cache_file(), {})
    if not isinstance(cache, dict):
        cache = {}
    hit = cache.get(key)
    if (
        isinstance(hit, dict)
        and hit.get("mtime_ns") == st.st_mtime_ns
        and hit.get("size") == st.st_size
    ):
        return str(hit["sha256"])
    digest = sha256_file(path)
    cache[key] = {"mtime_ns": st.st_mtime_ns, "size": st.st_size, "sha256": digest}
    write_json_atomic(_cache_file(), cache)
    return digest
