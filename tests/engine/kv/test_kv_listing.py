"""The disk tier's listing (engine/kv/listing.py): one stat per unchanged folder, and
every change seen, another process's in the same clock tick included."""

from __future__ import annotations

import os
from pathlib import Path

from inferenceos.engine.kv.entry import SUFFIX
from inferenceos.engine.kv.listing import DiskListing


def _write(folder: Path, name: str, size: int) -> Path:
    path = folder / f"{name}{SUFFIX}"
    path.write_bytes(b"x" * size)
    return path


def test_a_change_right_after_a_listing_is_seen(tmp_path: Path) -> None:
    """Each file lands within microseconds of the listing before it, in the coarse
    clock's same tick: the mtime alone would not move, the stamp does."""
    folder = tmp_path / "key"
    folder.mkdir()
    listing = DiskListing(tmp_path)
    assert listing.used() == 0
    for i in range(200):
        _write(folder, f"e{i}", 10)  # another process's write
        assert listing.used() == 10 * (i + 1)
    for i in range(200):
        (folder / f"e{i}{SUFFIX}").unlink()  # and its removals
        assert listing.used() == 10 * (199 - i)


def test_a_change_in_the_listings_clock_tick_is_seen(tmp_path: Path) -> None:
    """A kernel with a coarse timestamp clock (before Linux's multigrain timestamps)
    gives a change in the same tick as the folder's last one the same mtime: simulated
    by putting the mtime the listing saw back after the change."""
    folder = tmp_path / "key"
    folder.mkdir()
    _write(folder, "first", 5)
    listing = DiskListing(tmp_path)
    seen = folder.stat().st_mtime_ns
    assert listing.used() == 5
    _write(folder, "second", 6)
    os.utime(folder, ns=(folder.stat().st_atime_ns, seen))
    assert listing.used() == 11


def test_an_unchanged_folder_is_not_listed_again(tmp_path: Path) -> None:
    folder = tmp_path / "key"
    folder.mkdir()
    for i in range(5):
        _write(folder, f"e{i}", 100)
    listing = DiskListing(tmp_path)
    assert listing.used() == 500
    # a file slipped in with the folder's mtime put back: only a new listing sees it
    stamp = folder.stat().st_mtime_ns
    _write(folder, "hidden", 1000)
    os.utime(folder, ns=(folder.stat().st_atime_ns, stamp))
    assert listing.used() == 500
    os.utime(folder, ns=(folder.stat().st_atime_ns, stamp + 1))  # anything that moves it
    assert listing.used() == 1500


def test_our_own_writes_and_removals_keep_the_listing(tmp_path: Path) -> None:
    """What the caller did under the lock is applied to the listing, not listed again,
    and a new key's folder is found."""
    folder = tmp_path / "key"
    folder.mkdir()
    listing = DiskListing(tmp_path)
    listing.used()
    path = _write(folder, "mine", 300)
    listing.added(path, 300)
    stamp = folder.stat().st_mtime_ns
    assert listing.used() == 300 and folder.stat().st_mtime_ns == stamp
    path.unlink()
    listing.removed(path)
    assert listing.used() == 0 and listing.files() == []
    other = tmp_path / "other-key"
    other.mkdir()
    _write(other, "theirs", 40)
    assert listing.used() == 40


def test_dead_writers_temporaries_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "key"
    folder.mkdir()
    (folder / f".tmp-1234{SUFFIX}").write_bytes(b"partial")
    _write(folder, "whole", 7)
    assert DiskListing(tmp_path).used() == 7
    assert [p.name for p in folder.iterdir()] == [f"whole{SUFFIX}"]
