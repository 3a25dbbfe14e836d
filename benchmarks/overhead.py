"""The control plane's own cost per generated token, against llama.cpp's own tools.

A model whose kernels are almost free shows what the Python around them costs: the tiny
random-weight llama (2 layers, n_embd 512, ~19 MB; tests/tiny_models.py writes it) and,
for scale, the built-in Gemma 3 270M. Per model, in the same run:

- `inferenceos run` decode against llama-bench `tg` (run_overhead.py's measurements);
- `inferenceos serve` at 1, 8 and 32 concurrent streams against llama-server `-np N`:
  streamed, greedy, `ignore_eos`, llama-server's `/completion` dialect on both, plus
  the OpenAI route (`/v1/completions`) on ours. Each load window runs N clients for
  `--duration` seconds on each server in turn (the order rotated by round, each window
  once every server is quiet: `settle`), after one warm-up window on each that is not
  counted (`WARMUP_S`); tokens are
  counted as they arrive (`tokens_predicted` of each event; a chunk per token on the
  OpenAI route), so the figure is the steady aggregate t/s, ramp included;
- the CPU time of every process per generated token (/proc: the HTTP process, its
  worker, llama-server, and this process, the client), and the median time from a
  request's send to its first token (what a seat waits for between two requests:
  with 128-token requests at 8 streams it decided the last percent, docs/engine.md);
- with `--profile` (needs py-spy in .venv), one more window of ours at each stream
  count under `py-spy record --subprocesses --nonblocking --gil`: the samples of the
  thread holding the GIL in the worker and in the HTTP process (Python at work: a
  thread waiting on a lock, a pipe or epoll holds none, nor does llama_decode, whose
  ctypes call releases it), classified by the innermost frame of ours, give
  microseconds per generated token for each stage:
    scheduling     engine/scheduler.py, step_plan, executor.fill, kv/, spec/, running
                   (listed apart: the n-gram replay of a finished reply, the KV
                   store and slot table, the thread governor)
    sampling       engine/sampling.py, engine/candidates.py
    detok + stop   engine/output.py, engine/stop.py (the pieces, UTF-8, stop strings)
    llama_decode   engine/executor.py's decode with the GIL held (~0: a check)
    worker pipe    engine/worker/ (the worker's send, pickling, the parent's reader
                   thread) and engine/engine.py, engine/base.py (event delivery)
    HTTP process   server/ (routes, JSON, SSE, the generation thread), uvicorn, asyncio
    client socket  this process's CPU per token (measured, not sampled)
  "our own" is the sum of the stages above except llama_decode and the client.

Every figure is printed beside the load average at its measurement; the ratio is the
median of the rounds' own ratios (both sides of a round share the machine's state).

    .venv/bin/python benchmarks/overhead.py [--models tiny gemma] [--streams 1 8 32]
        [--rounds 2] [--duration 10] [--tokens 128] [--threads 2] [--serve-threads N]
        [--serve-extra ARGS] [--profile] [--no-run] [--no-openai]
        [--baseline-src OTHER_CHECKOUT/src] [--baseline-env NAME=VALUE ...] [--aa]
        [--both-ways] [--baseline-first] [--json FILE]

`--baseline-src` serves a second `ours` from another checkout's src in the same rounds
(e.g. `git worktree add /tmp/base <commit>`): a before / after measured side by side.
`--baseline-env NAME=VALUE ...` serves it with those settings (alone: this checkout's
src), e.g. `INFERENCEOS_SERVER_DIRECT_WRITES=0`: a setting's effect, side by side.
`--both-ways` runs each stream count a second time with the two of ours trading places
and prints the baseline's effect with the slots' bias cancelled (below).
`--aa` serves ours twice, the same command in both places: the spread of the per-round
baseline/ours figures it prints is how much a before / after must exceed to show. Each of
ours has its own data dir. The slots are not equal (A/A, tiny model: the baseline slot
~3-7 % ahead at 8 streams, ~4-9 % behind at 32, for reasons not found): a before /
after is run `--both-ways` (docs/engine.md, eighth pass).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from llama_tools import llama_tool
from run_overhead import bench_tg, ours_tg
from serve_load import free_port, wait_healthy

CLK_TCK = os.sysconf("SC_CLK_TCK")
_PREDICTED = re.compile(rb'"tokens_predicted":(\d+)')


def loadavg() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


# -- models --------------------------------------------------------------------------


def tiny_model(folder: Path) -> Path:
    """The tiny random-weight llama of issue 44's figures: 2 layers, n_embd 512 (~19 MB)."""
    from tiny_models import SHAPES, TinyShape, write_tiny_model

    SHAPES["overhead"] = TinyShape(n_layer=2, n_embd=512, n_head=8, n_head_kv=4, n_ff=1024,
                                   n_ctx=4096)
    return write_tiny_model(folder / "tiny-overhead.gguf", "overhead")


