"""Switching between two models under one memory budget: warm → hot against cold → hot.

Two models: the built-in Gemma 3 270M (Q4_K_M) and the same weights requantized to
Q8_0 (a second, larger model). Requests alternate between them through the memory
manager (`registry.manager.ModelManager`, the server's own), in two budgets:

- warm: the budget holds both models' weights but only one context; switching demotes
  the other model to warm (its context freed) and promotes this one (a new context on
  weights kept in its worker);
- cold: the budget holds only one model at all, so every switch unloads one and loads
  the other from disk, as a router that evicts by count does.

The switch overhead of a request is the time `acquire` takes (what a request waits
before its prompt can run: demote the other model, then promote or load this one). Each
request then generates 8 tokens so the switch happens under a real workload. Prints
p50 / p95 per budget and their ratio. Target: warm → hot p50 under 100 ms and at least
5x faster than a cold reload.

    python benchmarks/switch.py [--rounds 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import finish, record
from inferenceos.engine.sampling import SamplingParams
from inferenceos.model.default_model import ensure_default_model
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry.budget import MemoryBudget
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.manager import ModelManager
from inferenceos.registry.store import ModelStore
from llama_tools import quantize_q8

GEN = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _manager(catalog: Catalog, names: list[str], threads: int, warm: bool) -> ModelManager:
    """A manager whose budget holds both weights and one context (warm) or only one
    model (cold), from the planner's own charges."""
    probe = ModelManager(catalog.resolve, base=LoadRequest(n_ctx=2048, threads=threads),
                         context_hint=None)
    plans = [probe.plan_for(n) for n in names]
    hot = [sum(p.charge().values()) for p in plans]
    weights = [sum(p.charge(warm=True).values()) for p in plans]
    cap = sum(weights) + max(h - w for h, w in zip(hot, weights, strict=True)) + (1 << 20)
    if not warm:
        cap = max(hot) + (1 << 20)  # one model at all
    print(f"  {'warm' if warm else 'cold'} budget {cap / 2**20:.0f} MiB "
          f"(hot {[round(h / 2**20) for h in hot]} MiB, "
          f"weights {[round(w / 2**20) for w in weights]} MiB)")
    return ModelManager(catalog.resolve, budget=MemoryBudget(total_cap=cap),
                        base=LoadRequest(n_ctx=2048, threads=threads), context_hint=None)


def _alternate(mgr: ModelManager, names: list[str], rounds: int) -> list[float]:
    """Switch overheads (s) of alternating requests, after one warm-up pass."""
    overheads = []
    for i in range(2 * rounds + 2):
        name = names[i % 2]
        t0 = time.perf_counter()
        with mgr.acquire(name) as lease:
            waited = time.perf_counter() - t0
            gen = lease.engine.generate("The printing press", GEN)
            gen.text()
        if i >= 2:  # the first two loads are not switches
            overheads.append(waited)
            record("switch", lease.loaded.model.path, metrics=gen.metrics,
                   settings=lease.loaded.plan.params())
    return overheads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    gemma = ensure_default_model()
    q8 = quantize_q8(gemma, Path(tempfile.gettempdir()) / "gemma-3-270m-q8_0.gguf")
    with tempfile.TemporaryDirectory() as root:
        catalog = Catalog(ModelStore(Path(root)))
        names = [catalog.add_file(gemma, "gemma-q4").name, catalog.add_file(q8, "gemma-q8").name]
        results = {}
        for label, warm in (("warm → hot", True), ("cold → hot", False)):
            mgr = _manager(catalog, names, args.threads, warm)
            try:
                results[label] = _alternate(mgr, names, args.rounds)
            finally:
                mgr.close()
    finish("switch")
    print(f"\n{'switch':12} {'n':>3} {'p50 ms':>9} {'p95 ms':>9}")
    for label, vals in results.items():
        print(f"{label:12} {len(vals):3d} {1000 * statistics.median(vals):9.1f} "
              f"{1000 * _pct(vals, 0.95):9.1f}")
    warm_s, cold_s = results["warm → hot"], results["cold → hot"]
    ratio = statistics.median(cold_s) / statistics.median(warm_s)
    print(f"\ncold / warm p50 ratio: {ratio:.1f}x "
          f"(target: warm p50 < 100 ms: {'PASS' if statistics.median(warm_s) < 0.1 else 'FAIL'};"
          f" >= 5x: {'PASS' if ratio >= 5 else 'FAIL'})")


if __name__ == "__main__":
    main()
