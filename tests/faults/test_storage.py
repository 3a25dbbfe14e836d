"""The registry database corrupt or locked, a full disk during a pull, a load refused by
preflight for lack of memory. (The telemetry database's faults, locked, read-only,
truncated, garbage, full and a writer killed mid-write, are in
tests/telemetry/test_telemetry_faults.py; an RPC worker vanishing in
tests/cluster/test_cluster_server.py.)
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fake_hub import FakeHub, tiny_gguf
from faults.helpers import generate, ps, tags
from inferenceos.registry import hub_download
from inferenceos.registry.budget import MemoryBudget
from server_harness import Harness, serving

REPO = "TheOrg/Tiny-GGUF"


@pytest.fixture
def two(tiny_llama: Path, tiny_moe: Path, tmp_path: Path) -> Iterator[Harness]:
    """Models a and b in the registry database (copied into its blobs), a loaded."""
    with serving({}, tmp_path) as h:
        h.catalog.store.import_file(tiny_llama, "a")
        h.catalog.store.import_file(tiny_moe, "b")
        assert generate(h, "a").status_code == 200
        yield h


@contextlib.contextmanager
def server_errors() -> Iterator[list[logging.LogRecord]]:
    """Records uvicorn and the server log at ERROR (tracebacks land there)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.ERROR)
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "inferenceos.server")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield records
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


def test_corrupt_registry_is_a_clear_503_and_loaded_models_keep_answering(
        two: Harness) -> None:
    db = two.catalog.store.db_path
    with sqlite3.connect(db) as conn:  # everything in the main file, none in the WAL
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    good = db.read_bytes()
    with server_errors() as errors:
        db.write_bytes(b"this is not a database " * 200)
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        r = httpx.get(two.url + "/api/tags")
        assert r.status_code == 503, r.text
        assert str(db) in r.json()["error"] and "not a database" in r.json()["error"]
        assert generate(two, "a").status_code == 200  # a hot model needs no registry read
        r = httpx.get(two.v1 + "/models")
        assert r.status_code == 503
    assert not errors, [e.getMessage() for e in errors]  # no traceback, no "internal"
    db.write_bytes(good)  # repaired: served again without a restart, nothing lost
    assert tags(two) == ["a:latest", "b:latest"]
    assert generate(two, "b").status_code == 200


def test_locked_registry_waits_then_writes(two: Harness) -> None:
    """Another process's write lock: reads go on (WAL), a write waits for it."""
    db = two.catalog.store.db_path
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(db, timeout=5)
        conn.execute("BEGIN EXCLUSIVE")
        locked.set()
        release.wait(10)
        conn.rollback()
        conn.close()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert locked.wait(10)
    t0 = time.monotonic()
    assert tags(two) == ["a:latest", "b:latest"]
    assert time.monotonic() - t0 < 2  # readers are not blocked
    threading.Timer(1.5, release.set).start()
    t0 = time.monotonic()
    r = httpx.post(two.url + "/api/copy", json={"source": "a", "destination": "a2"},
                   timeout=30)
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 >= 1.0  # it waited for the lock instead of failing
    t.join(10)
    assert tags(two) == ["a2:latest", "a:latest", "b:latest"]
    assert generate(two, "a2").status_code == 200


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    blobs = {"Tiny-Q8_0.gguf": tiny_gguf(tmp_path, "llama", seed=5)}
    h = FakeHub(repos={REPO: blobs}).start()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    yield h
    h.stop()


def test_disk_full_while_pulling(two: Harness, hub: FakeHub,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC on the download's writes (injected: no tmpfs can be mounted here) after
    the first chunk: 503 naming the cause, nothing registered, the other models answer;
    once there is room, the same pull completes, resuming the partial file."""
    full = threading.Event()
    full.set()
    real = hub_download._write
    writes = [0]

    class Full:  # the partial file's handle, whose writes fail as on a full disk
        def write(self, chunk: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def write(out: Any, chunk: bytes) -> None:
        writes[0] += 1
        real(Full() if full.is_set() and writes[0] > 1 else out, chunk)

    monkeypatch.setattr(hub_download, "_write", write)
    name = f"hf.co/{REPO}:Q8_0"
    r = httpx.post(two.url + "/api/pull", json={"model": name, "stream": False}, timeout=60)
    assert r.status_code == 503 and "No space left" in r.json()["error"], r.text
    assert tags(two) == ["a:latest", "b:latest"]  # nothing half-registered
    assert generate(two, "a").status_code == 200
    with httpx.stream("POST", two.url + "/api/pull", json={"model": name}, timeout=60) as s:
        lines = [ln for ln in s.iter_lines() if ln]
    assert "No space left" in lines[-1]  # streamed: the error is the last line
    full.clear()  # room again
    r = httpx.post(two.url + "/api/pull", json={"model": name, "stream": False}, timeout=60)
    assert r.status_code == 200, r.text
    ranges = [g.range for g in hub.gets("Tiny-Q8_0.gguf")]
    assert ranges[-1] is not None and ranges[-1].startswith("bytes=")  # resumed
    assert "hf.co/theorg/tiny-gguf:Q8_0" in tags(two)
    assert generate(two, "hf.co/theorg/tiny-gguf:Q8_0").status_code == 200


def test_load_refused_by_preflight_then_served(two: Harness) -> None:
    """No room for b next to a pinned a: 503 with the figures; a is untouched; once
    the budget allows (no restart) b loads."""
    two.manager.pin("a")
    hot = sum(two.manager.plan_for("a").charge().values())
    old = two.manager.budget
    two.manager.budget = MemoryBudget(total_cap=hot + hot // 8)
    try:
        r = generate(two, "b")
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert "cannot load 'b:latest'" in err and "short by" in err
        assert r.headers.get("retry-after")
        assert ps(two)["a"]["state"] == "hot" and generate(two, "a").status_code == 200
        r = httpx.post(two.v1 + "/chat/completions", timeout=60, json={
            "model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_busy"
    finally:
        two.manager.budget = old
    assert generate(two, "b").status_code == 200
    assert tags(two) == ["a:latest", "b:latest"]


def test_concurrent_first_opens_of_a_new_registry(tmp_path: Path) -> None:
    """Eight threads open a registry that does not exist yet: one runs the migrations,
    the others wait for its lock and find them done (no "table already exists")."""
    from inferenceos.registry.store import ModelStore

    for trial in range(5):
        root = tmp_path / f"store{trial}"
        errors: list[BaseException] = []

        def first_open(root: Path = root, errors: list[BaseException] = errors) -> None:
            try:
                ModelStore(root).list()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=first_open) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors[:2]
