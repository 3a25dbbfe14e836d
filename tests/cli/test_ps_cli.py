"""`inferenceos ps` as a user reads it: against a server's /api/ps (here a stand-in that
answers fixed models), at 80 columns: whole names, human expiry times, one-line reasons."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from typing import Any

from cli_helpers import cli_env, run_cli
from inferenceos.units import iso_time
from slow_server import Answer, Lines, held_server

LONG_REASON = ("default context; plan: ctx 16384 · KV f16/f16 · flash-attn off · ubatch "
               "512 · CPU only · 2 threads · CPU 1.2 GiB")


def _models() -> list[dict[str, Any]]:
    return [
        {"name": "hf.co/qwen/qwen2.5-coder-1.5b-instruct-gguf:Q4_K_M", "state": "hot",
         "pinned": True, "memory_by_device": {"CPU": 1_300_000_000}, "context_length": 4096,
         "slots": 4, "expires_at": "2318-01-01T00:00:00.000000Z", "reason": LONG_REASON},
        {"name": "qwen2.5-coder-0.5b-instruct-q4_k_m:latest", "state": "warm",
         "pinned": False, "memory_by_device": {"CPU": 500_000_000, "CUDA0": 4_100_000_000},
         "context_length": 32768, "slots": 1, "expires_at": iso_time(time.time() + 280),
         "reason": "demoted to warm (memory)"},
        {"name": "tiny:latest", "state": "hot", "pinned": False,
         "memory_by_device": {"CPU": 5_000_000}, "context_length": 2048, "slots": 1,
         "expires_at": iso_time(time.time() - 3), "reason": "default context"},
    ]


def _ps(columns: int) -> list[str]:
    with held_server({"/api/ps": Answer({"models": _models()}, held=False)}) as srv:
        r = run_cli("ps", "--port", str(srv.port), COLUMNS=str(columns))
    assert r.returncode == 0, r.stderr
    return r.stdout.rstrip("\n").splitlines()


def test_ps_fits_80_columns_with_whole_names_and_human_times() -> None:
    lines = _ps(80)
    text = "\n".join(lines)
    assert all(len(line) <= 80 for line in lines), text
    for m in _models():  # every name whole, on one line
        assert any(m["name"] in line for line in lines), text
    assert "Forever" in text and "4 minutes from now" in text and "Stopping..." in text
    assert not re.search(r"\d{4}-\d\d-\d\dT", text), text  # no raw timestamps
    # a long reason is one line (cut with an ellipsis), not 11 wrapped ones
    (why,) = [line for line in lines if "default context; plan" in line]
    assert why.rstrip().endswith("…")
    assert len(lines) <= 2 + 3 * len(_models()), text


def test_ps_on_a_wide_terminal_is_one_line_per_model() -> None:
    lines = _ps(240)
    text = "\n".join(lines)
    assert len(lines) == 1 + len(_models()), text
    assert LONG_REASON in text and "4 minutes from now" in text
    header = lines[0].split()
    assert header == ["NAME", "STATE", "MEMORY", "CONTEXT", "UNTIL", "WHY"]


def test_human_until_follows_ollama() -> None:
    from inferenceos.cli.ps_cmd import human_until

    now = float(int(time.time()))  # whole seconds: iso_time keeps microseconds only
    assert human_until(iso_time(now + 280), now) == "4 minutes from now"
    assert human_until(iso_time(now + 30), now) == "30 seconds from now"
    assert human_until(iso_time(now + 61), now) == "About a minute from now"
    assert human_until(iso_time(now + 3 * 3600), now) == "3 hours from now"
    assert human_until("2318-01-01T00:00:00.000000Z", now) == "Forever"
    assert human_until(iso_time(now - 1), now) == "Stopping..."
    assert human_until("", now) == "" and human_until("soon", now) == "soon"
    # a plain Ollama's form, with a zone offset and 5 fractional digits
    assert human_until("2024-06-04T14:38:31.83753-07:00",
                       1717537111.0 - 600) == "10 minutes from now"


def test_ps_waits_for_a_busy_server_saying_so_and_shows_its_answer() -> None:
    """A server that takes the request and holds its answer is busy, not absent: ps
    says so on stderr, asks again with a longer wait, and prints the table once the
    answer comes (the server is released after the second wait)."""
    routes = {"/api/ps": Answer({"models": _models()}), "/metrics": Answer("")}
    with held_server(routes) as srv:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferenceos", "ps", "--port", str(srv.port),
             "--timeout", "0.3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=cli_env(COLUMNS="240"))
        err = Lines(proc.stderr)
        assert err.next() == "the server is busy: no answer in 0.3 s, retrying"
        assert err.next() == "the server is busy: no answer in 0.6 s, retrying"
        srv.release.set()
        out = "\n".join(Lines(proc.stdout).rest())
    assert proc.wait(60) == 0, err.rest()
    assert all(m["name"] in out for m in _models()), out
