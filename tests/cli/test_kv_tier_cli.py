"""`inferenceos cache list|clean` shows and empties the KV cache's disk tier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from inferenceos.engine.kv.store import KVStore
from inferenceos.paths import data_dir


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferenceos", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_cache_list_counts_entries_per_key_and_clean_empties_the_tier() -> None:
    root = data_dir() / "kv-cache"
    for key, n in (("a" * 32, 3), ("b" * 32, 1)):
        s = KVStore(key, root, 0, 1 << 30)
        for i in range(n):
            s.put(list(range(1000 * i, 1000 * i + 40)), np.ones(5000, np.uint8).tobytes(), 0.1)
        s.close()
    (root / ("a" * 32) / "junk.kv").write_bytes(b"not an entry")  # not counted as one
    listed = _cli("cache", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    kv = json.loads(listed.stdout)["kv-cache"]
    assert kv["keys"] == {"a" * 32: {"entries": 3, "tokens": 120, "bytes": kv["keys"]["a" * 32]
                                     ["bytes"]}, "b" * 32: {"entries": 1, "tokens": 40,
                                                            "bytes": kv["keys"]["b" * 32]["bytes"]}}
    assert kv["keys"]["a" * 32]["bytes"] > 3 * 5000
    table = _cli("cache", "list")
    assert "KV cache (disk tier)" in table.stdout and "a" * 32 in table.stdout
    kept = _cli("cache", "clean", "kv-cache", stdin="n\n")
    assert kept.returncode == 1 and len(list(root.rglob("*.kv"))) == 5
    cleaned = _cli("cache", "clean", "kv-cache", "--yes")
    assert cleaned.returncode == 0 and "kv-cache:" in cleaned.stdout
    assert not list(root.rglob("*.kv"))
    assert KVStore("a" * 32, root, 0, 1 << 30).lookup(list(range(41))) is None


def test_a_root_that_does_not_exist_lists_as_empty(tmp_path: Path) -> None:
    from inferenceos.engine.kv.store import clear_disk, disk_usage

    assert disk_usage(tmp_path / "none") == {} and clear_disk(tmp_path / "none") == 0
