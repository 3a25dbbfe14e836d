"""`inferenceos serve` as a process: starts, answers, refuses a foreign Host, and shuts
down cleanly on SIGTERM."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import httpx
import pytest

from cli_helpers import run_cli, start_serve


def test_serve_process_answers_and_stops_on_sigterm(tiny_llama: Path) -> None:
    proc, base = start_serve(str(tiny_llama), "--ctx", "256", "--threads", "1",
                             "--parallel", "2")
    try:
        r = httpx.post(base + "/api/generate", timeout=30, json={
            "prompt": "hi", "stream": False, "options": {"num_predict": 3}})
        assert r.status_code == 200 and r.json()["model"] == "tiny-llama:latest"
        assert httpx.get(base + "/health", headers={"Host": "attacker.test"}).status_code == 403
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal: the usual exit status
    assert proc.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err


@pytest.mark.parametrize(("args", "fa"), [
    (("--parallel", "1"), "off"),
    (("--parallel", "1", "--kv-cache-ram", "0", "--kv-cache-disk", "0"), "on"),
    ((), "on"),  # serve's default 4 sequences in one KV pool
])
def test_serve_plans_flash_attention_by_its_kv_cache(tiny_llama: Path, args: tuple[str, ...],
                                                    fa: str) -> None:
    """On the CPU, a server of one sequence whose KV cache keeps conversations plans
    without flash attention (plan/flash_attn.py); without that cache, or with several
    sequences sharing the KV pool, with it (llama.cpp's auto)."""
    proc, base = start_serve(str(tiny_llama), "--ctx", "256", "--threads", "1",
                             "--backend", "cpu", *args)
    try:
        r = httpx.post(base + "/api/generate", timeout=30, json={
            "prompt": "hi", "stream": False, "options": {"num_predict": 1}})
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert f"flash-attn {fa} " in err, err


def test_serve_on_a_busy_port_is_one_clear_line(tiny_llama: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = run_cli("serve", str(tiny_llama), "--port", str(port), timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot listen on 127.0.0.1")
    assert "--port" in lines[0]
