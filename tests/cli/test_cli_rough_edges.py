"""Issue 15's rough edges: JSON on failure for every --json command, impossible option
values, `--version`, `config KEY VALUE`, `ps --api-key`, and Ollama replies without nulls."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli_helpers import run_cli, run_main
from server_harness import serving


def _broken_config() -> None:
    cfg = Path(os.environ["INFERENCEOS_HOME"]) / "config" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text("server = [\n")


def _json_error(args: list[str], capsys: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch) -> dict:
    code, out, _ = run_main(args, capsys, monkeypatch)
    assert code != 0, args
    data = json.loads(out)  # stdout is JSON, nothing else
    assert isinstance(data, dict) and data["error"] and data["type"], data
    return data


@pytest.mark.parametrize("args", [
    ["run", "/no/such.gguf", "-p", "hi", "--json"],
    ["inspect", "/no/such.gguf", "--json"],
    ["simulate", "/no/such.gguf", "--json"],
    ["placement", "/no/such.gguf", "--json"],
    ["models", "show", "no-such-model", "--json"],
])
def test_missing_model_fails_in_json(args: list[str], capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert _json_error(args, capsys, monkeypatch)["type"] == "ModelNotFoundError"


@pytest.mark.parametrize("args", [
    ["hardware", "--json"], ["models", "list", "--json"], ["update", "--json"],
    ["config", "show", "--json"], ["ps", "--json"],
])
def test_bad_config_fails_in_json(args: list[str], capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _broken_config()
    data = _json_error(args, capsys, monkeypatch)
    assert data["type"] == "ConfigError" and "not valid TOML" in data["error"]


@pytest.mark.parametrize("args", [
    ["version", "--json", "--bogus"], ["cache", "list", "--json", "--bogus"],
    ["plugins", "--json", "--bogus"], ["run", "--json", "--threads", "abc"],
])
def test_usage_errors_fail_in_json(args: list[str], capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_main(args, capsys, monkeypatch)
    data = json.loads(out)
    assert code == 2 and data["type"] == "UsageError"


def test_doctor_json_failure_is_still_its_report(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _broken_config()
    code, out, _ = run_main(["doctor", "--json"], capsys, monkeypatch)
    data = json.loads(out)
    assert code == 1 and data["ok"] is False
    assert next(c for c in data["checks"] if c["name"] == "config")["status"] == "fail"


def test_ps_without_server_fails_in_json(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    data = _json_error(["ps", "--port", "9", "--json"], capsys, monkeypatch)
    assert "no InferenceOS server" in data["error"]


def test_without_json_errors_stay_one_line_on_stderr(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run_main(["inspect", "/no/such.gguf"], capsys, monkeypatch)
    assert code == 1 and out == "" and err.startswith("error:") and err.count("\n") == 1
    # `--json` after `--` is an argument, not the option
    code, out, _ = run_main(["inspect", "--", "--json"], capsys, monkeypatch)
    assert code != 0 and not out.startswith("{")


@pytest.mark.parametrize("args,needle", [
    (["run", "--threads", "-1", "-p", "x"], "-1 is negative"),
    (["run", "--threads", "100000", "-p", "x"], "logical CPUs"),
    (["run", "--batch", "-1", "-p", "x"], "--batch"),
    (["run", "--ctx", "-5", "-p", "x"], "--ctx"),
    (["serve", "--threads", "100000"], "logical CPUs"),
    (["serve", "--parallel", "0"], "--parallel"),
    (["serve", "--ctx", "-1"], "--ctx"),
    (["chat", "--threads", "-3"], "-3 is negative"),
])
def test_impossible_values_are_refused(args: list[str], needle: str,
                                       capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_main(args, capsys, monkeypatch)
    assert code == 2 and needle in err and "Traceback" not in err
    if args[0] == "run":  # the one of these with --json
        code, out, _ = run_main([*args, "--json"], capsys, monkeypatch)
        assert code == 2 and needle in json.loads(out)["error"]


def test_version_flag() -> None:
    from inferenceos import __version__

    for flag in ("--version", "-V"):
        r = run_cli(flag)
        assert r.returncode == 0 and r.stdout.strip() == f"inferenceos {__version__}"


def test_config_key_value_shorthand(capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_main(["config", "server.port", "8089"], capsys, monkeypatch)
    assert code == 0 and "server.port = 8089" in out
    code, out, _ = run_main(["config", "server.port"], capsys, monkeypatch)
    assert code == 0 and out.strip() == "8089"
    code, _, err = run_main(["config", "server.prot", "1"], capsys, monkeypatch)
    assert code == 2 and "did you mean 'server.port'" in err
    code, _, err = run_main(["config", "server.port", "99999999"], capsys, monkeypatch)
    assert code == 2 and "between" in err
    code, out, _ = run_main(["config", "get", "server.port"], capsys, monkeypatch)
    assert out.strip() == "8089"  # the long forms still work


def test_ps_api_key_flag_and_401_hint(tiny_llama: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from inferenceos.server.settings import ServerSettings

    with serving({"tiny": tiny_llama}, tmp_path, settings=ServerSettings(api_key="s3cret")) as h:
        port = str(h.port)
        code, _, err = run_main(["ps", "--port", port], capsys, monkeypatch)
        assert code == 1 and "401" in err and "--api-key" in err
        code, _, err = run_main(["ps", "--port", port, "--api-key", "wrong"], capsys,
                                monkeypatch)
        assert code == 1 and "wrong API key" in err
        code, out, _ = run_main(["ps", "--port", port, "--api-key", "s3cret", "--json"],
                                capsys, monkeypatch)
        assert code == 0 and "models" in json.loads(out)


def _nulls(value: object, path: str = "") -> list[str]:
    if isinstance(value, dict):
        return [p for k, v in value.items()
                for p in ([f"{path}{k}"] if v is None else _nulls(v, f"{path}{k}."))]
    if isinstance(value, list):
        return [p for v in value for p in _nulls(v, f"{path}[].")]
    return []


def test_ollama_replies_carry_no_nulls(tiny_llama: Path, tmp_path: Path) -> None:
    """Raw HTTP, as Ollama's stricter clients read it: no field is `null`."""
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        opts = {"num_predict": 3}
        for path, body in (
            ("/api/generate", {"model": "tiny", "prompt": "hi", "stream": False,
                               "options": opts}),
            ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                           "stream": False, "options": opts}),
            ("/api/generate", {"model": "tiny", "prompt": "", "stream": False}),  # a load
            ("/api/chat", {"model": "tiny", "messages": [], "stream": False}),
        ):
            r = httpx.post(h.url + path, json=body, timeout=60)
            assert r.status_code == 200, r.text
            data = r.json()
            assert _nulls(data) == [], (path, data)
            assert data["done"] is True
        r = httpx.post(h.url + "/api/chat", json={"model": "tiny", "stream": False,
                       "messages": [{"role": "user", "content": "hi"}], "options": opts})
        assert set(r.json()["message"]) == {"role", "content"}


def _json_commands() -> list[list[str]]:
    """Every command (and subcommand) that has a --json option, as argv prefixes."""
    import typer.main

    from inferenceos.cli.main import app

    found: list[list[str]] = []

    def walk(cmd: Any, path: list[str]) -> None:
        if hasattr(cmd, "list_commands"):  # a group: Click's API (the CLI loads lazily)
            ctx = typer.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), [*path, name])
        if any("--json" in getattr(p, "opts", ()) for p in getattr(cmd, "params", ())):
            found.append(path)

    walk(typer.main.get_command(app), [])
    return found


JSON_COMMANDS = _json_commands()


def test_json_commands_are_found() -> None:
    assert len(JSON_COMMANDS) >= 12 and ["run"] in JSON_COMMANDS


@pytest.mark.parametrize("path", JSON_COMMANDS, ids=" ".join)
def test_every_json_command_fails_in_json(path: list[str], capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A usage error on any --json command, present or future, is a JSON object."""
    code, out, _ = run_main([*path, "--json", "--no-such-option"], capsys, monkeypatch)
    assert code == 2 and json.loads(out)["type"] == "UsageError"
