"""The tiered KV cache: token-prefix states in host RAM and on disk, below the scheduler.

An entry is the `llama_state_seq_get_data` bytes of one token prefix, in the family of
one key (engine/kv/key.py: model digest + KV layout). The scheduler (scheduler.py) puts an
entry when a sequence ends (the end of a turn) and, before prefilling a prompt, asks
for the longest cached prefix: only the rest is evaluated. Tiers below the context:

- **RAM**: the bytes in this process, within `ram_budget`;
- **disk**: one file per entry under `<root>/<key>/` (engine/kv/entry.py: atomic, checksummed),
  within `disk_budget` over *every* key under `root` (one budget for the data dir).
  Every entry is written through to disk in a background thread, so a worker that dies
  or a server that restarts finds it again (a new store scans its key's folder).

**Eviction by value**: value = recompute cost (tokens x the measured prefill seconds per
token) x (1 + hits) / bytes / (1 + idle seconds / 300). The lowest value goes first; a
RAM entry only leaves RAM once its disk copy is written (it spills before it is
dropped), or is dropped when there is no disk tier.

**Safety**: disk writes hold an `fcntl` lock on `<root>/.lock` while they clean up
dead writers' temporaries, make room and write, so two processes on one data dir never
exceed the budget or remove each other's files mid-write. A file that fails its checks
is dropped with one warning line and the prompt is prefilled; a failed write (disk
full) warns once and leaves the store RAM-only for `DISK_RETRY_S`.

`partial`: whether a prefix shorter than an entry may be restored from it (restore,
then drop the cells past it). True for models whose every layer keeps all its cells
(no sliding window, or `swa_full`); with windowed SWA layers only whole entries match.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inferenceos.engine.kv.entry import (
    SUFFIX,
    EntryError,
    EntryMeta,
    is_temporary,
    read_meta,
    read_state,
    write_entry,
)
from inferenceos.engine.kv.entry_index import EntryIndex, common_count
from inferenceos.engine.kv.listing import DiskListing

log = logging.getLogger("inferenceos.kv_cache")

DISK_RETRY_S = 30.0  # after a failed write, how long the store stays RAM-only
WRITER_NICE = 19  # the disk writer yields the cores to compute (see _yield_cores)
IDLE_HALF_S = 300.0  # idle seconds that halve an entry's value
RAM, DISK = "ram", "disk"


@dataclass
class Entry:
    """One cached prefix and where its bytes are."""

    id: str
    tokens: np.ndarray  # int32
    nbytes: int  # state bytes
    cost_s: float
    data: bytes | None = None  # the RAM tier's copy
    disk: EntryMeta | None = None  # the disk tier's file, once written
    writing: bool = False  # queued for (or being written to) disk
    hits: int = 0
    last_used: float = field(default_factory=time.time)

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    def value(self, now: float) -> float:
        idle = max(0.0, now - self.last_used)
        return self.cost_s * (1 + self.hits) / max(1, self.nbytes) / (1 + idle / IDLE_HALF_S)


@dataclass(frozen=True)
class Hit:
    """The longest cached prefix of a prompt: `n` of its tokens, from `entry`."""

    entry: Entry
    n: int
    tier: str


def entry_id(key: str, tokens: np.ndarray) -> str:
    return hashlib.sha256(key.encode() + tokens.astype("<i4").tobytes()).hexdigest()[:32]


def default_budgets(root: Path) -> tuple[int, int]:
    """(RAM, disk) budgets when none is given: an eighth of the RAM available now (at
    most 1 GiB: the manager charges it to each model as a reservation) and a quarter
    of the free disk under `root` (at most 20 GiB)."""
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        avail = 8 << 30
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        free = 0
    return min(1 << 30, avail // 8), min(20 << 30, free // 4)


class KVStore:
    """The RAM and disk tiers of one key's entries (see the module docstring)."""

    def __init__(self, key: str, root: Path | None, ram_budget: int, disk_budget: int,
                 partial: bool = True, min_tokens: int = 16, min_gain: int = 8) -> None:
        self.key, self.partial = key, partial
        self.ram_budget, self.disk_budget = max(0, ram_budget), max(0, disk_budget)
        self.min_tokens, self.min_gain = min_tokens, min_gain
        self.root = root if root is not None and self.disk_budget > 0 else None
        self.dir = self.root / key if self.root is not None else None
        self._listing = DiskListing(self.root) if self.root is not None else None
        # by id, and grouped by their first tokens for the prefix questions
        self.entries: EntryIndex[Entry] = EntryIndex(min(min_gain, min_tokens))
        self._lock = threading.RLock()
        self._ram_used = 0  # bytes of the RAM copies held (`_keep`, `_release`)
        self._dir_stamp = -1
        self._disk_off_until = 0.0
        self.counters: dict[str, int] = {
            "hits_ram": 0, "hits_disk": 0, "hits_hot": 0, "misses": 0,
            "restored_tokens_ram": 0, "restored_tokens_disk": 0, "restored_tokens_hot": 0,
            "restored_bytes_ram": 0, "restored_bytes_disk": 0, "writes": 0,
            "write_errors": 0, "dropped": 0, "evicted_ram": 0, "evicted_disk": 0}
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        if self.dir is not None:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                log.warning("KV cache: no disk tier (%s: %s)", self.dir, exc.strerror)
                self.root = self.dir = None
        if self.dir is not None:
            self._scan()
            self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                            name="kv-disk-writer")
            self._writer.start()

    # -- lookup and restore -------------------------------------------------------------

    def lookup(self, prompt: list[int], at_least: int = 0) -> Hit | None:
        """The entry holding the longest prefix of `prompt[:-1]` (the last token is
        always evaluated), if it beats `at_least` tokens by `min_gain`; None counts a
        miss. Entries written by other processes since the last look are indexed."""
        limit = len(prompt) - 1
        if limit < max(self.min_tokens, at_least + self.min_gain):
            return None
        p = np.asarray(prompt[:limit], dtype=np.int64)
        hit = self._best(p, at_least)
        if hit is None and self._rescan_needed():
            self._scan()
            hit = self._best(p, at_least)
        if hit is None:
            self.counters["misses"] += 1
        return hit

    def _best(self, p: np.ndarray, at_least: int) -> Hit | None:
        best: Hit | None = None
        with self._lock:
            # with partial hits the longest common prefix is a neighbour's (entry_index)
            near = self.entries.neighbours(p) if self.partial else self.entries.candidates(p)
            for e in near:
                n = min(e.n_tokens, p.size)
                if n <= at_least + self.min_gain - 1 or (best is not None and n <= best.n):
                    continue
                common = common_count(e.tokens, p, n)
                if common < e.n_tokens and not self.partial:
                    continue
                if common >= at_least + self.min_gain and (best is None or common > best.n):
                    best = Hit(e, common, RAM if e.data is not None else DISK)
        return best

    def fetch(self, hit: Hit) -> bytes | None:
        """The hit's state bytes (RAM, else the verified disk file); None when the entry
        turned out unusable (dropped, with one warning line) or vanished."""
        e = hit.entry
        data = e.data
        tier = RAM
        if data is None:
            meta, tier = e.disk, DISK
            if meta is None:
                return None
            try:
                data = read_state(meta)
            except EntryError as exc:
                self.drop(e, str(exc), quiet=not meta.path.exists())
                return None
        with self._lock:
            e.hits += 1
            e.last_used = time.time()
            self.counters[f"hits_{tier}"] += 1
            self.counters[f"restored_tokens_{tier}"] += hit.n
            self.counters[f"restored_bytes_{tier}"] += len(data)
        if tier == DISK and e.disk is not None:
            with contextlib.suppress(OSError):  # recency for other processes' eviction
                os.utime(e.disk.path)
        return data

    def count_hot(self, n_tokens: int) -> None:
        """A prefix reused from the context itself (the hot tier)."""
        self.counters["hits_hot"] += 1
        self.counters["restored_tokens_hot"] += n_tokens

    def drop(self, e: Entry, why: str, quiet: bool = False) -> None:
        """Forget `e` in both tiers (a file that failed its checks, llama.cpp refused)."""
        with self._lock:
            self.entries.pop(e.id, None)
            self._release(e)
            self.counters["dropped"] += 1
        if e.disk is not None:
            if not quiet:
                log.warning("KV cache: dropped %s (%s); the prompt is prefilled",
                            e.disk.path.name, why)
            with contextlib.suppress(OSError):
                e.disk.path.unlink()
        elif not quiet:
            log.warning("KV cache: dropped an entry of %d tokens (%s)", e.n_tokens, why)

    # -- put ---------------------------------------------------------------------------

    def put(self, tokens: list[int], data: bytes, cost_s: float) -> Entry | None:
        """Keep the state `data` of `tokens` (RAM within budget; written through to
        disk). Entries it extends are superseded (with `partial`, it serves all they
        did). None when too short to be worth it or no tier can hold it."""
        if len(tokens) < self.min_tokens or not data:
            return None
        arr = np.asarray(tokens, dtype=np.int32)
        eid = entry_id(self.key, arr)
        with self._lock:
            old = self.entries.get(eid)
            if old is not None:
                old.last_used = time.time()
                if old.data is None and len(data) <= self.ram_budget:
                    self._keep(old, data)
                    self._fit_ram()
                return old
            disk = self._disk_ready() and len(data) <= self.disk_budget
            if len(data) > self.ram_budget and not disk:
                return None
            e = Entry(eid, arr, len(data), cost_s, writing=disk)
            self._keep(e, data)
            if self.partial:
                self._supersede(arr)
            self.entries[eid] = e
        if disk:
            self._queue.put(eid)
        self._fit_ram()
        return e

    def branch_point(self, prompt: list[int]) -> int:
        """Where `prompt[:-1]` and an entry go on differently after a common prefix:
        the longest such prefix, when it holds `min_tokens` or more and no entry holds
        exactly it; else 0. Conversations that share a system prompt (few-shot
        examples, tool definitions) part there, so an entry of that prefix serves all
        of them: on windowed-attention models, where only whole entries restore, it is
        the only way they share it."""
        p = np.asarray(prompt[:-1], dtype=np.int32)
        best = 0
        with self._lock:
            for e in self.entries.candidates(p):
                n = min(e.n_tokens, p.size)
                if n <= best:
                    continue
                common = common_count(e.tokens, p, n)
                if best < common < n:  # both go on, differently
                    best = common
            if best < self.min_tokens or entry_id(self.key, p[:best]) in self.entries:
                return 0
        return best

    def _supersede(self, arr: np.ndarray) -> None:
        """Forget the entries `arr` extends (earlier turns of its conversation), except
        a prefix that another entry extends too: a shared one (see branch_point)."""
        for old in self.entries.prefixes(arr, self.min_tokens):  # longest first
            if old.writing or self.entries.extended(old):
                continue
            self._release(old)
            self.entries.pop(old.id)
            if old.disk is not None:
                with contextlib.suppress(OSError):
                    old.disk.path.unlink()

    def _keep(self, e: Entry, data: bytes) -> None:
        """Give `e` its RAM copy `data` (under the lock), counted in `_ram_used`."""
        if e.data is None:
            self._ram_used += e.nbytes
        e.data = data

    def _release(self, e: Entry) -> None:
        """Drop `e`'s RAM copy (under the lock), counted in `_ram_used`."""
        if e.data is not None:
            self._ram_used -= e.nbytes
            e.data = None

    def _fit_ram(self) -> None:
        """Drop the least valuable RAM copies until RAM is within budget; an entry not
        yet on disk keeps its bytes until the writer is done (it spills first). Within
        budget it costs nothing: the bytes held are counted as they change."""
        with self._lock:
            if self._ram_used <= self.ram_budget:
                return
            now = time.time()
            held = [e for e in self.entries.values() if e.data is not None]
            for e in sorted(held, key=lambda x: x.value(now)):
                if self._ram_used <= self.ram_budget:
                    break
                if e.writing:
                    continue
                self._release(e)
                self.counters["evicted_ram"] += 1
                if e.disk is None:
                    self.entries.pop(e.id, None)

    # -- the disk tier -------------------------------------------------------------------

    def _disk_ready(self) -> bool:
        return self.dir is not None and time.monotonic() >= self._disk_off_until

    def _rescan_needed(self) -> bool:
        """Whether the folder changed since the index last saw all of it. Our own
        writes (under the root lock, `_write`) keep it current: without that, each
        reply's write made the next prompt's miss list and scan the whole folder (0.4-0.9
        ms at the admission of each request, a few hundred entries; issue 44)."""
        if self.dir is None:
            return False
        stamp = self._folder_mtime()
        return stamp >= 0 and stamp != self._dir_stamp

    def _folder_mtime(self) -> int:
        """The key folder's mtime (ns); -1 when it cannot be read."""
        try:
            return os.stat(self.dir).st_mtime_ns if self.dir is not None else -1
        except OSError:
            return -1

    def _scan(self) -> None:
        """Index this key's files (another process's, or a previous run's); files that
        fail their checks are dropped with a warning."""
        assert self.dir is not None
        try:
            self._dir_stamp = os.stat(self.dir).st_mtime_ns
            names = os.listdir(self.dir)
        except OSError:
            return
        with self._lock:
            known = {e.disk.path.name for e in self.entries.values() if e.disk is not None}
        for name in names:
            if not name.endswith(SUFFIX) or is_temporary(name) or name in known:
                continue
            path = self.dir / name
            try:
                meta = read_meta(path, self.key)
            except EntryError as exc:
                if path.exists():
                    log.warning("KV cache: dropped %s (%s)", name, exc)
                    with contextlib.suppress(OSError):
                        path.unlink()
                continue
            eid = name[: -len(SUFFIX)]
            if eid != entry_id(self.key, meta.tokens):
                log.warning("KV cache: dropped %s (its name does not match its tokens)", name)
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            with self._lock:
                e = self.entries.get(eid)
                if e is None:
                    mtime = _mtime(path)
                    self.entries[eid] = Entry(eid, meta.tokens, meta.state_bytes, meta.cost_s,
                                              disk=meta, last_used=mtime)
                elif e.disk is None and not e.writing:
                    e.disk = meta

    def _write_loop(self) -> None:
        _yield_cores()
        while (eid := self._queue.get()) is not None:
            try:
                self._write(eid)
            except Exception as exc:  # never let the writer die: the store goes RAM-only
                log.warning("KV cache: disk write failed (%r)", exc)
            finally:
                self._queue.task_done()

    def _write(self, eid: str) -> None:
        with self._lock:
            e = self.entries.get(eid)
            data = e.data if e is not None else None
        if e is None or data is None or not self._disk_ready():
            if e is not None:
                self._done_writing(e, None)
            return
        assert self.dir is not None and self.root is not None
        path = self.dir / f"{eid}{SUFFIX}"
        meta = None
        try:
            with _locked(self.root):
                seen_all = self._folder_mtime() == self._dir_stamp
                if self._make_room(e.nbytes + 4 * e.n_tokens + 4096, exclude=path):
                    write_entry(path, self.key, e.tokens, data, e.cost_s)
                    meta = read_meta(path, self.key)  # the header as written (its crc)
                    self._listing.added(path, meta.file_bytes)  # type: ignore[union-attr]
                    self.counters["writes"] += 1
                if seen_all:  # only our own changes since: the index still knows them all
                    self._dir_stamp = self._folder_mtime()
        except OSError as exc:
            self.counters["write_errors"] += 1
            self._disk_off_until = time.monotonic() + DISK_RETRY_S
            why = "disk full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
            log.warning("KV cache: cannot write to %s (%s); RAM only for %.0f s",
                        self.dir, why, DISK_RETRY_S)
        except EntryError as exc:
            log.warning("KV cache: an entry did not read back (%s)", exc)
            meta = None
        self._done_writing(e, meta)

    def _done_writing(self, e: Entry, meta: EntryMeta | None) -> None:
        with self._lock:
            e.writing = False
            e.disk = meta
            if meta is None and len(e.data or b"") > self.ram_budget:
                self.entries.pop(e.id, None)  # neither tier can keep it
                self._release(e)
        self._fit_ram()

    def _make_room(self, need: int, exclude: Path) -> bool:
        """Under the root lock: remove dead writers' temporaries, then the least
        valuable files (any key) until `need` more bytes fit the disk budget."""
        if need > self.disk_budget:
            return False
        assert self._listing is not None
        used = self._listing.used()
        if used + need <= self.disk_budget:
            return True
        files = self._listing.files()
        now = time.time()
        with self._lock:
            own = {e.disk.path: e for e in self.entries.values() if e.disk is not None}
        ranked = []
        for path, size in files:
            if path == exclude:
                continue
            e = own.get(path)
            ranked.append((e.value(now) if e is not None else _file_value(path, size, now),
                           path, size, e))
        for _, path, size, e in sorted(ranked, key=lambda r: r[0]):
            if used + need <= self.disk_budget:
                break
            with contextlib.suppress(OSError):
                path.unlink()
            self._listing.removed(path)
            used -= size
            self.counters["evicted_disk"] += 1
            if e is not None:
                with self._lock:
                    e.disk = None
                    if e.data is None:
                        self.entries.pop(e.id, None)
        return used + need <= self.disk_budget

    # -- reporting and shutdown -----------------------------------------------------------

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued disk write is done (True) or `timeout` passed."""
        end = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.005)
        return not self._queue.unfinished_tasks

    def stats(self) -> dict[str, Any]:
        with self._lock:
            es = list(self.entries.values())
        return {
            "key": self.key, "entries": len(es),
            "ram_entries": sum(e.data is not None for e in es),
            "disk_entries": sum(e.disk is not None for e in es),
            "ram_bytes": sum(e.nbytes for e in es if e.data is not None),
            "disk_bytes": sum(e.disk.file_bytes for e in es if e.disk is not None),
            "ram_budget": self.ram_budget, "disk_budget": self.disk_budget if self.dir else 0,
            "pending_writes": int(self._queue.unfinished_tasks),
            "disk_ok": self._disk_ready(), "partial": self.partial, **self.counters,
            **self._by_tier(es),
        }

    @staticmethod
    def _by_tier(es: list[Entry]) -> dict[str, int]:
        """bytes_<tier> / entries_<tier>, as /metrics labels them."""
        ram = [e for e in es if e.data is not None]
        disk = [e for e in es if e.disk is not None]
        return {"bytes_ram": sum(e.nbytes for e in ram), "entries_ram": len(ram),
                "bytes_disk": sum(e.disk.file_bytes for e in disk if e.disk is not None),
                "entries_disk": len(disk)}

    def close(self, timeout: float = 30.0) -> None:
        """Finish the queued disk writes (up to `timeout`), then stop the writer."""
        if self._writer is not None:
            self.flush(timeout)
            self._queue.put(None)
            self._writer.join(1.0)
            self._writer = None


def _yield_cores() -> None:
    """Lower the calling thread's CPU priority (Linux: per thread): its CRC and copies
    then take the cores only when llama.cpp's compute threads leave them. At normal
    priority, writing one 4,000-token entry beside a prefill step made that step ~30 %
    slower on a 2-core machine (llama.cpp's threads wait for the slowest of them)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _file_value(path: Path, size: int, now: float) -> float:
    """`Entry.value` of another process's (or key's) file, from its header and mtime
    (hits touch it); a file that is not a valid entry is worth nothing."""
    try:
        cost = read_meta(path).cost_s
    except EntryError:
        return 0.0
    return cost / max(1, size) / (1 + max(0.0, now - _mtime(path)) / IDLE_HALF_S)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """An exclusive `fcntl` lock on `<root>/.lock` (between processes and threads)."""
    import fcntl

    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def disk_usage(root: Path) -> dict[str, dict[str, int]]:
    """Per key folder under `root`: {"entries", "tokens", "bytes"} of its valid entries
    (for `cache list`; files that are not valid entries are not counted)."""
    out: dict[str, dict[str, int]] = {}
    for path, size in _listed(root):
        try:
            meta = read_meta(path, path.parent.name)
        except EntryError:
            continue
        row = out.setdefault(path.parent.name, {"entries": 0, "tokens": 0, "bytes": 0})
        row["entries"] += 1
        row["tokens"] += meta.n_tokens
        row["bytes"] += size
    return out


def clear_disk(root: Path) -> int:
    """Delete every entry (and dead writer's temporary) under `root`, holding the root
    lock so no writer is mid-entry; running servers see the files gone as misses.
    Returns the bytes freed."""
    if not root.is_dir():
        return 0
    freed = 0
    with _locked(root):
        for path, size in _listed(root, temporaries=True):
            with contextlib.suppress(OSError):
                path.unlink()
                freed += size
    return freed


def _listed(root: Path, temporaries: bool = False) -> Iterator[tuple[Path, int]]:
    """(path, size) of the entry files under `root` (and temporaries, when asked),
    without touching anything."""
    try:
        folders = [p for p in root.iterdir() if p.is_dir()]
    except OSError:
        return
    for folder in folders:
        with contextlib.suppress(OSError):
            for path in folder.iterdir():
                if path.name.endswith(SUFFIX) and (temporaries or not is_temporary(path.name)):
                    with contextlib.suppress(OSError):
                        yield path, path.stat().st_size
