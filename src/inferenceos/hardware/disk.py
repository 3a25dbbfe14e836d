"""Random read rate of a cold file: what weights streamed through mmap are read at.

A model that does not fit in memory is read back through page faults: the kernel reads
each missing range (its read-around window, 128 KiB by default) when a matrix product
touches it, one fault at a time per thread, in an order the page cache's holes decide.
That is a random read of small blocks at a low queue depth, not the sequential
streaming `bandwidth.measure_disk_read` measures. This module times exactly that on the
file the sequential test wrote: 64 KiB blocks at shuffled offsets, each read once (so
none can come from the page cache), readahead off (POSIX_FADV_RANDOM), O_DIRECT when
the sequential test needed it, within a time budget.
"""

from __future__ import annotations

import mmap
import os
import random
import time
from pathlib import Path

RANDOM_BLOCK = 64 * 1024
RANDOM_BUDGET_S = 0.5  # ~1000 reads at 0.1-0.2 GB/s: a stable figure, a short wait


def drop_cached(path: Path) -> None:
    """Drop `path`'s clean pages from the page cache (a no-op where unsupported)."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure_random_read(
    path: Path, direct: bool = False, block: int = RANDOM_BLOCK,
    budget_s: float = RANDOM_BUDGET_S, seed: int = 0,
) -> tuple[float, int]:
    """(GB/s, bytes read) reading `block`-sized pieces of `path` at shuffled offsets,
    each piece once, until the file or `budget_s` runs out. The caller has dropped the
    file from the page cache (or passes `direct` to bypass it)."""
    size = path.stat().st_size
    offsets = list(range(0, size - block + 1, block))
    random.Random(seed).shuffle(offsets)
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT requires
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead
        total, start = 0, time.perf_counter()
        for off in offsets:
            total += os.preadv(fd, [buf], off)
            if time.perf_counter() - start > budget_s:
                break
        seconds = max(time.perf_counter() - start, 1e-6)
    finally:
        os.close(fd)
        buf.close()
    return round(total / seconds / 1e9, 3), total
