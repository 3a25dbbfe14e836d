"""`inferenceos monitor` in a real terminal (tmux) against a real server, and
`inferenceos budget` changing a cap over the API."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli_helpers import cli_env, run_cli
from server_harness import SLOW, long_stream, serving
from slow_server import Answer, Lines, held_server
from tiny_models import write_tiny_model
from tmux_screen import Screen

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture
def screens() -> Iterator[list[Screen]]:
    opened: list[Screen] = []
    yield opened
    for s in opened:
        s.close()


def test_monitor_shows_devices_models_and_events_live_and_q_quits(
    tiny_llama: Path, tmp_path: Path, screens: list[Screen]
) -> None:
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        s = Screen([sys.executable, "-m", "inferenceos", "monitor", "--url", h.url,
                    "--interval", "0.3"], cli_env(), tmp_path)
        screens.append(s)
        screen = s.wait(r"InferenceOS monitor")
        assert "devices" in screen and "CPU" in screen and "(none loaded)" in screen
        httpx.post(h.url + "/api/generate", json={"model": "tiny", "prompt": "ab",
                                                   "stream": False,
                                                   "options": {"num_predict": 8}})
        s.wait(r"tiny:latest\s+hot")  # the model and its tier, live
        # its load event: the events are read apart from /api/ps, so the row may come a
        # frame later (a census saw the model hot and the events table still empty)
        screen = s.wait(r"load\s+tiny:latest\s+load \d+\.\d\d s, plan: ctx ")
        assert "load_s" not in screen  # the load event, in seconds a person reads
        httpx.post(h.url + "/api/budget", json={"device": "CPU", "bytes": 1 << 40})
        s.wait(r"budget\s+device CPU, cap 1\.0 TiB")
        s.wait(r"1\.0 TiB")  # the cap in the device table
        s.send("q")
        s.wait(r"EXITED=0")


def test_monitor_without_a_server_is_one_line(tmp_path: Path) -> None:
    r = run_cli("monitor", "--url", "http://127.0.0.1:9", "--once")
    assert r.returncode == 1
    assert "no InferenceOS server at http://127.0.0.1:9" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_cli("monitor", "--url", "ftp://x")
    assert r.returncode != 0 and "--url must start with http" in r.stderr


BUDGET = {"devices": [{"name": "CPU", "used_bytes": 0, "free_bytes": 1 << 30,
                       "total_bytes": 2 << 30, "cap_bytes": 3 << 30}],
          "pressure": {"migrations": 0, "dwell_s": 1.0}}
# what monitor reads, each answer held until the test releases the server
MONITOR_ROUTES = {"/metrics": Answer(""), "/api/budget": Answer(BUDGET),
                  "/api/ps": Answer({"models": []}), "/health": Answer({"workers": {}}),
                  "/api/events": Answer({"events": [], "last_id": 0})}


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "inferenceos", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env())


def test_monitor_shows_a_busy_server_in_its_frame_keeps_asking_and_q_quits(
    tmp_path: Path, screens: list[Screen]
) -> None:
    """A server that takes the requests and holds the answers is busy, not absent: the
    frame says so under the header and monitor asks again with a longer wait; the
    devices show once the answers come, and the status line goes."""
    with held_server(MONITOR_ROUTES) as srv:
        s = Screen([sys.executable, "-m", "inferenceos", "monitor", "--url", srv.url,
                    "--interval", "0.3", "--timeout", "0.3"], cli_env(), tmp_path)
        screens.append(s)
        screen = s.wait(r"the server is busy: no answer in 0\.3 s, retrying")
        assert "InferenceOS monitor" in screen and "EXITED" not in screen
        s.wait(r"the server is busy: no answer in 0\.6 s, retrying")
        srv.release.set()
        screen = s.wait(r"devices")
        assert "CPU" in screen and "(none loaded)" in screen
        s.send("q")
        s.wait(r"EXITED=0")


def test_monitor_once_and_budget_wait_for_a_busy_server_saying_so() -> None:
    """`monitor --once` and `budget` say on stderr that the server is busy, ask again,
    and print their answer once it comes; budget's POST, asked again, sets the same
    cap (setting it twice is setting it once)."""
    with held_server(MONITOR_ROUTES) as srv:
        once = _cli("monitor", "--url", srv.url, "--once", "--timeout", "0.3")
        budget = _cli("budget", "CPU", "3GiB", "--url", srv.url, "--timeout", "0.3")
        errs = [Lines(p.stderr) for p in (once, budget)]
        for err in errs:
            assert err.next() == "the server is busy: no answer in 0.3 s, retrying"
        srv.release.set()
        outs = ["\n".join(Lines(p.stdout).rest()) for p in (once, budget)]
    assert once.wait(60) == 0 and "devices" in outs[0], (outs[0], errs[0].rest())
    assert budget.wait(60) == 0 and "3.0 GiB" in outs[1], (outs[1], errs[1].rest())
    posts = [a for a in srv.asked if a.method == "POST"]
    assert posts and all(a.path == "/api/budget" and a.body == {"device": "CPU",
                                                                "bytes": 3 << 30}
                         for a in posts)


def test_budget_command_sets_shows_and_lifts_a_cap(tiny_llama: Path, tmp_path: Path) -> None:
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        r = run_cli("budget", "CPU", "3GiB", "--url", h.url)
        assert r.returncode == 0, r.stderr
        assert "CPU" in r.stdout and "3.0 GiB" in r.stdout
        assert h.manager.budget.caps == {"CPU": 3 << 30}
        r = run_cli("budget", "--url", h.url, "--json")
        assert r.returncode == 0
        assert '"cap_bytes": 3221225472' in r.stdout
        r = run_cli("budget", "CPU", "none", "--url", h.url)
        assert r.returncode == 0 and h.manager.budget.caps == {}
        r = run_cli("budget", "GPU9", "1GiB", "--url", h.url)
        assert r.returncode == 1 and "unknown device 'GPU9'" in r.stderr
        r = run_cli("budget", "CPU", "lots", "--url", h.url)
        assert r.returncode != 0 and "not a size" in r.stderr
        r = run_cli("budget", "CPU", "--url", h.url)
        assert r.returncode != 0 and "give a SIZE" in r.stderr
        # the monitor's one-frame mode sees the same server
        r = run_cli("monitor", "--url", h.url, "--once")
        assert r.returncode == 0 and "devices" in r.stdout and "CPU" in r.stdout


def test_monitor_shows_the_rate_while_a_request_generates(tmp_path: Path,
                                                          screens: list[Screen]) -> None:
    """While one long request generates, the header's tok/s is above zero (the counter
    it is read from used to move only when a request ended: 0.0 tok/s all along)."""
    slow = write_tiny_model(tmp_path / "slow.gguf", kind="wide", letters_only=True)
    with serving({"slow": slow}, tmp_path / "srv", manager_kw={"base": SLOW}) as h:
        s = Screen([sys.executable, "-m", "inferenceos", "monitor", "--url", h.url,
                    "--interval", "0.3"], cli_env(), tmp_path)
        screens.append(s)
        s.wait(r"InferenceOS monitor")
        with long_stream(h.url, "slow") as stream:
            deadline = time.monotonic() + 30
            rates: list[float] = []
            while not any(r > 0 for r in rates):
                assert not stream.ended.is_set(), "the request ended before a rate showed"
                assert time.monotonic() < deadline, f"rates while running: {rates}\n{s.text()}"
                found = re.findall(r"running 1 · waiting 0 · ([\d.]+) tok/s", s.text())
                rates = [float(r) for r in found]
                time.sleep(0.1)
            assert not stream.ended.is_set()
        s.send("q")
        s.wait(r"EXITED=0")
