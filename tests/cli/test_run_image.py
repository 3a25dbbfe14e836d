"""`inferenceos run MODEL --image FILE`: the real command, the tiny VLM pair, real files.

The projector is found beside the model (or given with --mmproj), the image's cells
count in the prompt, different images give different greedy replies, and a truncated
image, a missing file or a model without a projector are one-line errors (exit 1-2).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cli_helpers import run_cli

IMAGE_TOKENS = 16


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("images")
    out = {}
    for name, seed in (("a", 1), ("b", 2)):
        rgb = np.random.default_rng(seed).integers(0, 256, (50, 60, 3), dtype=np.uint8)
        Image.fromarray(rgb).save(d / f"{name}.png")
        out[name] = d / f"{name}.png"
    (d / "cut.png").write_bytes(out["a"].read_bytes()[:300])
    out["cut"] = d / "cut.png"
    return out


def _run(model: Path, *args: str) -> dict:
    r = run_cli("run", str(model), "-p", "what is it", "-n", "8", "-t", "0", "--raw",
                "--json", "--threads", "1", *args)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_run_sees_the_image_with_the_projector_beside_the_model(
    tiny_vlm_pair: tuple[Path, Path], images: dict[str, Path],
) -> None:
    model, mmproj = tiny_vlm_pair
    text_only = _run(model)
    a = _run(model, "--image", str(images["a"]))
    b = _run(model, "--image", str(images["b"]), "--mmproj", str(mmproj))
    n_text = text_only["metrics"]["prompt_tokens"]
    # the image's cells and the newline after its marker come on top of the text
    assert IMAGE_TOKENS < a["metrics"]["prompt_tokens"] - n_text <= IMAGE_TOKENS + 3
    assert a["metrics"]["completion_tokens"] == 8
    assert a["text"] != b["text"]


def test_run_image_errors_are_one_line(
    tiny_vlm_pair: tuple[Path, Path], images: dict[str, Path], tiny_llama: Path,
) -> None:
    model, _ = tiny_vlm_pair
    cut = run_cli("run", str(model), "-p", "x", "--image", str(images["cut"]))
    assert cut.returncode != 0 and "truncated" in cut.stderr
    assert "Traceback" not in cut.stderr
    missing = run_cli("run", str(model), "-p", "x", "--image", "/nonexistent.png")
    assert missing.returncode != 0 and "no such image file" in missing.stderr
    blind = run_cli("run", str(tiny_llama), "-p", "x", "--image", str(images["a"]))
    assert blind.returncode != 0 and "--mmproj" in blind.stderr
    assert "Traceback" not in blind.stderr + missing.stderr
    off = run_cli("run", str(model), "-p", "x", "--image", str(images["a"]), "--mmproj", "none")
    assert off.returncode != 0 and "projector" in off.stderr
