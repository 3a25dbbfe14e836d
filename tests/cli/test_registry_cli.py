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


def test_models_search_takes_several_words(tiny_llama: Path) -> None:
    """`models search qwen 1.5b` was a usage error; only the quoted form worked."""
    assert run_cli("models", "pull", str(tiny_llama), "--name",
                   "qwen2.5-coder-1.5b-instruct").returncode == 0
    assert run_cli("models", "pull", str(tiny_llama), "--name", "qwen2.5-0.5b").returncode == 0
    for words in (["qwen", "1.5b"], ["qwen 1.5b"]):
        r = run_cli("models", "search", *words, "--json")
        assert r.returncode == 0, r.stderr
        assert [m["name"] for m in json.loads(r.stdout)] == ["qwen2.5-coder-1.5b-instruct:latest"]
    r = run_cli("models", "search", "qwen", "7b")
    assert r.returncode == 1 and "no registered model matches 'qwen 7b'" in r.stderr


def test_a_mistyped_name_gets_did_you_mean(tiny_llama: Path) -> None:
    assert run_cli("models", "pull", str(tiny_llama), "--name", "qwen-coder").returncode == 0
    for args in (["run", "qwen-codr", "-p", "ab"], ["models", "show", "qwen-codr"],
                 ["rm", "qwen-codr"], ["simulate", "qwen-codr"]):
        r = run_cli(*args)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (args, r.stderr)
        assert "did you mean 'qwen-coder:latest'?" in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    r = run_cli("run", "zzzzzz", "-p", "ab")  # nothing close: no suggestion
    assert r.returncode == 1 and "did you mean" not in r.stderr


def test_close_names_prefers_prefixes_then_difflib() -> None:
    from inferenceos.registry.names import close_names, did_you_mean

    names = ["qwen2.5-coder-0.5b-instruct:latest", "gemma3-270m:latest", "tiny:q8",
             "tiny:latest"]
    assert close_names("qwen", names) == ["qwen2.5-coder-0.5b-instruct:latest"]
    assert close_names("gema3-270m", names) == ["gemma3-270m:latest"]
    assert close_names("tiny:q4", names)[0] == "tiny:q8"
    assert close_names("zzzz", names) == [] and did_you_mean("zzzz", names) == ""
    assert did_you_mean("tin", ["tiny:latest", "tiny:q8"]) == (
        "; did you mean 'tiny:latest' or 'tiny:q8'?")
