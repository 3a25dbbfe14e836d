"""Run the real `inferenceos` command in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
