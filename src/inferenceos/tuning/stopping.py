"""How the search scores settings, drops hopeless ones early, and decides to adopt one.

Pure functions over measured rates, so the rules are testable without llama.cpp.

- A setting is *scored* by the geometric mean of its prefill and decode ratios to the
  baseline (both phases count the same; a ratio, not a sum of t/s, so a slow phase is
  not drowned by a fast one).
- A trial is *hopeless* once its partial decode rate is below `HOPELESS` of the best
  decode rate seen so far: it cannot win decode, and (outside the thread sweep, where
  each phase gets its own thread count) it lost prefill by far already.
- A candidate is *adopted* only after a paired duel against the current best (rounds
  alternate, so both see the same background load) in which neither phase lost more
  than `TOLERANCE` and the score rose by `MIN_GAIN`: one short trial on a shared machine
  is too noisy (±5 % here) to move the best on its own. A *decisive* sweep win (score
  up by `DECISIVE`, neither phase below `TOLERANCE`) skips the duel: no noise is that
  large, and on a machine where the best is slow (two threads fighting a busy neighbour
  for two cores ran at 1.7 t/s against 38 with one) the duel would eat the budget.
- The search's best is *confirmed* against llama.cpp's defaults only when, in the final
  paired rounds, neither phase is below 1.0x and the score gained `MIN_GAIN`: a best
  that merely ties the defaults within the noise is not a recommendation (a search
  here kept `t2/2 b1024/u256` at 0.999x / 0.994x, which an independent check then
  measured at 1.009x / 0.978x). Otherwise the defaults are kept and stored.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

HOPELESS = 0.85  # below this fraction of the best rate a trial is not worth finishing
TOLERANCE = 0.98  # a duel may lose at most 2 % on either phase
MIN_GAIN = 1.01  # ... and must gain at least 1 % of score
DECISIVE = 1.2  # a sweep win this large is not noise: adopted without a duel


def score(prefill_tps: float, decode_tps: float, base_prefill: float, base_decode: float) -> float:
    """Geometric mean of the two phase ratios to the baseline (0 when anything is 0)."""
    if min(prefill_tps, decode_tps, base_prefill, base_decode) <= 0:
        return 0.0
    return math.sqrt(prefill_tps / base_prefill * decode_tps / base_decode)


def skip_decode(prefill_tps: float, best_prefill: float, separable: bool) -> bool:
    """True when a trial's decode need not be measured: its prefill already lost by far
    and the dimension does not let each phase keep its own value (`separable`)."""
    return not separable and best_prefill > 0 and prefill_tps < HOPELESS * best_prefill


def stop_decode(partial_decode_tps: float, best_decode: float) -> bool:
    """True when the decode measured so far is hopeless against the best seen."""
    return best_decode > 0 and partial_decode_tps < HOPELESS * best_decode


def paired_ratios(candidate: Sequence[float], reference: Sequence[float]) -> float:
    """Median of the per-round ratios candidate / reference (rounds are adjacent in
    time, so each ratio sees one background load); 0 when a reference is 0."""
    ratios = [c / r if r > 0 else 0.0 for c, r in zip(candidate, reference, strict=True)]
    return statistics.median(ratios) if ratios else 0.0


def adopt(prefill_ratio: float, decode_ratio: float) -> bool:
    """The duel's verdict from its median paired ratios (candidate / current best)."""
    return (
        min(prefill_ratio, decode_ratio) >= TOLERANCE
        and math.sqrt(max(prefill_ratio, 0) * max(decode_ratio, 0)) >= MIN_GAIN
    )


def confirmed(prefill_ratio: float, decode_ratio: float) -> bool:
    """The confirmation's verdict (best / defaults, median paired ratios): the best
    beats the defaults: no phase below 1.0x and a score gain of at least `MIN_GAIN`."""
    return (
        min(prefill_ratio, decode_ratio) >= 1.0
        and math.sqrt(max(prefill_ratio, 0) * max(decode_ratio, 0)) >= MIN_GAIN
    )


def decisive(prefill_ratio: float, decode_ratio: float) -> bool:
    """A sweep's win (ratios to the sweep's reference) too large to need a duel."""
    return (
        min(prefill_ratio, decode_ratio) >= TOLERANCE
        and math.sqrt(max(prefill_ratio, 0) * max(decode_ratio, 0)) >= DECISIVE
    )