def model_paths(names: list[str], folder: Path) -> dict[str, Path]:
    from inferenceos.model.default_model import ensure_default_model

    out: dict[str, Path] = {}
    for name in names:
        out[name] = tiny_model(folder) if name == "tiny" else ensure_default_model()
    return out


# -- CPU time of processes -----------------------------------------------------------


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads); 0 when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def children(pid: int) -> list[int]:
    """The direct children of `pid`."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def python_children(pid: int) -> list[int]:
    """`pid`'s children that run Python (the model worker; not resource trackers)."""
    out = []
    for c in children(pid):
        try:
            cmd = Path(f"/proc/{c}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd:
            out.append(c)
    return out


# -- the client ------------------------------------------------------------------------


@dataclass
class Window:
    """One load window's counts."""

    tokens: int = 0
    requests: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)  # s from sending to the first token


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    status = await reader.readline()
    if not status:
        raise ConnectionError("connection closed")
    headers: dict[bytes, bytes] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.partition(b":")
        headers[k.strip().lower()] = v.strip()
    return int(status.split()[1]), headers


async def _body_chunks(reader: asyncio.StreamReader, headers: dict[bytes, bytes]
                       ) -> Any:
    """The response body's pieces as they arrive (chunked or by length)."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while True:
            size = int((await reader.readline()).strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    else:
        n = int(headers.get(b"content-length", b"0"))
        if n:
            yield await reader.readexactly(n)


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str,
               body: bytes, openai: bool, deadline: float, win: Window) -> bool:
    """One streamed request; counts its tokens into `win` while before `deadline`, and
    its time to first token. False when the deadline cut it (the connection is then
    dropped)."""
    sent = time.monotonic()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    status, headers = await _read_head(reader)
    buf = b""
    seen = 0
    seen_any = False
    async for chunk in _body_chunks(reader, headers):
        if status != 200:
            win.failed += 1
            win.errors.append(f"{status} {chunk[:200]!r}")
            continue
        buf += chunk
        *events, buf = buf.split(b"\n\n")
        now = time.monotonic()
        for ev in events:
            if b'"error"' in ev[:40]:
                win.failed += 1
                win.errors.append(ev[:200].decode(errors="replace"))
                continue
            if openai:
                n = 1 if b'"text":"' in ev and b'"text":""' not in ev else 0
            else:
                m = _PREDICTED.search(ev)
                n = max(0, int(m.group(1)) - seen) if m else 0
                seen += n
            if now < deadline:
                if n and not seen_any:
                    win.ttft.append(now - sent)
                seen_any = seen_any or n > 0
                win.tokens += n
        if now >= deadline:
            return False
    win.requests += 1
    return True


async def _client(port: int, i: int, openai: str, tokens: int, deadline: float,
                  win: Window) -> None:
    """Requests one after the other until `deadline`, each on a connection of its own
    (llama-server closes a connection after a stream). `openai`: the model name for the
    OpenAI route; "": llama-server's /completion."""
    k = 0
    while time.monotonic() < deadline:
        prompt = f"Client {i} request {k}: once upon a time"
        k += 1
        if openai:
            path = "/v1/completions"
            req: dict[str, Any] = {"model": openai, "prompt": prompt, "max_tokens": tokens,
                                   "stream": True, "temperature": 0}
        else:
            path = "/completion"
            req = {"prompt": prompt, "n_predict": tokens, "stream": True,
                   "temperature": 0, "ignore_eos": True}
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            if not await _one(reader, writer, path, json.dumps(req).encode(), bool(openai),
                              deadline, win):
                return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            win.failed += 1
            win.errors.append(repr(exc)[:200])
        finally:
            writer.close()


