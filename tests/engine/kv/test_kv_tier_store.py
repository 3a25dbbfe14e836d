"""The tiered KV store (engine/kv/store.py, engine/kv/entry.py) on its own: real files, real
processes, a real tmpfs; the state bytes are opaque to it, so random bytes stand in
for llama.cpp's (tests/engine/kv/test_kv_tier_engine.py restores real ones)."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferenceos.engine.kv.entry import (
    SUFFIX,
    EntryError,
    is_temporary,
    read_meta,
    read_state,
    write_entry,
)
from inferenceos.engine.kv.store import KVStore, entry_id

KEY = "k" * 32
MiB = 1 << 20


def toks(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def state(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def store(root: Path | None, ram: int = 64 * MiB, disk: int = 64 * MiB, **kw: Any) -> KVStore:
    return KVStore(KEY, root, ram, disk, **kw)


def files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(f"*{SUFFIX}") if not is_temporary(p.name))


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob(f"*{SUFFIX}") if p.exists())


# -- the entry file ------------------------------------------------------------------------


def test_an_entry_round_trips_and_any_damage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "e.kv"
    data = state(10_000)
    size = write_entry(path, KEY, toks(50), data, cost_s=0.5)
    assert size == path.stat().st_size
    meta = read_meta(path, KEY)
    assert meta.tokens.tolist() == toks(50) and meta.cost_s == 0.5
    assert read_state(meta) == data
    with pytest.raises(EntryError, match="another model"):
        read_meta(path, "x" * 32)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF  # one flipped bit in the state
    path.write_bytes(bytes(raw))
    with pytest.raises(EntryError, match="checksum"):
        read_state(read_meta(path, KEY))
    path.write_bytes(bytes(raw[: len(raw) // 2]))  # cut in half
    with pytest.raises(EntryError, match="truncated"):
        read_meta(path, KEY)
    path.write_bytes(b"GGUF" + bytes(100))  # not ours at all
    with pytest.raises(EntryError, match="not an InferenceOS"):
        read_meta(path, KEY)


# -- lookup ---------------------------------------------------------------------------------


def test_lookup_finds_the_longest_cached_prefix_and_never_the_last_token(tmp_path: Path) -> None:
    s = store(tmp_path, disk=0)
    s.put(toks(100), state(1000, 1), 0.1)
    s.put(toks(40, start=5000), state(1000, 2), 0.1)
    s.put(toks(60), state(1000, 3), 0.1)  # a prefix of the first (put later: both kept)
    prompt = [*toks(80), 9, 9]
    hit = s.lookup(prompt)
    assert hit is not None and hit.n == 80 and hit.entry.n_tokens == 100
    exact = s.lookup(toks(100))  # the whole entry: all but the last prompt token
    assert exact is not None and exact.n == 99
    assert s.lookup([1, 2, 3, *toks(70)]) is None  # no shared prefix
    assert s.lookup(toks(90), at_least=85) is None  # not min_gain better than the slot's
    assert s.counters["misses"] == 1  # the slot's own prefix was as good: no miss


def test_without_partial_restores_only_whole_entries_match(tmp_path: Path) -> None:
    s = store(tmp_path, disk=0, partial=False)
    s.put(toks(100), state(1000), 0.1)
    assert s.lookup([*toks(80), 7, 7]) is None
    hit = s.lookup([*toks(100), 7, 7])
    assert hit is not None and hit.n == 100


def test_an_entry_it_extends_is_superseded(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.put(toks(50), state(500, 1), 0.1)
    s.flush()
    s.put(toks(90), state(900, 2), 0.1)
    s.flush()
    assert [e.n_tokens for e in s.entries.values()] == [90]
    assert len(files(tmp_path)) == 1
    assert ram_counted(s)


def test_a_prefix_two_conversations_share_is_kept(tmp_path: Path) -> None:
    """Superseded longest first: turn 2 of a conversation forgets turn 1 and the shared
    system prompt only where no other conversation extends it."""
    s = store(tmp_path, disk=0)
    system = toks(40)
    s.put([*system, *toks(20, start=500)], state(600, 2), 0.1)  # conversation A, turn 1
    s.put([*system, *toks(20, start=900)], state(600, 3), 0.1)  # conversation B, turn 1
    s.put(system, state(400, 1), 0.1)  # their branch point (KVStore.branch_point)
    assert sorted(e.n_tokens for e in s.entries.values()) == [40, 60, 60]
    s.put([*system, *toks(20, start=500), *toks(30, start=700)], state(900, 4), 0.1)
    assert sorted(e.n_tokens for e in s.entries.values()) == [40, 60, 90]  # A's turn 1 gone
    assert ram_counted(s)


def ram_counted(s: KVStore) -> bool:
    """The store's running count of RAM bytes equals those its entries hold."""
    return s._ram_used == sum(e.nbytes for e in s.entries.values() if e.data is not None)


