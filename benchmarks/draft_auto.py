"""`--draft auto` against plain decoding, paired, on real models (issue 26's drafter).

For each model (the built-in Gemma 3 270M and the Qwen2.5-Coder models of issue 19) and
each task (`copy`: return a config file with a line added, a reply that quotes its
prompt whole; `edit`: return a function with a variable renamed, a quote broken every
few tokens; `free`: a short story), in a fresh data dir: `--learn` greedy runs with the
default `--draft auto` teach the plan (each plain run records its n-gram replay), then
`--rounds` paired rounds run the same prompt with auto and with `--draft none`,
alternating which goes first. Prints the plan's drafter line, each side's median decode
t/s and the median of the rounds' ratios (auto / none): >= 1.0 means the choice did not
cost speed, and on free text auto should decode plainly (ratio ~1, noise).

    PYTHONPATH=src .venv/bin/python benchmarks/draft_auto.py --models gemma qwen05
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from first_use import CLI, models  # the installed CLI; the three models, assembled

FUNCTION = "\n".join([
    "def summarize(values, weights, scale):",
    "    total = 0",
    "    count = 0",
    "    for v, w in zip(values, weights):",
    "        if v > 0:",
    "            total += v * w * scale",
    "            count += 1",
    "        elif v < 0:",
    "            total -= v * w",
    "        else:",
    "            count -= 1",
    "    if count == 0:",
    "        return None",
    "    print('sum', total, 'count', count)",
    "    return total / count",
])
CONFIG = "\n".join([
    "[server]", 'host = "127.0.0.1"', "port = 8080", "workers = 4", "timeout_seconds = 30",
    "max_body_bytes = 1048576", "", "[database]",
    'url = "postgres://app:secret@localhost:5432/app"', "pool_size = 10",
    "statement_timeout_ms = 5000", "", "[cache]", 'backend = "redis"',
    'url = "redis://localhost:6379/0"', "ttl_seconds = 600",
])
TASKS = {
    "copy": "Copy this configuration file exactly, line by line, and add the line "
            "debug = true at the end:\n\n" + CONFIG + "\n",
    "edit": "Rename the variable total to acc in this function and return the whole "
            "function:\n\n" + FUNCTION + "\n",
    "free": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def run(path: Path, prompt: str, env: dict[str, str], draft: str | None,
        tokens: int) -> tuple[dict, str]:
    cmd = [CLI, "run", str(path), "--prompt", prompt, "--temperature", "0", "-n",
           str(tokens), "--json", *(["--draft", draft] if draft else [])]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    line = next((ln for ln in r.stderr.splitlines() if ln.startswith("plan:")), "")
    return json.loads(r.stdout)["metrics"], line.rsplit(" · ", 1)[-1]


def case(path: Path, task: str, args: argparse.Namespace) -> dict:
    d = tempfile.mkdtemp(prefix="draft-auto-")
    env = {k: v for k, v in os.environ.items() if k != "INFERENCEOS_PLAN_DRAFT"}
    env["INFERENCEOS_DATA_DIR"] = d
    try:
        for _ in range(args.learn):
            run(path, TASKS[task], env, None, args.tokens)
        auto_tps, none_tps, ratios, line, drafted = [], [], [], "", ""
        for i in range(args.rounds):
            sides = [None, "none"] if i % 2 == 0 else ["none", None]
            got = {}
            for side in sides:
                m, plan_line = run(path, TASKS[task], env, side, args.tokens)
                if m["completion_tokens"] < 16:  # a reply too short to time decode
                    return {"short": m["completion_tokens"]}
                got[side] = m["decode_tps"]
                if side is None:
                    line, drafted = plan_line, m["draft"] or "plain"
            auto_tps.append(got[None])
            none_tps.append(got["none"])
            ratios.append(got[None] / got["none"])
        return {"plan": line, "drafted": drafted, "auto": statistics.median(auto_tps),
                "none": statistics.median(none_tps), "ratio": statistics.median(ratios),
                "ratios": ratios}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["gemma", "qwen05", "qwen15"])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS))
    ap.add_argument("--learn", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=160)
    args = ap.parse_args()
    found = models()
    for name, path in ((n, found[n]) for n in args.models):
        for task in args.tasks:
            r = case(path, task, args)
            if "short" in r:
                print(f"{name:7} {task:5} n/a: the reply was {r['short']} tokens", flush=True)
                continue
            print(f"{name:7} {task:5} auto {r['auto']:6.1f} t/s  none {r['none']:6.1f} t/s  "
                  f"ratio {r['ratio']:.3f} ({', '.join(f'{x:.2f}' for x in r['ratios'])})"
                  f"  drafted: {r['drafted']}  [{r['plan']}]", flush=True)


if __name__ == "__main__":
    main()