def load_window(port: int, clients: int, duration: float, tokens: int, openai: str = ""
                ) -> tuple[Window, float]:
    """`clients` streaming clients for `duration` s; (counts, this process's CPU s)."""
    win = Window()

    async def main() -> None:
        deadline = time.monotonic() + duration
        await asyncio.gather(*(_client(port, i, openai, tokens, deadline, win)
                               for i in range(clients)))

    c0 = time.process_time()
    asyncio.run(main())
    return win, time.process_time() - c0


# -- servers -------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pids(self) -> dict[str, int]:
        """The processes whose CPU counts: the server, and ours' model worker."""
        out = {"llama-server" if self.name == "llama-server" else "http": self.proc.pid}
        for pid in python_children(self.proc.pid):
            out["worker"] = pid
        return out

    def model_id(self) -> str:
        """The id /v1/models lists first (the OpenAI route wants a model it serves)."""
        import httpx

        data = httpx.get(f"http://127.0.0.1:{self.port}/v1/models", timeout=10).json()
        return str(data["data"][0]["id"])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def start(name: str, cmd: list[str], env: dict[str, str]) -> Server:
    port = free_port()
    cmd = [c.replace("{port}", str(port)) for c in cmd]
    with tempfile.NamedTemporaryFile(prefix=f"overhead-{name}-", suffix=".log",
                                     delete=False) as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    srv = Server(name, proc, port, Path(log.name))
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    except RuntimeError as exc:
        srv.stop()
        tail = srv.log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{name}: {exc}; its log ({log.name}) ends:\n{tail}") from None
    load_window(port, 1, 2.0, 8)  # warm-up
    return srv


def servers(model: Path, n: int, args: argparse.Namespace, env: dict[str, str],
            swapped: bool = False) -> dict[str, Server]:
    """ours, llama-server and, with --baseline-src, ours from that checkout's src (with
    --threads; --serve-threads and --serve-extra are ours' own). `swapped`: the two of
    ours trade places (ours runs the baseline's src and settings, the baseline this
    checkout's), for --both-ways."""
    ctx = max(512, args.tokens + 64)

    def serve(threads: int) -> list[str]:
        return [sys.executable, "-m", "inferenceos", "serve", str(model), "--parallel",
                str(n), "--ctx", str(ctx), "--queue", str(4 * n), "--threads", str(threads),
                "--port", "{port}", "--draft", "none"]

    def own_home(name: str) -> dict[str, str]:
        # one data dir each: two of ours sharing one would share a KV store (its disk
        # writes and their lock) and a telemetry database
        return {**env, "INFERENCEOS_HOME": f"{env['INFERENCEOS_HOME']}-{name}"}

    ours = serve(args.serve_threads or args.threads) + shlex.split(args.serve_extra)
    launches = [("ours", ours, own_home("ours")),
                ("llama-server", [
                    str(llama_tool("llama-server")), "-m", str(model), "-np", str(n), "-c",
                    str(ctx * n), "-t", str(args.threads), "--host", "127.0.0.1", "--port",
                    "{port}"], env)]
    if args.aa:  # the same command as ours: what the bench alone makes of a pair
        launches.append(("baseline", ours, own_home("baseline")))
    elif args.baseline_src or args.baseline_env:
        extra = dict(kv.split("=", 1) for kv in args.baseline_env)
        if args.baseline_src:
            extra["PYTHONPATH"] = str(args.baseline_src)
        mine: tuple[list[str], dict[str, str]] = (ours, {})
        theirs = (serve(args.threads), extra)
        if swapped:  # each of ours in the other's place (this src named, as theirs is)
            here = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
            mine, theirs = theirs, (ours, here)
        launches[0] = ("ours", mine[0], {**own_home("ours"), **mine[1]})
        launches.append(("baseline", theirs[0], {**own_home("baseline"), **theirs[1]}))
    if args.baseline_first:
        launches.reverse()
    out: dict[str, Server] = {}
    try:
        for name, cmd, launch_env in launches:
            out[name] = start(name, cmd, launch_env)
    except BaseException:
        for srv in out.values():
            srv.stop()
        raise
    return out


