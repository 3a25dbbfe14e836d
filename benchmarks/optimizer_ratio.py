"""The optimizer's best settings against llama.cpp's defaults, as same-run ratios.

1. `optimize` runs as the CLI runs it (budgeted search by real trials, every trial and
   the best recorded in the telemetry store of the current data dir).
2. An independent check in a fresh trial runner: `--rounds` paired rounds alternate the
   baseline (llama.cpp's defaults: a thread per physical core, batch 2048 / ubatch 512,
   flash attention auto, f16 KV) and the best (the order flips every round), with a
   longer decode than the search's trials. The ratios are the medians of the per-round
   ratios best / baseline (each round's two runs are adjacent in time, so a busy
   neighbour slows both). Target: >= 1.0x on both phases.

When the search's own confirmation did not show its best beating the defaults, the
optimizer keeps and stores the defaults (`tuning.stopping.confirmed`); the report says
so, and the ratio is 1.0x by construction (nothing else is recommended).

`optimizer_ratio(model)` is what `benchmarks/learning.py` calls; run this file alone:

    PYTHONPATH=src .venv/bin/python benchmarks/optimizer_ratio.py [--model PATH]
        [--budget 120] [--rounds 5] [--prompt 512] [--tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from inferenceos.model.default_model import ensure_default_model  # noqa: E402
from inferenceos.model.spec import load_spec  # noqa: E402
from inferenceos.tuning import records  # noqa: E402
from inferenceos.tuning.search import optimize  # noqa: E402
from inferenceos.tuning.space import Knobs  # noqa: E402
from inferenceos.tuning.stopping import paired_ratios  # noqa: E402
from inferenceos.tuning.trials import TrialResult, TrialRunner  # noqa: E402


def _has_gpu() -> bool:
    from inferenceos.cli.optimize_cmd import _has_gpu as has_gpu

    return has_gpu()


def verify(
    model: Path, base: Knobs, best: Knobs, rounds: int, prompt: int, tokens: int
) -> dict[str, Any]:
    """Paired rounds of `base` and `best` in a fresh runner: medians and ratios."""
    rb: list[TrialResult] = []
    rc: list[TrialResult] = []
    # a crawling baseline (a busy machine) gets fewer decode tokens, not minutes each
    with TrialRunner(model, prompt, tokens, max_trial_s=20) as runner:
        for i in range(rounds):
            order = [(base, rb), (best, rc)] if i % 2 == 0 else [(best, rc), (base, rb)]
            for knobs, out in order:
                res = runner.run(knobs, "verify")
                if res.error:
                    raise RuntimeError(f"{knobs.label()}: {res.error}")
                out.append(res)
    return {
        "rounds": rounds,
        "baseline": {
            "prefill_tps": round(statistics.median(r.prefill_tps for r in rb), 1),
            "decode_tps": round(statistics.median(r.decode_tps for r in rb), 1),
        },
        "best": {
            "prefill_tps": round(statistics.median(r.prefill_tps for r in rc), 1),
            "decode_tps": round(statistics.median(r.decode_tps for r in rc), 1),
        },
        "prefill": round(
            paired_ratios([r.prefill_tps for r in rc], [r.prefill_tps for r in rb]), 3
        ),
        "decode": round(paired_ratios([r.decode_tps for r in rc], [r.decode_tps for r in rb]), 3),
    }


def optimizer_ratio(
    model: Path, budget_s: float = 120, rounds: int = 5, prompt: int = 512, tokens: int = 128
) -> dict[str, Any]:
    """Run `optimize` on `model`, store its best, verify it against the defaults; returns
    {"best", "search": ratios from the search's confirmation, "verify": paired ratios,
    "trials", "pass"} and prints one line per step."""
    spec = load_spec(model)
    sid = records.new_search_id()
    result = optimize(
        spec.path,
        budget_s=budget_s,
        has_gpu=_has_gpu(),
        n_layers=spec.block_count,
        on_trial=lambda r: records.trial(spec.path, sid, r),
    )
    records.best(spec.path, sid, result)
    records.flush()
    print(f"optimize: {len(result.trials)} trials in {result.elapsed_s:.0f} s ({result.ended}); "
          f"best {result.best.label()} vs defaults {result.baseline.label()}: prefill "
          f"{result.ratios['prefill']:.3f}x, decode {result.ratios['decode']:.3f}x "
          f"(search confirmation, {result.confirm_rounds} rounds)", flush=True)
    for note in result.notes:
        print(f"  note: {note}")
    same = result.best == result.baseline
    if same:
        # the optimizer recommends llama.cpp's defaults themselves (its confirmation did
        # not show a faster setting, see the note): what `run` gets is the baseline,
        # 1.0x by construction; a paired check of identical settings would measure noise
        print("optimize kept and stored llama.cpp's defaults (no setting beat them in its "
              "own confirmation): the recommendation is the baseline, 1.0x by "
              "construction; no separate verification", flush=True)
        return {
            "best": result.best.label(),
            "kept_defaults": True,
            "search": result.ratios,
            "verify": {"prefill": 1.0, "decode": 1.0, "rounds": 0},
            "trials": len(result.trials),
            "pass": True,
        }
    v = verify(spec.path, result.baseline, result.best, rounds, prompt, tokens)
    print(f"verify ({rounds} paired rounds, {prompt} prompt + {tokens} decode tokens): "
          f"defaults {v['baseline']['prefill_tps']:.1f} / {v['baseline']['decode_tps']:.1f} "
          f"t/s, best {v['best']['prefill_tps']:.1f} / {v['best']['decode_tps']:.1f} t/s "
          f"(prefill / decode): prefill {v['prefill']:.3f}x, decode {v['decode']:.3f}x",
          flush=True)
    return {
        "best": result.best.label(),
        "kept_defaults": False,
        "search": result.ratios,
        "verify": {"prefill": v["prefill"], "decode": v["decode"], "rounds": rounds},
        "trials": len(result.trials),
        "pass": v["prefill"] >= 1.0 and v["decode"] >= 1.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="default: the built-in Gemma")
    ap.add_argument("--budget", type=float, default=120)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    model = a.model or ensure_default_model()
    out = optimizer_ratio(model, a.budget, a.rounds, a.prompt, a.tokens)
    kept = " (kept the defaults)" if out["kept_defaults"] else ""
    print(f"optimizer best over llama.cpp defaults: prefill {out['verify']['prefill']:.3f}x, "
          f"decode {out['verify']['decode']:.3f}x{kept} (target >= 1.0x on both: "
          f"{'PASS' if out['pass'] else 'FAIL'})")


if __name__ == "__main__":
    main()