# -- tiers and restarts --------------------------------------------------------------------


def test_a_new_process_finds_the_disk_tier_and_the_bytes_match(tmp_path: Path) -> None:
    a = store(tmp_path)
    data = state(200_000)
    a.put(toks(300), data, 0.3)
    a.close()
    b = store(tmp_path)  # a restarted server
    hit = b.lookup([*toks(300), 1])
    assert hit is not None and hit.tier == "disk" and hit.n == 300
    assert b.fetch(hit) == data
    assert b.counters["hits_disk"] == 1 and b.counters["restored_tokens_disk"] == 300


def test_ram_only_and_disk_only_and_nothing(tmp_path: Path) -> None:
    ram_only = store(None, disk=0)
    assert ram_only.put(toks(30), state(100), 0.1) is not None
    assert ram_only.lookup([*toks(30), 1]) is not None
    disk_only = store(tmp_path, ram=0)
    disk_only.put(toks(30), state(100), 0.1)
    disk_only.flush()
    e = next(iter(disk_only.entries.values()))
    assert e.data is None and e.disk is not None  # spilled, then dropped from RAM
    hit = disk_only.lookup([*toks(30), 1])
    assert hit is not None and disk_only.fetch(hit) == state(100)
    zero = store(tmp_path / "z", ram=0, disk=0)  # a budget of 0: no cache at all
    assert zero.put(toks(30), state(100), 0.1) is None
    assert zero.lookup([*toks(30), 1]) is None
    assert not (tmp_path / "z").exists()


def test_ram_evicts_by_value_and_spills_before_dropping(tmp_path: Path) -> None:
    s = store(tmp_path, ram=3 * MiB)
    cheap = s.put(toks(20, start=1), state(MiB, 1), cost_s=0.001)
    dear = s.put(toks(2000, start=10_000), state(MiB, 2), cost_s=2.0)
    s.flush()
    assert cheap is not None and dear is not None
    s.put(toks(500, start=50_000), state(MiB, 3), cost_s=0.5)
    s.put(toks(500, start=90_000), state(MiB, 4), cost_s=0.5)
    s.flush()
    assert dear.data is not None  # the dear one stays in RAM
    assert cheap.data is None and cheap.disk is not None  # the cheap one spilled to disk
    assert s.stats()["ram_bytes"] <= 3 * MiB and ram_counted(s)


def test_the_disk_tier_never_grows_past_its_budget(tmp_path: Path) -> None:
    budget = 5 * MiB
    s = store(tmp_path, ram=0, disk=budget)
    seen = []
    for i in range(12):
        s.put(toks(100 + i, start=1000 * i), state(MiB, i), cost_s=0.01 * (i + 1))
        s.flush()
        seen.append(disk_bytes(tmp_path))
    assert max(seen) <= budget
    assert s.counters["evicted_disk"] > 0
    for p in files(tmp_path):  # whatever is left is whole
        read_state(read_meta(p, KEY))
    too_big = s.put(toks(50, start=7), state(6 * MiB), 1.0)  # larger than the budget
    assert too_big is None


# -- faults ---------------------------------------------------------------------------------


def _damage(path: Path, how: str) -> None:
    raw = path.read_bytes()
    if how == "corrupt":
        path.write_bytes(raw[:-10] + bytes(b ^ 0x55 for b in raw[-10:]))
    elif how == "truncated":
        path.write_bytes(raw[: len(raw) - 7])
    elif how == "torn":
        path.write_bytes(raw[:40])


