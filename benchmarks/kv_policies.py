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


def attention_profile(lm: LoadedModel, probe: AttentionProbe, tokens: list[int]) -> str:
    """Share of the last token's attention on sinks (first 4), the last 20 %, the rest."""
    probe.reset()
    lm.reset()
    lm.prefill(tokens)
    row = probe.attended[-1]
    mass = probe.mass  # the whole batch; use the last row's visible cells for shares
    n = int(row.sum())
    sinks, recent = mass[:4].sum(), mass[n - n // 5 : n].sum()
    total = mass[:n].sum()
    return (
        f"attention mass over the prompt: sinks {sinks / total:.1%}, "
        f"recent 20% {recent / total:.1%}, middle {(total - sinks - recent) / total:.1%}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--tokens", type=int, default=0, help="use only the first N tokens")
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
        print(
            f"model {model.name}: {len(tokens)} tokens, KV budget {budget} "
            f"({args.budget:.0%}); attention watched on layers {sorted(probe.layers)}"
        )
        for name, policy, p in (
            ("full cache", NoEviction(), None),
            ("streaming", StreamingLLM(), None),
            ("h2o", HeavyHitterOracle(), probe),
        ):
            t0 = time.perf_counter()
            limit = len(tokens) if name == "full cache" else budget
            ppl = budgeted_perplexity(lm, tokens, policy, limit, p)
            print(f"  {name:<11} perplexity {ppl:8.3f}   ({time.perf_counter() - t0:.0f} s)")
        print("  " + attention_profile(lm, probe, tokens[: min(len(tokens), 1024)]))
        swa = [layer.index for layer in spec.layers if layer.is_swa]
        if swa:
            print(
                f"  note: layers {swa} use a {spec.sliding_window}-token sliding window; "
                "H2O scores come from the full-attention layers only"
            )


if __name__ == "__main__":
    main()
