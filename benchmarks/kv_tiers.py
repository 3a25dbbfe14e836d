"""TTFT of a returning conversation through the tiered KV cache, against re-prefill and
llama-server's own prompt caches, paired rounds in one run.

Model A (the conversation's) and model B (the one used in between) are served by the
server's own memory manager (`registry.manager.ModelManager`, the engines `serve`
builds, with `--kv-cache-ram` / `--kv-cache-disk` defaults) in-process. Each round a
fresh history of ~HISTORY tokens (passages of benchmarks/data) is prefilled once
(turn 1, greedy reply); then the next turn, each case with its own question after the
same history + reply, is timed from the request (before `acquire`: promotion or load
included) to its first token:

- hot: A stayed loaded (its slot holds the history);
- warm: B was used in between under a budget that holds both weights but one context,
  so A was demoted to warm (context freed) and is promoted back;
- cold: under a budget for one model only, B's use unloaded A (a fresh worker loads it);
- killed: A's worker was SIGKILLed after turn 1 (a fresh worker loads it);
- restart: a new manager (new workers: as a server restart; the disk tier only), the
  model loaded before the clock starts (as a pinned model is, and as llama-server
  loads at start);
- re-prefill: the same length with nothing cached, on a loaded model.

Every case's first tokens are compared with the uninterrupted conversation's (a
store-less engine: turn 1, then the same prompt from its slot; greedy, same threads).
Against llama-server (built from the vendored llama.cpp, `-np 1`): hot
(`cache_prompt`), after an unrelated prompt in between (its `--cache-ram` host cache),
after a restart (`--slot-save-path`, `POST /slots/0?action=save|restore`, the restore
counted in its TTFT) and re-prefill (`cache_prompt: false`); each case with its own
question, as ours, so none finds its question in the cache.

    .venv/bin/python benchmarks/kv_tiers.py [--model A.gguf] [--other B.gguf]
        [--history 4000] [--rounds 3] [--threads 2] [--no-llama-server]

Targets: every restored case >= 20x faster than re-prefill; warm < 100 ms above hot;
ours <= llama-server in each case it can do.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferenceos.engine.sampling import SamplingParams
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry.budget import MemoryBudget
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.leases import COLD, WARM
from inferenceos.registry.manager import ModelManager, engine_factory
from inferenceos.registry.store import ModelStore

DATA = Path(__file__).resolve().parent / "data" / "declaration_of_independence.txt"
CACHE = Path.home() / ".cache" / "inferenceos-test"
FIRST = 8  # tokens compared with the uninterrupted conversation
MiB = 1 << 20
KV_RAM = 512 * MiB  # each engine's RAM tier (charged by the manager beside the model)
CASES = ("hot", "warm", "cold", "killed", "restart", "re-prefill")
LS_CASES = ("hot", "in between (--cache-ram)", "restart (slot save/restore)", "re-prefill")


@dataclass
class Timing:
    ttft: float
    cached: int
    tokens: list[int] = field(default_factory=list)
    load_s: float = 0.0  # the worker's model load (llama.cpp), when this case loaded it


# -- ours ---------------------------------------------------------------------------------


def manager(catalog: Catalog, names: list[str], base: LoadRequest, root: Path | None,
            budget: str) -> ModelManager:
    """The server's manager with a budget that holds both weights and one context
    ("warm"), one model only ("cold"), or anything ("any"); KV tiers under `root`
    (None: no KV cache, the uninterrupted reference)."""
    probe = ModelManager(catalog.resolve, base=base, context_hint=None)
    plans = [probe.plan_for(n) for n in names]
    hot = [sum(p.charge().values()) for p in plans]
    weights = [sum(p.charge(warm=True).values()) for p in plans]
    reserve = KV_RAM if root is not None else 0
    cap = {"warm": sum(weights) + max(h - w for h, w in zip(hot, weights, strict=True))
           + 2 * reserve + MiB, "cold": max(hot) + reserve + MiB, "any": None}[budget]
    kv: dict[str, Any] = ({"kv_cache_ram": KV_RAM, "kv_cache_disk": 8 << 30, "kv_cache_dir": root}
          if root is not None else {})
    return ModelManager(catalog.resolve, factory=engine_factory(**kv),
                        budget=MemoryBudget(total_cap=cap), base=base, context_hint=None)


def ask(mgr: ModelManager, name: str, prompt: list[int] | str, n: int = FIRST) -> Timing:
    """Request → first token (acquire included), greedy, `n` tokens."""
    t0 = time.perf_counter()
    ttft = 0.0
    out: list[int] = []
    with mgr.acquire(name) as lease:
        gen = lease.engine.generate(prompt, SamplingParams(temperature=0, max_tokens=n))
        for ev in gen:
            if ev.token < 0:
                continue
            ttft = ttft or time.perf_counter() - t0
            out.append(ev.token)
        return Timing(ttft, gen.metrics.cached_tokens, out, gen.metrics.load_s)


def tier(mgr: ModelManager, name: str) -> str:
    return next((m.tier for m in mgr.loaded() if m.model.name == name), COLD)


def settle(mgr: ModelManager, name: str) -> None:
    """Wait until A's finished turns are on disk (what a kill or restart finds)."""
    for m in mgr.loaded():
        if m.model.name == name and m.tier != COLD:
            for _ in range(3000):
                engine: Any = m.engine
                kv = engine.stats().get("kv_cache", {})
                if not kv.get("pending_writes"):
                    return
                time.sleep(0.01)


