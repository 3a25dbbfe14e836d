"""Continuous batching against llama.cpp's own tools, same model, threads and run.

1. Single stream: Engine decode t/s vs llama-bench tg (ratio target >= 0.95).
2. 8 concurrent streams: Engine aggregate t/s and TTFT p50/p99 vs llama-server
   --parallel 8 built from the same vendored source (ratio target >= 0.9).
3. How many of the 8 concurrent greedy texts equal the same prompt run alone, for both
   (llama.cpp's CPU kernels differ by batch shape, so some near ties flip in both).

    .venv/bin/python benchmarks/batching.py [--model PATH] [--tokens 128] [--streams 8]
        [--rounds 3]

With `--batches K` it runs only the equality study, large enough to compare the sides
(8 prompts decide nothing): K batches of `--streams` distinct chat prompts of varied
length (the model's chat template, rendered once by llama-server's /apply-template, the
same string to both sides), greedy, `ignore_eos`, `--tokens` tokens, each batch sent
concurrently to `inferenceos serve --parallel N` and to `llama-server -np N` over the
/completion dialect (`return_tokens`), then every prompt alone, one after another. Each
phase gets a fresh server (ours: no KV tiers), so no reply reuses cells another phase
computed. Per side: replies identical to the same side's lone reply, and the mean first
divergent token of the others. `--serve-extra` / `--server-extra` add flags to either.

    .venv/bin/python benchmarks/batching.py --batches 8 --tokens 64 [--model PATH]
        [--threads N] [--sides ours llama-server] [--serve-extra "--flash-attn off"]
        [--server-extra "--kv-unified"]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import bandwidth, child_env, finish, ram_gbps, record
from determinism import diverges
from inferenceos.engine.engine import Engine
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.session import default_threads
from inferenceos.model.default_model import ensure_default_model
from inferenceos.model.spec import load_spec
from inferenceos.plan.llama_params import LlamaParams
from llama_tools import llama_tool
from overhead import Server, loadavg, start
from run_overhead import bench_tg

PROMPTS = [
    "The three primary colors are", "Water boils at", "The largest planet is",
    "A short poem about the sea:", "def fibonacci(n):", "The capital of Japan is",
    "Once upon a time,", "The chemical symbol for gold is",
]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


One = Callable[[int], tuple[float, int, str]]  # request i → (TTFT, tokens, text)


def concurrent(n: int, one: One) -> tuple[float, list[float], list[str]]:
    """Run `one(i)` for i < n in threads; returns (aggregate t/s, TTFTs, texts by i)."""
    out: dict[int, tuple[float, int, str]] = {}
    t0 = time.perf_counter()
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, one(i))) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    texts = [out[i][2] for i in range(n)]
    return sum(v[1] for v in out.values()) / wall, [v[0] for v in out.values()], texts


def alone(n: int, one: One) -> list[str]:
    """The texts of requests 0..n-1 run one after another."""
    return [one(i)[2] for i in range(n)]


def ours(engine: Engine, tokens: int, concurrency: int = 0,
         settings: LlamaParams | None = None) -> One:
    """Request i on `engine`; recorded in telemetry when `concurrency` is given."""
    sampling = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)

    def one(i: int) -> tuple[float, int, str]:
        t0 = time.perf_counter()
        ttft, n, text = 0.0, 0, []
        gen = engine.generate(PROMPTS[i % len(PROMPTS)], sampling)
        for ev in gen:
            text.append(ev.text)
            if ev.token >= 0:
                n += 1
                ttft = ttft or time.perf_counter() - t0
        if concurrency:
            record("batching", engine.spec.path, metrics=gen.metrics, settings=settings,
                   concurrency=concurrency, total_s=time.perf_counter() - t0)
        return ttft, n, "".join(text)

    return one


def server(port: int, tokens: int) -> One:
    def one(i: int) -> tuple[float, int, str]:
        body = json.dumps({"prompt": PROMPTS[i % len(PROMPTS)], "n_predict": tokens,
                           "temperature": 0, "ignore_eos": True, "stream": True,
                           "cache_prompt": False})
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        t0 = time.perf_counter()
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        ttft, n, text = 0.0, 0, []
        for line in resp:
            if line.startswith(b"data: ") and b'"content"' in line:
                n += 1
                ttft = ttft or time.perf_counter() - t0
                text.append(json.loads(line[6:])["content"])
        conn.close()
        return ttft, n, "".join(text)

    return one


def start_server(
    binary: Path, model: Path, streams: int, threads: int
) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "-c", str(512 * streams), "-np", str(streams),
         "-t", str(threads), "--host", "127.0.0.1", "--port", str(port), "-b", "512"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    for _ in range(600):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("llama-server did not become healthy")


def lone_decode_tps(engine: Engine, tokens: int, settings: LlamaParams | None = None) -> float:
    """One stream's decode t/s (decode only, as llama-bench's tg measures)."""
    lone = engine.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=tokens,
                                                      ignore_eos=True))
    lone.text()
    record("batching", engine.spec.path, metrics=lone.metrics, settings=settings)
    return lone.metrics.decode_tps


def paired(ours_xs: list[float], theirs: list[float]) -> float:
    """Median of the rounds' own ratios (both sides of a round are adjacent in time)."""
    return statistics.median(a / b for a, b in zip(ours_xs, theirs, strict=True))


