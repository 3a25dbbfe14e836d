"""Routed experts resident by heat against in file order, under a real memory limit.

The upcycled Qwen MoE (tests/upcycle_moe.py: 4 experts, 2 used, routers skewed so that
some experts are hot) runs inside a child memory cgroup (tests/memcg.py) at each
`--fractions` of its file size, cold each time, through tests/ltm_probe.py:
- heat: the default, the resident experts chosen by the heat stored from earlier runs
  and re-chosen from the run's own picks (engine/weights/resident_choice.py);
- file order: `--no-heat`, the same room filled with experts in file order, nothing
  read from or written to the heat store.
The two alternate `--rounds` times per limit (a first heat run records picks when the
store has none). Printed per limit: decode t/s of each (median), bytes read from disk
per token, the share of router picks that fell on resident experts, and the median of
the rounds' own ratios (heat / file order).

    .venv/bin/python benchmarks/expert_heat.py [--fractions 0.4,0.6] [--rounds 2]
        [--tokens 16] [--threads 2] [--model FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from larger_than_memory import ours
from memcg import cold_copy, writable_cgroup


def _row(r: dict[str, Any]) -> str:
    if r.get("killed"):
        return "killed (OOM)"
    if "decode_tps" not in r:
        return f"failed ({r.get('error', r.get('refused', '?'))[:80]})"
    hit = r.get("expert_hit")
    return (f"{r['decode_tps']:.2f} t/s, {r.get('read_per_token', 0) / 2**20:.0f} MiB/token, "
            f"{r.get('resident_experts', 0)} experts resident, hit "
            f"{'-' if hit is None else f'{hit:.2f}'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--fractions", default="0.4,0.6")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if writable_cgroup() is None:
        print("no writable memory cgroup here (needs root and the memory controller)")
        return 1
    from inferenceos.paths import cache_dir

    src = a.model or cache_dir() / "models" / "qwen2.5-coder-0.5b-moe4.gguf"
    if not Path(src).is_file():
        print(f"{src} not found: build it with tests/upcycle_moe.py")
        return 1
    model = cold_copy(Path(src), cache_dir() / "ltm-bench-copy.gguf")
    size = model.stat().st_size
    print(f"model {Path(src).name}: {size / 2**20:.0f} MiB; {a.tokens} tokens greedy, "
          f"{a.threads} threads, cold page cache per run")
    ours(model, int(size * min(float(f) for f in a.fractions.split(","))), a.tokens,
         a.threads)  # records heat for the runs below (the store may have none yet)
    cases = []
    for frac in [float(f) for f in a.fractions.split(",")]:
        limit = int(size * frac)
        pairs = [(ours(model, limit, a.tokens, a.threads),
                  ours(model, limit, a.tokens, a.threads, ("--no-heat",)))
                 for _ in range(max(1, a.rounds))]
        ratios = [h["decode_tps"] / f["decode_tps"] for h, f in pairs
                  if h.get("decode_tps") and f.get("decode_tps")]
        print(f"{frac:.0%} ({limit / 2**20:.0f} MiB):")
        for name, k in (("heat", 0), ("file order", 1)):
            for r in (p[k] for p in pairs):
                print(f"  {name:<10} {_row(r)}")
        if ratios:
            print(f"  heat / file order: {statistics.median(ratios):.2f}x (median of "
                  f"{len(ratios)} paired rounds)")
        cases.append({"fraction": frac, "limit": limit, "pairs": pairs})
    print(json.dumps({"cases": cases}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
