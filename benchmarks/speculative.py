"""Speculative decoding: ours (none / ngram / self / a draft model) against llama-server's
speculative settings in the vendored llama.cpp, same run, paired rounds (Gemma by default).

Two tasks, greedy, the same prompts for everyone:
(a) repetitive: continue a text that quotes a given passage (the model copies it);
(b) free generation (a story opening).
Ours is the `run --draft` path (a one-slot scheduler on an in-process model); llama-server
runs plain, `--spec-type ngram-simple`, `ngram-map-k`, and draft-simple with
our self-draft file as its draft model (`-md`). With `--draft-model PATH` (e.g.
Qwen2.5-Coder-0.5B for `--model` the 1.5B) ours also drafts with that file ("model") and
llama-server runs `-md` with it, at its defaults and at 8 draft tokens: each side's
drafted / plain is printed, and ours over llama-server's best -md speedup, both paired per
round. Each round runs every configuration once
per task, in a rotated order; the figures are medians, and the ratios are medians of each
round's own ratios (both sides of a round share the machine's state). Decode t/s counts
the tokens after the first over the time they took (llama-server's `predicted_per_second`
counts all of them: same scale within 1 %). Bandwidth achieved: every decode or
verification step reads the weights once, so weight bytes × steps per second (t/s over
tokens per step), against the machine's measured RAM read bandwidth (hardware profile).

Targets: (a) ngram >= 1.5x our plain decode and >= 1.1x llama-server's best;
(b) every drafter within 3 % of plain (never slower); a draft model >= 1.0x plain and
>= llama-server -md's own speedup (issue 44).

    .venv/bin/python benchmarks/speculative.py [--model PATH] [--tokens 96] [--rounds 3]
        [--threads 2] [--no-server] [--draft-model PATH]
    # the draft pair on free text:
    .venv/bin/python benchmarks/speculative.py --model ~/.cache/inferenceos/models/\
        qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --draft-model ~/.cache/inferenceos/models/\
        qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --tasks free --ours none model \
        --servers plain draft-model draft-model-8
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import ram_gbps
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.session import LoadedModel
from inferenceos.engine.spec.self_draft import self_draft_path
from inferenceos.model.default_model import ensure_default_model
from inferenceos.model.spec import load_spec
from inferenceos.plan.llama_params import LlamaParams
from llama_tools import llama_tool

PASSAGE = (
    "The committee met on Tuesday to review the budget for the new library. After a long "
    "discussion, the members agreed to fund the reading room, the children's corner and a "
    "small garden behind the building, but they postponed the decision on the second floor "
    "until the city publishes its spending plan for next year. The chair thanked the "
    "volunteers who had collected more than four thousand signatures in support of the "
    "project, and asked the architect to prepare two cheaper designs for the next meeting."
)
TASKS = {
    "repetitive": f"Passage: {PASSAGE}\n\nThe secretary read the passage aloud, word for "
                  f"word: \"The committee met",
    "free": "Once upon a time, in a small village by the sea, there lived",
}
OURS = ("none", "ngram", "self", "model")  # model: the --draft-model file
SERVER = {
    "plain": [],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "draft-self": ["--spec-type", "draft-simple", "-md", "{self}", "--spec-draft-n-max", "8"],
    # the --draft-model file: llama-server's defaults (3 draft tokens), and 8
    "draft-model": ["--spec-type", "draft-simple", "-md", "{draft}"],
    "draft-model-8": ["--spec-type", "draft-simple", "-md", "{draft}", "--spec-draft-n-max",
                      "8"],
}
DRAFT_MODEL = ("model", "draft-model", "draft-model-8")  # need --draft-model


def ours_once(lm: LoadedModel, prompt: list[int], tokens: int, draft: str) -> dict[str, Any]:
    sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    out = [ev.token for ev in generate_one(lm, prompt, sp, None if draft == "none" else draft)
           if ev.token >= 0]
    m = lm.metrics
    assert len(out) == tokens, (draft, len(out))
    return {"tps": m.decode_tps, "acc": m.acceptance_rate, "per_step": m.tokens_per_step,
            "text": out}


def start_server(binary: Path, model: Path, threads: int, extra: list[str]
                 ) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "-c", "2048", "-np", "1", "-t", str(threads),
         "--host", "127.0.0.1", "--port", str(port), *extra],
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
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server {' '.join(extra)} exited ({proc.returncode})")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("llama-server did not become healthy")


def server_once(port: int, prompt: str, tokens: int) -> dict[str, Any]:
    body = json.dumps({"prompt": prompt, "n_predict": tokens, "temperature": 0,
                       "ignore_eos": True, "cache_prompt": False})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    data = json.loads(conn.getresponse().read())
    conn.close()
    t = data["timings"]
    n, acc = t.get("draft_n", 0), t.get("draft_n_accepted", 0)
    return {"tps": float(t["predicted_per_second"]), "acc": acc / n if n else 0.0,
            "per_step": 0.0}


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _stop_on_sigterm() -> None:
    """SIGTERM ends the run through `finally`, so the llama-servers are stopped too."""
    import signal

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--draft-model", type=Path, default=None,
                    help="a draft model file: ours 'model' and llama-server 'draft-model*'")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-server", action="store_true", help="ours only")
    ap.add_argument("--ours", nargs="+", default=None, choices=OURS)
    ap.add_argument("--servers", nargs="+", default=None, choices=list(SERVER))
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    args = ap.parse_args()
    usable = [x for x in (*OURS, *SERVER) if args.draft_model or x not in DRAFT_MODEL]
    args.ours = args.ours or [x for x in OURS if x in usable]
    args.servers = args.servers or [x for x in SERVER if x in usable]
    if "none" not in args.ours:
        ap.error("--ours must include none (the baseline)")
    if not args.draft_model and {*args.ours, *args.servers} & set(DRAFT_MODEL):
        ap.error(f"{', '.join(DRAFT_MODEL)} need --draft-model")
    return args


def start_servers(args: argparse.Namespace, model: Path
                  ) -> dict[str, tuple[subprocess.Popen[bytes], int]]:
    """The llama-servers `args` asks for, by config name (none with --no-server)."""
    servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    if args.no_server:
        return servers
    binary = llama_tool("llama-server")
    for name in args.servers:
        extra = SERVER[name]
        if "{self}" in extra:
            extra = [x.replace("{self}", str(self_draft_path(model))) for x in extra]
        extra = [x.replace("{draft}", str(args.draft_model)) for x in extra]
        try:
            servers[name] = start_server(binary, model, args.threads, extra)
        except RuntimeError as exc:
            print(f"skipping llama-server {name}: {exc}")
    return servers


def main() -> None:
    _stop_on_sigterm()
    args = parse_args()
    model = args.model or ensure_default_model()
    drafts = {d: d for d in args.ours}
    if args.draft_model:
        drafts["model"] = str(args.draft_model)
    servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    settings = LlamaParams(n_ctx=2048, n_threads=args.threads)
    try:
        servers = start_servers(args, model)
        with LoadedModel(model, settings) as lm:
            bytes_per_pass = load_spec(model).tensor_bytes  # weights read per step
            prompts = {task: lm.tokenize(text) for task, text in TASKS.items()}
            for task in args.tasks:  # warm-up: page cache, self-draft build, first decodes
                for d in args.ours:
                    ours_once(lm, prompts[task], 8, drafts[d])
            configs = [("ours", d) for d in args.ours] + [("server", s) for s in servers]
            for r in range(args.rounds):
                order = configs[r % len(configs):] + configs[: r % len(configs)]
                for task in args.tasks:
                    for side, name in order:
                        load = os.getloadavg()[0]
                        res = (ours_once(lm, prompts[task], args.tokens, drafts[name])
                               if side == "ours"
                               else server_once(servers[name][1], TASKS[task], args.tokens))
                        res["load"] = max(load, os.getloadavg()[0])
                        results.setdefault((task, f"{side}:{name}"), []).append(res)
                print(f"round {r + 1}/{args.rounds} done", flush=True)
                report(results, args, bytes_per_pass)  # so far: a slow machine may stop us
    finally:
        stop_servers(servers)


def stop_servers(servers: dict[str, tuple[subprocess.Popen[bytes], int]]) -> None:
    """Terminate every llama-server, then wait; one still busy after 10 s is killed."""
    for proc, _ in servers.values():
        proc.terminate()
    for proc, _ in servers.values():
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def report(results: dict[tuple[str, str], list[dict[str, Any]]], args: argparse.Namespace,
           bytes_per_pass: int) -> None:
    bw = ram_gbps()
    print(f"\n{args.tokens} tokens, greedy, {args.threads} threads, {args.rounds} rounds; "
          f"RAM bandwidth {bw or float('nan'):.1f} GB/s (hardware profile)")
    print(f"{'task':<11} {'config':<20} {'t/s':>7} {'accept':>7} {'tok/step':>8} "
          f"{'GB/s':>6} {'of RAM':>6}  load (1-min, per run)")
    for (task, name), rs in sorted(results.items()):
        tps = med([r["tps"] for r in rs])
        per_step = med([r["per_step"] for r in rs]) or 1.0
        gbps = tps / per_step * bytes_per_pass / 1e9  # weight passes per second × bytes
        share = f"{gbps / bw:6.0%}" if bw else "     -"
        known = name.startswith("ours:") or name == "server:plain"  # server: no step count
        cells = f"{per_step:8.2f} {gbps:6.1f} {share}" if known else f"{'-':>8} {'-':>6} {'-':>6}"
        loads = [r["load"] for r in rs]
        print(f"{task:<11} {name:<20} {tps:7.1f} {med([r['acc'] for r in rs]):7.2f} {cells}  "
              f"{min(loads):.1f}-{max(loads):.1f}")
    for task in args.tasks:
        plain = [r["tps"] for r in results[(task, "ours:none")]]
        for d in [x for x in args.ours if x != "none"]:
            xs = [r["tps"] for r in results[(task, f"ours:{d}")]]
            ratio = med([x / p for x, p in zip(xs, plain, strict=True)])
            same = all(r["text"] == p["text"] for r, p in
                       zip(results[(task, f"ours:{d}")], results[(task, "ours:none")], strict=True))
            print(f"{task}: {d} / plain {ratio:.3f} (paired median), greedy text identical "
                  f"to plain: {same}")
        draft_model_ratios(results, task)
        spec = [k for (t, k) in results if t == task and k.startswith("server:")
                and k != "server:plain" and not k.startswith("server:draft-model")]
        if spec:
            best = max(spec, key=lambda k: med([r["tps"] for r in results[(task, k)]]))
            theirs = [r["tps"] for r in results[(task, best)]]
            if (task, "ours:ngram") not in results:
                continue
            ours = [r["tps"] for r in results[(task, "ours:ngram")]]
            ratio = med([x / y for x, y in zip(ours, theirs, strict=True)])
            print(f"{task}: ours ngram / llama-server best ({best}) {ratio:.3f} (paired median)")
    print("targets: repetitive ngram/plain >= 1.5 and ngram/llama-server best >= 1.1; "
          "free: every drafter / plain >= 0.97; draft model / plain >= 1.0 and >= "
          "llama-server -md / its plain")


def paired(results: dict[tuple[str, str], list[dict[str, Any]]], task: str, a: str, b: str
           ) -> list[float]:
    """Each round's t/s of config `a` over config `b`'s, on `task`."""
    return [x["tps"] / y["tps"] for x, y in
            zip(results[(task, a)], results[(task, b)], strict=True)]


def draft_model_ratios(results: dict[tuple[str, str], list[dict[str, Any]]], task: str) -> None:
    """llama-server -md's speedup over its own plain (each setting), and ours (the same
    draft model) over llama-server's best -md speedup, paired per round."""
    if (task, "server:plain") not in results:
        return
    best = None
    for k in ("server:draft-model", "server:draft-model-8"):
        if (task, k) in results:
            xs = paired(results, task, k, "server:plain")
            print(f"{task}: llama-server {k[7:]} / its plain {med(xs):.3f} (paired median; "
                  f"rounds {' '.join(f'{x:.3f}' for x in xs)})")
            best = xs if best is None or med(xs) > med(best) else best
    if (task, "ours:model") in results:
        ours = paired(results, task, "ours:model", "ours:none")
        print(f"{task}: ours model / plain rounds {' '.join(f'{x:.3f}' for x in ours)}")
        if best is not None:
            rel = [o / t for o, t in zip(ours, best, strict=True)]
            print(f"{task}: ours model speedup / llama-server best -md speedup {med(rel):.3f} "
                  f"(paired median)")
    if (task, "ours:none") in results:
        xs = paired(results, task, "ours:none", "server:plain")
        print(f"{task}: ours plain / llama-server plain {med(xs):.3f} (paired median)")


if __name__ == "__main__":
    main()
