"""`inferenceos telemetry`, `stats` and `logs` as a user runs them, after real runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import cli_env, run_cli, run_main


def _run(model: Path) -> None:
    r = run_cli("run", str(model), "-p", "hi", "-n", "3", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr


def _stats_runs() -> int:
    r = run_cli("stats", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["runs"] == sum(m["runs"] for m in data["models"])
    return int(data["runs"])


def test_three_runs_show_in_stats_and_survive_export_reset_import(
        tiny_llama: Path, tmp_path: Path) -> None:
    for _ in range(3):
        _run(tiny_llama)
    r = run_cli("stats", "--json")
    data = json.loads(r.stdout)
    assert data["runs"] == 3
    (model,) = data["models"]
    assert model["model"] == "tiny-llama" and model["sources"] == {"run": 3}
    assert model["decode_tps"]["p50"] > 0 and model["ttft_ms"]["p90"] > 0
    table = run_cli("stats")
    assert table.returncode == 0 and "tiny-llama" in table.stdout

    export = tmp_path / "knowledge.json"
    r = run_cli("telemetry", "export", str(export))
    assert r.returncode == 0, r.stderr
    assert "generations 3" in r.stdout
    r = run_cli("telemetry", "reset", "--yes")
    assert r.returncode == 0 and "deleted" in r.stdout
    assert _stats_runs() == 0
    r = run_cli("telemetry", "import", str(export))
    assert r.returncode == 0 and "generations 3" in r.stdout, r.stderr
    assert _stats_runs() == 3
    r = run_cli("telemetry", "import", str(export))  # twice: nothing new
    assert "generations 0" in r.stdout and _stats_runs() == 3


def test_off_and_on(tiny_llama: Path, capsys: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_main(["telemetry", "--off"], capsys, monkeypatch)
    assert code == 0 and "telemetry off" in out
    code, out, _ = run_main(["telemetry", "--json"], capsys, monkeypatch)
    status = json.loads(out)
    assert status["enabled"] is False and status["enabled_from"] == "file"
    _run(tiny_llama)
    assert _stats_runs() == 0
    code, out, _ = run_main(["telemetry", "--on"], capsys, monkeypatch)
    assert code == 0 and "telemetry on" in out
    _run(tiny_llama)
    assert _stats_runs() == 1
    code, out, _ = run_main(["telemetry"], capsys, monkeypatch)
    assert "telemetry: on" in out and "generations 1" in out
    code, _, err = run_main(["telemetry", "--off", "--on"], capsys, monkeypatch)
    assert code == 2 and "exclude" in err


def test_bad_import_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run_main(["telemetry", "import", str(bad)], capsys, monkeypatch)
    assert code == 2 and "not a telemetry export" in err and len(err.strip().splitlines()) == 1
    r = run_cli("telemetry", "reset", input="n\n")
    assert r.returncode == 1 and "nothing changed" in r.stdout


def test_logs_show_levels_and_follow(tiny_llama: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_main(["logs"], capsys, monkeypatch)
    assert code == 0 and "no log yet" in err
    follower = subprocess.Popen([sys.executable, "-m", "inferenceos", "logs", "-f"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=cli_env())
    try:
        time.sleep(1.0)
        _run(tiny_llama)
        deadline = time.monotonic() + 30
        assert follower.stdout is not None
        line = ""
        while time.monotonic() < deadline:
            line = follower.stdout.readline()
            if "inferenceos.run" in line:
                break
        assert " INFO " in line and "cli[" in line and "generated 3 tok" in line
    finally:
        follower.terminate()
        follower.wait(10)
    code, out, _ = run_main(["logs", "-n", "5"], capsys, monkeypatch)
    assert code == 0 and "INFO" in out and "inferenceos.run" in out
    code, out, _ = run_main(["logs", "--level", "warning"], capsys, monkeypatch)
    assert code == 0 and "inferenceos.run" not in out
    code, _, err = run_main(["logs", "--level", "loud"], capsys, monkeypatch)
    assert code == 2 and "unknown level" in err


def test_stats_model_takes_the_name_the_model_ran_under(tiny_llama: Path) -> None:
    """`stats --model NAME` found nothing for a model run as NAME: runs record the
    file's own name (its GGUF header's), or NAME:latest through the server."""
    assert run_cli("pull", str(tiny_llama), "--name", "mytiny").returncode == 0
    r = run_cli("run", "mytiny", "-p", "hi", "-n", "3", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    for name in ("mytiny", "mytiny:latest", "MyTiny", "tiny-llama", str(tiny_llama)):
        r = run_cli("stats", "--model", name, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["runs"] == 1, name
    r = run_cli("stats", "--model", "mytiny")
    assert r.returncode == 0 and "tiny-llama" in r.stdout
    r = run_cli("stats", "--model", "other")
    assert r.returncode == 0 and "no runs recorded for 'other'" in r.stdout
