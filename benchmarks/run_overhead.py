"""Decode and prefill speed of `inferenceos run` against llama.cpp's llama-bench, same run.

For each thread count, alternates llama-bench `tg` runs with `inferenceos run --json`
runs (the user's path: a fresh process, the chat template, the sampler chain) on the
same model and token count, and prints the medians and their ratio. Target: ratio ≥ 0.95.
On a shared machine other work only ever slows a round down, so the best round of each
side is printed too (the least disturbed estimate of what each can do), and the median
of the rounds' own ratios (each round's runs are adjacent in time).

Prefill: llama-bench pp512 against `run`'s prompt t/s on a raw 512-token prompt (target
>= 1.0 at 2 threads). Bandwidth: decode reads every weight once per token, so weight
bytes × t/s is the memory bandwidth achieved, printed against the machine's measured RAM
read bandwidth (the hardware profile): the physical limit, and how close each side is.

    .venv/bin/python benchmarks/run_overhead.py [--model PATH] [--tokens 128]
        [--threads 1 2] [--rounds 3] [--only decode|prefill]

Prefill is measured the way a user meets it: `run`'s first llama_decode in a fresh
process, against llama-bench's pp512 after its warmup run (docs/engine.md, "Prefill
against llama-bench": our first prefill costs the same CPU seconds per token as
llama-bench's and as our own second one; a warmup decode at load changed nothing). On a
loaded machine the wall-clock ratio scatters by ±25 % per round: read the paired median
beside the load average printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import child_env, finish, ram_gbps
from inferenceos.model.default_model import ensure_default_model
from inferenceos.model.spec import load_spec
from llama_tools import llama_tool

PP_TOKENS = 512


def bench_tg(bench: Path, model: Path, tokens: int, threads: int) -> float:
    """llama-bench's mean decode t/s for `tokens` tokens (one repetition)."""
    out = subprocess.run(
        [
            str(bench),
            "-m",
            str(model),
            "-p",
            "0",
            "-n",
            str(tokens),
            "-t",
            str(threads),
            "-r",
            "1",
            "-o",
            "json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out)[0]["avg_ts"])


def bench_pp(bench: Path, model: Path, tokens: int, threads: int, cold: bool = False) -> float:
    """llama-bench's prefill t/s for a `tokens`-token prompt (one repetition), after its
    warm-up run, or `cold`: without one (its first prefill, as `run`'s is)."""
    extra = ["--no-warmup", "-fa", "1"] if cold else []
    out = subprocess.run([str(bench), "-m", str(model), "-p", str(tokens), "-n", "0", "-t",
                          str(threads), "-r", "1", *extra, "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


# ~512 Gemma tokens of plain prose (a word is about one token); checked per run
PROSE = ("The river ran past the old mill where the children played after school, and "
         "the miller watched them from his window while the wheel turned slowly. ") * 18


def ours_pp(model: Path, threads: int) -> tuple[float, int]:
    """`inferenceos run`'s prompt t/s on the raw PROSE prompt, and its token count."""
    args = [sys.executable, "-m", "inferenceos", "run", str(model), "--raw", "-n", "1",
            "--threads", str(threads), "--json", "--temperature", "0"]
    out = subprocess.run(args, input=PROSE, check=True, capture_output=True, text=True,
                         env=child_env("run_overhead")).stdout
    metrics = json.loads(out)["metrics"]
    return float(metrics["prompt_tps"]), int(metrics["prompt_tokens"])


def ours_tg(model: Path, tokens: int, threads: int, greedy: bool) -> float:
    """`inferenceos run`'s decode t/s for `tokens` generated tokens."""
    args = [
        sys.executable,
        "-m",
        "inferenceos",
        "run",
        str(model),
        "--prompt",
        "Tell me a story.",
        "-n",
        str(tokens),
        "--ignore-eos",
        "--threads",
        str(threads),
        "--json",
        "--seed",
        "1",
        "--draft",  # plain decode against llama-bench's tg
        "none",
    ]
    if greedy:
        args += ["--temperature", "0"]
    # the run records itself in telemetry, tagged as this benchmark's
    out = subprocess.run(args, check=True, capture_output=True, text=True,
                         env=child_env("run_overhead")).stdout
    metrics = json.loads(out)["metrics"]
    assert metrics["completion_tokens"] == tokens, metrics
    return float(metrics["decode_tps"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=("decode", "prefill"), default=None,
                    help="measure one half only")
    args = ap.parse_args()
    model = args.model or ensure_default_model()
    bench = llama_tool("llama-bench")
    print(f"model {model.name}, {args.tokens} tokens, {args.rounds} alternating rounds, "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if args.only != "prefill":
        decode(args, bench, model)
    if args.only != "decode":
        prefill(args, bench, model)
    finish("run_overhead")


def decode(args: argparse.Namespace, bench: Path, model: Path) -> None:
    """Decode t/s, ours (sampled and greedy) against llama-bench tg, and bandwidth."""
    print(
        f"{'threads':>7} {'llama-bench':>12} {'ours default':>13} {'ours greedy':>12} "
        f"{'ratio default':>14} {'ratio greedy':>13}"
    )
    worst = 1.0
    decode_medians: dict[int, tuple[float, float]] = {}
    for t in args.threads:
        base, sampled, greedy = [], [], []
        for _ in range(args.rounds):
            base.append(bench_tg(bench, model, args.tokens, t))
            sampled.append(ours_tg(model, args.tokens, t, greedy=False))
            greedy.append(ours_tg(model, args.tokens, t, greedy=True))
        b, s, g = (statistics.median(x) for x in (base, sampled, greedy))
        worst = min(worst, s / b, g / b)
        print(f"{t:>7} {b:>12.1f} {s:>13.1f} {g:>12.1f} {s / b:>14.3f} {g / b:>13.3f}")
        bb, bs, bg = max(base), max(sampled), max(greedy)
        print(f"{'best':>7} {bb:>12.1f} {bs:>13.1f} {bg:>12.1f} {bs / bb:>14.3f} {bg / bb:>13.3f}")
        # each round's own ratio: both sides of a round share the machine's state then
        ps = statistics.median(x / y for x, y in zip(sampled, base, strict=True))
        pg = statistics.median(x / y for x, y in zip(greedy, base, strict=True))
        print(f"{'paired':>7} {'':>12} {'':>13} {'':>12} {ps:>14.3f} {pg:>13.3f}")
        decode_medians[t] = (b, g)
        print(f"        rounds: llama-bench {[round(x, 1) for x in base]}, "
              f"ours {[round(x, 1) for x in sampled]}, greedy {[round(x, 1) for x in greedy]}")
    print(f"worst ratio {worst:.3f} (target >= 0.95)")
    weights = load_spec(model).tensor_bytes
    bw = ram_gbps()
    print(f"\nbandwidth: {weights / 1e6:.0f} MB of weights read per decoded token; "
          f"machine RAM read {bw or float('nan'):.1f} GB/s (hardware profile)")
    for t, (b, g) in decode_medians.items():
        for name, tps in (("llama-bench", b), ("ours greedy", g)):
            gbps = weights * tps / 1e9
            share = f" = {gbps / bw:.0%} of RAM bandwidth" if bw else ""
            print(f"  {t} threads {name:<12} {tps:6.1f} t/s x {weights / 1e6:.0f} MB = "
                  f"{gbps:5.1f} GB/s{share}")


def prefill(args: argparse.Namespace, bench: Path, model: Path) -> None:
    """Prefill t/s: `run`'s prompt t/s on PROSE against llama-bench pp512, paired."""
    print(f"\nprefill (pp{PP_TOKENS}): {'threads':>7} {'llama-bench':>12} {'ours':>8} "
          f"{'ratio':>6} {'paired':>7}")
    for t in args.threads:
        base_pp, cold_pp, ours_pp_ = [], [], []
        n_tok = 0
        for _ in range(args.rounds):
            base_pp.append(bench_pp(bench, model, PP_TOKENS, t))
            tps, n_tok = ours_pp(model, t)
            ours_pp_.append(tps)
            cold_pp.append(bench_pp(bench, model, n_tok, t, cold=True))
        b, o = statistics.median(base_pp), statistics.median(ours_pp_)
        paired = statistics.median(x / y for x, y in zip(ours_pp_, base_pp, strict=True))
        print(f"{'':>16} {t:>7} {b:>12.1f} {o:>8.1f} {o / b:>6.3f} {paired:>7.3f}"
              f"   (our prompt: {n_tok} tokens; load average {os.getloadavg()[0]:.2f})")
        cold = statistics.median(x / y for x, y in zip(ours_pp_, cold_pp, strict=True))
        print(f"{'':>24} like with like: llama-bench's own first prefill of {n_tok} tokens "
              f"(--no-warmup, flash attention on) {statistics.median(cold_pp):.1f} t/s; "
              f"ours / it, paired: {cold:.3f}")
        print(f"{'':>24} rounds: llama-bench {[round(x) for x in base_pp]}, cold "
              f"{[round(x) for x in cold_pp]}, ours {[round(x) for x in ours_pp_]}")
    print("prefill target: ratio >= 1.0 at 2 threads (pp512 is after llama-bench's warm-up "
          "run; `run`'s prefill is a fresh process's first: the like-with-like line compares "
          "first prefills)")


if __name__ == "__main__":
    main()
