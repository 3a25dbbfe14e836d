"""The TOML configuration: defaults, file, env overrides, validation, the CLI."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cli_helpers import run_main as run_cli
from inferenceos.config import (
    SETTINGS,
    ConfigError,
    config_path,
    load_config,
    parse_value,
    read_file,
    set_value,
    to_toml,
    unset_value,
)


def test_defaults_without_a_file() -> None:
    cfg = load_config()
    assert cfg.get("server.host") == "127.0.0.1" and cfg.get("server.port") == 11434
    assert cfg.get("run.threads") == 0 and cfg.get("run.n_ctx") == 0
    assert cfg.models_dir.name == "models" and "ios-home" in str(cfg.models_dir)
    assert set(cfg.sources.values()) == {"default"}


def test_set_writes_toml_and_env_overrides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set_value("server.port", "8080") == 8080
    assert set_value("hardware.measure_bandwidth", "off") is False
    assert "[server]\nport = 8080" in config_path().read_text()
    assert load_config().source("server.port") == "file"
    monkeypatch.setenv("INFERENCEOS_SERVER_PORT", "9000")
    cfg = load_config()
    assert cfg.get("server.port") == 9000 and cfg.source("server.port") == "env"
    assert unset_value("server.port") and not unset_value("server.port")
    assert read_file() == {"hardware.measure_bandwidth": False}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("server.prot", "1", "did you mean 'server.port'"),
        ("server.port", "99999", "must be between 1 and 65535"),
        ("server.port", "eighty", "expected int"),
        ("run.threads", "-1", "must be between 0"),
        ("hardware.measure_bandwidth", "maybe", "expected true/false"),
        ("server.host", "two words", "host name"),
        ("update.index_url", "ftp://x", "http"),
    ],
)
def test_bad_keys_and_values_are_rejected_clearly(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        set_value(key, value)
    assert not config_path().exists()


def test_bad_file_contents_are_rejected_with_the_path() -> None:
    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text("[server]\nport = true\n")
    with pytest.raises(ConfigError, match=r"server\.port = True from .*config\.toml: expected int"):
        load_config()
    config_path().write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config()
    config_path().write_text("[serve]\nport = 1\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'serve\.port'"):
        load_config()


def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERENCEOS_RUN_N_CTX", "lots")
    with pytest.raises(ConfigError, match="env INFERENCEOS_RUN_N_CTX"):
        load_config()


def test_toml_round_trip_of_every_default() -> None:
    defaults = {k: s.default for k, s in SETTINGS.items()}
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_toml({**defaults, "server.api_key": 'quote " and \\ back'}))
    assert read_file() == {**defaults, "server.api_key": 'quote " and \\ back'}
    assert parse_value("update.timeout_s", "2") == 2.0


def test_config_cli_show_get_set_unset(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_cli(["config", "set", "run.threads", "4"], capsys, monkeypatch)[0] == 0
    code, out, _ = run_cli(["config", "get", "run.threads"], capsys, monkeypatch)
    assert (code, out.strip()) == (0, "4")
    code, out, _ = run_cli(["config", "show", "--json"], capsys, monkeypatch)
    assert '"run.threads": 4' in out and '"run.threads": "file"' in out
    code, out, _ = run_cli(["config"], capsys, monkeypatch)
    assert code == 0 and "server.port" in out
    code, _, err = run_cli(["config", "set", "server.port", "0"], capsys, monkeypatch)
    assert code == 2 and "error: server.port = 0" in err and len(err.strip().splitlines()) == 1
    assert run_cli(["config", "unset", "run.threads"], capsys, monkeypatch)[0] == 0
    assert run_cli(["config", "path"], capsys, monkeypatch)[1].strip() == str(config_path())


def _editor(tmp_path: Path, content: str) -> str:
    script = tmp_path / "fake-editor"
    script.write_text(f"#!/bin/sh\ncat > \"$1\" <<'EOF'\n{content}EOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_config_edit_saves_only_valid_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.setenv("EDITOR", _editor(tmp_path, "[server]\nport = 8888\n"))
    assert run_cli(["config", "edit"], capsys, monkeypatch)[0] == 0
    assert load_config().get("server.port") == 8888
    monkeypatch.setenv("EDITOR", _editor(tmp_path, "[server]\nport = 'x'\n"))
    code, _, err = run_cli(["config", "edit"], capsys, monkeypatch)
    assert code == 2 and "config unchanged, your edit is kept in" in err
    assert load_config().get("server.port") == 8888
    drafts = [p for p in os.listdir(config_path().parent) if p.startswith("config.")]
    assert len(drafts) == 2  # config.toml and the kept draft
