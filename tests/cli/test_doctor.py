"""`inferenceos doctor`: passes on this machine, fails usefully when things break."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest

from cli_helpers import run_main as run_cli
from inferenceos.cli.doctor_cmd import run_checks
from inferenceos.paths import data_dir


def checks() -> dict[str, dict[str, str]]:
    return {r.name: {"status": r.status, "detail": r.detail, "fix": r.fix} for r in run_checks()}


@pytest.fixture
def free_port(monkeypatch: pytest.MonkeyPatch) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("INFERENCEOS_SERVER_PORT", str(port))
    return port


def test_doctor_passes_here(
    free_port: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run_cli(["doctor", "--json"], capsys, monkeypatch)
    data = json.loads(out)
    failed = [c for c in data["checks"] if c["status"] == "fail"]
    assert code == 0 and data["ok"] and not failed, failed
    names = [c["name"] for c in data["checks"]]
    assert names == [
        "config",
        "llama.cpp",
        "GPU backend",
        "GPU driver",
        "hardware probe",
        "default model",
        "models dir",
        "database",
        "server port",
    ]
    code, out, _ = run_cli(["doctor"], capsys, monkeypatch)
    assert code == 0 and "0 failed" in out


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod 0555")
def test_read_only_models_dir_fails(
    tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "ro-models"
    models.mkdir()
    models.chmod(0o555)
    monkeypatch.setenv("INFERENCEOS_MODELS_DIR", str(models))
    try:
        result = checks()["models dir"]
    finally:
        models.chmod(0o755)
    assert result["status"] == "fail" and "not writable" in result["detail"]
    assert "config set models.dir" in result["fix"]


def test_immutable_models_dir_fails_even_for_root(
    tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`chattr +i` makes a directory read-only for root too (ext4, xfs, btrfs)."""
    models = tmp_path / "immutable-models"
    models.mkdir()
    if (
        not shutil.which("chattr")
        or subprocess.run(["chattr", "+i", str(models)], capture_output=True).returncode != 0
    ):
        pytest.skip("chattr +i not possible here (not root, or filesystem without it)")
    monkeypatch.setenv("INFERENCEOS_MODELS_DIR", str(models))
    try:
        result = checks()["models dir"]
    finally:
        subprocess.run(["chattr", "-i", str(models)], check=True)
    assert result["status"] == "fail" and f"{models} is not writable" in result["detail"]
    assert "config set models.dir" in result["fix"]


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs procfs")
def test_models_dir_on_a_read_only_filesystem_fails(
    free_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # procfs refuses new files even to root: a read-only place on every Linux box
    monkeypatch.setenv("INFERENCEOS_MODELS_DIR", "/proc/inferenceos-models")
    code, _, _ = run_cli(["doctor"], capsys, monkeypatch)
    assert code == 1
    result = checks()["models dir"]
    assert result["status"] == "fail"
    assert "/proc/inferenceos-models cannot be created" in result["detail"]


def test_models_dir_that_is_a_file_fails(
    tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models").write_text("oops")
    monkeypatch.setenv("INFERENCEOS_MODELS_DIR", str(tmp_path / "models"))
    result = checks()["models dir"]
    assert result["status"] == "fail" and "not a directory" in result["detail"]


def test_garbage_database_file_fails(
    free_port: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = data_dir() / "telemetry.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.write_bytes(os.urandom(8192))
    code, out, _ = run_cli(["doctor", "--json"], capsys, monkeypatch)
    result = next(c for c in json.loads(out)["checks"] if c["name"] == "database")
    assert code == 1 and result["status"] == "fail"
    assert "not a database" in result["detail"] and "mv " in result["fix"]


def test_damaged_database_pages_fail_integrity_check(free_port: int) -> None:
    db = data_dir() / "telemetry.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, note TEXT)")
        conn.execute("CREATE INDEX runs_note ON runs(note)")
        conn.executemany(
            "INSERT INTO runs (note) VALUES (?)", [(f"run {i}" * 20,) for i in range(2000)]
        )
    conn.close()
    raw = bytearray(db.read_bytes())
    page = 4096
    raw[5 * page : 5 * page + 512] = os.urandom(512)  # scribble over a b-tree page
    db.write_bytes(bytes(raw))
    result = checks()["database"]
    assert result["status"] == "fail", result


def test_healthy_database_passes(free_port: int) -> None:
    db = data_dir() / "telemetry.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    assert checks()["database"]["status"] == "pass"


def test_port_in_use_warns_with_a_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        monkeypatch.setenv("INFERENCEOS_SERVER_PORT", str(s.getsockname()[1]))
        result = checks()["server port"]
    assert result["status"] == "warn" and "in use" in result["detail"]
    assert "config set server.port" in result["fix"]


def test_bad_config_fails_but_other_checks_still_run(free_port: int) -> None:
    from inferenceos.config import config_path

    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text("[server]\nport = 'x'\n")
    results = checks()
    assert results["config"]["status"] == "fail" and "expected int" in results["config"]["detail"]
    assert results["llama.cpp"]["status"] in ("pass", "fail") and len(results) == 9