@pytest.mark.parametrize("how", ["corrupt", "truncated", "torn"])
def test_a_damaged_entry_is_dropped_with_one_warning_and_never_restored(
        tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    a = store(tmp_path)
    a.put(toks(200), state(50_000), 0.2)
    a.close()
    (path,) = files(tmp_path)
    _damage(path, how)
    caplog.set_level(logging.WARNING, "inferenceos.kv_cache")
    b = store(tmp_path)
    hit = b.lookup([*toks(200), 1])
    if hit is not None:  # the header still reads (corrupt state): the checksum catches it
        assert b.fetch(hit) is None
    assert not path.exists()
    warnings = [r for r in caplog.records if r.name == "inferenceos.kv_cache"]
    assert len(warnings) == 1 and path.name in warnings[0].getMessage()
    assert b.lookup([*toks(200), 1]) is None


def test_a_foreign_entry_is_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    other = KVStore("o" * 32, tmp_path, MiB, MiB)
    other.put(toks(100), state(1000), 0.1)
    other.close()
    (path,) = files(tmp_path)
    (tmp_path / KEY).mkdir()
    planted = tmp_path / KEY / f"{entry_id(KEY, np.asarray(toks(100)))}{SUFFIX}"
    path.rename(planted)  # another model's state under our key and a valid name
    caplog.set_level(logging.WARNING, "inferenceos.kv_cache")
    s = store(tmp_path)
    assert s.lookup([*toks(100), 1]) is None and not planted.exists()
    assert "another model" in caplog.text


_KILLED_WRITER = """
import sys, numpy as np
from pathlib import Path
from inferenceos.engine.kv.store import KVStore
s = KVStore("k" * 32, Path(sys.argv[1]), 0, 1 << 40)
s.put(list(range(100, 400)), np.ones(400 << 20, dtype=np.uint8).tobytes(), 1.0)
s.flush(600)
"""


def test_a_writer_killed_mid_entry_leaves_nothing_that_is_read(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)])
    deadline = time.monotonic() + 60
    tmp = None
    while time.monotonic() < deadline and tmp is None:
        tmp = next((p for p in tmp_path.rglob(".tmp-*") if p.stat().st_size > MiB), None)
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert tmp is not None, "the writer never started its temporary file"
    s = store(tmp_path, ram=0, disk=8 * MiB)
    assert s.lookup([*list(range(100, 400)), 1]) is None and not s.entries
    s.put(toks(50), state(1000), 0.1)  # the next write (under the lock) clears it
    s.flush()
    assert not tmp.exists()
    assert len(files(tmp_path)) == 1


def _hammer(root: str, seed: int, budget: int) -> None:
    s = KVStore(KEY, Path(root), 0, budget)
    for i in range(15):
        s.put(toks(100, start=seed * 100_000 + i * 1000), state(MiB, seed * 100 + i), 0.01)
        s.flush()
    s.close()


def test_two_processes_on_one_data_dir_stay_within_budget_and_whole(tmp_path: Path) -> None:
    budget = 6 * MiB
    stop = threading.Event()
    peak = [0]

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], sum(
                    p.stat().st_size for p in tmp_path.rglob(f"*{SUFFIX}") if p.exists()))
            time.sleep(0.002)

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), k, budget)) for k in (1, 2)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    stop.set()
    watcher.join()
    assert all(p.exitcode == 0 for p in procs)
    assert peak[0] <= budget + MiB // 8  # a renamed file and a stat racing, at most
    assert files(tmp_path)
    for path in files(tmp_path):
        read_state(read_meta(path, KEY))
    fresh = store(tmp_path, ram=0, disk=budget)
    assert fresh.entries and fresh.stats()["disk_bytes"] <= budget


def test_disk_full_degrades_to_ram_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)],
                        capture_output=True).returncode
    if rc != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        caplog.set_level(logging.WARNING, "inferenceos.kv_cache")
        s = store(mnt, ram=16 * MiB, disk=1 << 30)  # the budget says yes, the disk says no
        e = s.put(toks(100), state(2 * MiB), 0.5)
        s.flush()
        assert e is not None and e.data is not None and e.disk is None
        assert s.counters["write_errors"] == 1 and not s.stats()["disk_ok"]
        assert "disk full" in caplog.text
        hit = s.lookup([*toks(100), 1])
        assert hit is not None and hit.tier == "ram" and s.fetch(hit) == state(2 * MiB)
        assert not [p for p in mnt.rglob("*") if p.is_file() and p.name != ".lock"]
        s.close()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
