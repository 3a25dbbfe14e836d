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


def start_serve(*args: str, **env: str) -> tuple[subprocess.Popen[str], str]:
    """`inferenceos serve ARGS` on a free loopback port, started and answering /health
    (within 60 s, else the test fails with its stderr): (the process, its base URL).
    The caller stops it (SIGTERM) and reads its pipes."""
    import time

    import httpx

    from inferenceos.cluster.spawn import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferenceos", "serve", *args, "--port", str(port)],
        env=cli_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"serve did not start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.1)
