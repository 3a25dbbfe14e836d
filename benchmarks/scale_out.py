"""Scale-out figures: one and two `inferenceos serve` replicas behind LiteLLM's Router.

Starts two replicas of the same model on loopback ports (each warmed by one request),
then, in one run: REQUESTS chat requests at CONCURRENCY through a Router that knows only
the first replica, the same through a Router over both, and the same again over both
with the first replica killed (SIGKILL) after a quarter of the requests have been
answered. Prints requests/s, completion tokens/s and failures for each, and who
answered. docs/scale-out.md has the figures of a run.

    python benchmarks/scale_out.py [--model PATH] [--requests 64] [--concurrency 16]
        [--max-tokens 16] [--threads 1] [--parallel 4]

Two replicas on one machine share its cores: with 2 cores and a replica at 1 thread,
two replicas can at best double the one's rate, and anything else running (the
router, the client, other work) takes from it. Loopback only; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# read by litellm at import time: the bundled cost map, nothing fetched
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path.home() / ".cache" / "inferenceos-test" / "gemma-3-270m-q4_k_m.gguf"


@dataclass
class Outcome:
    label: str
    seconds: float = 0.0
    ok: int = 0
    failed: int = 0
    tokens: int = 0
    by: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        rps = self.ok / self.seconds if self.seconds else 0.0
        tps = self.tokens / self.seconds if self.seconds else 0.0
        by = ", ".join(f"{k} {v}" for k, v in sorted(self.by.items()))
        return (f"{self.label:<34} {rps:6.2f} req/s  {tps:7.1f} tok/s  ok {self.ok:3d}  "
                f"failed {self.failed}  ({self.seconds:.1f} s; {by})")


def start_replica(model: Path, threads: int, parallel: int, home: Path) -> tuple[Any, str]:
    """`inferenceos serve MODEL` on a free loopback port, answering /health and warmed."""
    sys.path.insert(0, str(ROOT / "src"))
    from inferenceos.cluster.spawn import free_port

    port = free_port()
    env = {**os.environ, "INFERENCEOS_HOME": str(home),
           "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferenceos", "serve", str(model), "--port", str(port),
         "--ctx", "1024", "--threads", str(threads), "--parallel", str(parallel),
         "--queue", "256", "--any-model"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"replica on {base} did not start")
        time.sleep(0.2)
    httpx.post(base + "/v1/chat/completions", timeout=120, json={
        "model": "gemma", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    return proc, base


def router(bases: list[str]) -> Any:
    import litellm

    litellm.success_callback, litellm.failure_callback, litellm.callbacks = [], [], []
    return litellm.Router(model_list=[{
        "model_name": "gemma",
        "litellm_params": {"model": "openai/gemma", "api_base": b + "/v1", "api_key": "none"},
        "model_info": {"id": f"replica-{i}"},
    } for i, b in enumerate(bases)], timeout=120, num_retries=3, retry_after=0,
        allowed_fails=0, cooldown_time=60, enable_weighted_failover=True)


async def load(r: Any, out: Outcome, n: int, concurrency: int, max_tokens: int,
               kill: tuple[int, Any] | None = None) -> None:
    """`n` chat requests, `concurrency` at a time; `kill` = (after how many answers,
    the process to SIGKILL then)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            try:
                resp = await r.acompletion(
                    model="gemma", max_tokens=max_tokens, temperature=0,
                    messages=[{"role": "user", "content": f"Write a line about the number {i}."}])
            except Exception as exc:  # a failure is a figure here, not a crash
                out.failed += 1
                out.errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
                return
        out.ok += 1
        out.tokens += resp.usage.completion_tokens
        out.by[str(resp._hidden_params.get("model_id"))] += 1
        if kill is not None and out.ok == kill[0]:
            kill[1].kill()

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), 1800)
    out.seconds = time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=4)
    args = ap.parse_args()
    if not args.model.is_file():
        raise SystemExit(f"no model at {args.model} (pass --model PATH)")
    import tempfile

    with tempfile.TemporaryDirectory() as home:
        replicas = [start_replica(args.model, args.threads, args.parallel, Path(home) / str(i))
                    for i in range(2)]
        bases = [b for _, b in replicas]
        try:
            print(f"model {args.model.name}, {args.requests} requests, concurrency "
                  f"{args.concurrency}, max_tokens {args.max_tokens}, {args.threads} "
                  f"thread(s) and {args.parallel} slots per replica, {os.cpu_count()} cores")
            runs = [("one replica", router(bases[:1]), None),
                    ("two replicas", router(bases), None),
                    ("two, replica-0 killed at 1/4", router(bases),
                     (args.requests // 4, replicas[0][0]))]
            for label, r, kill in runs:
                out = Outcome(label)
                asyncio.run(load(r, out, args.requests, args.concurrency, args.max_tokens,
                                 kill))
                print(out.line(), flush=True)
                for e in out.errors[:5]:
                    print("   ", e)
        finally:
            for proc, _ in replicas:
                if proc.poll() is None:
                    proc.terminate()
                proc.wait(30)


if __name__ == "__main__":
    main()
