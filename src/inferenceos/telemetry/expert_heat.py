"""Which routed experts a model's tokens pick: the heat a disk-bound plan keeps resident by.

One row per (model, layer): the picks per expert and the tokens routed through the
layer, both decayed by tokens, so the heat follows the workload without forgetting it
at once: before new counts are added the stored ones are scaled by
`0.5 ** (new_tokens / HALF_LIFE_TOKENS)`. The heat is the model's, not the machine's
(no machine id): a prompt mix picks the same experts on any hardware.

A pick's odds (`odds`) are picks / tokens: the chance a token reads that expert, the
experts of a layer summing to the experts used per token.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from inferenceos.telemetry import db as dbmod
from inferenceos.telemetry.queries import _query

HALF_LIFE_TOKENS = 20_000.0

# layer -> picks per expert, layer -> tokens routed through it
Heat = tuple[dict[int, np.ndarray], dict[int, float]]


def write_heat(conn: sqlite3.Connection, model_id: int, picks: Mapping[int, Any],
               tokens: float | Mapping[int, float], now: float | None = None) -> None:
    """Add `picks` (layer -> picks per expert) over `tokens` new tokens (one count for
    every layer, or per layer: a prompt's last layer routes only the rows it outputs,
    llama.cpp's `inp_out_ids`) to the model's stored heat, decaying what was stored
    (module doc). Layers whose expert count changed start again."""
    now = time.time() if now is None else now
    for layer, counts in picks.items():
        n = float(tokens.get(layer, 0.0) if isinstance(tokens, Mapping) else tokens)
        if n <= 0:
            continue
        keep = 0.5 ** (n / HALF_LIFE_TOKENS)
        new = np.asarray(counts, dtype=float)
        row = conn.execute("SELECT picks, tokens FROM expert_heat WHERE model_id = ? AND "
                           "layer = ?", (model_id, int(layer))).fetchone()
        old = np.asarray(json.loads(row[0]), dtype=float) if row else None
        if old is not None and old.shape == new.shape:
            new, total = old * keep + new, float(row[1]) * keep + n
        else:
            total = n
        conn.execute(
            "INSERT INTO expert_heat (model_id, layer, picks, tokens, ts) VALUES (?,?,?,?,?)"
            " ON CONFLICT(model_id, layer) DO UPDATE SET picks = excluded.picks,"
            " tokens = excluded.tokens, ts = excluded.ts",
            (model_id, int(layer), json.dumps([round(float(x), 3) for x in new]), total, now))


def read_heat(digest: str, path: Path | None = None) -> Heat | None:
    """The stored heat of the model with `digest`: (layer -> decayed picks per expert,
    layer -> decayed tokens), or None when nothing is stored or the store cannot be
    read (a warning, never an error: heat only orders residency)."""
    rows = _query("SELECT h.layer, h.picks, h.tokens FROM expert_heat h JOIN models m ON "
                  "m.id = h.model_id WHERE m.digest = ?", (digest,), path or dbmod.db_path())
    if not rows:
        return None
    picks = {int(r["layer"]): np.asarray(json.loads(r["picks"]), dtype=float) for r in rows}
    return picks, {int(r["layer"]): float(r["tokens"]) for r in rows}


def odds(heat: Heat, layer: int, n_expert: int, prior: float) -> np.ndarray:
    """The chance a token picks each expert of `layer`: its picks over its tokens, drawn
    towards `prior` (experts used / experts) by a few pseudo-tokens so a layer seen
    little is not taken for a skewed one."""
    picks, tokens = heat
    counts = picks.get(layer)
    if counts is None or counts.shape != (n_expert,):
        return np.full(n_expert, prior)
    return layer_odds(counts, tokens.get(layer, 0.0), prior)


def layer_odds(picks: np.ndarray, tokens: float, prior: float) -> np.ndarray:
    """One layer's picks per expert over its `tokens`, drawn towards `prior` by 16
    pseudo-tokens (`odds`)."""
    pseudo = 16.0
    return (picks + prior * pseudo) / (tokens + pseudo)


def coldest_first(heat: Heat, layers: list[int], n_expert: int, prior: float
                  ) -> tuple[float, ...]:
    """Every expert's odds over `layers`, coldest first (plan/perf.py streams those)."""
    return tuple(sorted(float(p) for layer in layers for p in odds(heat, layer, n_expert,
                                                                    prior)))
