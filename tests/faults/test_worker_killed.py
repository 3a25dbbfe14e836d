"""A model's worker SIGKILLed during load, prefill and decode: the request in flight ends
with a clear error (never a hang, never a crash of the server), the next request gets a
fresh worker, the other model keeps answering, the registry and telemetry are intact."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from faults.helpers import children, generate, in_thread, kill_next_child, tags, worker_pid
from inferenceos import telemetry
from server_harness import Harness, serving
from tiny_models import write_tiny_model


@pytest.fixture
def two(tiny_llama: Path, tmp_path: Path) -> Iterator[Harness]:
    """Models a (a tiny llama) and b (one that never stops on its own: endless decode)."""
    b = write_tiny_model(tmp_path / "b.gguf", "llama", seed=1, letters_only=True)
    with serving({"a": tiny_llama, "b": b}, tmp_path) as h:
        yield h


def _intact(h: Harness) -> None:
    assert tags(h) == ["a:latest", "b:latest"]
    assert generate(h, "a").status_code == 200


def test_killed_during_load(two: Harness, tmp_path: Path) -> None:
    assert generate(two, "a").status_code == 200
    with kill_next_child(children(), model=tmp_path / "b.gguf") as killed:
        r = generate(two, "b")
    assert killed, "no worker was started"
    assert r.status_code in (500, 503), r.text
    msg = r.json()["error"]
    assert "worker" in msg and "internal server error" not in msg
    assert generate(two, "b").status_code == 200  # a new worker, no restart
    _intact(two)


def test_killed_during_decode(two: Harness) -> None:
    assert generate(two, "a").status_code == 200
    # streaming eviction: decoding past the 256-token context, so the stream is still
    # running when the kill lands (without it the tiny model filled its context in
    # ~0.1 s and ended normally first, once, in a parallel run)
    body = {"model": "b", "prompt": "ab",
            "options": {"num_predict": 100_000, "kv_policy": "streaming"}}
    t0 = time.monotonic()
    with httpx.stream("POST", two.url + "/api/generate", json=body, timeout=30) as r:
        lines = r.iter_lines()
        first = json.loads(next(lines))
        assert first["done"] is False  # decoding now
        os.kill(worker_pid(two, "b"), signal.SIGKILL)
        rest = [json.loads(ln) for ln in lines if ln]
    assert time.monotonic() - t0 < 20  # ended, not hung
    assert "worker died" in rest[-1]["error"]  # in-band: the headers were sent already
    assert generate(two, "b").status_code == 200
    _intact(two)
    telemetry.recorder().flush(30)
    deaths = telemetry.events("worker_death")
    assert any(ev.detail.get("exit_code") == -signal.SIGKILL for ev in deaths)


@pytest.mark.slow
def test_killed_during_prefill(gemma_path: Path, tiny_llama: Path, tmp_path: Path) -> None:
    """A long prompt on the real Gemma, small batches: the worker dies before the first
    token, so the answer is a status (503), not a half stream."""
    from dataclasses import replace

    from server_harness import TINY_REQUEST

    kw = {"base": replace(TINY_REQUEST, n_ctx=4096, n_batch=32)}
    with serving({"g": gemma_path, "a": tiny_llama}, tmp_path, manager_kw=kw) as h:
        assert generate(h, "g", 1).status_code == 200
        prompt = " ".join(f"word{i}" for i in range(400))  # ~1600 tokens
        body = {"model": "g", "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 4, "stream": True}
        t, out = in_thread(lambda: httpx.post(h.v1 + "/chat/completions", json=body,
                                              timeout=120))
        deadline = time.monotonic() + 30
        while h.state.admission.running == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # a few of the ~50 prompt batches in
        os.kill(worker_pid(h, "g"), signal.SIGKILL)
        t.join(60)
        r = out[0]
        assert r.status_code == 503 and r.json()["error"]["code"] == "worker_died", r.text
        assert generate(h, "g", 1).status_code == 200
        assert generate(h, "a").status_code == 200
