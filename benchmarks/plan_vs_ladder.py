"""The optimizer's plan against the old ladder's, decoded for real, paired, same run.

For each scenario (a `--ram` cap and two loopback `inferenceos worker`s with a memory
cap each, as in issue 26) both planners plan the built-in Gemma 3 270M (or `--model`):
the optimizer (`preflight.make_plan`, what every caller now gets) and the ladder
(`preflight.ladder_plan`, the previous planner). Each plan gets its own pair of workers
(an RPC server serves one client at a time) with the same caps, so both models stay
loaded and the rounds alternate them: a busy neighbour slows both alike. Printed per
scenario: both plans, the quality each gave up (context, KV type), decode and prefill
t/s (medians) and the median of the per-round ratios optimizer / ladder.

On this machine a `--ram` cap is not enforced by the OS: a "disk-bound" plan still reads
its weights from the page cache, so the ladder's disk-bound plans measure faster here
than they would under a real limit (the ratios understate the optimizer's gain there).

With `--delay-ms D` every worker is reached through benchmarks/cluster.py's delay relay
(replies held back D ms: a round trip + D, as `cluster.py --netem D --delay-by relay`),
so both planners meet the link latency of cluster.py's scenarios; the optimizer sees it
in the workers' measured round trip, the ladder does not price links.

    PYTHONPATH=src .venv/bin/python benchmarks/plan_vs_ladder.py [--rounds 3]
        [--model PATH] [--threads 1] [--prompt-tokens 64] [--gen-tokens 32] [--delay-ms D]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

MiB = 1 << 20
# (label, --ram, worker memory): the three cases and one with smaller workers
SCENARIOS = (
    ("--ram 200MiB, workers 200+200 MiB", 200, 200),
    ("--ram 300MiB, workers 200+200 MiB", 300, 200),
    ("--ram 400MiB, workers 200+200 MiB", 400, 200),
    ("--ram 280MiB, workers 120+120 MiB", 280, 120),
)


@contextlib.contextmanager
def worker_pair(mem_mib: int, threads: int, logs: Path,
                delay_ms: float = 0.0) -> Iterator[list[str]]:
    """Two workers with `mem_mib` each; with `delay_ms`, their addresses are relays
    (cluster.py's) that hold each reply back that long."""
    from inferenceos.cluster.spawn import free_port, spawn_worker, stop_worker

    procs, relays, addrs = [], [], []
    try:
        for _ in range(2):
            port = free_port()
            procs.append(spawn_worker(port, mem=f"{mem_mib}MiB", threads=threads,
                                      log=logs / f"worker-{port}.log"))
            if delay_ms > 0:
                local = free_port()
                for off in (0, 1):  # the RPC port and the info port beside it
                    relays.append(subprocess.Popen(
                        [sys.executable, str(ROOT / "benchmarks" / "cluster.py"), "--_relay",
                         f"{local + off}:127.0.0.1:{port + off}:{delay_ms}"]))
                time.sleep(0.5)
                port = local
            addrs.append(f"127.0.0.1:{port}")
        yield addrs
    finally:
        for r in relays:
            r.kill()
        for p in procs:
            stop_worker(p)


def plans(facts: Any, ram: int, addrs: list[str], threads: int, ladder: bool) -> Any:
    """The plan of one planner for `facts` with `ram` and the workers at `addrs`."""
    from inferenceos.plan import entry, preflight
    from inferenceos.plan.devices import Overrides, apply_overrides, local_machine, with_workers
    from inferenceos.plan.entry import LoadRequest, plan_load

    machine = with_workers(local_machine(), ",".join(addrs), refresh=True)
    machine = apply_overrides(machine, Overrides(ram=ram * MiB))
    req = LoadRequest(threads=threads)
    if not ladder:
        return plan_load(facts, machine, req)
    real = preflight.make_plan

    def old(facts: Any, machine: Any, ctx: Any, threads: int = 0,
            leeway: preflight.Leeway | None = None, **_: Any) -> Any:
        return preflight.ladder_plan(facts, machine, ctx, threads, leeway or preflight.Leeway())

    # entry.py binds make_plan at import: swap it there (swapping it in preflight
    # alone, as before 1d13bbd moved entry's import to the top, now changes nothing)
    entry.make_plan = old
    try:
        return plan_load(facts, machine, req)
    finally:
        entry.make_plan = real


def _generate(lm: Any, tokens: list[int], n: int) -> tuple[float, float]:
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one

    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    for _ in generate_one(lm, tokens, sp, adaptive_threads=False):
        pass
    return lm.metrics.prompt_tps, lm.metrics.decode_tps


def _quality(plan: Any) -> str:
    c = plan.ctx
    return f"ctx {c.n_ctx}, KV {c.type_k}/{c.type_v}" + (", disk-bound" if plan.disk_bound else "")


def run(label: str, model: Path, ram: int, mem: int, args: argparse.Namespace,
        logs: Path) -> dict[str, Any]:
    from inferenceos.engine.session import LoadedModel
    from inferenceos.plan.model_facts import load_model_facts

    facts = load_model_facts(model)
    with worker_pair(mem, args.threads, logs, args.delay_ms) as a, \
            worker_pair(mem, args.threads, logs, args.delay_ms) as b:
        opt = plans(facts, ram, a, args.threads, ladder=False)
        lad = plans(facts, ram, b, args.threads, ladder=True)
        print(f"\n{label}\n  optimizer: {opt.summary()}\n  ladder:    {lad.summary()}")
        ratios: list[float] = []
        od: list[float] = []
        ld: list[float] = []
        op: list[float] = []
        lp: list[float] = []
        with LoadedModel(model, opt.params()) as om, LoadedModel(model, lad.params()) as lm:
            tokens = om.tokenize("The quick brown fox jumps over the lazy dog. " * 40)
            tokens = tokens[: args.prompt_tokens]
            _generate(om, tokens[:8], 4)
            _generate(lm, tokens[:8], 4)
            for r in range(args.rounds):
                pair = [(om, od, op), (lm, ld, lp)]
                for m, dec, pre in pair if r % 2 == 0 else pair[::-1]:
                    p, d = _generate(m, tokens, args.gen_tokens)
                    dec.append(d)
                    pre.append(p)
                ratios.append(od[-1] / ld[-1])
    return {"label": label, "opt": opt, "lad": lad, "ratio": statistics.median(ratios),
            "od": statistics.median(od), "ld": statistics.median(ld),
            "op": statistics.median(op), "lp": statistics.median(lp)}


def main() -> None:
    from inferenceos.model.default_model import ensure_default_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--delay-ms", type=float, default=0.0,
                    help="hold every worker reply back this long (cluster.py's relay)")
    args = ap.parse_args()
    model = args.model or ensure_default_model()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, ram, mem in SCENARIOS:
            try:
                rows.append(run(label, model, ram, mem, args, Path(tmp)))
            except Exception as exc:  # a scenario one planner refuses: say so, go on
                print(f"\n{label}: {type(exc).__name__}: {exc}")
    print(f"\n{'scenario':<36} {'optimizer':<28} {'ladder':<28} {'decode o/l':>11} "
          f"{'prefill o/l':>12} {'ratio':>6}")
    for r in rows:
        print(f"{r['label']:<36} {_quality(r['opt']):<28} {_quality(r['lad']):<28} "
              f"{r['od']:>5.1f}/{r['ld']:<5.1f} {r['op']:>6.0f}/{r['lp']:<5.0f} "
              f"{r['ratio']:>5.2f}x")
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"load average {load}; {args.rounds} alternating rounds, {args.threads} thread(s);"
          f" worker replies delayed {args.delay_ms:g} ms;"
          " --ram is not enforced by the OS here: disk-bound plans read the page cache")


if __name__ == "__main__":
    main()
