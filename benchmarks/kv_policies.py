"""Perplexity of a fixed text under KV cache policies at a reduced KV budget.

Reads benchmarks/data/declaration_of_independence.txt one token at a time (teacher
forcing) with (a) the full cache, (b) StreamingLLM and (c) H2O, each limited to
`--budget` (default 20 %) of the text's tokens. Also prints where the watched layers'
attention goes (sink tokens, recent window, the rest), the data that explains why one
policy beats the other on this model.

    .venv/bin/python benchmarks/kv_policies.py [--model PATH] [--budget 0.2] [--tokens N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from inferenceos.engine.attention_probe import AttentionProbe
from inferenceos.engine.kv_policies import HeavyHitterOracle, NoEviction, StreamingLLM
from inferenceos.engine.scoring import budgeted_perplexity
from inferenceos.engine.session import LoadedModel, LoadSettings, default_threads
from inferenceos.model.default_model import ensure_default_model
from inferenceos.model.spec import load_spec

TEXT = Path(__file__).resolve().parent / "data" / "declaration_of_independence.txt"


def attention_profile(model: Path, tokens: list[int]) -> list[str]:
    """Per layer: share of the prompt's attention on the 4 first tokens (sinks), the most
    recent 20 % and the middle — what a KV policy keeps or drops."""
    spec = load_spec(model)
    probe = AttentionProbe(layer.index for layer in spec.layers)  # every layer this time
    settings = LoadSettings(n_ctx=4096, n_batch=2048, n_ubatch=2048, flash_attn=0)
    with LoadedModel(model, settings, eval_callback=probe.callback) as lm:
        probe.reset()
        lm.prefill(tokens)  # a fresh cache: cell i holds position i in both caches
    n = len(tokens)
    lines = ["layer  kind  sinks  recent20%  middle"]
    for layer in spec.layers:
        mass = probe.layer_mass[layer.index][:n]
        total = float(mass.sum())
        sinks, recent = float(mass[:4].sum()), float(mass[n - n // 5 :].sum())
        kind = "swa" if layer.is_swa else "full"
        lines.append(f"{layer.index:>5}  {kind:<4}  {sinks / total:5.1%}  {recent / total:9.1%}"
                     f"  {(total - sinks - recent) / total:6.1%}")  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--tokens", type=int, default=0, help="use only the first N tokens")
    ap.add_argument("--profile-only", action="store_true", help="only the attention table")
    ap.add_argument("--h2o-recent", type=float, default=0.5, help="H2O's recent share")
    args = ap.parse_args()
    model = args.model or ensure_default_model()
    spec = load_spec(model)
    probe = AttentionProbe(layer.index for layer in spec.layers if not layer.is_swa)
    settings = LoadSettings(n_ctx=4096, n_batch=512, flash_attn=0, n_threads=default_threads())
    with LoadedModel(model, settings, eval_callback=probe.callback) as lm:
        tokens = lm.tokenize(TEXT.read_text())
        if args.tokens:
            tokens = tokens[: args.tokens]
        budget = max(8, int(len(tokens) * args.budget))
        if args.profile_only:
            budget = 0
        print(
            f"model {model.name}: {len(tokens)} tokens, KV budget {budget} "
            f"({args.budget:.0%}); attention watched on layers {sorted(probe.layers)}"
        )
        runs = (
            ("full cache", NoEviction(), None),
            ("streaming", StreamingLLM(), None),
            ("h2o", HeavyHitterOracle(recent_fraction=args.h2o_recent), probe),
        )
        for name, policy, p in runs if budget else ():
            t0 = time.perf_counter()
            limit = len(tokens) if name == "full cache" else budget
            ppl = budgeted_perplexity(lm, tokens, policy, limit, p)
            print(f"  {name:<11} perplexity {ppl:8.3f}   ({time.perf_counter() - t0:.0f} s)")
    print("  attention mass per layer over the text (prefilled at once, all layers watched):")
    for line in attention_profile(model, tokens[:2048]):
        print("    " + line)
    swa = [layer.index for layer in spec.layers if layer.is_swa]
    if swa:
        print(
            f"  note: layers {swa} use a {spec.sliding_window}-token sliding window; "
            "H2O scores come from the full-attention layers only"
        )


if __name__ == "__main__":
    main()
