"""Load-aware threads under contention: our thread pick against "all cores".

One competing busy process (a pure-Python loop pinned to one core) runs throughout.
Two Gemma 3 270M contexts are loaded: one with the thread count the planner picks from
the free cores (`plan.threads.pick_threads` on `hardware.cpu_load.sample_cpu_load()`),
one with every usable core (what llama.cpp and the planner did before). Rounds
alternate which goes first; each round generates the same greedy tokens with both and
the per-round ratio of decode t/s is taken. Target: median ratio >= 1.3x.

`--midrun`: the competing process starts *during* a generation instead (the planner
picked every core, as it should on an idle machine). One Gemma stream runs through the
scheduler with its thread governor (engine/thread_governor.py) and without, alternating;
the decode t/s of the tokens generated after the busy process started is compared.

    PYTHONPATH=src .venv/bin/python benchmarks/contention.py [--rounds 5] [--tokens 64]
    PYTHONPATH=src .venv/bin/python benchmarks/contention.py --midrun [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from inferenceos.engine.sampling import SamplingParams  # noqa: E402
from inferenceos.engine.scheduler import generate_one  # noqa: E402
from inferenceos.engine.session import LoadedModel  # noqa: E402
from inferenceos.hardware.cpu_load import sample_cpu_load  # noqa: E402
from inferenceos.model.default_model import ensure_default_model  # noqa: E402
from inferenceos.plan.llama_params import LlamaParams  # noqa: E402
from inferenceos.plan.threads import explain_threads, pick_threads  # noqa: E402

BUSY = "while True:\n    pass\n"


def decode_tps(lm: LoadedModel, tokens: list[int], n: int) -> float:
    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    for _ in generate_one(lm, tokens, sp, adaptive_threads=False):
        pass
    return lm.metrics.decode_tps


def busy_process(cpu: int) -> subprocess.Popen[bytes]:
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    os.sched_setaffinity(busy.pid, {cpu})
    return busy


def midrun_tps(lm: LoadedModel, tokens: list[int], adaptive: bool, before: int, after: int,
               cpu: int) -> tuple[float, int]:
    """Decode t/s of the `after` tokens generated once a busy process started (after
    `before` tokens), and the thread count at the end."""
    from inferenceos.engine.messages import TokenOut
    from inferenceos.engine.scheduler import Request, Scheduler

    cores = len(os.sched_getaffinity(0))
    lm._ll.llama_set_n_threads(lm.ctx, cores, cores)
    sched = Scheduler(lm, 1, lm.settings.n_batch, adaptive_threads=adaptive)
    sp = SamplingParams(temperature=0.0, max_tokens=before + after, ignore_eos=True)
    sched.submit(Request(1, tokens, sp))
    n, busy, t0 = 0, None, 0.0
    try:
        while sched.has_work():
            n += sum(isinstance(ev, TokenOut) for ev in sched.step())
            if busy is None and n >= before:
                busy, t0 = busy_process(cpu), time.perf_counter()
        threads = int(lm._ll.llama_n_threads(lm.ctx))
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
        sched.close()
    return (n - before) / (time.perf_counter() - t0), threads


def midrun(rounds: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    path = ensure_default_model()
    lm = LoadedModel(path, LlamaParams(n_ctx=2048, n_batch=512, n_ubatch=512,
                                       n_threads=len(cpus), flash_attn=1))
    prompt = lm.tokenize("The quick brown fox jumps over the lazy dog. " * 4)
    decode_tps(lm, prompt, 8)  # warm up
    ratios = []
    for r in range(rounds):
        order = [True, False] if r % 2 == 0 else [False, True]
        got = {a: midrun_tps(lm, prompt, a, 48, 400, cpus[0]) for a in order}
        ratios.append(got[True][0] / got[False][0])
        print(f"round {r + 1}: governor {got[True][0]:6.1f} t/s (ends at {got[True][1]} "
              f"threads), fixed {len(cpus)} threads {got[False][0]:6.1f} t/s, ratio "
              f"{ratios[-1]:.2f}x", flush=True)
    lm.close()
    med = statistics.median(ratios)
    print(f"decode t/s after a busy process started mid-stream, with the thread governor "
          f"over without: median {med:.2f}x (min {min(ratios):.2f}x, max {max(ratios):.2f}x) "
          f"over {len(ratios)} paired rounds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--midrun", action="store_true",
                    help="the busy process starts during the stream (thread governor)")
    a = ap.parse_args()
    if a.midrun:
        midrun(a.rounds)
        return
    cpus = sorted(os.sched_getaffinity(0))
    cores = len(cpus)
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    os.sched_setaffinity(busy.pid, {cpus[0]})
    try:
        time.sleep(1.0)
        load = sample_cpu_load(window_s=0.5)
        pick = pick_threads(cores, load)
        print(f"cores {cores}; competing busy process on CPU {cpus[0]}; sensor: "
              f"{load.busy_others:.2f} CPUs busy with others, steal {load.steal_fraction:.0%}, "
              f"load average {load.loadavg_1m:.1f}")
        print(f"planner's pick: {explain_threads(cores, load)}; baseline: {cores} threads")
        if pick == cores:
            print("note: the pick equals all cores (the sensor saw no contention)")
        path = ensure_default_model()
        base = dict(n_ctx=1024, n_batch=512, n_ubatch=512, flash_attn=1)
        ours = LoadedModel(path, LlamaParams(n_threads=pick, **base))
        every = LoadedModel(path, LlamaParams(n_threads=cores, **base))
        prompt = ours.tokenize("The quick brown fox jumps over the lazy dog. " * 4)
        decode_tps(ours, prompt, 8)
        decode_tps(every, prompt, 8)  # warm up both
        ratios = []
        for r in range(a.rounds):
            order = [("pick", ours), ("all", every)]
            if r % 2:
                order.reverse()
            got = {name: decode_tps(lm, prompt, a.tokens) for name, lm in order}
            ratios.append(got["pick"] / got["all"])
            print(f"round {r + 1}: pick {got['pick']:6.1f} t/s, all cores {got['all']:6.1f} "
                  f"t/s, ratio {ratios[-1]:.2f}x", flush=True)
        ours.close()
        every.close()
    finally:
        busy.kill()
        busy.wait()
    med = statistics.median(ratios)
    print(f"decode t/s, our pick ({pick} threads) over all cores ({cores}): median "
          f"{med:.2f}x (min {min(ratios):.2f}x, max {max(ratios):.2f}x) over {len(ratios)} "
          f"paired rounds; target >= 1.3x: {'PASS' if med >= 1.3 else 'FAIL'}")


if __name__ == "__main__":
    main()
