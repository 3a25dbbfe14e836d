"""Ctrl-C at random moments: `run` stops within a second whatever it is doing (importing,
loading, prefilling a long prompt, decoding, drafting), exits 130 and never shows a
traceback; `serve` with a request in flight ends the stream cleanly on SIGTERM.

The moments are drawn from a fixed seed, so a failure names a moment that can be
replayed (the assertion message carries it)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cli_helpers import cli_env, start_serve

pytestmark = pytest.mark.slow



def _long_prompt(chapters: int) -> str:
    return " ".join(f"Chapter {i}: the dragon flew over the mountains and the old town."
                    for i in range(chapters)) + " Now write a very long story about the dragon."


# Gemma: ~1,300 tokens, a prefill of 2-3 s on one thread, so many moments land inside it;
# the tiny model reads bytes: ~2,700 tokens, in its 4,096-token context
PROMPTS = {"gemma": _long_prompt(80), "tiny": _long_prompt(40)}
STOP_WITHIN_S = 1.0


@dataclass(frozen=True)
class Stopped:
    moment: float  # seconds after start that SIGINT was sent
    took: float  # seconds from SIGINT to exit
    code: int
    stderr: str
    draft: bool


def _interrupt_run(model: Path, prompt: str, moment: float, draft: bool) -> Stopped:
    cmd = [sys.executable, "-m", "inferenceos", "run", str(model), "-p", prompt,
           "-n", "3000", "--ctx", "4096", "--threads", "1", "--ignore-eos"]
    if draft:
        cmd += ["--draft", "ngram"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=cli_env())
    time.sleep(moment)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return Stopped(moment, float("inf"), -9, err, draft)
    return Stopped(moment, time.monotonic() - sent, proc.returncode, err, draft)


def _check(s: Stopped) -> None:
    where = f"SIGINT at {s.moment:.2f}s (draft={s.draft}): exit {s.code} after {s.took:.2f}s"
    assert s.code == 130, f"{where}\n{s.stderr}"
    assert "Traceback" not in s.stderr and "Exception ignored" not in s.stderr, where
    lines = s.stderr.strip().splitlines()
    # after the load the footer (stop: interrupted); before it, one line
    assert "stop: interrupted" in s.stderr or lines[-1:] == ["error: interrupted"], (
        f"{where}\n{s.stderr}")
    assert s.took <= STOP_WITHIN_S, f"{where}\n{s.stderr}"


def _moments(seed: int, n: int, late: float) -> list[tuple[float, bool]]:
    """`n` seeded moments up to `late` s; the first two within 0.3 s of the start, before
    any load (a CLI process takes longer than that to import): on a quiet machine Gemma
    loaded before the earliest of the seeded draws (1.19 s), and no moment fell before."""
    rng = random.Random(seed)
    return [(rng.uniform(0.05, 0.3 if i < 2 else late), i % 4 == 3) for i in range(n)]


@pytest.mark.parametrize(("which", "n", "late"), [("tiny", 20, 4.0), ("gemma", 30, 8.0)])
def test_ctrl_c_at_random_moments_stops_run_within_a_second(
        which: str, n: int, late: float, request: pytest.FixtureRequest) -> None:
    """50 moments in all (20 on the tiny model, 30 on Gemma), two runs at a time."""
    model = request.getfixturevalue("tiny_wide" if which == "tiny" else "gemma_path")
    moments = _moments(29 if which == "tiny" else 2929, n, late)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda m: _interrupt_run(model, PROMPTS[which], *m),
                                moments))
    for s in results:
        _check(s)
    loaded = sum("stop: interrupted" in s.stderr for s in results)
    assert 0 < loaded < n, "the moments should fall both before and after the load"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_with_a_stream_in_flight_ends_it_cleanly_and_exits_0(
        tiny_wide: Path, sig: signal.Signals) -> None:
    """The stream still running after the grace (1 s) is cancelled: it ends with a last
    chunk and [DONE], and the server exits 0."""
    proc, base = start_serve(str(tiny_wide), "--ctx", "4096", "--threads", "1",
                             INFERENCEOS_SERVER_SHUTDOWN_GRACE_S="1")
    try:
        lines: list[str] = []
        sent: float | None = None
        with httpx.stream("POST", base + "/v1/completions", timeout=30, json={
                "prompt": "ab", "max_tokens": 100000, "stream": True,
                "ignore_eos": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                # once: SSE's blank separator lines would repeat the check, and a
                # second SIGINT is uvicorn's (and any shell user's) forced exit
                if len(lines) == 5 and sent is None:
                    proc.send_signal(sig)
                    sent = time.monotonic()
        assert sent is not None, f"the stream ended before the signal: {lines[-3:]}"
        took = time.monotonic() - sent
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert lines[-1] == "data: [DONE]", lines[-3:]  # a clean end of stream, not a cut
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert took < 1 + 3, took  # the grace (1 s) and the cancel


@pytest.mark.parametrize("name", ["inferenceos", "their_app"])
def test_a_ctrl_c_while_the_cli_imports_is_one_line_and_130(tmp_path: Path, name: str) -> None:
    """The CLI's process (the `inferenceos` script, `python -m inferenceos`) answers a
    Ctrl-C from its first import on: one line, exit 130 (a fresh clone's first run,
    compiling every module, once got a traceback from inside `import inferenceos`).
    A program of another name that imports the package keeps Python's own Ctrl-C."""
    script = tmp_path / name
    script.write_text("import time\nimport inferenceos\nprint('ready', flush=True)\n"
                      "time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    if name == "inferenceos":
        assert proc.returncode == 130 and err == "error: interrupted\n", err
    else:
        assert proc.returncode != 130 and "KeyboardInterrupt" in err
