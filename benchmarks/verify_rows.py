"""What a verification step costs by its row count: llama_decode of N rows, every row
with logits (a speculative step's shape), after a 150-token context, on Gemma.

Prints the median time of each N over alternating-order rounds, its time per row, and
the shape effect the scheduler's row shaping uses (engine/spec/row_shape.py): each odd N
against N + 1, and the row multiple the scheduler derives for this build and model.
On AVX2, llamafile's tinyBLAS tiles activation rows two at a time and walks the whole
weight matrix again for a leftover row, so an odd N costs more than N + 1.

    .venv/bin/python benchmarks/verify_rows.py [--model PATH] [--max-rows 64]
        [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferenceos.engine.llama.batch import TokenBatch
from inferenceos.engine.session import LoadedModel
from inferenceos.engine.spec.row_shape import head_type, row_multiple
from inferenceos.model.default_model import ensure_default_model
from inferenceos.plan.llama_params import LlamaParams

CONTEXT = 150  # cells already in the cache, as after a short prompt


def step_seconds(lm: LoadedModel, batch: TokenBatch, n: int) -> float:
    """One llama_decode of `n` rows with logits after CONTEXT cells (rows removed after)."""
    ll, ctx = lm._ll, lm.ctx
    ll.llama_memory_seq_rm(ll.llama_get_memory(ctx), 0, CONTEXT, -1)
    batch.clear()
    for i in range(n):
        batch.add(100 + i, CONTEXT + i, 0, True)
    t0 = time.perf_counter()
    if ll.llama_decode(ctx, batch.raw) != 0:
        raise RuntimeError(f"llama_decode of {n} rows failed")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--max-rows", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = args.model or ensure_default_model()
    settings = LlamaParams(n_ctx=2048, n_threads=args.threads)
    sizes = list(range(1, args.max_rows + 2))
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with LoadedModel(model, settings) as lm:
        batch = TokenBatch(max(CONTEXT, args.max_rows + 2), 1)
        batch.clear()
        for i in range(CONTEXT):
            batch.add(200 + i, i, 0, i == CONTEXT - 1)
        lm._ll.llama_decode(lm.ctx, batch.raw)
        for r in range(args.rounds):  # alternate the order: drift hits both ends alike
            for n in sizes if r % 2 == 0 else sizes[::-1]:
                times[n].append(step_seconds(lm, batch, n))
        info = lm._ll.llama_print_system_info().decode(errors="replace")
        multiple = row_multiple(info, head_type(model), settings.n_gpu_layers == 0)
        batch.close()
    med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    print(f"{model.name}, {args.threads} threads, {args.rounds} rounds, head "
          f"{head_type(model)}; scheduler row multiple here: {multiple}")
    print(f"{'rows':>5} {'ms':>8} {'ms/row':>7}")
    for n in sizes:
        print(f"{n:>5} {med[n]:8.1f} {med[n] / n:7.2f}")
    odd = [n for n in sizes if n % 2 and n > 1 and n + 1 in med]
    ratios = [med[n] / med[n + 1] for n in odd]
    print(f"odd N / (N + 1), N = 3..{odd[-1]}: median {statistics.median(ratios):.3f}, "
          f"range {min(ratios):.3f}-{max(ratios):.3f} (> 1: the odd step costs more "
          f"though it verifies one row less)")


if __name__ == "__main__":
    main()
