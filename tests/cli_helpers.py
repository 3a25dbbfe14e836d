"""Run the real `inferenceos` command in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"


def cli_env(**extra: str) -> dict[str, str]:
    """The test process's environment (with its INFERENCEOS_HOME) plus `src` on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run_cli(
    *args: str, input: str | None = None, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `python -m inferenceos ARGS...` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "inferenceos", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(**env),
    )


def run_main(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """Run the console entry point in this process; (exit code, stdout, stderr)."""
    from inferenceos.cli.main import main

    monkeypatch.setattr(sys, "argv", ["inferenceos", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
