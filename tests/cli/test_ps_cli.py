"""`inferenceos ps` as a user reads it: against a server's /api/ps (here a stand-in that
answers fixed models), at 80 columns: whole names, human expiry times, one-line reasons."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cli_helpers import run_cli
from inferenceos.registry.catalog import now_iso

LONG_REASON = ("default context; plan: ctx 16384 · KV f16/f16 · flash-attn off · ubatch "
               "512 · CPU only · 2 threads · CPU 1.2 GiB")


def _models() -> list[dict[str, Any]]:
    return [
        {"name": "hf.co/qwen/qwen2.5-coder-1.5b-instruct-gguf:Q4_K_M", "state": "hot",
         "pinned": True, "memory_by_device": {"CPU": 1_300_000_000}, "context_length": 4096,
         "slots": 4, "expires_at": "2318-01-01T00:00:00.000000Z", "reason": LONG_REASON},
        {"name": "qwen2.5-coder-0.5b-instruct-q4_k_m:latest", "state": "warm",
         "pinned": False, "memory_by_device": {"CPU": 500_000_000, "CUDA0": 4_100_000_000},
         "context_length": 32768, "slots": 1, "expires_at": now_iso(time.time() + 280),
         "reason": "demoted to warm (memory)"},
        {"name": "tiny:latest", "state": "hot", "pinned": False,
         "memory_by_device": {"CPU": 5_000_000}, "context_length": 2048, "slots": 1,
         "expires_at": now_iso(time.time() - 3), "reason": "default context"},
    ]


@contextmanager
def fake_ps(models: list[dict[str, Any]]) -> Iterator[int]:
    """An HTTP server answering GET /api/ps with `models`; yields its port."""
    body = json.dumps({"models": models}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _ps(columns: int) -> list[str]:
    with fake_ps(_models()) as port:
        r = run_cli("ps", "--port", str(port), COLUMNS=str(columns))
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

    now = float(int(time.time()))  # whole seconds: now_iso keeps microseconds only
    assert human_until(now_iso(now + 280), now) == "4 minutes from now"
    assert human_until(now_iso(now + 30), now) == "30 seconds from now"
    assert human_until(now_iso(now + 61), now) == "About a minute from now"
    assert human_until(now_iso(now + 3 * 3600), now) == "3 hours from now"
    assert human_until("2318-01-01T00:00:00.000000Z", now) == "Forever"
    assert human_until(now_iso(now - 1), now) == "Stopping..."
    assert human_until("", now) == "" and human_until("soon", now) == "soon"
    # a plain Ollama's form, with a zone offset and 5 fractional digits
    assert human_until("2024-06-04T14:38:31.83753-07:00",
                       1717537111.0 - 600) == "10 minutes from now"