@dataclass
class Measured:
    """One window on one server: aggregate t/s and CPU µs per token by process."""

    tps: float
    us: dict[str, float]
    load: float
    failed: int = 0
    ttft_ms: float = 0.0  # the window's median time to first token


QUIET_SHARE = 0.05  # of one CPU: what the servers may still burn when a window starts
SETTLE_MAX_S = 15.0


def settle(srvs: list[Server]) -> float:
    """Wait until every server is quiet (their processes together under QUIET_SHARE
    of a CPU over 0.25 s), at most SETTLE_MAX_S; the seconds waited (printed). A window
    of ours may leave work behind it (the KV store's disk writes of its requests at
    nice 19, telemetry records) that the next window would pay for; in the eighth
    pass's runs every server was quiet at the first look (0.3 s), so that is not what
    favours one slot (docs/engine.md, "Who waits at the barrier")."""
    pids = [pid for srv in srvs for pid in srv.pids.values()]
    t0 = time.monotonic()
    before = sum(cpu_s(p) for p in pids)
    while time.monotonic() - t0 < SETTLE_MAX_S:
        time.sleep(0.25)
        now = sum(cpu_s(p) for p in pids)
        if now - before < QUIET_SHARE * 0.25:
            break
        before = now
    return time.monotonic() - t0


def measure(srv: Server, n: int, args: argparse.Namespace, openai: bool = False) -> Measured:
    pids = srv.pids
    before = {k: cpu_s(p) for k, p in pids.items()}
    t0 = time.monotonic()
    win, client_cpu = load_window(srv.port, n, args.duration, args.tokens,
                                  srv.model_id() if openai else "")
    wall = time.monotonic() - t0
    tok = max(win.tokens, 1)
    us = {k: (cpu_s(p) - before[k]) / tok * 1e6 for k, p in pids.items()}
    us["client"] = client_cpu / tok * 1e6
    if win.failed:
        print(f"    {srv.name}{' openai' if openai else ''}: {win.failed} failed: "
              f"{win.errors[:2]}")
    time.sleep(0.5)  # requests the deadline cut end before the next window
    ttft = statistics.median(win.ttft) * 1e3 if win.ttft else 0.0
    return Measured(win.tokens / min(wall, args.duration), us, os.getloadavg()[0],
                    win.failed, ttft)


# The first window after the servers start was the lowest of ours' four in four runs at
# 8 streams (2,459-3,149 t/s against 3,291-4,263 after it) and of llama-server's in
# three of four, whichever server it was; the first round's pair then decided the
# median's side (2026-12-07, issue 44). Each server gets one window first, not counted.
WARMUP_S = 2.0


def warm_up(srvs: dict[str, Server], n: int, args: argparse.Namespace) -> None:
    """One uncounted window of `n` streams on each server (WARMUP_S at most), printed."""
    seen: list[str] = []
    seconds = min(WARMUP_S, args.duration)
    for name, srv in srvs.items():
        settle(list(srvs.values()))
        win, _ = load_window(srv.port, n, seconds, args.tokens)
        seen.append(f"{name} {win.tokens / seconds:.0f} t/s")
        time.sleep(0.5)  # requests the deadline cut end before the next window
    print(f"      warm-up windows (not counted): {', '.join(seen)}", flush=True)


# -- py-spy stages ---------------------------------------------------------------------

