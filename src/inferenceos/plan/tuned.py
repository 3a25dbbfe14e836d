"""The settings `inferenceos optimize` found fastest, read back for the planner.

`optimize` stores its best configuration per machine and model in the telemetry store
(`best_settings` table). The planner's entry point calls
`apply_tuned(model_path, params, pinned)` — `best_settings(model_path)` applied with
`apply_best(params, best)`, which only moves a parameter where doing so cannot break
what the planner already decided:

- thread counts apply only when the plan's thread pick (which follows the CPUs free
  now) equals the free CPUs when `optimize` ran — a count found while a neighbour held a
  core must not hold an idle machine back, nor one found idle crowd a busy machine — and
  never rise above the plan's;
- the micro-batch never grows past the plan's (the plan sized it to the memory left);
- KV cache types and flash attention change only when the plan kept llama.cpp's f16
  cache (a quantized cache chosen to fit memory is kept, and a quantized V cache keeps
  flash attention on);
- GPU layers only ever go down (fewer layers on a GPU need less of its memory);
- `pinned` names parameters the user set explicitly: those are never touched.

`describe(best, applied)` is the phrase the plan line shows: the values applied, and
the stored thread counts when they were not. Telemetry failures read as "nothing
stored" (the store itself warns once), so a broken database never stops a run.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

TUNED_KEYS = ("n_threads", "n_threads_batch", "n_batch", "n_ubatch", "flash_attn",
              "type_k", "type_v", "n_gpu_layers")


def best_settings(model_path: str | Path) -> dict[str, Any] | None:
    """The stored best for `model_path` on this machine (else on one of the same kind):
    `{"settings": {n_threads, n_threads_batch, n_batch, n_ubatch, flash_attn, type_k,
    type_v, n_gpu_layers}, "measured": {...}, "ts": unix time, "machine": fingerprint}`,
    or None when `optimize` never ran for it (or the file is not readable)."""
    import inferenceos.telemetry as telemetry

    try:
        best = telemetry.best_settings(Path(model_path))
    except OSError:  # the model file vanished between planning steps
        return None
    if best is None or not isinstance(best.settings, dict):
        return None
    settings = {k: best.settings[k] for k in TUNED_KEYS if k in best.settings}
    if not settings:
        return None
    return {"settings": settings, "measured": dict(best.measured or {}), "ts": best.ts,
            "machine": best.machine}


def apply_best(params: Any, best: dict[str, Any], pinned: Iterable[str] = ()) -> Any:
    """`params` (a LlamaParams-like frozen dataclass) with the tuned values of `best`
    applied under the rules of the module docstring."""
    tuned = best.get("settings", best)
    have = {f.name for f in fields(params)}
    keep = set(pinned)
    change: dict[str, Any] = {}

    def want(key: str) -> Any:
        return None if key in keep or key not in have or key not in tuned else tuned[key]

    then = best.get("measured", {}).get("free_threads")
    now = getattr(params, "n_threads", 0)
    same_conditions = not isinstance(then, int) or not now or then == now
    for key in ("n_threads", "n_threads_batch"):
        value, current = want(key), getattr(params, key, 0)
        if same_conditions and isinstance(value, int) and value >= 1:
            change[key] = min(value, current) if current else value
    n_batch = want("n_batch")
    if isinstance(n_batch, int) and n_batch >= 1:
        change["n_batch"] = n_batch
    ubatch = want("n_ubatch")
    if isinstance(ubatch, int) and ubatch >= 1:
        change["n_ubatch"] = min(ubatch, params.n_ubatch)
    change["n_ubatch"] = min(change.get("n_ubatch", params.n_ubatch),
                             change.get("n_batch", params.n_batch))
    if getattr(params, "type_k", "f16") == "f16" and getattr(params, "type_v", "f16") == "f16":
        for key in ("type_k", "type_v", "flash_attn"):
            if want(key) is not None:
                change[key] = tuned[key]
        if change.get("type_v", "f16") != "f16" and change.get("flash_attn", 1) == 0:
            change.pop("type_v")  # a quantized V cache needs flash attention
    layers = want("n_gpu_layers")
    if isinstance(layers, int) and 0 <= layers < getattr(params, "n_gpu_layers", 0):
        change["n_gpu_layers"] = layers
    return replace(params, **change)


def describe(best: dict[str, Any], applied: Any = None) -> str:
    """The plan line's phrase, e.g. `tuned by optimize 2026-11-30: t2/2 b512/u256 fa:on
    kv:f16/f16 (prefill 1.04x, decode 1.02x vs llama.cpp defaults)`.

    With `applied` (the parameters after `apply_best`) it names the values the plan
    runs with, and says when the stored thread counts were left out (found with
    another number of CPUs free, or above the plan's), so the phrase never contradicts
    the plan line's own thread count."""
    stored = best.get("settings", {})
    s = dict(stored)
    if applied is not None:
        s.update({k: getattr(applied, k) for k in TUNED_KEYS if hasattr(applied, k)})
    fa = {-1: "auto", 0: "off", 1: "on"}.get(s.get("flash_attn", -1), "?")
    when = time.strftime("%Y-%m-%d", time.localtime(best.get("ts") or 0))
    text = (f"tuned by optimize {when}: t{s.get('n_threads', '?')}/"
            f"{s.get('n_threads_batch', '?')} b{s.get('n_batch', '?')}/u{s.get('n_ubatch', '?')}"
            f" fa:{fa} kv:{s.get('type_k', 'f16')}/{s.get('type_v', 'f16')}")
    ratios = best.get("measured", {}).get("ratios")
    if isinstance(ratios, dict) and "prefill" in ratios and "decode" in ratios:
        text += (f" (prefill {ratios['prefill']:.2f}x, decode {ratios['decode']:.2f}x vs "
                 "llama.cpp defaults)")
    found = (stored.get("n_threads"), stored.get("n_threads_batch"))
    if applied is not None and None not in found and found != (s["n_threads"],
                                                                s["n_threads_batch"]):
        then = best.get("measured", {}).get("free_threads")
        when = f" with {then} CPUs free" if isinstance(then, int) else ""
        text += (f"; threads as planned (optimize found t{found[0]}/{found[1]}{when})")
    return text


def apply_tuned(model_path: str | Path, params: Any, pinned: Iterable[str] = ()) -> tuple[Any, str]:
    """The planner's one call: `params` with this machine's `optimize` result for
    `model_path` applied (`apply_best`), and the plan line's phrase (`describe`), or
    `params` unchanged and "" when nothing is stored."""
    best = best_settings(model_path)
    if best is None:
        return params, ""
    applied = apply_best(params, best, pinned)
    return applied, describe(best, applied)
