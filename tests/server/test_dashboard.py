"""The web dashboard at /ui in a real headless Chromium (Debian's), driven over the
DevTools protocol: the page fills with the server's models, devices and events, a
screenshot is not blank, and a chat message gets a streamed reply."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferenceos.server.settings import ServerSettings
from server_harness import serving
from tiny_models import write_tiny_model

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


class Browser:
    """One headless Chromium with one page, spoken to over its DevTools websocket."""

    def __init__(self, url: str, profile: Path) -> None:
        from websockets.sync.client import connect

        assert CHROMIUM is not None
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "--window-size=1280,1000", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError("chromium did not start")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json()
                 if t["type"] == "page"]
        self._conn = connect(pages[0]["webSocketDebuggerUrl"], max_size=64 << 20,
                             open_timeout=30)
        self.ws = self._conn.__enter__()
        self.ids = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.ids += 1
        self.ws.send(json.dumps({"id": self.ids, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.ids:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return dict(msg["result"])

    def js(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                      awaitPromise=True)
        return r["result"].get("value")

    def wait(self, expression: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                body = self.js("document.body.innerText")
                raise AssertionError(f"{expression} stayed false; page:\n{body}")
            time.sleep(0.2)

    def close(self) -> None:
        self._conn.__exit__(None, None, None)
        self.proc.terminate()
        self.proc.wait(20)


@pytest.fixture
def browsers() -> Iterator[list[Browser]]:
    opened: list[Browser] = []
    yield opened
    for b in opened:
        b.close()


@pytest.fixture(scope="module")
def letters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("ui") / "letters.gguf", letters_only=True)


def _not_blank(png: bytes, path: Path) -> tuple[int, float]:
    """(distinct colours, pixel standard deviation) of a screenshot."""
    import matplotlib.image as mpimg
    import numpy as np

    path.write_bytes(png)
    img = mpimg.imread(str(path))
    flat = (img[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    return len(np.unique(flat, axis=0)), float(img[..., :3].std())


def test_the_dashboard_shows_the_server_and_chats(letters: Path, tmp_path: Path,
                                                  browsers: list[Browser]) -> None:
    with serving({"letters": letters}, tmp_path) as h:
        httpx.post(h.url + "/api/generate", json={"model": "letters", "prompt": "ab",
                                                   "stream": False,
                                                   "options": {"num_predict": 4}})
        page = httpx.get(h.url + "/ui")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "http" not in page.text.split("<body>")[1].replace("http-equiv", "")  # no CDN
        b = Browser(h.url + "/ui", tmp_path / "profile")
        browsers.append(b)
        b.wait("document.getElementById('status').textContent === 'live'")
        b.wait("document.querySelector('#models tbody').textContent.includes('letters:latest')")
        assert "hot" in b.js("document.querySelector('#models tbody').textContent")
        assert "CPU" in b.js("document.getElementById('devices').textContent")
        b.wait("document.getElementById('events').textContent.includes('load')")
        b.js("document.getElementById('chat-input').value = 'hello';"
             "document.getElementById('chat-send').click(); true")
        reply = b.wait("(e => e && e.classList.contains('done') && e.textContent)"
                       "(document.querySelector('.msg.assistant'))")
        assert reply.strip() and "error" not in b.js(
            "document.querySelector('.msg.assistant').className")
        b.wait("document.getElementById('tps-now').textContent !== ''")
        shot = base64.b64decode(b.call("Page.captureScreenshot", format="png")["data"])
        colours, spread = _not_blank(shot, tmp_path / "dashboard.png")
        assert colours > 20 and spread > 0.02, (colours, spread)


def test_the_dashboard_follows_the_api_rules(letters: Path, tmp_path: Path,
                                             browsers: list[Browser]) -> None:
    """With a key, the page's static files are public (they hold no data) and every
    data route needs the key, which the page sends once given (here in the link)."""
    with serving({"letters": letters}, tmp_path, settings=ServerSettings(api_key="k")) as h:
        assert httpx.get(h.url + "/ui").status_code == 200
        assert httpx.get(h.url + "/ui/app.js").status_code == 200
        for route in ("/api/ps", "/api/budget", "/api/events", "/metrics"):
            assert httpx.get(h.url + route).status_code == 401, route
        evil = httpx.get(h.url + "/ui", headers={"Host": "evil.example"})
        assert evil.status_code in (400, 403, 421)  # DNS rebinding: refused on loopback
        assert httpx.get(h.url + "/ui/../api/ps").status_code in (401, 404)
        b = Browser(h.url + "/ui#key=k", tmp_path / "profile-key")
        browsers.append(b)
        b.wait("document.getElementById('status').textContent === 'live'")
        assert "key" not in b.js("location.href")  # not left in the address bar


# the labels of each canvas's last frame ({canvas id: [text, ...]}), recorded from
# before the page's script runs (a frame starts with clearRect)
RECORD_LABELS = """
window.__drawn = {};
const proto = CanvasRenderingContext2D.prototype;
const clearRect = proto.clearRect, fillText = proto.fillText;
proto.clearRect = function (...args) {
  window.__drawn[this.canvas.id] = [];
  return clearRect.apply(this, args);
};
proto.fillText = function (text, ...rest) {
  (window.__drawn[this.canvas.id] ||= []).push(String(text));
  return fillText.call(this, text, ...rest);
};
"""


def _labels(b: Browser, canvas: str) -> set[str]:
    return set(json.loads(b.js(f"JSON.stringify(window.__drawn[{canvas!r}] || [])")))


def test_the_dashboard_shows_live_rates_round_axes_and_readable_events(
    tmp_path: Path, browsers: list[Browser],
) -> None:
    """As a person sees it, once the page's data has loaded: before any request the
    charts say "no data yet" on a 0..1 axis (not 1.00e-9); while one long request
    generates, the throughput is above zero (it showed 0.0 tok/s until the request
    ended); the load event reads "load 0.97 s", not "load_s=0.9714506950000441"."""
    from server_harness import SLOW, long_stream

    slow = write_tiny_model(tmp_path / "slow.gguf", kind="wide", letters_only=True)
    with serving({"slow": slow}, tmp_path / "srv", manager_kw={"base": SLOW}) as h:
        b = Browser("about:blank", tmp_path / "profile")
        browsers.append(b)
        b.call("Page.enable")
        b.call("Page.addScriptToEvaluateOnNewDocument", source=RECORD_LABELS)
        b.call("Page.navigate", url=h.url + "/ui")
        b.wait("document.getElementById('status').textContent === 'live'")
        b.wait("document.getElementById('tps-now').textContent !== ''")  # two polls
        # an idle rate (0 tok/s, one point so far) and no TTFT at all: a 0..1 axis
        for chart, unit, note in (("tps", "tok/s", ""), ("ttft", "ms", "no data yet")):
            labels = _labels(b, chart)
            assert {"0", "0.5", "1", unit} <= labels, (chart, labels)
            assert not any("e-" in t for t in labels), labels
            assert not note or note in labels, (chart, labels)
        empty = base64.b64decode(b.call("Page.captureScreenshot", format="png")["data"])
        (tmp_path / "empty.png").write_bytes(empty)
        with long_stream(h.url, "slow") as stream:
            rate = b.wait("(t => parseFloat(t) > 0 && t)"
                          "(document.getElementById('tps-now').textContent)", timeout=30)
            assert not stream.ended.is_set(), "the rate showed only once the request ended"
            assert rate.endswith(" tok/s")
            b.wait("document.getElementById('events').textContent.includes('load')")
            busy = base64.b64decode(b.call("Page.captureScreenshot", format="png")["data"])
            (tmp_path / "busy.png").write_bytes(busy)
        events = b.js("document.getElementById('events').textContent")
        assert re.search(r"load slow:latest load \d+\.\d\d s, plan: ctx ", events), events
        assert "load_s" not in events
        labels = _labels(b, "ttft")
        assert "no data yet" not in labels and not any("e-" in t for t in labels), labels
        shots = Path(os.environ.get("INFERENCEOS_UI_SHOTS", tmp_path))
        shots.mkdir(parents=True, exist_ok=True)
        for name in ("empty.png", "busy.png"):
            (shots / name).write_bytes((tmp_path / name).read_bytes())
