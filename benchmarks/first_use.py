"""How right `simulate` is before and after history, as a user meets it (issue 26).

Each case runs the installed `inferenceos` CLI in a fresh data dir, on the built-in
Gemma 3 270M and the two Qwen2.5-Coder models of issue 19 (Q4_K_M), for a ~480-token
prompt and 128 generated tokens (greedy, `--ignore-eos`):

- `first`: the data dir's first `simulate` (it calibrates itself: the probe, one line
  on stderr), then two `run`s measure;
- `learned`: three recorded `run`s of the model first, then `simulate`, then two more;
- `transfer`: three recorded runs of Gemma only, then `simulate` of each Qwen model (a
  family never run here), measured by runs in another data dir (nothing learned).

`--probe synthetic` gives each case its own INFERENCEOS_HOME (no model in its cache, so
the probe is the synthetic stand-in); `--probe builtin` only a fresh data dir beside the
default cache (the probe times the built-in Gemma). Prints predicted / measured and
the error per model, and the median |error| over prefill and decode. Paths to the
models come from the packaged-model cache (assembled if missing).

    PYTHONPATH=src .venv/bin/python benchmarks/first_use.py first --probe synthetic
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from inferenceos.model.default_model import ensure_default_model  # noqa: E402
from inferenceos.model.packaged_models import (  # noqa: E402
    QWEN_05B,
    QWEN_15B,
    ensure_packaged_model,
)

CLI = str(Path(sys.executable).parent / "inferenceos")
WORDS = [
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as",
    "by", "at", "from", "his", "an", "were", "are", "which", "this", "be", "or", "has",
    "had", "not", "but", "its", "first", "new", "one", "after", "also", "who",
]
PROMPT = " ".join(WORDS[(i * 7 + i // 5) % len(WORDS)] for i in range(480))
OUT = 128
_DIRS: list[str] = []  # the fresh dirs, removed at the end


def models() -> dict[str, Path]:
    return {"gemma": ensure_default_model(), "qwen05": ensure_packaged_model(QWEN_05B),
            "qwen15": ensure_packaged_model(QWEN_15B)}


def fresh_env(probe: str) -> dict[str, str]:
    """The environment of a fresh data dir (and, for the synthetic probe, home)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("INFERENCEOS_HOME", "INFERENCEOS_DATA_DIR", "INFERENCEOS_SELF_CALIBRATE")}
    d = tempfile.mkdtemp(prefix="first-use-")
    _DIRS.append(d)
    env["INFERENCEOS_HOME" if probe == "synthetic" else "INFERENCEOS_DATA_DIR"] = d
    return env


def run(path: Path, env: dict[str, str], prompt: str = PROMPT, out: int = OUT,
        draft: str = "none") -> dict[str, float]:
    """`run`'s metrics for `prompt`, `out` tokens, greedy, EOS ignored, `--draft draft`."""
    cmd = [CLI, "run", str(path), "--prompt", prompt, "--raw", "--max-tokens", str(out),
           "--ignore-eos", "--temperature", "0", "--json", "--draft", draft]
    text = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(text[text.index("{"):])["metrics"]


def simulate_json(path: Path, prompt: int, env: dict[str, str], out: int = OUT,
                  *more: str) -> dict:
    """`simulate --json`'s object for `prompt` tokens in, `out` out (`more`: options)."""
    cmd = [CLI, "simulate", str(path), "--prompt-tokens", str(prompt), "--output-tokens",
           str(out), "--json", *more]
    got = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(got.stdout))


def simulate(path: Path, prompt: int, env: dict[str, str]) -> tuple[float, float, str]:
    j = simulate_json(path, prompt, env)
    return j["prefill_tps"], j["decode_tps"], f"{j['basis']} ({j['calibration_runs']} runs)"


def measure(path: Path, env: dict[str, str]) -> tuple[float, float]:
    ms = [run(path, env) for _ in range(2)]
    return (statistics.mean(m["prompt_tps"] for m in ms),
            statistics.mean(m["decode_tps"] for m in ms))


def report(name: str, pred: tuple[float, float, str], meas: tuple[float, float],
           errs: list[float]) -> None:
    ep, ed = pred[0] / meas[0] - 1, pred[1] / meas[1] - 1
    errs += [abs(ep), abs(ed)]
    print(f"{name:7} prefill {pred[0]:6.0f}/{meas[0]:6.0f} {ep * 100:+6.1f} %   decode "
          f"{pred[1]:5.1f}/{meas[1]:5.1f} {ed * 100:+6.1f} %   basis {pred[2]}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=("first", "learned", "transfer"))
    ap.add_argument("--probe", choices=("synthetic", "builtin"), default="builtin")
    a = ap.parse_args()
    paths: dict[str, Path] = models()
    errs: list[float] = []
    prompt = int(run(paths["gemma"], fresh_env(a.probe))["prompt_tokens"])
    if a.case == "transfer":
        env = fresh_env(a.probe)
        for _ in range(3):
            run(paths["gemma"], env)
        for name in ("qwen05", "qwen15"):
            pred = simulate(paths[name], prompt, env)
            report(name, pred, measure(paths[name], fresh_env(a.probe)), errs)
    else:
        for name, path in paths.items():
            env = fresh_env(a.probe)
            for _ in range(3 if a.case == "learned" else 0):
                run(path, env)
            pred = simulate(path, prompt, env)
            report(name, pred, measure(path, env), errs)
    print(f"median |error| over prefill and decode: {statistics.median(errs) * 100:.1f} % "
          f"({a.case}, {a.probe} probe, {prompt}-token prompt, {OUT} out)")
    for d in _DIRS:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
