"""A child process for the larger-than-memory tests and benchmark: plan here (inside
whatever memory cgroup it was started in), load, decode greedily, and print one JSON
line with the plan's tiers and what the process really held.

    python tests/ltm_probe.py MODEL [--tokens N] [--prompt TEXT] [--n-ctx N]

Exit 3 with {"refused": message} when the preflight refuses the plan. A plan the
kernel cannot hold ends in an OOM kill (exit -9 / 137) and prints nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any


def status_kib(key: str) -> int:
    """A /proc/self/status field in KiB (RssAnon, RssFile, VmHWM...)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def read_bytes() -> int:
    """Bytes this process has caused to be read from storage (/proc/self/io), page
    faults' read-ahead included: what streaming really fetched."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def mapped_kib(path: str) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps): the
    model's weights held in the page cache, as opposed to on disk."""
    total, inside = 0, False
    real = str(Path(path).resolve())
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line
            inside = len(head) >= 6 and head[5] == real
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def expert_figures(streamer: Any) -> dict[str, Any]:
    """A routed model's heat figures: whether stored heat was read, how often the
    resident set changed, the experts resident, and the share of the run's router
    picks (prefill's included) that fell on resident experts."""
    if streamer is None or not streamer.n_expert:
        return {}
    seen = streamer._seen
    total = sum(float(v.sum()) for v in seen.values())
    hits = sum(float(seen[u[0]][u[1]]) for u in streamer.resident
               if isinstance(u, tuple) and u[0] in seen)
    return {"heat_stored": streamer._stored is not None, "rechosen": streamer.rechosen,
            "resident_experts": sum(isinstance(u, tuple) for u in streamer.resident),
            "expert_hit": hits / total if total else None}


def _record(model: Path, metrics: Any, params: Any) -> None:
    """One generation in the telemetry store, with the settings `run` records."""
    from dataclasses import asdict

    from inferenceos import telemetry

    rec = telemetry.recorder()
    rec.generation(model, source="benchmark:larger_than_memory", metrics=metrics.to_json(),
                   settings=asdict(params), threads=params.n_threads, n_ctx=params.n_ctx,
                   n_batch=params.n_batch, n_ubatch=params.n_ubatch)
    rec.flush(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prompt", default="def fibonacci(n):")
    ap.add_argument("--n-ctx", type=int, default=0)
    # "on": the control, loaded as before the fix (CPU_REPACK whatever the plan says);
    # "off": a reference with the disk plan's kernels (repacked kernels round otherwise)
    ap.add_argument("--repack", choices=("plan", "on", "off"), default="plan")
    ap.add_argument("--kv", default=None, help="pin the KV cache type (same numerics)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--n-batch", type=int, default=0, help="the batch asked of the plan")
    ap.add_argument("--record", action="store_true",
                    help="record the run in the telemetry store, as `run` does (what "
                         "later predictions learn the disk's streaming rate from)")
    ap.add_argument("--no-stream", action="store_true",
                    help="no prefetch thread (engine/weights/prefetch.py): the kernel pages alone")
    ap.add_argument("--cap-above-start", type=int, default=0, metavar="BYTES",
                    help="after start-up, limit this process's cgroup to its charge + BYTES")
    ap.add_argument("--no-heat", action="store_true",
                    help="experts resident in file order: no stored heat read, no re-choice "
                         "from the picks (the control of benchmarks/expert_heat.py)")
    a = ap.parse_args()

    from inferenceos.engine.llama.lib import lib
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.engine.session import LoadedModel
    from inferenceos.plan.devices import local_machine
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.plan.here import plan_here
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.preflight import PlanRefused
    from inferenceos.plan.simulate import Workload, predict

    lib()  # the library's one-time start-up cost is the baseline, not the load's
    cap = 0
    if a.cap_above_start:  # the limit: this run's own start-up charge plus N bytes
        from memcg import cap_own_memory

        cap = cap_own_memory(a.cap_above_start)
        print(f"capped at {cap}", file=sys.stderr, flush=True)
    base_anon = status_kib("RssAnon") * 1024
    machine = local_machine()
    try:
        req = LoadRequest(n_ctx=a.n_ctx, type_k=a.kv, type_v=a.kv, threads=a.threads,
                          n_batch=a.n_batch)
        facts = load_model_facts(a.model)
        here = plan_here(facts, machine, req)
        plan = here.plan
    except PlanRefused as e:
        print(json.dumps({"refused": str(e)}))
        return 3
    params = plan.params().per_sequence()
    if a.repack != "plan":
        params = replace(params, use_extra_bufts=a.repack == "on")
    ram = machine.cpu.memory_bytes
    if a.no_stream:
        params = replace(params, stream_resident_bytes=0)
    if a.no_heat:
        from inferenceos.engine import session
        from inferenceos.engine.weights import prefetch

        session._heat_store = lambda _path: (None, None)  # type: ignore[assignment]
        prefetch.RECHOOSE_TOKENS = 1 << 62
    t0 = time.perf_counter()
    with LoadedModel(Path(a.model), params) as m:
        load_s = time.perf_counter() - t0
        streamer = m._streamer
        loaded_anon = status_kib("RssAnon") * 1024
        tokens = m.tokenize(a.prompt)
        work = Workload(prompt_tokens=len(tokens), output_tokens=a.tokens)
        predicted = predict(facts, machine, plan, work, here.calibration)
        sampling = SamplingParams(temperature=0.0, max_tokens=a.tokens, ignore_eos=True)
        before = read_bytes()
        text = "".join(ev.text for ev in generate_one(m, tokens, sampling))
        fetched = read_bytes() - before
        metrics = m.metrics
        if a.record:
            _record(Path(a.model), metrics, params)
        out = {
            "ram_budget": ram,
            "cap": cap,
            "disk_bound": plan.disk_bound,
            "use_extra_bufts": params.use_extra_bufts,
            "tiers": plan.memory.tiers(ram),
            "repack": plan.memory.repack,
            "n_ctx": params.n_ctx,
            "base_anon": base_anon,
            "loaded_anon": loaded_anon,
            "anon": status_kib("RssAnon") * 1024,
            "file": status_kib("RssFile") * 1024,
            "model_rss": mapped_kib(a.model) * 1024,
            "load_s": load_s,
            "decode_tps": metrics.decode_tps,
            "prompt_tps": metrics.prompt_tps,
            "text": text,
            "predicted_decode_tps": predicted.decode_tps,
            # disk bytes per generated token, prefill included (prefill reads the weights
            # once per ubatch, decode once per token)
            "read_per_token": fetched / max(1, a.tokens),
            "plan": plan.summary(),
            "streamed": streamer is not None,
            "resident_layers": len(streamer.resident) if streamer else 0,
            "locked": streamer.locked if streamer else 0,
            "resident_in_core": streamer.resident_in_core() if streamer else 0.0,
            **expert_figures(streamer),
        }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
