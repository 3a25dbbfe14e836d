"""`inferenceos serve` starting as a user starts it: a pinned model is loaded before the
server answers (the first request pays no load), and the access log follows `-v`."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from cli_helpers import start_serve


@contextmanager
def serve(*args: str) -> Iterator[tuple[str, list[str]]]:
    """`serve ARGS` until the block ends: (base URL, its stderr lines once stopped)."""
    proc, base = start_serve(*args, "--ctx", "256", "--threads", "1", "--parallel", "1")
    lines: list[str] = []
    try:
        yield base, lines
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        lines += err.splitlines()


def test_a_pinned_model_is_hot_before_the_server_answers(tiny_llama: Path) -> None:
    with serve(str(tiny_llama), "--pin", "tiny-llama") as (base, err):
        ps = httpx.get(base + "/api/ps", timeout=5).json()["models"]
        assert [(m["name"], m["state"], m["pinned"]) for m in ps] == [
            ("tiny-llama:latest", "hot", True)]
        r = httpx.post(base + "/api/generate", timeout=30, json={
            "prompt": "hi", "stream": False, "options": {"num_predict": 2}})
        assert r.status_code == 200 and r.json()["load_duration"] == 0  # loaded already
    ready = next(i for i, line in enumerate(err) if "InferenceOS API on" in line)
    loaded = [i for i, line in enumerate(err) if line.startswith("tiny-llama:latest: plan:")]
    assert loaded and loaded[0] < ready, err  # loaded (its plan line) before "ready"


def test_the_access_log_is_off_by_default_and_on_with_v(tiny_llama: Path) -> None:
    """As llama-server and `ollama serve` users expect (docs/api.md: `-v`): one JSON
    line per response on stderr with -v, none without."""
    for flags, lines in (((), 0), (("-v",), 1)):
        with serve(str(tiny_llama), *flags) as (base, err):
            assert httpx.get(base + "/api/version", timeout=5).status_code == 200
        access = [line for line in err if '"route": "/api/version"' in line]
        assert len(access) == lines, (flags, err)
        assert all('"status": 200' in line for line in access)