STAGES = ("scheduling", "sampling", "detok + stop", "worker pipe", "HTTP process")
# innermost frame of ours first: (file suffix, function or "", stage); None: look further
_WORKER_RULES: list[tuple[str, str, str | None]] = [
    ("engine/executor.py", "decode", "llama_decode"),
    ("engine/output.py", "", "detok + stop"),
    ("engine/stop.py", "", "detok + stop"),
    ("engine/sampling.py", "", "sampling"),
    ("engine/candidates.py", "", "sampling"),
    ("engine/worker/", "", "worker pipe"),
    ("engine/messages.py", "", None),
    ("engine/generation.py", "", None),
    ("engine/session.py", "", None),
    ("engine/llama/", "", None),
    ("engine/spec/ngram_replay.py", "", "scheduling: n-gram replay"),
    ("engine/kv/", "", "scheduling: KV store + slots"),
    ("engine/thread_governor.py", "", "scheduling: thread governor"),
    ("inferenceos/engine/", "", "scheduling: step"),
]
_HTTP_RULES: list[tuple[str, str, str | None]] = [
    ("engine/cancel.py", "", None),
    ("engine/generation.py", "", None),
    ("engine/messages.py", "", None),
    ("inferenceos/engine/", "", "worker pipe"),
    ("server/sse.py", "", "HTTP: SSE framing + JSON"),
    ("server/dialects/", "", "HTTP: routes + JSON"),
    ("server/reply.py", "", "HTTP: generation stream"),
    ("server/generation.py", "", "HTTP: generation stream"),
    ("server/bridge.py", "", "HTTP: generation stream"),
    ("inferenceos/server/", "", "HTTP: other server code"),
]
_FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


def classify(frames: list[str], rules: list[tuple[str, str, str | None]], default: str
             ) -> str:
    for frame in reversed(frames):
        m = _FRAME.match(frame)
        if not m:
            continue
        func, path = m.group(1), m.group(2)
        for suffix, fn, stage in rules:
            if suffix in path and (not fn or fn == func):
                if stage is not None:
                    return stage
                break
    return default


def profile(srv: Server, n: int, args: argparse.Namespace) -> dict[str, float]:
    """µs per generated token by stage, from one window of ours under py-spy."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        print("    py-spy is not installed (.venv/bin/pip install py-spy): no stages")
        return {}
    out = Path(tempfile.mkdtemp(prefix="overhead-spy-")) / "stacks.txt"
    rate = args.rate
    pids = srv.pids
    spy_proc = subprocess.Popen([spy, "record", "--pid", str(srv.proc.pid), "--subprocesses",
                                 "--nonblocking", "--gil", "--rate", str(rate), "--format", "raw",
                                 "--duration", str(int(args.duration) + 2), "-o", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
    win, client_cpu = load_window(srv.port, n, args.duration, args.tokens)
    spy_proc.wait(60)
    samples: Counter[str] = Counter()
    worker = pids.get("worker")
    for line in out.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if any(f.startswith("process ") for f in frames[-1:]):
            continue  # a process line alone: no Python frame held the GIL
        if worker is not None and any(f.startswith(f"process {worker}:") for f in frames):
            stage = classify(frames, _WORKER_RULES, "worker pipe")
        else:
            stage = classify(frames, _HTTP_RULES, "HTTP: uvicorn + asyncio")
        samples[stage] += int(count)
    tok = max(win.tokens, 1)
    # the window of samples is duration + 2 s, the tokens' args.duration: scale
    scale = args.duration / (args.duration + 1.0)
    us = {k: v / rate / tok * 1e6 * scale for k, v in samples.items()}
    us["client socket"] = client_cpu / tok * 1e6
    return us


def print_stages(n: int, us: dict[str, float], load: float) -> dict[str, float]:
    """The stage table (stages with parts, "HTTP: ..." and "scheduling: ...", summed
    and their parts listed under them); returns the stages' figures."""
    def total(stage: str) -> float:
        return sum(v for k, v in us.items() if k == stage or k.startswith(stage + ":"))

    table = {"scheduling": total("scheduling"), "sampling": us.get("sampling", 0.0),
             "detok + stop": us.get("detok + stop", 0.0),
             "worker pipe": us.get("worker pipe", 0.0), "HTTP process": total("HTTP")}
    own = sum(table.values())
    print(f"  stages at {n} streams (py-spy, µs per generated token, load {load:.2f}):")
    for k, v in table.items():
        print(f"    {k:<28} {v:8.1f}")
        prefix = "HTTP" if k == "HTTP process" else k
        for sub, w in sorted(us.items()):
            if sub.startswith(prefix + ":"):
                print(f"      {sub[len(prefix) + 2:]:<26} {w:8.1f}")
    print(f"    {'= our own':<28} {own:8.1f}   (target at 8 streams: <= 100)")
    print(f"    {'llama_decode (GIL held)':<28} {us.get('llama_decode', 0.0):8.1f}")
    print(f"    {'client socket (measured)':<28} {us.get('client socket', 0.0):8.1f}")
    return {**table, "our own": own, "llama_decode": us.get("llama_decode", 0.0),
            "client socket": us.get("client socket", 0.0)}


