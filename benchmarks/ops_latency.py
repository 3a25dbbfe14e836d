"""Operations endpoints answer while the server works: their p50 / p99 latency.

A real `inferenceos serve` on loopback (its own process), probed one request at a time,
round robin, over /health, /api/version, /api/ps, /api/budget, /metrics, /v1/models and
/api/events (what `monitor`, `ps`, `budget` and the dashboard read), first idle and then
in each of four situations:

- streams: 8 streams generating at once (`--parallel 8`);
- load: another model loading again and again (each request asks `keep_alive: 0`, so it
  is unloaded when done and the next request loads it anew);
- migration: a cap on the CPU below the model's charge, then lifted, again and again:
  each a live migration down and back up with a stream running through it. Printed too:
  how long after each cap the migration started (its "migrating" event; an operator's
  cap is an order, not a noisy signal);
- kill: the model's worker process killed (SIGKILL) again and again while streams run;
  the next request starts a new worker.

The probes run in a separate process (their own interpreter: the load's client threads
do not delay them), every `--gap-ms`, each with a 30 s timeout (a timeout counts as an
error and as 30 s). Target: p99 under 100 ms in every situation, against a few
milliseconds idle. On a shared machine the tail follows its load (another job's
threads delay the server's event loop like anything else): each situation's line says
the load average at its end. `--model tiny` (the default: the wide tiny model, ~2 min)
or `gemma` (the built-in Gemma 3 270M, loaded twice under two names).

    .venv/bin/python benchmarks/ops_latency.py [--model tiny|gemma] [--seconds 20]
        [--gap-ms 10] [--only SITUATION ...] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from inferenceos.cluster.spawn import free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tiny model writer

ENDPOINTS = ("/health", "/api/version", "/api/ps", "/api/budget", "/metrics", "/v1/models",
             "/api/events")
MAIN, OTHER = "main", "other"
STREAMS = 8
PROBE_TIMEOUT_S = 30.0


# -- the probe process -----------------------------------------------------------------------


def probe(base: str, seconds: float, gap_s: float) -> dict[str, list[float]]:
    """Round robin over ENDPOINTS for `seconds`: each endpoint's latencies in seconds
    (a failed or timed-out request counts PROBE_TIMEOUT_S and is listed under
    "errors")."""
    out: dict[str, list[float]] = {e: [] for e in ENDPOINTS}
    out["errors"] = []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
        i = 0
        while time.monotonic() < end:
            path = ENDPOINTS[i % len(ENDPOINTS)]
            i += 1
            t0 = time.perf_counter()
            try:
                ok = client.get(base + path).status_code == 200
            except httpx.HTTPError:
                ok = False
            took = time.perf_counter() - t0
            out[path].append(took if ok else PROBE_TIMEOUT_S)
            if not ok:
                out["errors"].append(float(i))
            time.sleep(gap_s)
    return out


def probe_in_process(base: str, seconds: float, gap_s: float) -> dict[str, list[float]]:
    """`probe` in a child interpreter (this script with --probe)."""
    r = subprocess.run([sys.executable, __file__, "--probe", base, "--seconds", str(seconds),
                        "--gap-ms", str(gap_s * 1000)], capture_output=True, text=True,
                       timeout=seconds + 4 * PROBE_TIMEOUT_S)
    if r.returncode:
        raise SystemExit(f"the probe failed: {r.stderr[-2000:]}")
    result: dict[str, list[float]] = json.loads(r.stdout)
    return result


# -- the server ----------------------------------------------------------------------------


def cli(home: Path, *args: str) -> None:
    env = {**os.environ, "INFERENCEOS_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "inferenceos", *args], env=env, timeout=300,
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"inferenceos {' '.join(args)} failed: {r.stderr.strip()}")


def register(home: Path, model: str) -> int:
    """The main and the other model in `home`'s registry; the main one's context per
    sequence."""
    from tiny_models import write_tiny_model

    if model == "gemma":  # Gemma loads while Gemma serves
        from inferenceos.model.default_model import ensure_default_model

        cli(home, "pull", str(ensure_default_model()), "--name", MAIN)
        cli(home, "pull", str(ensure_default_model()), "--name", OTHER)
        return 512
    cli(home, "pull", str(write_tiny_model(home / "other.gguf", "llama")), "--name", OTHER)
    # the wide tiny model: a 4,096-token training context, so a cap on the CPU has a
    # KV cache to take back (a migration down shrinks it)
    cli(home, "pull", str(write_tiny_model(home / "wide.gguf", "wide")), "--name", MAIN)
    return 512


@contextlib.contextmanager
def serving(home: Path, ctx: int) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`inferenceos serve` on a free port, answering /health; stopped after."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = home / "serve.log"
    env = {**os.environ, "INFERENCEOS_HOME": str(home)}
    with log.open("wb") as f:  # a file, not a pipe: nobody reads a pipe during the run
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferenceos", "serve", MAIN, "--port", str(port),
             "--ctx", str(ctx), "--threads", "1", "--parallel", str(STREAMS),
             "--keep-alive", "-1", "--kv-cache-ram", "0", "--kv-cache-disk", "0"],
            env=env, stdout=f, stderr=f)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield proc, base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


# -- the situations ------------------------------------------------------------------------


class Load:
    """Background work on the server until `stop` (threads; `errors` counts failures)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors = 0
        self.tokens = 0
        self.note: list[str] = []

    def start(self, fn: Callable[[], None], n: int = 1) -> None:
        for _ in range(n):
            t = threading.Thread(target=self._guard, args=(fn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _guard(self, fn: Callable[[], None]) -> None:
        while not self.stop.is_set():
            try:
                fn()
            except (httpx.HTTPError, ValueError, KeyError):
                self.errors += 1  # a killed worker ends its streams with an error
                self.stop.wait(0.05)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def stream(self) -> None:
        """One long greedy stream of the main model (until `stop`)."""
        body = {"model": MAIN, "prompt": "Once upon a time", "max_tokens": 400,
                "stream": True, "temperature": 0, "ignore_eos": True}
        with httpx.stream("POST", self.base + "/v1/completions", json=body,
                          timeout=120) as r:
            for line in r.iter_lines():
                if self.stop.is_set():
                    return
                if line.startswith("data: {"):
                    if '"error"' in line:
                        raise ValueError(line[:200])
                    self.tokens += 1

    def load_other(self) -> None:
        """A request to the other model, unloaded once done: each one is a load."""
        body = {"model": OTHER, "prompt": "hi", "stream": False, "keep_alive": 0,
                "options": {"num_predict": 2}}
        httpx.post(self.base + "/api/generate", json=body, timeout=120).raise_for_status()

    def migrate(self) -> None:
        """Cap the CPU below the main model's charge, wait for the migration down, lift
        the cap, wait for the migration back up."""
        models = httpx.get(self.base + "/api/ps", timeout=30).json()["models"]
        main = next((m for m in models if m["name"].startswith(MAIN)), None)
        if main is None:
            self.stop.wait(0.1)
            return
        charge = int(main["memory_by_device"]["CPU"])
        since = httpx.get(self.base + "/api/events", timeout=30).json()["last_id"]
        t0 = time.time()
        self._budget(int(charge * 0.8))
        start = self._wait_event(since, "migration")
        if start is not None:
            self.note.append(f"{(start - t0) * 1000:.0f}")
        since = httpx.get(self.base + "/api/events", timeout=30).json()["last_id"]
        self._budget(None)
        self._wait_event(since, "migration")

    def _budget(self, cap: int | None) -> None:
        httpx.post(self.base + "/api/budget", json={"device": "CPU", "bytes": cap},
                   timeout=30).raise_for_status()

    def _wait_event(self, since: int, kind: str, timeout: float = 60) -> float | None:
        """Wait for an event of `kind` after `since`; the time its migration started (the
        "migrating" event's, or the migration's start) as wall-clock seconds."""
        deadline = time.monotonic() + timeout
        while not self.stop.is_set() and time.monotonic() < deadline:
            events = httpx.get(self.base + "/api/events", params={"since": since},
                               timeout=30).json()["events"]
            done = [e for e in events if e["kind"] == kind]
            if done:
                started = [e["ts"] for e in events if e["kind"] == "migrating"]
                return started[0] if started else done[0]["ts"] - (done[0]["duration_s"] or 0)
            self.stop.wait(0.05)
        return None

    def kill_worker(self, server_pid: int) -> None:
        """SIGKILL the main model's worker process (a child of the server), then give
        the streams time to start a new one."""
        for pid in _workers(server_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                self.note.append(str(pid))
        self.stop.wait(1.5)


def _workers(server_pid: int) -> list[int]:
    """The server's engine workers: its children started by multiprocessing's spawn."""
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{server_pid}/task"):
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{server_pid}/task/{task}/children").read_text()
                pids += [int(p) for p in children.split()]
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
    return out


# -- the report ----------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def report(results: dict[str, dict[str, list[float]]]) -> bool:
    """The table (ms): p50 / p99 per endpoint and situation; True when every p99 under
    load is below 100 ms."""
    names = list(results)
    print("\nlatency in ms, p50 / p99 (n per cell in the last row)")
    print(f"{'endpoint':<13}" + "".join(f"{n:>16}" for n in names))
    ok = True
    for e in ENDPOINTS:
        cells = []
        for n in names:
            v = results[n][e]
            cells.append(f"{pct(v, 0.5) * 1000:7.1f} /{pct(v, 0.99) * 1000:6.1f}")
            ok = ok and (n == "idle" or pct(v, 0.99) < 0.1)
        print(f"{e:<13}" + "".join(f"{c:>16}" for c in cells))
    every = {n: [x for e in ENDPOINTS for x in results[n][e]] for n in names}
    print(f"{'all':<13}" + "".join(
        f"{pct(every[n], 0.5) * 1000:7.1f} /{pct(every[n], 0.99) * 1000:6.1f}" .rjust(16)
        for n in names))
    print(f"{'n / errors':<13}" + "".join(
        f"{len(every[n])} / {len(results[n]['errors'])}".rjust(16) for n in names))
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("tiny", "gemma"), default="tiny")
    ap.add_argument("--seconds", type=float, default=20.0, help="per situation")
    ap.add_argument("--gap-ms", type=float, default=10.0, help="between two probes")
    ap.add_argument("--only", action="append", choices=SITUATIONS,
                    help="run this situation (repeatable; default: all)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary home (the server's log: its access lines)")
    ap.add_argument("--probe", help=argparse.SUPPRESS)  # the probe process: its base URL
    args = ap.parse_args()
    gap = args.gap_ms / 1000
    if args.probe:
        print(json.dumps(probe(args.probe, args.seconds, gap)))
        return
    home = Path(tempfile.mkdtemp(prefix="ios-ops-"))
    try:
        ctx = register(home, args.model)
        with serving(home, ctx) as (proc, base):
            _run(proc, base, args.seconds, gap, args.only or list(SITUATIONS))
    finally:
        if args.keep:
            print(f"home kept: {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)


SITUATIONS = ("idle", "8 streams", "load", "migration", "kill")


def _start(name: str, load: Load, server_pid: int) -> None:
    """Start situation `name`'s work on `load` (see the module doc)."""
    if name == "8 streams":
        load.start(load.stream, STREAMS)
    elif name == "load":
        load.start(load.load_other)
    elif name == "migration":
        load.start(load.stream)
        load.start(load.migrate)
    elif name == "kill":
        load.start(load.stream, 2)
        load.start(lambda: load.kill_worker(server_pid))


def _run(proc: subprocess.Popen[bytes], base: str, seconds: float, gap: float,
         only: list[str]) -> None:
    # the main model loaded before measuring (the first request loads it)
    httpx.post(base + "/v1/completions", json={"model": MAIN, "prompt": "hi",
                                               "max_tokens": 2}, timeout=300)
    results: dict[str, dict[str, list[float]]] = {}
    for name in SITUATIONS:
        if name not in only:
            continue
        load = Load(base)
        _start(name, load, proc.pid)
        time.sleep(1.0 if name != "idle" else 0)  # the work under way before probing
        t0 = time.monotonic()
        results[name] = probe_in_process(base, seconds, gap)
        load.close()
        detail = f"; load average {os.getloadavg()[0]:.1f}"
        if name == "migration":
            detail += f"; cap → migrating (ms): {', '.join(load.note) or 'none'}"
        elif name == "kill":
            detail += f"; workers killed: {len(load.note)}"
        print(f"{name}: {time.monotonic() - t0:.0f} s, {load.tokens} tokens streamed, "
              f"{load.errors} load errors{detail}", flush=True)
    ok = report(results)
    print("\ntarget p99 < 100 ms under load:", "met" if ok else "MISSED")


if __name__ == "__main__":
    main()
