"""What one request costs the server, apart from its tokens: ours against llama-server.

With direct writes a generated token costs `serve`'s HTTP process nothing. A request
costs it its parse, routing, admission, response and records, which at 8 streams of
128-token requests decided the last percents against llama-server (docs/engine.md,
"Per request, not per token"). This measures that cost directly. The tiny llama of
overhead.py is served by `inferenceos serve` and by llama-server (the same flags as
overhead.py's), one at a time. Each server gets `--requests` streamed `/completion`
requests of `--tokens` tokens, one after the other, each on a fresh connection. The
script prints, per request and per round:

- the wall time, and the time from the send to the first byte;
- the CPU time of every process from /proc: ours' HTTP process (its event loop, the
  main thread, and its other threads) and its model worker; llama-server's one process;
- ours' own `timings` (prompt_ms, predicted_ms: the medians), which say how much of
  the wall time is the prompt and the tokens, and how much is around them;
- the ratio of our total CPU per request to llama-server's, and of the wall times.

The client is this process, the same for both (raw sockets, no HTTP library). The order
alternates by round; ratios are the median of the rounds' own ratios.

    .venv/bin/python benchmarks/request_cost.py [--requests 300] [--tokens 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import CLK_TCK, Server, cpu_s, loadavg, servers, tiny_model


@dataclass
class Cost:
    """One server's figures for one round, per request (ms)."""

    wall: float
    first_byte: float
    cpu: dict[str, float]  # process or thread group -> CPU ms a request
    prompt_ms: float | None  # the server's own timings (medians; None: not reported)
    predicted_ms: float | None

    @property
    def total(self) -> float:
        return sum(v for k, v in self.cpu.items() if k not in ("loop", "http threads"))


_TIMINGS = re.compile(rb'"timings":(\{[^}]*\})')


def one_request(port: int, i: int, tokens: int) -> tuple[float, dict[str, float]]:
    """Send request `i` and read its chunked stream to the end: the seconds to its
    first byte, and the `timings` of its final event (llama-server's shape, which ours
    reports too: prompt_ms, predicted_ms...)."""
    body = json.dumps({"prompt": f"Client 0 request {i}: once upon a time",
                       "n_predict": tokens, "stream": True, "temperature": 0,
                       "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        t0 = time.perf_counter()
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
        first = 0.0
        got = b""
        while not got.endswith(b"0\r\n\r\n"):  # the chunked body's last chunk
            data = s.recv(65536)
            if not data:
                break
            first = first or time.perf_counter() - t0
            got += data
    found = _TIMINGS.findall(got)
    return first, (json.loads(found[-1]) if found else {})


def thread_cpu_s(pid: int) -> tuple[float, float]:
    """(the main thread's, the other threads') CPU seconds of process `pid`."""
    main = others = 0.0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        s = (int(fields[11]) + int(fields[12])) / CLK_TCK
        if int(task.name) == pid:
            main += s
        else:
            others += s
    return main, others


def measure(srv: Server, n: int, tokens: int) -> Cost:
    """`n` sequential requests to `srv` (after 20 unmeasured ones)."""
    for i in range(20):
        one_request(srv.port, i, tokens)  # (warm-up)
    pids = srv.pids  # (ours: the HTTP process and its model worker)
    before = {k: cpu_s(p) for k, p in pids.items()}
    threads0 = thread_cpu_s(srv.proc.pid)
    t0 = time.perf_counter()
    got = [one_request(srv.port, 100 + i, tokens) for i in range(n)]
    wall = time.perf_counter() - t0
    firsts = [f for f, _ in got]
    cpu = {k: (cpu_s(p) - before[k]) * 1000 / n for k, p in pids.items()}
    if srv.name != "llama-server":
        threads1 = thread_cpu_s(srv.proc.pid)
        cpu["loop"] = (threads1[0] - threads0[0]) * 1000 / n
        cpu["http threads"] = (threads1[1] - threads0[1]) * 1000 / n
    def timing(key: str) -> float | None:
        # (llama-server's stream carries its timings in some replies only: not read)
        found = [float(t[key]) for _, t in got if key in t and srv.name != "llama-server"]
        return statistics.median(found) if found else None

    return Cost(wall * 1000 / n, statistics.median(firsts) * 1000, cpu,
                timing("prompt_ms"), timing("predicted_ms"))


def report(name: str, c: Cost) -> None:
    parts = "  ".join(f"{k} {v:6.2f}" for k, v in c.cpu.items())
    own = ("not read" if c.prompt_ms is None or c.predicted_ms is None else
           f"prompt {c.prompt_ms:5.2f} ms, generation {c.predicted_ms:5.2f} ms")
    print(f"    {name:<13} wall {c.wall:6.2f} ms  first byte {c.first_byte:5.2f} ms  "
          f"its timings: {own}\n"
          f"    {'':<13} CPU ms a request: {parts}  total {c.total:6.2f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=8, help="tokens per request")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="request-cost-"))
    env = dict(os.environ, INFERENCEOS_HOME=str(folder / "home"))
    print(f"request_cost.py: {args.rounds} rounds of {args.requests} sequential requests of "
          f"{args.tokens} tokens, the tiny llama, {args.threads} threads, {loadavg()}",
          flush=True)
    cost: dict[str, list[float]] = {"ours": [], "llama-server": []}
    wall: dict[str, list[float]] = {"ours": [], "llama-server": []}
    try:
        # overhead.py's two servers as at 8 streams (8 slots of 512 cells, 2 threads)
        srv = servers(tiny_model(folder), 8, argparse.Namespace(
            tokens=args.tokens, threads=args.threads, serve_threads=0, serve_extra="",
            baseline_src=None, baseline_env=[], aa=False, baseline_first=False,
            both_ways=False), env)
        try:
            for r in range(args.rounds):
                print(f"  round {r + 1} ({loadavg()})", flush=True)
                order = ["ours", "llama-server"][:: 1 if r % 2 == 0 else -1]
                for name in order:
                    c = measure(srv[name], args.requests, args.tokens)
                    report(name, c)
                    cost[name].append(c.total)
                    wall[name].append(c.wall)
        finally:
            for s in srv.values():
                s.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    def ratio(of: dict[str, list[float]]) -> float:
        return statistics.median(a / b for a, b in zip(of["ours"], of["llama-server"],
                                                       strict=True))

    cpu_ratio, wall_ratio = ratio(cost), ratio(wall)
    print(f"  CPU a request, ours / llama-server: {cpu_ratio:.2f}   wall a request: "
          f"{wall_ratio:.2f}   (lower is better)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