# -- the equality study (--batches) ----------------------------------------------------

TOPICS = [
    "a hash map", "TCP slow start", "the Rust borrow checker", "a B-tree",
    "Python's GIL", "gradient descent", "a bloom filter", "the CAP theorem",
    "UTF-8", "garbage collection", "a mutex", "public-key cryptography",
    "a Makefile", "SQL joins", "a Kalman filter", "copy-on-write",
]
ASKS = [
    "Explain {t}.",
    "In two short paragraphs, explain {t} to a new programmer and give one example.",
    "I am preparing notes for a workshop on systems programming. The audience knows "
    "Python well but little C, and they learn best from concrete code. Explain {t}, "
    "say when it matters in practice, and write a small Python snippet showing it.",
    "You are reviewing a colleague's design document. The document proposes using {t} "
    "in a service that handles about ten thousand requests a second on four machines, "
    "with a strict latency budget of twenty milliseconds at the 99th percentile and a "
    "team of three engineers to maintain it. List the questions you would ask about "
    "{t} in that setting, the risks you see, and how you would test the design before "
    "it ships. Keep each point to one sentence.",
]


def chat_questions(n: int) -> list[str]:
    """`n` distinct user messages of four lengths (~5 to ~90 words), lengths interleaved
    so that every batch of 8 holds all four."""
    qs = [a.format(t=t) for t in TOPICS for a in ASKS]
    if n > len(qs):
        raise SystemExit(f"--batches asks for {n} prompts; there are {len(qs)}")
    return qs[:n]


def post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{path}: {resp.status} {data[:300]!r}")
        return dict(json.loads(data))
    finally:
        conn.close()


def reply_tokens(port: int, prompt: str, tokens: int) -> list[int]:
    """One greedy /completion, `tokens` long (ignore_eos): its token ids."""
    out = post(port, "/completion", {
        "prompt": prompt, "n_predict": tokens, "temperature": 0, "ignore_eos": True,
        "cache_prompt": False, "return_tokens": True, "stream": False})
    return [int(t) for t in out["tokens"]]


def batched_and_lone(launch: Callable[[], Server], prompts: list[str], tokens: int,
                     width: int) -> tuple[list[list[int]], list[list[int]], float]:
    """Every prompt's reply in batches of `width` sent together, on one fresh server,
    and alone, on another; and the wall seconds of the batched phase."""
    srv = launch()
    try:
        t0 = time.perf_counter()
        batched: list[list[int]] = []
        for k in range(0, len(prompts), width):
            part = prompts[k:k + width]

            def one(i: int, part: list[str] = part) -> tuple[float, int, str]:
                return 0.0, 0, json.dumps(reply_tokens(srv.port, part[i], tokens))

            batched += [json.loads(t) for t in concurrent(len(part), one)[2]]
        wall = time.perf_counter() - t0
    finally:
        srv.stop()
    srv = launch()
    try:
        lone = [reply_tokens(srv.port, p, tokens) for p in prompts]
    finally:
        srv.stop()
    return batched, lone, wall


def equality(name: str, batched: list[list[int]], lone: list[list[int]]) -> str:
    """'name: S/N identical, ...' with the mean first divergent token of the others."""
    where = {i: d for i, (a, b) in enumerate(zip(lone, batched, strict=True))
             if (d := diverges(a, b)) is not None}
    mean = f"{statistics.mean(where.values()):.1f}" if where else "-"
    lengths = ", ".join(f"#{i} (length {i % len(ASKS)}): {d}" for i, d in where.items())
    return (f"{name}: {len(batched) - len(where)}/{len(batched)} identical to their lone "
            f"reply; the others diverge at token {mean} on average ({lengths})")


def launchers(model: Path, args: argparse.Namespace) -> dict[str, Callable[[], Server]]:
    """Fresh-server factories for ours and llama-server, the same threads and context."""
    ctx, n, threads = max(512, 512 + args.tokens), args.streams, args.threads
    env = child_env("batching")
    ours_cmd = [sys.executable, "-m", "inferenceos", "serve", str(model), "--parallel",
                str(n), "--ctx", str(ctx), "--queue", str(8 * n), "--threads", str(threads),
                "--port", "{port}", "--draft", "none", "--kv-cache-ram", "0",
                "--kv-cache-disk", "0", *shlex.split(args.serve_extra)]
    theirs_cmd = [str(llama_tool("llama-server")), "-m", str(model), "-np", str(n), "-c",
                  str(ctx * n), "-t", str(threads), "--host", "127.0.0.1", "--port",
                  "{port}", *shlex.split(args.server_extra)]
    return {"ours": lambda: start("ours", ours_cmd, env),
            "llama-server": lambda: start("llama-server", theirs_cmd, env)}


