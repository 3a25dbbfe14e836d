"""Measured bandwidths: RAM streaming read, sequential and random disk read.

RAM: every usable thread streams its own numpy buffer (first touched by a pool thread)
through `max()`, a reduction numpy runs with the GIL released and SIMD-wide, so it is
memory-bound, not compute-bound (it reaches ~50 GB/s per core from L2). The buffers
together are at least 1.5 x L3 (and 256 MiB). The test runs many short passes within a
time budget and reports the 90th percentile: noise from other processes only slows a
pass down and short passes often escape it, while the percentile (not the maximum)
ignores the odd pass that still found its data in a cache. Each thread times its own read,
so a pass counts as fast only if every thread was fast; threads that did not overlap in
time would overstate a bus-limited machine, which short passes make unlikely.

Disk: a temporary file in the measured directory is written, fsync'ed and dropped from
the page cache with posix_fadvise(DONTNEED); mincore() confirms the drop. It is then
read sequentially with ordinary reads (kernel read-ahead on, as when a model is loaded).
If the drop did not take (tmpfs, some network filesystems) O_DIRECT is tried; failing
that the figure is flagged `cached`, i.e. probably RAM speed. The same file, dropped
again, is then read in 64 KiB blocks at shuffled offsets (hardware/disk.py): the rate
weights streamed through mmap page faults are read at.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from inferenceos.hardware.disk import drop_cached, measure_random_read
from inferenceos.hardware.profile import Bandwidth

MIB = 1 << 20
RAM_BUDGET_S = 0.35
RAM_SLICE = 16 * MIB
DISK_FILE_BYTES = 128 * MIB
DISK_CHUNK = 8 * MIB


class RamResult(NamedTuple):
    gbps: float
    threads: int
    buffer_bytes: int


class DiskResult(NamedTuple):
    gbps: float
    method: str  # fadvise | o_direct | cached
    fs_type: str | None
    file_bytes: int
    random_gbps: float | None = None  # 64 KiB reads at shuffled offsets (hardware/disk.py)


def ram_buffer_bytes(l3_bytes: int, usable_ram: int) -> int:
    """Total buffer for the RAM test: max(256 MiB, 1.5 x L3), at most 768 MiB and 1/8 of
    usable RAM (never below 32 MiB)."""
    want = max(256 * MIB, int(1.5 * l3_bytes))
    cap = min(768 * MIB, usable_ram // 8) if usable_ram else 768 * MIB
    return max(32 * MIB, min(want, cap))


def measure_ram_read(threads: int, buffer_bytes: int, budget_s: float = RAM_BUDGET_S,
                     min_passes: int = 8, max_passes: int = 400) -> RamResult:
    """Streaming-read rate in GB/s: the 90th percentile of short passes run within
    `budget_s` seconds.

    Each thread owns `buffer_bytes / threads`, cut into RAM_SLICE pieces read in turn
    (a piece was last read a whole buffer ago, so it is out of the caches). In a pass
    every thread reads one piece and times itself; the pass rate is
    threads x piece / slowest thread's time, which leaves out thread-pool dispatch.
    """
    import numpy as np

    threads = max(1, threads)
    part = max(RAM_SLICE, buffer_bytes // threads // RAM_SLICE * RAM_SLICE)
    n_slices = part // RAM_SLICE

    def alloc(_: int) -> Any:
        buf = np.empty(part, dtype=np.uint8)
        buf.fill(1)  # first touch by a pool thread, so pages sit near the readers
        return buf

    def read(job: tuple[Any, int]) -> float:
        buf, offset = job
        t0 = time.perf_counter()
        buf[offset:offset + RAM_SLICE].max()
        return time.perf_counter() - t0

    rates: list[float] = []
    with ThreadPoolExecutor(threads) as pool:
        bufs = list(pool.map(alloc, range(threads)))
        start = time.perf_counter()
        while len(rates) < max_passes and (len(rates) < min_passes or
                                           time.perf_counter() - start < budget_s):
            offset = (len(rates) % n_slices) * RAM_SLICE
            slowest = max(pool.map(read, [(b, offset) for b in bufs]))
            rates.append(threads * RAM_SLICE / max(slowest, 1e-9) / 1e9)
    rates.sort()
    return RamResult(round(rates[int(0.9 * (len(rates) - 1))], 2), threads, part * threads)


def measure_disk_read(directory: Path, file_bytes: int = DISK_FILE_BYTES) -> DiskResult:
    """Sequential read rate of a fresh file in `directory` (which must be writable)."""
    path = directory / f".inferenceos-bw-{os.getpid()}.tmp"
    try:
        _write_file(path, file_bytes)
        method = "fadvise"
        if _resident_fraction(path) > 0.1:
            method = "o_direct" if hasattr(os, "O_DIRECT") else "cached"
        try:
            seconds, n = _timed_read(path, direct=method == "o_direct")
        except OSError:  # O_DIRECT refused (EINVAL on tmpfs and others)
            method = "cached"
            seconds, n = _timed_read(path, direct=False)
        drop_cached(path)  # the sequential pass cached it: random reads start cold again
        rnd, _ = measure_random_read(path, direct=method == "o_direct")
        return DiskResult(round(n / seconds / 1e9, 3), method, filesystem_type(directory), n,
                          rnd)
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def _write_file(path: Path, size: int) -> None:
    """Write `size` incompressible bytes, fsync, then drop them from the page cache."""
    block = os.urandom(DISK_CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(max(1, size // DISK_CHUNK)):
            os.write(fd, block)
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _timed_read(path: Path, direct: bool) -> tuple[float, int]:
    """(seconds, bytes) to read the whole file in DISK_CHUNK pieces."""
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    buf = mmap.mmap(-1, DISK_CHUNK)  # page-aligned, as O_DIRECT requires
    fd = os.open(path, flags)
    try:
        total, start = 0, time.perf_counter()
        while (n := os.readv(fd, [buf])) > 0:
            total += n
        return max(time.perf_counter() - start, 1e-6), total
    finally:
        os.close(fd)
        buf.close()


def _resident_fraction(path: Path) -> float:
    """Share of the file's pages in the page cache (mincore); 1.0 when unknown."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return 1.0
    libc = ctypes.CDLL(libc_name, use_errno=True)
    size = path.stat().st_size
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
    # A private (copy-on-write) mapping is writable, so ctypes can take its address;
    # untouched, its pages are the file's page-cache pages.
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        anchor = ctypes.c_char.from_buffer(mm)
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
        del anchor  # release the export before the mapping closes
    if rc != 0:
        return 1.0
    return sum(b & 1 for b in vec) / len(vec)


