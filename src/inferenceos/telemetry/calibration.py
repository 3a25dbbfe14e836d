"""What recorded runs teach the performance model: per model, per quantization family,
per machine, a correction of the roofline's speeds.

Each recorded generation becomes an `Observation`: the ratio of the speed it measured
to the speed the roofline (calibrated by the hardware probe) predicts for the same
model, settings and lengths. The planner computes those predictions
(`plan/calibration_load.py`); this module only fits, so it stays below `plan/`.

The fit (`fit_learned`) is least squares on log ratios with one intercept per scope,
nested and shrunk towards the level above (ridge: each scope starts from `PRIOR_RUNS`
pseudo-runs of its parent's value; the machine level starts from 0 = "the roofline is
right"):

    machine = Σ w·log r / (Σ w + K)                              all models here
    family  = (Σ_family w·log r + K·machine) / (Σ_family w + K)   same tensor types
    model   = (Σ_model  w·log r + K·family)  / (Σ_model  w + K)   this file

Why log ratios: speed errors are multiplicative (a slower kernel, a busier machine),
and a log keeps one 3x-slow outlier from outweighing many good runs; ratios beyond
`OUTLIER` of the scope's median are dropped (a build running beside one run). Why
nested scopes: a model never run here inherits what its family (same ggml tensor types:
the same kernels read the same bytes per weight) and the machine taught. Runs at the
target's thread count weigh 1, others `OTHER_THREADS_WEIGHT`; weights halve every
`HALF_LIFE_RUNS` newer runs, so a machine that changed (a new neighbour, a driver)
is followed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PRIOR_RUNS = 1.0  # K: pseudo-runs of the parent scope's value each scope starts from
OTHER_THREADS_WEIGHT = 0.3
OUTLIER = math.log(2.0)  # drop ratios more than 2x away from the scope's median
HALF_LIFE_RUNS = 20.0  # a run's weight halves with every 20 newer runs (machines drift)
# what streaming weights under a memory limit reads at against the disk's cold
# sequential rate, before any run that streamed was recorded here: the kernel reclaims
# in the reading path. Measured on this project's VM: Qwen2.5-Coder-1.5B read ahead by
# layers 0.46-0.57 of it, the upcycled MoE's picked experts read exactly 0.39
# (2026-12-04/05); without the prior a first disk-bound run was predicted 2-2.4x fast
DISK_SCALE_PRIOR = 0.5
MIN_DECODE_TOKENS = 8
MIN_PREFILL_TOKENS = 16


@dataclass(frozen=True)
class Observation:
    """One recorded run as the fit sees it: measured / modelled speed per phase."""

    model: str  # digest
    family: str  # see `plan.calibration.quant_family`
    threads: int
    decode_ratio: float | None = None
    prefill_ratio: float | None = None


@dataclass(frozen=True)
class Learned:
    """The correction for one target model: multiply the roofline's speeds by the
    scales. `runs` counts the observations at the most specific scope that had any
    (`scope`: model, family or machine); `confidence` is in [0, 1]."""

    decode_scale: float
    prefill_scale: float
    runs: int
    scope: str
    confidence: float

    def describe(self) -> str:
        where = {"model": "this model", "family": "models of its tensor types",
                 "machine": "other models on this machine"}[self.scope]
        return f"learned from {self.runs} recorded run{'s' * (self.runs != 1)} of {where}"


def _recency(i: int, n: int) -> float:
    """The weight of the i-th of n runs (oldest first): it halves every HALF_LIFE_RUNS."""
    return 0.5 ** ((n - 1 - i) / HALF_LIFE_RUNS)


def _robust(values: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(log ratio, weight) pairs without those far from the median."""
    if len(values) < 3:
        return values
    med = statistics.median(v for v, _ in values)
    return [(v, w) for v, w in values if abs(v - med) <= OUTLIER]


def _shrunk(values: list[tuple[float, float]], parent: float) -> float:
    sw = sum(w for _, w in values)
    return (sum(v * w for v, w in values) + PRIOR_RUNS * parent) / (sw + PRIOR_RUNS)


def _phase(
    obs: Sequence[Observation], model: str, family: str, threads: int, decode: bool
) -> tuple[float, int, str, float]:
    """(log scale, runs at the chosen scope, scope, spread) for one phase."""

    n = len(obs)

    def pairs(keep: Iterable[tuple[int, Observation]]) -> list[tuple[float, float]]:
        out = []
        for i, o in keep:
            r = o.decode_ratio if decode else o.prefill_ratio
            if r is not None and r > 0:
                w = 1.0 if not threads or o.threads == threads else OTHER_THREADS_WEIGHT
                w *= _recency(i, n)
                out.append((math.log(r), w))
        return _robust(out)

    every = pairs(enumerate(obs))
    fam = pairs((i, o) for i, o in enumerate(obs) if o.family == family)
    own = pairs((i, o) for i, o in enumerate(obs) if o.model == model)
    m0 = _shrunk(every, 0.0) if every else 0.0
    m1 = _shrunk(fam, m0) if fam else m0
    m2 = _shrunk(own, m1) if own else m1
    used, scope = (own, "model") if own else (fam, "family") if fam else (every, "machine")
    spread = statistics.pstdev(v for v, _ in used) if len(used) >= 2 else 0.15
    return m2, len(used), scope, spread


def fit_learned(
    obs: Sequence[Observation], model: str, family: str, threads: int = 0
) -> Learned | None:
    """The correction for `model` (digest) of `family`, or None without observations.
    `obs` are oldest first: newer runs weigh more (`HALF_LIFE_RUNS`)."""
    if not obs:
        return None
    d_log, d_n, d_scope, d_sd = _phase(obs, model, family, threads, decode=True)
    p_log, p_n, _, p_sd = _phase(obs, model, family, threads, decode=False)
    if d_n == 0 and p_n == 0:
        return None
    scope_weight = {"model": 1.0, "family": 0.7, "machine": 0.4}[d_scope]
    n = max(d_n, p_n)
    confidence = scope_weight * n / (n + PRIOR_RUNS) * math.exp(-max(d_sd, p_sd))
    return Learned(
        decode_scale=math.exp(d_log),
        prefill_scale=math.exp(p_log),
        runs=n,
        scope=d_scope,
        confidence=round(min(max(confidence, 0.0), 1.0), 2),
    )


def fit_disk_scale(ratios: Sequence[float]) -> tuple[float, int]:
    """(scale, runs): how fast runs that streamed read their weights against the disk's
    measured rate (`ratios`, oldest first, each measured / measured-disk rate), shrunk
    towards `DISK_SCALE_PRIOR` by `PRIOR_RUNS` and weighted by recency like the speed
    scales; (DISK_SCALE_PRIOR, 0) without a usable ratio."""
    n = len(ratios)
    pairs = _robust([(math.log(r), _recency(i, n)) for i, r in enumerate(ratios) if r > 0])
    if not pairs:
        return DISK_SCALE_PRIOR, 0
    return math.exp(_shrunk(pairs, math.log(DISK_SCALE_PRIOR))), len(pairs)