def equality_study(model: Path, args: argparse.Namespace) -> None:
    """--batches: the equality counts of both sides over batches * streams prompts."""
    side = launchers(model, args)
    srv = side["llama-server"]()
    try:
        prompts = [str(post(srv.port, "/apply-template", {
            "messages": [{"role": "user", "content": q}]})["prompt"])
            for q in chat_questions(args.batches * args.streams)]
    finally:
        srv.stop()
    print(f"model {model.name}, {len(prompts)} chat prompts in {args.batches} batches of "
          f"{args.streams}, {args.tokens} tokens, greedy, {args.threads} threads; "
          f"ours {args.serve_extra or 'as served'}, llama-server "
          f"{args.server_extra or 'defaults'}; {loadavg()}", flush=True)
    for name, launch in side.items():
        if name not in args.sides:
            continue
        batched, lone, wall = batched_and_lone(launch, prompts, args.tokens, args.streams)
        print(f"  {equality(name, batched, lone)}; batched "
              f"{len(prompts) * args.tokens / wall:.1f} t/s; {loadavg()}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    ap.add_argument("--batches", type=int, default=0,
                    help="only the equality study, over this many batches (module doc)")
    ap.add_argument("--serve-extra", default="", help="more flags for ours (--batches)")
    ap.add_argument("--sides", nargs="+", default=["ours", "llama-server"],
                    choices=["ours", "llama-server"], help="which sides run (--batches)")
    ap.add_argument("--threads", type=int, default=default_threads(),
                    help="both sides' threads (--batches)")
    ap.add_argument("--server-extra", default="", help="more flags for llama-server")
    args = ap.parse_args()
    model = args.model or ensure_default_model()
    if args.batches:
        equality_study(model, args)
        return
    threads = default_threads()
    print(f"model {model.name}, {args.tokens} tokens per stream, {threads} threads, "
          f"{args.rounds} alternating rounds")
    settings = LlamaParams(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=threads)
    bench_bin = llama_tool("llama-bench")
    single, bench, agg, s_agg = [], [], [], []
    ttfts: list[float] = []
    s_ttfts: list[float] = []
    proc, port = start_server(llama_tool("llama-server"), model, args.streams, threads)
    try:
        concurrent(1, server(port, 8))  # warm-up
        for _ in range(args.rounds):
            # a fresh engine, as llama-bench starts empty: prefixes other sequences
            # left cached in the shared KV pool slow a lone stream (docs/engine.md)
            with Engine(model, settings, n_parallel=args.streams) as fresh:
                single.append(lone_decode_tps(fresh, args.tokens, settings))
            bench.append(bench_tg(bench_bin, model, args.tokens, threads))
            # like for like: llama-server gets cache_prompt false, so our engine must not
            # reuse the previous round's cached prompts either: a fresh one each round
            with Engine(model, settings, n_parallel=args.streams) as engine:
                a, t, texts = concurrent(args.streams,
                                         ours(engine, args.tokens, args.streams, settings))
            agg.append(a)
            ttfts += t
            a, t, s_texts = concurrent(args.streams, server(port, args.tokens))
            s_agg.append(a)
            s_ttfts += t
        s_lone_texts = alone(args.streams, server(port, args.tokens))
    finally:
        proc.terminate()
        proc.wait(10)
    with Engine(model, settings, n_parallel=args.streams) as fresh:  # no batched KV to reuse
        lone_texts = alone(args.streams, ours(fresh, args.tokens))
    med = statistics.median
    print(f"single stream decode: ours {med(single):.1f} t/s, llama-bench tg {med(bench):.1f} "
          f"t/s, ratio {paired(single, bench):.3f} (target >= 0.95)")
    print(f"{args.streams} streams: ours {med(agg):.1f} t/s, llama-server {med(s_agg):.1f} t/s, "
          f"ratio {paired(agg, s_agg):.3f} (target >= 0.9)")
    # one pass over the weights per step: a lone stream's token, or one token per stream
    weights, ram = load_spec(model).tensor_bytes, ram_gbps()
    print(f"  bandwidth achieved: single stream ours {bandwidth(med(single), weights, ram)}, "
          f"llama-bench {bandwidth(med(bench), weights, ram)}; {args.streams} streams ours "
          f"{bandwidth(med(agg) / args.streams, weights, ram)}, llama-server "
          f"{bandwidth(med(s_agg) / args.streams, weights, ram)} (a step of {args.streams} "
          "streams reads the weights once)")
    print(f"  rounds: ours {[round(x, 1) for x in agg]}, llama-server "
          f"{[round(x, 1) for x in s_agg]}")
    for name, xs in (("ours", ttfts), ("llama-server", s_ttfts)):
        print(f"  TTFT {name}: p50 {statistics.median(xs) * 1000:.0f} ms, "
              f"p99 {percentile(xs, 0.99) * 1000:.0f} ms")
    same = sum(a == b for a, b in zip(texts, lone_texts, strict=True))
    s_same = sum(a == b for a, b in zip(s_texts, s_lone_texts, strict=True))
    print(f"greedy texts identical to the prompt run alone: ours {same}/{args.streams}, "
          f"llama-server {s_same}/{args.streams}")
    finish("batching")


if __name__ == "__main__":
    main()
