"""Live migration on Gemma: the pause a migration puts in a token stream, its total
time, and what a stop-and-reload costs instead.

One greedy stream (Gemma 3 270M Q4_K_M, a ~300-token conversation as the prompt) runs
while the engine migrates down (context 2048 → 1024, ubatch 512 → 256: a placement
down on a CPU-only machine) and back up, alternating make-before-break (the new worker
loads while the old one generates) and break-before-make (pause, save, reload,
restore). For each migration it records:

- the stream's gap: the longest interval between two tokens the client received while
  the migration ran (what a user sees), and the engine's own pause (export → import);
- the migration's total time (the new worker's load included);
- whether the stream's tokens equal an undisturbed run's (no lost / repeated token): a
  one-thread run, bitwise reproducible; two-thread decode is not always, so a stream
  that differs is re-scored against lone runs (engine.scoring.greedy_agreement).

Against it, in the same run: one model load (each round's fresh Engine: every gap is
also divided by its own round's load, so a noisy machine slows both sides of the
ratio), and a stop-and-reload that keeps the conversation (close the engine, load the
new placement, prefill the prompt plus what was generated so far, up to the next
token). Target: pause under 2x one model load, and no lost conversation.

`--ab`: every migration is make-before-break, and rounds alternate the engine's core
sharing (worker_swap._core_shares: the old worker gives a core to the loading one, each
gets its threads back once the other is out of the way) with none (both workers on
their full thread counts, as before it): the paired comparison of the two.

    python benchmarks/migration.py [--rounds 3] [--threads 2] [--ab]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import inferenceos.engine.worker.swap as swap_mod
from inferenceos.engine.engine import Engine
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scoring import greedy_agreement
from inferenceos.model.default_model import ensure_default_model
from inferenceos.plan.llama_params import LlamaParams

CONVERSATION = " ".join(
    f"Turn {i}: the user asks about memory pressure on device {i % 3}, and the assistant "
    "explains how layers move between devices while generation continues." for i in range(12)
)
AT = 40  # tokens into the stream before a migration (and between the two)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _stream(engine: Engine, prompt: str | list[int], gen: SamplingParams,
            stamps: list[tuple[float, int]]) -> threading.Thread:
    """Read a generation on a thread, stamping each token with its arrival time."""
    it = iter(engine.generate(prompt, gen))

    def read() -> None:
        for ev in it:
            stamps.append((time.perf_counter(), ev.token))

    t = threading.Thread(target=read)
    t.start()
    return t


def _wait_tokens(stamps: list[tuple[float, int]], n: int) -> None:
    while len(stamps) < n:
        time.sleep(0.002)


def _gap(stamps: list[tuple[float, int]], t0: float, t1: float) -> float:
    """Longest interval between consecutive tokens that touches [t0, t1]."""
    times = [t for t, _ in stamps]
    gaps = [b - a for a, b in itertools.pairwise(times) if b >= t0 and a <= t1]
    return max(gaps, default=0.0)


def _unshared(old: LlamaParams, new: LlamaParams, cores: int | None = None) -> None:
    """No core sharing (--ab's other half): both workers on their full thread counts."""
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--ab", action="store_true",
                    help="make-before-break only; rounds alternate core sharing on / off")
    a = ap.parse_args()
    gemma = ensure_default_model()
    hi = LlamaParams(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=a.threads)
    lo = LlamaParams(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=a.threads)
    gen = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)

    t0 = time.perf_counter()
    with Engine(gemma, hi, n_parallel=1) as engine:
        load_s = time.perf_counter() - t0
        prompt = engine.tokenize(CONVERSATION)
        stamps: list[tuple[float, int]] = []
        _stream(engine, prompt, gen, stamps).join()
    # the reference tokens on one thread: there llama.cpp's CPU decode is bitwise the
    # same run to run; on two it is not always (an undisturbed Gemma run flipped a near
    # tie at token 275 in 1 of 5 here), so a mismatch is re-scored (engine.scoring)
    ref = Engine(gemma, replace(hi, n_threads=1), n_parallel=1)
    want = [ev.token for ev in ref.generate(prompt, gen)]
    normal = [b[0] - a[0] for a, b in itertools.pairwise(stamps)]
    print(f"Gemma 3 270M Q4_K_M, {len(prompt)}-token prompt, {a.max_tokens} tokens, "
          f"{a.threads} threads; one model load {load_s:.2f} s; normal inter-token gap "
          f"p50 {_pct(normal, 0.5) * 1000:.1f} ms, max {max(normal) * 1000:.0f} ms "
          "(undisturbed: what the machine's other load does alone)")

    # label -> (stream gap, engine pause, total, that round's load) per migration
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    exact = rescored = 0
    shares = swap_mod._core_shares
    for r in range(a.rounds):
        shared = not a.ab or r % 2 == 0
        swap_mod._core_shares = shares if shared else _unshared
        t0 = time.perf_counter()
        with Engine(gemma, hi, n_parallel=1) as engine:
            round_load = time.perf_counter() - t0
            stamps = []
            done: list[tuple[int, bool, float, float, dict]] = []
            reader = _stream(engine, prompt, gen, stamps)
            for i, target in enumerate((lo, hi)):
                mbb = a.ab or (r + i) % 2 == 0
                _wait_tokens(stamps, len(stamps) + AT)  # AT tokens after the last one
                m0 = time.perf_counter()
                info = engine.migrate(target, make_before_break=mbb)
                m1 = time.perf_counter()
                assert info["moved"] == 1, info
                done.append((i, mbb, m0, m1, info))
            reader.join()
        swap_mod._core_shares = shares
        for i, mbb, m0, m1, info in done:  # the gaps once every token has arrived
            gap = _gap(stamps, m0, m1)
            label = "make before break" if mbb else "pause-save-reload"
            if a.ab:
                label += ", shared" if shared else ", unshared"
            rows.setdefault(label, []).append((gap, info["pause_s"], info["seconds"],
                                               round_load))
            print(f"  round {r} {'down' if i == 0 else 'up  '} {label}: stream gap "
                  f"{gap * 1000:.0f} ms = {gap / round_load:.2f}x this round's load "
                  f"({round_load:.2f} s), engine pause {info['pause_s'] * 1000:.0f} ms, "
                  f"total {info['seconds']:.2f} s")
        got = [tok for _, tok in stamps]
        exact += got == want
        if got != want:
            check = greedy_agreement(ref, prompt, [t for t in got if t >= 0])
            rescored += check.ok
            print(f"  round {r}: not the reference's tokens; re-scored: {check}")

    reload_costs = []
    for _ in range(a.rounds):
        engine = Engine(gemma, hi, n_parallel=1)
        stamps = []
        it = iter(engine.generate(prompt, gen))
        so_far = [next(it).token for _ in range(AT)]
        t0 = time.perf_counter()
        engine.close()  # stop...
        with Engine(gemma, lo, n_parallel=1) as fresh:  # ...reload, prefill again
            nxt = next(iter(fresh.generate(prompt + so_far, gen))).token
            reload_costs.append(time.perf_counter() - t0)
        assert nxt == want[AT], "the reloaded conversation went another way"

    print(f"\n{'migration':<31} {'stream gap p50':>15} {'max':>8} {'gap/load p50':>13} "
          f"{'max':>6} {'engine pause p50':>17} {'total p50':>10} {'max':>8}")
    for label, vals in rows.items():
        gaps = [g for g, _, _, _ in vals]
        ratios = [g / ld for g, _, _, ld in vals]
        pauses = [p for _, p, _, _ in vals]
        totals = [t for _, _, t, _ in vals]
        print(f"{label:<31} {_pct(gaps, 0.5) * 1000:>12.0f} ms {max(gaps) * 1000:>5.0f} ms "
              f"{_pct(ratios, 0.5):>12.2f}x {max(ratios):>5.2f}x "
              f"{_pct(pauses, 0.5) * 1000:>14.0f} ms {_pct(totals, 0.5):>8.2f} s "
              f"{max(totals):>6.2f} s")
    print(f"{'stop and reload':<31} {_pct(reload_costs, 0.5) * 1000:>12.0f} ms "
          f"{max(reload_costs) * 1000:>5.0f} ms   (close, load, prefill {len(prompt) + AT} "
          "tokens, next token)")
    all_gaps = [g for v in rows.values() for g, _, _, _ in v]
    worst = max(all_gaps)
    worst_ratio = max(g / ld for v in rows.values() for g, _, _, ld in v)
    ratio = statistics.median(all_gaps) / statistics.median(reload_costs)
    print(f"\nworst stream gap {worst:.2f} s = {worst / load_s:.2f}x the first model load, "
          f"worst gap / its own round's load {worst_ratio:.2f}x (target < 2x); median gap / "
          f"stop-and-reload: {ratio:.2f}x; streams token-identical to the undisturbed run: "
          f"{exact}/{a.rounds}, the others within the re-scoring tolerance: "
          f"{rescored}/{a.rounds - exact}")
    ref.close()


if __name__ == "__main__":
    main()