def filesystem_type(path: Path) -> str | None:
    """The filesystem type of the mount holding `path`, from /proc/mounts."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target = str(path.resolve())
    best: tuple[str, str | None] = ("", None)
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3:
            mnt = fields[1].replace("\\040", " ")
            if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and \
                    len(mnt) >= len(best[0]):
                best = (mnt, fields[2])
    return best[1]


def measurable_dir(models_dir: Path) -> Path | None:
    """`models_dir` (created if missing), else its nearest existing writable ancestor."""
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        return models_dir if os.access(models_dir, os.W_OK) else None
    except OSError:
        pass
    for parent in models_dir.parents:
        if parent.is_dir():
            return parent if os.access(parent, os.W_OK) else None
    return None


def measure_all(threads: int, l3_bytes: int, usable_ram: int, models_dir: Path,
                warnings: list[str]) -> Bandwidth:
    """RAM and disk figures; a failing part adds a warning and stays None."""
    start = time.perf_counter()
    ram: RamResult | None = None
    disk: DiskResult | None = None
    try:
        ram = measure_ram_read(threads, ram_buffer_bytes(l3_bytes, usable_ram))
    except (MemoryError, ImportError, OSError) as exc:
        warnings.append(f"bandwidth: RAM read test failed: {exc}")
    target = measurable_dir(models_dir)
    if target is None:
        warnings.append(f"bandwidth: {models_dir} is not writable; disk read not measured")
    else:
        try:
            disk = measure_disk_read(target)
        except OSError as exc:
            warnings.append(f"bandwidth: disk read test in {target} failed: {exc.strerror}")
    if disk is not None and disk.method == "cached":
        warnings.append(f"bandwidth: could not keep the page cache out of the disk test in "
                        f"{target} ({disk.fs_type}); the figure may be RAM speed")
    return Bandwidth(
        ram_read_gbps=ram.gbps if ram else None, ram_threads=ram.threads if ram else 0,
        ram_buffer_bytes=ram.buffer_bytes if ram else 0,
        disk_read_gbps=disk.gbps if disk else None,
        disk_random_read_gbps=disk.random_gbps if disk else None,
        disk_path=str(target) if disk else None, disk_method=disk.method if disk else None,
        disk_fs=disk.fs_type if disk else None, disk_bytes=disk.file_bytes if disk else 0,
        seconds=round(time.perf_counter() - start, 3),
    )