# -- the run ----------------------------------------------------------------------------


def ratio(xs: list[float], ys: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(xs, ys, strict=True) if y > 0)


def run_decode(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`run` against llama-bench tg, alternating, paired."""
    bench = llama_tool("llama-bench")
    ours: list[float] = []
    theirs: list[float] = []
    loads: list[float] = []
    for r in range(args.rounds):
        pair: list[Callable[[], None]] = [
            lambda: ours.append(ours_tg(model, args.tokens, args.threads, greedy=True)),
            lambda: theirs.append(bench_tg(bench, model, args.tokens, args.threads))]
        for f in pair if r % 2 else reversed(pair):
            f()
        loads.append(os.getloadavg()[0])
    print(f"  run vs llama-bench tg{args.tokens}: ours {statistics.median(ours):8.1f} t/s  "
          f"llama-bench {statistics.median(theirs):8.1f}  ratio {ratio(ours, theirs):5.3f}  "
          f"rounds {[round(x) for x in ours]} / {[round(x) for x in theirs]}  "
          f"load {[round(x, 2) for x in loads]}", flush=True)
    return {"ours": ours, "llama_bench": theirs, "ratio": ratio(ours, theirs), "load": loads}


def run_streams(model: Path, n: int, args: argparse.Namespace, env: dict[str, str],
                swapped: bool = False) -> dict[str, Any]:
    if swapped:
        print(f"  {n:>2} streams, the other way round (ours: the baseline's code and "
              "settings; baseline: this checkout's):", flush=True)
    srvs = servers(model, n, args, env, swapped)
    rows: dict[str, list[Measured]] = {"ours": [], "llama-server": [], "ours openai": [],
                                       "baseline": []}
    waited: list[float] = []  # settle() before each window
    try:
        warm_up(srvs, n, args)
        for r in range(args.rounds):
            order = [("ours", srvs["ours"], False), ("llama-server", srvs["llama-server"], False)]
            if not args.no_openai:
                order.append(("ours openai", srvs["ours"], True))
            if "baseline" in srvs:
                order.append(("baseline", srvs["baseline"], False))
            # rotated, so over len(order) rounds each window takes each place once (a
            # window after another server's can differ from the first of a round)
            for name, srv, openai in order[r % len(order):] + order[:r % len(order)]:
                waited.append(settle(list(srvs.values())))
                rows[name].append(measure(srv, n, args, openai))
        stages = profile(srvs["ours"], n, args) if args.profile else {}
    finally:
        for srv in srvs.values():
            srv.stop()
    ours_tps = [m.tps for m in rows["ours"]]
    their_tps = [m.tps for m in rows["llama-server"]]
    print(f"  {n:>2} streams: serve {statistics.median(ours_tps):8.1f} t/s  llama-server "
          f"{statistics.median(their_tps):8.1f}  ratio {ratio(ours_tps, their_tps):5.3f}  "
          f"rounds {[round(x) for x in ours_tps]} / {[round(x) for x in their_tps]}  "
          f"load {[round(m.load, 2) for m in rows['ours']]}", flush=True)
    print(f"      settled before each window: {min(waited):.1f}-{max(waited):.1f} s")
    for name, label in (("ours openai", "OpenAI route"),
                        ("baseline", "A/A copy" if args.aa else "baseline serve")):
        if rows[name]:
            xs = [m.tps for m in rows[name]]
            print(f"      {label:<15} {statistics.median(xs):8.1f} t/s  ratio to llama-server "
                  f"{ratio(xs, their_tps):5.3f}  rounds {[round(x) for x in xs]}  load "
                  f"{[round(m.load, 2) for m in rows[name]]}")
    base_tps = [m.tps for m in rows["baseline"]]
    over = ratio(base_tps, ours_tps) if base_tps else None  # (median of the rounds')
    if over is not None:
        per_round = [round(b / o, 3) for b, o in zip(base_tps, ours_tps, strict=True) if o]
        print(f"      baseline / ours by round {per_round}  median {over:5.3f}"
              + ("  (A/A)" if args.aa else ""))
    for name, ms in rows.items():
        if not ms:
            continue
        keys = ms[0].us.keys()
        cpu = {k: statistics.median(m.us[k] for m in ms) for k in keys}
        ttft = statistics.median(m.ttft_ms for m in ms)
        print(f"      CPU µs/token {name:<13} " + "  ".join(f"{k} {v:7.1f}"
                                                          for k, v in cpu.items())
              + f"  TTFT p50 {ttft:5.1f} ms")
    out: dict[str, Any] = {k: [m.__dict__ for m in v] for k, v in rows.items()}
    out["ratio"] = ratio(ours_tps, their_tps)
    if over is not None:
        out["baseline_over_ours"] = over
    if stages:
        out["stages"] = print_stages(n, stages, os.getloadavg()[0])
    return out


def both_ways(n: int, first: dict[str, Any], swapped: dict[str, Any]) -> None:
    """The baseline's effect with the slots' own bias cancelled: x = bias * B/A (first
    run), y = bias * A/B (swapped), so B/A = sqrt(x / y) and the bias sqrt(x * y)."""
    x, y = first["baseline_over_ours"], swapped["baseline_over_ours"]
    print(f"  {n:>2} streams both ways: the baseline's code and settings against this "
          f"checkout's {math.sqrt(x / y):5.3f} (slots' bias cancelled; the baseline slot's "
          f"own {math.sqrt(x * y):5.3f})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "gemma"],
                    choices=["tiny", "gemma"])
    ap.add_argument("--streams", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per load window")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--serve-threads", type=int, default=0,
                    help="ours' compute threads in serve (default: --threads)")
    ap.add_argument("--serve-extra", default="",
                    help="more arguments for ours' serve (not the baseline's), e.g. "
                         "'--flash-attn on'")
    ap.add_argument("--profile", action="store_true", help="stages through py-spy")
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--no-run", action="store_true", help="skip run vs llama-bench")
    ap.add_argument("--no-openai", action="store_true", help="skip the OpenAI route")
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="also serve from this checkout's src (PYTHONPATH): before/after")
    ap.add_argument("--baseline-env", nargs="+", default=[], metavar="NAME=VALUE",
                    help="also serve with these environment settings (this src, or "
                         "--baseline-src's), e.g. INFERENCEOS_SERVER_DIRECT_WRITES=0")
    ap.add_argument("--aa", action="store_true",
                    help="the baseline is ours again (same src, flags and settings): the "
                         "difference two identical servers show is the run's noise floor")
    ap.add_argument("--both-ways", action="store_true",
                    help="with --baseline-src/--baseline-env: each stream count again with "
                         "the two of ours trading places; prints the effect with the "
                         "slots' bias cancelled")
    ap.add_argument("--baseline-first", action="store_true",
                    help="start the servers in the other order (the baseline first, ours "
                         "last): whether the start order is what favours a slot")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="overhead-"))
    env = dict(os.environ, INFERENCEOS_HOME=str(folder / "home"))
    print(f"overhead.py: {args.rounds} rounds of {args.duration:.0f} s windows, "
          f"{args.tokens} tokens a request, {args.threads} threads, {os.cpu_count()} CPUs, "
          f"{loadavg()}", flush=True)
    result: dict[str, Any] = {}
    try:
        for name, model in model_paths(args.models, folder).items():
            print(f"\n== {name} ({model.name}, {model.stat().st_size / 1e6:.1f} MB, "
                  f"{loadavg()})", flush=True)
            res: dict[str, Any] = {}
            if not args.no_run:
                res["run"] = run_decode(model, args)
            for n in args.streams:
                res[f"serve{n}"] = run_streams(model, n, args, env)
                if args.both_ways and "baseline_over_ours" in res[f"serve{n}"]:
                    res[f"serve{n} swapped"] = run_streams(model, n, args, env, swapped=True)
                    both_ways(n, res[f"serve{n}"], res[f"serve{n} swapped"])
            result[name] = res
    finally:  # the servers' data dir holds their KV cache: 50-200 MB a run, left behind
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
