"""What the disk tier holds: the entry files under a data dir's KV root and their sizes,
listed again only where something changed.

The disk budget covers every key's folder under the root, and each write must know the
bytes in use (engine/kv/store.py, `KVStore._make_room`). Listing and stat-ing every file
per write cost 1.2 ms at 100 entries and 12 ms at 1,000 (a server that has finished a
few thousand short replies): O(entries) per reply, on a thread that shares the cores
with the compute. Entry files never change once renamed into place, so a folder whose
mtime is the one seen at its last listing holds the same files: one stat per folder.

A kernel timestamp comes from a coarse clock, so a file added in the same tick as a
listing could leave the mtime as it was. So the listing stamps the folder itself, under
the root lock, before it reads it: its mtime set 1 ns back (`os.utime`), a value no
later change can give, since every change sets the clock's time, at least the old
mtime. Any process's change (a write, an eviction, `cache rm`) then moves the mtime, and
the listing is as exact across processes as a full one taken under the same lock. A
folder that cannot be stamped (not ours, read-only) is listed every time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from inferenceos.engine.kv.entry import SUFFIX, is_temporary


@dataclass
class _Folder:
    mtime_ns: int  # the mtime the listing saw; -1: list again
    files: dict[Path, int] = field(default_factory=dict)  # entry file -> bytes
    total: int = 0  # the files' bytes

    def __post_init__(self) -> None:
        self.total = sum(self.files.values())


class DiskListing:
    """The entry files under `root`, by folder, for a caller that holds the root lock
    (engine/kv/store.py `_locked`) while it reads and changes them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._folders: dict[Path, _Folder] = {}

    def used(self) -> int:
        """Bytes of every entry file under the root, as they are now. Folders whose
        mtime moved are listed again, and dead writers' temporaries found then are
        removed (a live writer holds the root lock while its temporary exists)."""
        try:
            folders = [p for p in self.root.iterdir() if p.is_dir()]
        except OSError:
            folders = []
        self._folders = {f: self._current(f) for f in folders}
        return sum(f.total for f in self._folders.values())

    def files(self) -> list[tuple[Path, int]]:
        """(path, size) of every entry file, as of the last `used()`."""
        return [item for f in self._folders.values() for item in f.files.items()]

    def removed(self, path: Path) -> None:
        """The caller unlinked `path`: forget it, and keep trusting the folder's
        listing when nothing else changed it."""
        folder = self._folders.get(path.parent)
        size = folder.files.pop(path, None) if folder is not None else None
        if folder is not None and size is not None:
            folder.total -= size
            self._restamp(path.parent, folder)

    def added(self, path: Path, size: int) -> None:
        """The caller wrote the entry `path` of `size` bytes (renamed into place)."""
        folder = self._folders.get(path.parent)
        if folder is not None:
            folder.total += size - folder.files.get(path, 0)
            folder.files[path] = size
            self._restamp(path.parent, folder)

    def _current(self, path: Path) -> _Folder:
        """The folder's listing: the one kept when its mtime has not moved."""
        try:
            mtime_ns = path.stat().st_mtime_ns
        except OSError:
            return _Folder(-1)
        kept = self._folders.get(path)
        if kept is not None and kept.mtime_ns == mtime_ns:
            return kept
        stamp = _stamp(path)  # before the listing: a change after it moves the mtime
        return _Folder(stamp, dict(_entry_files(path)))

    def _restamp(self, path: Path, folder: _Folder) -> None:
        """After our own change (under the root lock, so no other writer's), the
        listing we hold is the folder's: stamp it again."""
        if folder.mtime_ns >= 0:
            folder.mtime_ns = _stamp(path)


def _stamp(folder: Path) -> int:
    """Set the folder's mtime 1 ns back and return it (-1 where that fails)."""
    try:
        st = folder.stat()
        stamp = st.st_mtime_ns - 1
        os.utime(folder, ns=(st.st_atime_ns, stamp))
        return stamp if folder.stat().st_mtime_ns == stamp else -1
    except OSError:
        return -1


def _entry_files(folder: Path) -> Iterator[tuple[Path, int]]:
    """(path, size) of the folder's entry files; temporaries are removed."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        path = folder / name
        if is_temporary(name):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if not name.endswith(SUFFIX):
            continue
        try:
            yield path, path.stat().st_size
        except OSError:
            continue
