"""Live migration off a GPU and back (docs/migration.md) with the model's layers on the
Vulkan device: `serve`, a greedy stream, `POST /api/budget` caps the device at half of
what the model holds there; the model moves to a placement with fewer layers on the
device while the stream goes on; the cap lifted, it moves back up. The streamed text is
the undisturbed stream's, token for token; the migration counter (`/metrics`, `monitor`)
and the events show both moves. scripts/gpu_check.py's `migrate` step, on lavapipe."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tiny_models import write_tiny_model
from vulkan_cli import DEVICE, VulkanCli, serving

pytestmark = pytest.mark.gpu_vulkan

N_PREDICT = 120


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 6-layer, 24 MB tiny model (f32: the CPU's and the device's kernels agree to
    the token): ~6 tokens/s on lavapipe, so a stream outlives two migrations."""
    return write_tiny_model(tmp_path_factory.mktemp("vk-migrate") / "wide.gguf", "wide")


def _stream(base: str, out: list[str], started: threading.Event | None = None) -> None:
    import httpx

    body = {"prompt": "abc ab", "temperature": 0,
            "n_predict": N_PREDICT, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", base + "/completion", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                d = json.loads(line[6:])
                assert not d.get("error"), d
                out.append(d.get("content", ""))
                if started is not None and len(out) >= 8:
                    started.set()


def _vram(base: str) -> int:
    import httpx

    return sum(int(m.get("size_vram") or 0)
               for m in httpx.get(base + "/api/ps", timeout=10).json()["models"])


def _wait(pred: Any, timeout: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.2)
    return None


def test_a_lowered_cap_moves_layers_off_the_device_mid_stream_and_back(
        vk: VulkanCli, wide: Path, tmp_path: Path) -> None:
    import httpx

    with serving(vk, wide, "--ctx", "1024", "--parallel", "1", log=tmp_path / "serve.log",
                 env={"INFERENCEOS_PRESSURE_DWELL_S": "1"}) as base:
        want: list[str] = []
        _stream(base, want)  # undisturbed, on the plan's placement
        v0 = _vram(base)
        assert v0 > 0, "the model holds nothing on the device"
        got: list[str] = []
        started = threading.Event()
        reader = threading.Thread(target=_stream, args=(base, got, started), daemon=True)
        reader.start()
        assert started.wait(120)
        httpx.post(base + "/api/budget", json={"device": DEVICE, "bytes": v0 // 2},
                   timeout=10).raise_for_status()
        down = _wait(lambda: _vram(base) <= v0 // 2, 60)
        at_cap, tokens_at_cap = _vram(base), len(got)
        httpx.post(base + "/api/budget", json={"device": DEVICE, "bytes": None},
                   timeout=10).raise_for_status()
        up = _wait(lambda: _vram(base) >= v0, 60)
        reader.join(300)
        frame = vk("monitor", "--once", "--url", base).stdout
        metrics = httpx.get(base + "/metrics", timeout=10).text
    assert down is not None, f"{v0} bytes on {DEVICE}, {at_cap} after the cap"
    assert up is not None, "never moved back up"
    assert 0 < at_cap <= v0 // 2
    assert tokens_at_cap < N_PREDICT, "the stream had ended before the move down"
    assert not reader.is_alive() and len(got) == len(want)
    assert "".join(got) == "".join(want)
    moves = [ln for ln in metrics.splitlines()
             if ln.startswith("inferenceos:migrations_total{")]
    assert sum(float(ln.rsplit(" ", 1)[1]) for ln in moves) >= 2, moves
    assert "migrations 2" in frame, frame
