"""The disk's random read rate (hardware/disk.py) and where the figure goes."""

from __future__ import annotations

import os
from pathlib import Path

from inferenceos.hardware.bandwidth import measure_disk_read
from inferenceos.hardware.disk import RANDOM_BLOCK, drop_cached, measure_random_read
from inferenceos.plan.devices import Overrides, apply_overrides, machine_from_profile_json


def test_random_read_reads_whole_blocks_each_once(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(64 * RANDOM_BLOCK))
    drop_cached(path)
    gbps, n = measure_random_read(path, budget_s=5.0)
    assert gbps > 0 and n == 64 * RANDOM_BLOCK  # every block, none twice


def test_random_read_stops_at_its_budget(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(256 * RANDOM_BLOCK))
    _, n = measure_random_read(path, budget_s=0.0)
    assert n == RANDOM_BLOCK  # one read, then the budget is spent


def test_the_disk_test_reports_sequential_and_random(tmp_path: Path) -> None:
    r = measure_disk_read(tmp_path, file_bytes=16 << 20)
    assert r.gbps > 0 and r.random_gbps is not None and r.random_gbps > 0
    assert not list(tmp_path.iterdir())  # its file is gone


def test_the_machine_carries_the_random_figure_and_an_override_replaces_it() -> None:
    data = {"cpu": {"usable_threads": 2}, "memory": {"usable_bytes": 1 << 30},
            "bandwidth": {"disk_read_gbps": 0.65, "disk_random_read_gbps": 0.2}}
    m = machine_from_profile_json(data)
    assert m.disk_gbps == 0.65 and m.disk_random_gbps == 0.2
    assert not any(n.startswith("disk bandwidth") for n in m.notes)
    o = apply_overrides(m, Overrides(disk_gbps=2.0))
    assert o.disk_gbps == 2.0 and o.disk_random_gbps is None
