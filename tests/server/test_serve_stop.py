"""`serve` stopped the way service managers stop it: SIGTERM to the whole process group.

systemd's default stop, `timeout` and a container's stop signal every process of the
service, so the model's worker gets SIGTERM beside the server. It must leave through
its cleanup (the KV store's disk writes, the weight streamer's last record), not die
mid-air: before, a streamed MoE's expert picks of the run were never recorded when
`serve` was stopped so (the parent alone stopped: recorded).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx

from cli_helpers import cli_env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_process_group_sigterm_lets_the_worker_record_its_expert_picks(
        tiny_moe: Path, isolated_home: Path) -> None:
    port = _free_port()
    # 2.62 MiB: the tiny MoE's anonymous needs and two layers of streaming room fit,
    # its weights beside them do not: a disk-bound plan, streamed by the worker
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferenceos", "serve", str(tiny_moe), "--port", str(port),
         "--ram", "2.62MiB", "--ctx", "256", "--parallel", "1", "--threads", "1"],
        env=cli_env(INFERENCEOS_SELF_CALIBRATE="0"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                       json={"model": "tiny-moe", "prompt": "abc", "max_tokens": 8,
                             "temperature": 0})
        assert r.status_code == 200, r.text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its worker alike
        _, err = proc.communicate(timeout=30)
    assert "disk-bound" in err, err  # else the case tests nothing: see the comment above
    assert "Traceback" not in err
    db = isolated_home / "data" / "telemetry.db"
    deadline = time.monotonic() + 10  # the worker may still be finishing its exit
    rows: list[tuple[int, float]] = []
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT layer, tokens FROM expert_heat").fetchall()
        if rows:
            break
        time.sleep(0.2)
    assert len(rows) == 2 and all(tokens >= 8 for _, tokens in rows), rows