def kill_worker(mgr: ModelManager, name: str) -> None:
    engine: Any = next(m for m in mgr.loaded() if m.model.name == name).engine
    os.kill(engine.worker_pid, signal.SIGKILL)
    for _ in range(1000):  # until the engine has seen it (its next call starts a worker)
        if not engine.worker_alive:
            return
        time.sleep(0.01)


# -- the conversation ---------------------------------------------------------------------


def history(tokenize: Any, n_tokens: int, round_no: int) -> list[int]:
    """~n_tokens of passages, different each round (no round reuses another's cache)."""
    words = DATA.read_text(encoding="utf-8").split()
    start = (round_no * 997) % len(words)
    text, i = f"Round {round_no}. Read these passages carefully.\n", start
    while True:
        chunk = " ".join(words[i % len(words): i % len(words) + 120])
        i += 120
        text += f"\nPassage: {chunk}\n"
        tokens: list[int] = tokenize(text)
        if len(tokens) >= n_tokens:
            return tokens


def question(tokenize: Any, case: str) -> list[int]:
    out: list[int] = tokenize(f"\nQuestion ({case}): in one word, what is this about?\n",
                              add_special=False)
    return out


# -- llama-server ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def llama_server(binary: Path, model: Path, n_ctx: int, threads: int,
                 slots_dir: Path) -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "-c", str(n_ctx), "-np", "1", "-t", str(threads),
         "--host", "127.0.0.1", "--port", str(port), "--cache-ram", "8192",
         "--slot-save-path", str(slots_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(900):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("llama-server did not become healthy")
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def _post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    out: dict[str, Any] = json.loads(conn.getresponse().read() or b"{}")
    conn.close()
    return out


def ls_ask(port: int, prompt: list[int], cache: bool = True, t0: float | None = None,
           n: int = FIRST) -> Timing:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "stream": True,
            "cache_prompt": cache, "id_slot": 0, "return_tokens": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = t0 if t0 is not None else time.perf_counter()
    conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    ttft, cached, tokens = 0.0, 0, list[int]()
    for line in conn.getresponse():
        if not line.startswith(b"data: "):
            continue
        msg = json.loads(line[6:])
        if msg.get("tokens") or msg.get("content"):
            ttft = ttft or time.perf_counter() - t0
            tokens += msg.get("tokens") or []
        if msg.get("timings"):
            cached = int(msg["timings"].get("cache_n", 0))
    conn.close()
    return Timing(ttft, cached, tokens)


def llama_server_round(binary: Path, model: Path, h: list[int], qs: dict[str, list[int]],
                       plain: list[int], args: argparse.Namespace) -> dict[str, Timing]:
    """The same history, its own greedy reply, then each case it can do with that case's
    own question (`qs`: hot, warm, restart), as ours: a case never finds the question
    another case asked already in the cache."""
    n_ctx = len(h) + max(len(q) for q in qs.values()) + 256
    res: dict[str, Timing] = {}
    with tempfile.TemporaryDirectory() as slots:
        with llama_server(binary, model, n_ctx, args.threads, Path(slots)) as port:
            first = ls_ask(port, h, n=16)
            res["hot"] = ls_ask(port, h + first.tokens + qs["hot"])
            _post(port, "/slots/0?action=save", {"filename": "conv.bin"})
            ls_ask(port, h[:1] + h[1:40][::-1], n=2)  # unrelated: the slot is given up
            res["in between (--cache-ram)"] = ls_ask(port, h + first.tokens + qs["warm"])
            res["re-prefill"] = ls_ask(port, plain, cache=False)
        with llama_server(binary, model, n_ctx, args.threads, Path(slots)) as port:
            t0 = time.perf_counter()
            _post(port, "/slots/0?action=restore", {"filename": "conv.bin"})
            res["restart (slot save/restore)"] = ls_ask(port, h + first.tokens + qs["restart"],
                                                        t0=t0)
    return res


# -- one round ------------------------------------------------------------------------------


def our_round(catalog: Catalog, names: list[str], base: LoadRequest, root: Path,
              r: int, args: argparse.Namespace) -> tuple[dict[str, Timing], dict[str, Any]]:
    """Every case for one fresh history; returns the timings and the prompts used."""
    a, b = names
    res: dict[str, Timing] = {}
    warm = manager(catalog, names, base, root, "warm")
    try:
        with warm.acquire(a) as lease:
            tok = lease.engine.tokenize
        h = history(tok, args.history, r)
        reply = ask(warm, a, h, n=16).tokens  # turn 1 (prefilled, not timed)
        base2 = h + reply
        prompts = {c: base2 + question(tok, c) for c in CASES[:-1]}
        prompts["re-prefill"] = (tok(f"Unrelated {r}: " + "x" * 3) + base2[4:]
                                 + question(tok, "x"))  # shares no prefix with any entry
        res["hot"] = ask(warm, a, prompts["hot"])
        ask(warm, b, "Hello there.", n=2)
        assert tier(warm, a) == WARM, f"A is {tier(warm, a)}, not warm: the budget is off"
        res["warm"] = ask(warm, a, prompts["warm"])
        settle(warm, a)
        kill_worker(warm, a)
        res["killed"] = ask(warm, a, prompts["killed"])
        settle(warm, a)
    finally:
        warm.close()
    cold = manager(catalog, names, base, root, "cold")
    try:
        ask(cold, b, "Hello there.", n=2)  # B holds the only place: A is cold
        res["cold"] = ask(cold, a, prompts["cold"])
        settle(cold, a)
    finally:
        cold.close()
    fresh = manager(catalog, names, base, root, "any")  # a restart: new workers
    try:
        # loaded before the clock starts, as llama-server loads at start (a pinned model)
        fresh.acquire(a).release()
        res["restart"] = ask(fresh, a, prompts["restart"])
        res["re-prefill"] = ask(fresh, a, prompts["re-prefill"])  # shares no prefix
    finally:
        fresh.close()
    return res, {"h": h, "reply": reply, "prompts": prompts}


def reference(catalog: Catalog, names: list[str], base: LoadRequest,
              run: dict[str, Any]) -> dict[str, Timing]:
    """The uninterrupted conversation (no KV cache): turn 1, then each case's prompt
    from the slot, in the order our round asked them."""
    ref = manager(catalog, names, base, None, "any")
    out: dict[str, Timing] = {}
    try:
        ask(ref, names[0], run["h"], n=16)
        for case in ("hot", "warm", "killed", "cold", "restart"):
            out[case] = ask(ref, names[0], run["prompts"][case])
    finally:
        ref.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path,
                    default=CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--other", type=Path, default=CACHE / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--history", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama-server", action="store_true")
    args = ap.parse_args()
    binary = None
    if not args.no_llama_server:
        from llama_tools import llama_tool

        binary = llama_tool("llama-server")
    # as `serve` plans a model whose turns its KV cache keeps (plan/flash_attn.py)
    base = LoadRequest(n_ctx=args.history + 1024, threads=args.threads, cached_turns=True)
    ours: dict[str, list[Timing]] = {c: [] for c in CASES}
    refs: dict[str, list[Timing]] = {c: [] for c in CASES}
    theirs: dict[str, list[Timing]] = {c: [] for c in LS_CASES}
    same = 0
    checked = 0
    with tempfile.TemporaryDirectory() as home:
        os.environ["INFERENCEOS_HOME"] = home  # its own data dir: an empty disk tier
        catalog = Catalog(ModelStore(Path(home) / "models"))
        names = [catalog.add_file(args.model, "conv-a").name,
                 catalog.add_file(args.other, "other-b").name]
        for r in range(args.rounds):
            res, run = our_round(catalog, names, base, Path(home) / "kv-cache", r, args)
            ref = reference(catalog, names, base, run)
            for c in CASES:
                ours[c].append(res[c])
                if c != "re-prefill":
                    refs[c].append(ref[c])
                    checked += 1
                    same += res[c].tokens == ref[c].tokens
            if binary is not None:
                turn1 = len(run["h"]) + len(run["reply"])
                qs = {c: run["prompts"][c][turn1:] for c in ("hot", "warm", "restart")}
                ls = llama_server_round(binary, args.model, run["h"], qs,
                                        run["prompts"]["re-prefill"], args)
                for c in LS_CASES:
                    theirs[c].append(ls[c])
            line = ", ".join(f"{c} {res[c].ttft * 1000:.0f} ms ({res[c].cached})" for c in CASES)
            print(f"round {r + 1} ({len(run['prompts']['hot'])} tokens): {line}", flush=True)
    report(ours, theirs, same, checked, args)


def _med(ts: list[Timing]) -> float:
    return statistics.median(t.ttft for t in ts)


def report(ours: dict[str, list[Timing]], theirs: dict[str, list[Timing]], same: int,
           checked: int, args: argparse.Namespace) -> None:
    print(f"\n{args.model.name}, history ~{args.history} tokens, {args.rounds} rounds, "
          f"{args.threads} threads (other model: {args.other.name})")
    plain = [t.ttft for t in ours["re-prefill"]]
    print(f"{'case':12} {'TTFT p50 ms':>12} {'cached':>7} {'re-prefill / case':>18} "
          f"{'of which model load ms':>23}")
    for c in CASES:
        ratio = statistics.median(p / t.ttft for p, t in zip(plain, ours[c], strict=True))
        load = (f"{statistics.median(t.load_s for t in ours[c]) * 1000:23.0f}"
                if c in ("cold", "killed") else f"{'-':>23}")
        print(f"{c:12} {_med(ours[c]) * 1000:12.0f} {ours[c][-1].cached:7d} {ratio:17.1f}x "
              f"{load}")
    warm_gap = statistics.median(w.ttft - h.ttft for w, h in zip(ours["warm"], ours["hot"],
                                                                 strict=True))
    print(f"warm - hot: {warm_gap * 1000:.0f} ms (target < 100)")
    print(f"first {FIRST} tokens equal to the uninterrupted conversation's: {same}/{checked}")
    if any(theirs.values()):
        print(f"\nllama-server {'case':28} {'TTFT p50 ms':>12} {'cache_n':>8}")
        for c in LS_CASES:
            print(f"             {c:28} {_med(theirs[c]) * 1000:12.0f} "
                  f"{theirs[c][-1].cached:8d}")
        pairs = (("hot", "hot"), ("warm", "in between (--cache-ram)"),
                 ("restart", "restart (slot save/restore)"), ("re-prefill", "re-prefill"))
        for mine, other in pairs:
            ratio = statistics.median(o.ttft / m.ttft for m, o in zip(ours[mine], theirs[other],
                                                                      strict=True))
            print(f"llama-server {other} / ours {mine}: {ratio:.2f}x (>= 1: ours faster)")


if __name__ == "__main__":
    main()
