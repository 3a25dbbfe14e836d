"""`inferenceos models ...` and `inferenceos ps`, run as a user would."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import run_cli


def test_models_pull_list_show_cp_rm(tiny_llama: Path) -> None:
    r = run_cli("models", "pull", str(tiny_llama), "--name", "tiny")
    assert r.returncode == 0, r.stderr
    assert "tiny:latest" in r.stdout
    assert run_cli("models", "cp", "tiny", "tiny:copy").returncode == 0
    listed = json.loads(run_cli("models", "list", "--json").stdout)
    assert [m["name"] for m in listed] == ["tiny:copy", "tiny:latest"]
    shown = json.loads(run_cli("models", "show", "tiny", "--json").stdout)
    assert shown["architecture"] == "llama" and Path(shown["path"]).is_file()
    assert run_cli("models", "rm", "tiny", "tiny:copy").returncode == 0
    assert json.loads(run_cli("models", "list", "--json").stdout) == []


def test_models_errors_are_one_line() -> None:
    r = run_cli("models", "pull", "llama3:70b")
    assert r.returncode == 1 and "not from Ollama's library" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_cli("models", "show", "../../etc/passwd")
    assert r.returncode == 2 and "invalid model name" in r.stderr


def test_ps_without_a_server() -> None:
    r = run_cli("ps", "--port", "9")
    assert r.returncode == 1 and "no InferenceOS server" in r.stderr


def test_registry_names_work_where_paths_do(tiny_llama: Path) -> None:
    """After a pull, the name works for run, inspect and simulate like the path does."""
    assert run_cli("models", "pull", str(tiny_llama), "--name", "tiny").returncode == 0
    r = run_cli("simulate", "tiny", "--json", "--prompt-tokens", "64")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["feasible"]
    r = run_cli("run", "tiny", "-p", "ab", "-n", "3", "--json", "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["completion_tokens"] >= 1
    assert run_cli("inspect", "tiny").returncode == 0
    r = run_cli("run", "no-such-model", "-p", "ab")
    assert r.returncode != 0 and "not found" in r.stderr and "Traceback" not in r.stderr
