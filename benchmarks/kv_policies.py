"""Perplexity of a fixed text under KV cache policies at a reduced KV budget.

Reads benchmarks/data/declaration_of_independence.txt one token at a time (teacher
forcing) with (a) the full cache, (b) StreamingLLM and (c) H2O, each limited to
`--budget` (default 20 %) of the text's tokens. Also prints where the watched layers'
attention goes (sink tokens, recent window, the rest), the data that explains why one
policy beats the other on this model.

    .venv/bin/python benchmarks/kv_policies.py [--model PATH] [--budget 0.2] [--tokens N]
        [--h2o-recent 0.5 0.9] [--global-window]

`--global-window` runs a copy of the model whose sliding window is widened past the
text, so every layer attends globally and H2O watches them all: the same weights as a
model without sliding-window layers, to check H2O's recent share there.
"""

from __future__ import annotations

import argparse
import shutil
import struct
import time
from pathlib import Path

from inferenceos.engine.kv.attention_probe import AttentionProbe
from inferenceos.engine.kv.policies import HeavyHitterOracle, NoEviction, StreamingLLM
from inferenceos.engine.scoring import budgeted_perplexity
from inferenceos.engine.session import LoadedModel, default_threads
from inferenceos.model.default_model import ensure_default_model
from inferenceos.model.spec import load_spec
from inferenceos.paths import cache_dir
from inferenceos.plan.llama_params import LlamaParams

TEXT = Path(__file__).resolve().parent / "data" / "declaration_of_independence.txt"


def widen_window(model: Path, window: int, out_dir: Path) -> Path:
    """A copy of `model` with `<arch>.attention.sliding_window` set to `window` (the
    uint32 is patched in place in the copy; the original is untouched)."""
    arch = load_spec(model).architecture
    key = f"{arch}.attention.sliding_window".encode()
    needle = struct.pack("<Q", len(key)) + key + struct.pack("<I", 4)  # GGUF type uint32
    out = out_dir / f"{model.stem}-window{window}.gguf"
    if not out.exists():
        with model.open("rb") as f:
            head = f.read(64 << 20)
        at = head.find(needle)
        if at < 0:
            raise SystemExit(f"{model.name} has no uint32 {key.decode()} to widen")
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        shutil.copyfile(model, tmp)
        with tmp.open("r+b") as f:
            f.seek(at + len(needle))
            f.write(struct.pack("<I", window))
        tmp.replace(out)
    return out


def attention_profile(model: Path, tokens: list[int]) -> list[str]:
    """Per layer: share of the prompt's attention on the 4 first tokens (sinks), the most
    recent 20 % and the middle — what a KV policy keeps or drops."""
    spec = load_spec(model)
    probe = AttentionProbe(layer.index for layer in spec.layers)  # every layer this time
    settings = LlamaParams(n_ctx=4096, n_batch=2048, n_ubatch=2048, flash_attn=0)
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
                     f"  {(total - sinks - recent) / total:6.1%}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--tokens", type=int, default=0, help="use only the first N tokens")
    ap.add_argument("--profile-only", action="store_true", help="only the attention table")
    ap.add_argument("--h2o-recent", type=float, nargs="+", default=[0.5],
                    help="H2O's recent share (several: one run each)")
    ap.add_argument("--global-window", action="store_true",
                    help="widen the sliding window past the text: every layer global")
    args = ap.parse_args()
    model = args.model or ensure_default_model()
    if args.global_window:
        model = widen_window(model, 1 << 20, cache_dir() / "experiments")
    spec = load_spec(model)
    watched = [ly.index for ly in spec.layers if args.global_window or not ly.is_swa]
    probe = AttentionProbe(watched)
    settings = LlamaParams(n_ctx=4096, n_batch=512, flash_attn=0, n_threads=default_threads())
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
        runs = [
            ("full cache", NoEviction(), None),
            ("streaming", StreamingLLM(), None),
            *((f"h2o r={r}", HeavyHitterOracle(recent_fraction=r), probe) for r in args.h2o_recent),
        ]
        for name, policy, p in runs if budget else ():
            t0 = time.perf_counter()
            limit = len(tokens) if name == "full cache" else budget
            ppl = budgeted_perplexity(lm, tokens, policy, limit, p)
            print(f"  {name:<12} perplexity {ppl:8.3f}   ({time.perf_counter() - t0:.0f} s)")
    print("  attention mass per layer over the text (prefilled at once, all layers watched):")
    for line in attention_profile(model, tokens[:2048]):
        print("    " + line)
    swa = [layer.index for layer in spec.layers if layer.is_swa]
    if swa and not args.global_window:
        print(
            f"  note: layers {swa} use a {spec.sliding_window}-token sliding window; "
            "H2O scores come from the full-attention layers only"
        )


if __name__ == "__main__":
    main()
