"""Soak: minutes of mixed load against a real `inferenceos serve` on loopback.

Three models share one memory budget: two tiny generated llamas (Hermes-style tool
template) and the built-in Gemma 3 270M. The run is cut in phases (`--phase-s`); each
phase uses two of the three models, rotating, so every phase switch makes the memory
manager demote or unload one (the budget holds Gemma and one tiny model hot, not all
three, so a switch frees an idle model's context: hot -> warm), and one Ollama request in
four asks `keep_alive: 0`, which unloads its model when idle (-> cold: the next request
starts a new worker). Phases switch at a barrier (every client finishes its request
first), so a switch never finds the model to evict busy: a 503 is then a real failure,
not bad luck.

Each client loops over a mix: OpenAI chat streamed and not, Ollama generate and chat,
a stream abandoned after its first chunks (cancellation), embeddings (OpenAI and
Ollama), and chat with tools. Every request is checked (status 200 and the right
shape); the run fails on any failed request, on a server whose RSS or open file
descriptors grow (sampled every `--sample-s` and printed), or on a request stuck past
its timeout. The run is bounded: `--minutes`, `--max-requests`, a per-request timeout
and a hard deadline.

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--clients 3] [--phase-s 20]
        [--sample-s 30] [--max-requests 100000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tiny model writer and the tool template

GEMMA, TINY_A, TINY_B = "gemma", "tiny-a", "tiny-b"
# each phase's two models, rotating: every switch needs a model the budget has no room for
PHASES = [(GEMMA, TINY_A), (TINY_A, TINY_B), (GEMMA, TINY_B)]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
PROMPTS = ["The capital of France is", "Write one line about the sea.", "Count: 1, 2, 3,",
           "Name a colour.", "What is 2 + 2?"]
KINDS = ["chat", "chat_stream", "ollama_generate", "ollama_chat_stream", "cancel",
         "embed_openai", "embed_ollama", "tools"]


def cli(home: Path, *args: str, timeout: float = 300) -> str:
    env = {**os.environ, "INFERENCEOS_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "inferenceos", *args], env=env, timeout=timeout,
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"inferenceos {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def register_models(home: Path, gemma: Path) -> None:
    from tiny_models import write_tiny_model
    from tool_templates import TINY_HERMES_TEMPLATE

    for seed, name in enumerate((TINY_A, TINY_B)):
        path = write_tiny_model(home / f"{name}.gguf", "llama", seed=seed,
                                chat_template=TINY_HERMES_TEMPLATE)
        cli(home, "pull", str(path), "--name", name)
    cli(home, "pull", str(gemma), "--name", GEMMA)


def budget_bytes(home: Path, ctx: int, threads: int, parallel: int) -> tuple[int, dict]:
    """Gemma's hot charge + the larger tiny model's + half the smaller one's: two of the
    three models fit hot, never all three (the planner's own figures, as serve's)."""
    os.environ["INFERENCEOS_HOME"] = str(home)
    from inferenceos.config import load_config
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.registry.catalog import Catalog
    from inferenceos.registry.manager import ModelManager
    from inferenceos.registry.store import ModelStore

    catalog = Catalog(ModelStore(load_config().models_dir))
    probe = ModelManager(catalog.resolve, base=LoadRequest(n_ctx=ctx, threads=threads),
                         slots=parallel, context_hint=None)
    hot = {n: sum(probe.plan_for(n).charge().values()) for n in (GEMMA, TINY_A, TINY_B)}
    tiny = sorted((hot[TINY_A], hot[TINY_B]))
    return hot[GEMMA] + tiny[1] + tiny[0] // 2, hot


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the server's footprint ----------------------------------------------------------------


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


@dataclass
class Sample:
    t: float
    ok: int
    failed: int
    rss_mb: float  # the server process
    workers_mb: float  # its engine workers together (they come and go with evictions)
    fds: int
    workers: int


# -- the load ------------------------------------------------------------------------------


@dataclass
class Tally:
    ok: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    latency: dict[str, list[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, seconds: float, error: str | None) -> None:
        with self.lock:
            if error is None:
                self.ok[kind] += 1
                self.latency.setdefault(kind, []).append(seconds)
            else:
                self.failed[kind] += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{kind}: {error}")


def _check(r: httpx.Response) -> None:
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")


def one_request(c: httpx.Client, kind: str, model: str, rng: random.Random) -> None:
    """Send one request of `kind` to `model`; raise on anything but a good answer."""
    prompt = rng.choice(PROMPTS)
    msgs = [{"role": "user", "content": prompt}]
    n = rng.randint(4, 24)
    if kind == "tools" and model == GEMMA:  # Gemma's template has no tools: a tiny one
        kind = "chat"
    if kind in ("chat", "tools"):
        body: dict = {"model": model, "messages": msgs, "max_tokens": n}
        if kind == "tools":
            body |= {"tools": TOOLS, "tool_choice": "auto"}
        r = c.post("/v1/chat/completions", json=body)
        _check(r)
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] in ("stop", "length", "tool_calls"), choice
    elif kind in ("chat_stream", "cancel"):
        body = {"model": model, "messages": msgs, "stream": True,
                "max_tokens": 200 if kind == "cancel" else n}
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            _check(r)
            lines = [ln for ln in _first_lines(r, 3 if kind == "cancel" else None) if ln]
        if kind == "cancel":  # closed after 3 lines: the server must cancel and carry on
            assert lines and lines[0].startswith("data: "), lines
        else:
            assert lines[-1] == "data: [DONE]", lines[-3:]
    elif kind == "ollama_generate":
        body = {"model": model, "prompt": prompt, "stream": False,
                "options": {"num_predict": n}}
        if rng.random() < 0.25:  # unload when idle: the next request loads it cold
            body["keep_alive"] = 0
        r = c.post("/api/generate", json=body)
        _check(r)
        assert r.json()["done"] is True
    elif kind == "ollama_chat_stream":
        with c.stream("POST", "/api/chat", json={
                "model": model, "messages": msgs, "options": {"num_predict": n}}) as r:
            _check(r)
            last = [ln for ln in r.iter_lines() if ln][-1]
        assert json.loads(last)["done"] is True
    elif kind == "embed_openai":
        r = c.post("/v1/embeddings", json={"model": model, "input": [prompt, "second"]})
        _check(r)
        assert len(r.json()["data"]) == 2
    elif kind == "embed_ollama":
        r = c.post("/api/embed", json={"model": model, "input": prompt})
        _check(r)
        assert len(r.json()["embeddings"]) == 1
    else:  # pragma: no cover
        raise ValueError(kind)


def _first_lines(r: httpx.Response, limit: int | None) -> list[str]:
    out = []
    for ln in r.iter_lines():
        out.append(ln)
        if limit is not None and len([x for x in out if x]) >= limit:
            break
    return out


class Load:
    """Clients looping over the mix, phase by phase, until the end or the request cap."""

    def __init__(self, base: str, clients: int, phase_s: float, end: float, max_requests: int,
                 timeout_s: float, seed: int = 0) -> None:
        self.base, self.clients, self.phase_s = base, clients, phase_s
        self.end, self.max_requests, self.timeout_s = end, max_requests, timeout_s
        self.tally = Tally()
        self.sent = 0
        self.phase = 0
        self.switches: list[dict] = []
        self.barrier = threading.Barrier(clients, action=self._next_phase)
        self.phase_end = time.monotonic() + phase_s
        self.seed = seed
        self.stop = False

    def _next_phase(self) -> None:
        """Runs once, with every client parked: record the tiers, then move on."""
        ps = httpx.get(self.base + "/api/ps", timeout=30).json()["models"]
        self.switches.append({m["name"].split(":")[0]: m.get("state", "?") for m in ps})
        self.phase += 1
        self.phase_end = time.monotonic() + self.phase_s
        if time.monotonic() >= self.end or self.sent >= self.max_requests:
            self.stop = True

    def client(self, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        with httpx.Client(base_url=self.base, timeout=self.timeout_s) as c:
            while not self.stop:
                models = PHASES[self.phase % len(PHASES)]
                while time.monotonic() < self.phase_end and self.sent < self.max_requests:
                    kind, model = rng.choice(KINDS), rng.choice(models)
                    self.sent += 1
                    t0 = time.monotonic()
                    try:
                        one_request(c, kind, model, rng)
                        self.tally.add(kind, time.monotonic() - t0, None)
                    except Exception as exc:  # every failure is counted and reported
                        self.tally.add(kind, time.monotonic() - t0,
                                       f"{model}: {type(exc).__name__}: {str(exc)[:160]}")
                try:
                    self.barrier.wait(timeout=self.timeout_s * 2)
                except threading.BrokenBarrierError:
                    self.tally.add("phase-switch", 0, "a client did not reach the barrier")
                    self.stop = True
                    return


# -- the run -------------------------------------------------------------------------------


def flat(samples: list[Sample], attr: str, rel: float, slack: float) -> tuple[bool, str]:
    """After warm-up (the first third of samples), the last third's median must not
    exceed the middle third's by more than `rel` + `slack`."""
    xs = [getattr(s, attr) for s in samples]
    k = max(1, len(xs) // 3)
    mid, last = xs[k: 2 * k] or xs, xs[2 * k:] or xs
    a, b = statistics.median(mid), statistics.median(last)
    ok = b <= a * (1 + rel) + slack
    return ok, f"{attr}: middle third median {a:.1f}, last third {b:.1f} " \
               f"(bound {a * (1 + rel) + slack:.1f}) {'flat' if ok else 'GROWING'}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--phase-s", type=float, default=20.0)
    ap.add_argument("--sample-s", type=float, default=30.0)
    ap.add_argument("--max-requests", type=int, default=100_000)
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the temporary home")
    args = ap.parse_args()
    from inferenceos.model.default_model import ensure_default_model

    home = Path(tempfile.mkdtemp(prefix="ios-soak-"))
    t_setup = time.monotonic()
    register_models(home, ensure_default_model())
    parallel = 2
    budget, hot = budget_bytes(home, args.ctx, args.threads, parallel)
    print("hot charges (MiB): " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in hot.items())
          + f"; budget {budget / 2**20:.1f} MiB")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = home / "serve.log"
    with log.open("wb") as f:  # a file, not a pipe: nobody reads a pipe during the run
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferenceos", "serve", TINY_A, "--port", str(port),
             "--ctx", str(args.ctx), "--threads", str(args.threads), "--parallel",
             str(parallel), "--memory-budget", str(budget), "--keep-alive", "-1"],
            env={**os.environ, "INFERENCEOS_HOME": str(home)}, stdout=f, stderr=f)
    samples: list[Sample] = []
    code = 1
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        print(f"setup {time.monotonic() - t_setup:.0f} s; serving on {base} (pid {proc.pid})")
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        load = Load(base, args.clients, args.phase_s, end, args.max_requests, args.timeout_s)
        threads = [threading.Thread(target=load.client, args=(i,), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        hard = end + 2 * args.timeout_s + args.phase_s + 60  # nothing may outlive this
        print(f"{'min':>6} {'ok':>7} {'failed':>6} {'rss MB':>7} {'workers MB':>10} "
              f"{'fds':>4} {'workers':>7}")
        next_sample = t0
        while any(t.is_alive() for t in threads) and time.monotonic() < hard:
            if time.monotonic() >= next_sample:
                kids = _children(proc.pid)
                with load.tally.lock:
                    ok, failed = sum(load.tally.ok.values()), sum(load.tally.failed.values())
                s = Sample(time.monotonic() - t0, ok, failed, _rss_kb(proc.pid) / 1024,
                           sum(_rss_kb(k) for k in kids) / 1024, _fds(proc.pid), len(kids))
                samples.append(s)
                print(f"{s.t / 60:6.1f} {s.ok:7d} {s.failed:6d} {s.rss_mb:7.1f} "
                      f"{s.workers_mb:10.1f} {s.fds:4d} {s.workers:7d}", flush=True)
                next_sample += args.sample_s
            time.sleep(0.5)
        stuck = [t for t in threads if t.is_alive()]
        elapsed = time.monotonic() - t0
        tally = load.tally
        n_ok, n_failed = sum(tally.ok.values()), sum(tally.failed.values())
        print(f"\n{elapsed / 60:.1f} min, {n_ok} requests ok, {n_failed} failed, "
              f"{len(stuck)} clients stuck, {load.phase} phase switches")
        for kind in KINDS:
            lat = tally.latency.get(kind, [])
            p50 = statistics.median(lat) * 1000 if lat else float("nan")
            print(f"  {kind:<20} ok {tally.ok[kind]:6d} failed {tally.failed[kind]:3d} "
                  f"p50 {p50:7.0f} ms")
        for e in tally.errors:
            print("  error:", e)
        moves: Counter[str] = Counter()
        for a, b in zip(load.switches, load.switches[1:], strict=False):
            for name in {*a, *b}:
                if a.get(name) != b.get(name):
                    moves[f"{a.get(name, 'cold')}->{b.get(name, 'cold')}"] += 1
        print("tier changes between phases: "
              + ", ".join(f"{k} {v}" for k, v in sorted(moves.items())))
        checks = [flat(samples, "rss_mb", 0.10, 20.0), flat(samples, "fds", 0.0, 4.0)]
        for _, line in checks:
            print("  " + line)
        code = 0 if (n_failed == 0 and not stuck and n_ok > 0 and all(c[0] for c in checks)
                     and len(samples) >= 3) else 1
        print("SOAK PASSED" if code == 0 else "SOAK FAILED")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if args.keep or code:
            print(f"home kept: {home} (server log: {log})")
        else:
            shutil.rmtree(home, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
