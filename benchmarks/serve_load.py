"""Load test: N concurrent streaming clients against `inferenceos serve` and llama-server.

Each client loops for DURATION seconds: POST /v1/completions with stream=true and
max_tokens tokens, measuring time to first token (TTFT), the gaps between streamed
tokens (inter-token latency, ITL) and tokens received. Both servers get the same model,
the same number of parallel sequences and the same load, one after the other (they
would fight over the CPU cores if run together).

    python benchmarks/serve_load.py [--model PATH] [--clients 32] [--duration 60]

Prints requests/s, aggregate tokens/s, p50/p99 TTFT and ITL, and failed requests.
Traffic goes to 127.0.0.1 only; every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


@dataclass
class Stats:
    ok: int = 0
    failed: int = 0
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def one_request(client: httpx.AsyncClient, url: str, body: dict, stats: Stats) -> None:
    t0 = time.perf_counter()
    last, n = None, 0
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            stats.failed += 1
            stats.errors.append(f"{r.status_code} {(await r.aread())[:200]!r}")
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                stats.failed += 1
                stats.errors.append(str(event["error"])[:200])
                return
            if any(c.get("text") for c in event.get("choices", [])):
                now = time.perf_counter()
                if last is None:
                    stats.ttft.append(now - t0)
                else:
                    stats.itl.append(now - last)
                last, n = now, n + 1
    stats.ok += 1
    stats.tokens += n


async def load(base: str, model: str, clients: int, duration: float, max_tokens: int) -> Stats:
    stats = Stats()
    deadline = time.monotonic() + duration
    limits = httpx.Limits(max_connections=clients + 4)

    async def client_loop(i: int) -> None:
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            k = 0
            while time.monotonic() < deadline:
                body = {
                    "model": model,
                    "prompt": f"Story {i}-{k}: Once upon a time",
                    "max_tokens": max_tokens,
                    "stream": True,
                    "temperature": 0.8,
                    "seed": i * 1000 + k,
                }
                try:
                    await one_request(client, base + "/v1/completions", body, stats)
                except (httpx.HTTPError, ValueError) as exc:
                    stats.failed += 1
                    stats.errors.append(repr(exc)[:200])
                k += 1

    t0 = time.monotonic()
    await asyncio.gather(*(client_loop(i) for i in range(clients)))
    stats.elapsed = time.monotonic() - t0  # type: ignore[attr-defined]
    return stats


def wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server did not become healthy")


def pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] * 1000 if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1000


def report(name: str, s: Stats) -> None:
    el = getattr(s, "elapsed", 1.0)
    print(
        f"{name:<14} req/s {s.ok / el:6.2f}  tok/s {s.tokens / el:7.1f}  "
        f"TTFT p50 {pct(s.ttft, 50):7.0f} ms p99 {pct(s.ttft, 99):7.0f} ms  "
        f"ITL p50 {pct(s.itl, 50):6.1f} ms p99 {pct(s.itl, 99):7.1f} ms  "
        f"ok {s.ok} failed {s.failed}"
    )
    for e in s.errors[:3]:
        print("   error:", e)


def run_server(
    cmd: list[str], base: str, env: dict[str, str], args: argparse.Namespace, model: str, name: str
) -> Stats:
    # stderr goes to a file, never an unread pipe: a server blocks once a pipe's 64 KiB
    # fill up (llama-server logs every request), which hung this benchmark for minutes
    with tempfile.NamedTemporaryFile(prefix=f"serve_load-{name}-", suffix=".log",
                                     delete=False) as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        try:
            wait_healthy(base, proc)
        except RuntimeError as exc:
            tail = Path(log.name).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name}: {exc}; its log ({log.name}) ends:\n{tail}") from None
        asyncio.run(load(base, model, 1, 3, 4))  # warm up (load the model)
        stats = asyncio.run(load(base, model, args.clients, args.duration, args.max_tokens))
        report(name, stats)
        return stats
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: built-in Gemma)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=8, help="sequences batched per server")
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence")
    ap.add_argument("--skip-llama-server", action="store_true")
    args = ap.parse_args()
    if args.model is None:
        from inferenceos.model.default_model import ensure_default_model

        args.model = ensure_default_model()
    print(
        f"model {args.model.name}, {args.clients} clients, {args.duration:.0f} s, "
        f"max_tokens {args.max_tokens}, {args.parallel} parallel, {os.cpu_count()} CPUs"
    )
    env = dict(os.environ, INFERENCEOS_HOME=tempfile.mkdtemp(prefix="ios-bench-"))
    port = free_port()
    ours = run_server(
        [
            sys.executable,
            "-m",
            "inferenceos",
            "serve",
            str(args.model),
            "--port",
            str(port),
            "--parallel",
            str(args.parallel),
            "--queue",
            str(args.clients * 2),
            "--ctx",
            str(args.ctx),
        ],
        f"http://127.0.0.1:{port}",
        env,
        args,
        "",
        "inferenceos",
    )
    failed = ours.failed
    if not args.skip_llama_server:
        sys.path.insert(0, str(Path(__file__).parent))
        from llama_tools import llama_tool

        port = free_port()
        theirs = run_server(
            [
                str(llama_tool("llama-server")),
                "-m",
                str(args.model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-np",
                str(args.parallel),
                "-c",
                str(args.ctx * args.parallel),
                "-t",
                str(os.cpu_count() or 1),
            ],
            f"http://127.0.0.1:{port}",
            env,
            args,
            "model",
            "llama-server",
        )
        failed += theirs.failed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
