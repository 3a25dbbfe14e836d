"""The llama.cpp speed probe's child process: `python -m inferenceos.engine.llama.speed_probe
MODEL` loads MODEL, says "ready", reads a thread count on stdin and prints one JSON line
of prefill and decode timings (hardware/llama_speed.py starts it and reads it).

It loads with the engine's own parameter builder (structs.py) from a `LlamaParams`, so
the probe times the load the engine makes: the same flash attention, batch sizes, load
mode and abort hooks, and no GPU layers (the probe calibrates the CPU's kernels). Only
the timing loop is its own: one sequence, greedy argmax, no scheduler (the scheduler's
own per-token work is what `benchmarks/` prices, not the kernels).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from inferenceos.engine.llama.lib import lib
from inferenceos.engine.llama.structs import context_params, model_params
from inferenceos.hardware.llama_speed import (
    DECODE,
    DECODE_1THREAD,
    N_CTX,
    PREFILL_ROUNDS,
    PROMPT,
    ROUNDS,
    ROUNDS_1THREAD,
)
from inferenceos.plan.llama_params import LlamaParams

# the planner's defaults for the probe's shape: flash attention on, 512-token batches
SETTINGS = LlamaParams(n_ctx=N_CTX, n_batch=512, n_ubatch=512, n_gpu_layers=0,
                       flash_attn=1)


def _load(path: str) -> tuple[Any, Any]:
    ll = lib()
    mp = model_params(SETTINGS)
    model = ll.llama_model_load_from_file(path.encode(), mp.struct)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    ctx = ll.llama_init_from_model(model, context_params(SETTINGS))
    if not ctx:
        ll.llama_model_free(model)
        raise RuntimeError("llama.cpp could not create a context")
    return model, ctx


def _decoder(model: Any, ctx: Any) -> tuple[Callable[[list[int]], None], Callable[[], int]]:
    """(decode these tokens, the greedy next token) on `ctx`."""
    ll = lib()
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))

    def decode(tokens: list[int]) -> None:
        arr = (ll.llama_token * len(tokens))(*tokens)
        if ll.llama_decode(ctx, ll.llama_batch_get_one(arr, len(tokens))) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax() -> int:
        ptr = ll.llama_get_logits_ith(ctx, -1)
        return int(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).argmax())

    return decode, argmax


def probe(path: str) -> dict[str, Any] | None:
    """Load `path`, say "ready", read the thread count from stdin, time prefill and
    decode with it; None when the parent cancels (no count)."""
    ll = lib()
    model, ctx = _load(path)
    decode, argmax = _decoder(model, ctx)
    mem = ll.llama_get_memory(ctx)
    prompt = [3 + i % 256 for i in range(PROMPT)]

    def decode_run(n: int = DECODE) -> float:
        t0 = time.perf_counter()
        tok = 3
        for _ in range(n):
            decode([3 + tok % 256])
            tok = argmax()
        return time.perf_counter() - t0

    decode(prompt[:8])  # warm up: first-touch of the weights, thread pool start
    print("ready", flush=True)  # loaded (SpeedProbe.wait_ready): now the thread count
    line = sys.stdin.readline().strip()
    if not line.isdigit() or int(line) < 1:
        return None  # cancelled
    threads = int(line)
    ll.llama_set_n_threads(ctx, threads, threads)
    best_pre = best_dec = best_dec1 = float("inf")
    for i in range(max(ROUNDS, PREFILL_ROUNDS)):
        ll.llama_memory_clear(mem, True)
        t0 = time.perf_counter()
        decode(prompt)
        argmax()
        best_pre = min(best_pre, time.perf_counter() - t0)
        if i < ROUNDS:
            best_dec = min(best_dec, decode_run())
    if threads > 1:  # one thread too: what a thread computes vs what memory allows
        ll.llama_set_n_threads(ctx, 1, threads)
        for _ in range(ROUNDS_1THREAD):
            # back to the last round's prompt, whose cells stay: the same context as the
            # decodes above, without computing the prompt again
            ll.llama_memory_seq_rm(mem, 0, PROMPT, -1)
            best_dec1 = min(best_dec1, decode_run(DECODE_1THREAD) * DECODE / DECODE_1THREAD)
    ll.llama_free(ctx)
    ll.llama_model_free(model)
    return {
        "threads": threads, "prompt_tokens": PROMPT, "prefill_s": best_pre,
        "decode_tokens": DECODE, "decode_s": best_dec, "n_ctx": N_CTX,
        "n_ubatch": SETTINGS.n_ubatch, "flash_attn": True,
        "decode_s_1thread": best_dec1 if threads > 1 else None,
    }


if __name__ == "__main__":
    result = probe(sys.argv[1])
    if result is not None:
        print(json.dumps(result))
