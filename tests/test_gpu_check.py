"""scripts/gpu_check.sh --dry-run: the GPU check's logic on this CPU machine (no CUDA
build; a fake nvidia-smi printing a recorded H200's output; the CPU llama.cpp). Every
step must run, parse what it gets and write the report; checks that need a real GPU
are reported "dry", never passed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable,
           "GPU_CHECK_BUDGET_S": "300"}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"],
                       env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "DRY RUN" in r.stdout and "GPU CHECK PASSED" in r.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["dry_run"] is True
    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == ["model", "hardware", "doctor", "simulate", "placement", "run",
                           "bench", "partial", "serve", "memory", "migrate"]
    for s in steps.values():
        assert s["status"] in ("pass", "dry", "skip"), s
    # what the fake H200 lets the dry run check for real: detection and planning
    assert "ok   it is an H200" in steps["hardware"]["checks"]
    assert steps["simulate"]["figures"]["n_gpu_layers"] > 0
    assert steps["placement"]["status"] == "pass"
    # the GPU-only checks are marked dry, not passed
    assert any(c.startswith("dry") for c in steps["serve"]["checks"])
    assert steps["run"]["figures"]["completion_tokens"] == 128
    assert (out / "report.md").read_text().startswith("# gpu_check (DRY RUN")
