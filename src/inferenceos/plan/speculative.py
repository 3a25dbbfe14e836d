"""What speculative decoding should gain: a pure model for the planner and `simulate`.

With a per-token acceptance rate a (drafts accepted independently, Leviathan et al.
2023), a verification of k draft tokens yields (1 - a^(k+1)) / (1 - a) tokens on
average, and costs 1 + c·k plain decode steps, where c is the cost of drafting one token
and verifying one more row, relative to one plain step. The speedup is their ratio.

Typical figures measured by benchmarks/speculative.py on Gemma 3 270M, 2 CPU threads:
n-gram drafting costs c ≈ 0.1 (verification rows only; the lookup is free) with a near 1
on text that quotes its prompt and near 0 on free text; a layer-skipped self-draft
costs c ≈ 1 on that model (its 262k-token output head dominates a token's cost).
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one verification of `k` drafts yields on average (at least 1)."""
    a = min(max(acceptance, 0.0), 1.0)
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_speedup(acceptance: float, k: int, cost: float) -> float:
    """Decode speedup over plain decoding: (1 - a^(k+1)) / ((1 - a)(1 + c·k))."""
    if k <= 0:
        return 1.0
    return expected_tokens(acceptance, k) / (1.0 + cost * k)


@dataclass(frozen=True)
class SpeculativeEstimate:
    """The best draft length for an expected acceptance, and what it gives."""

    acceptance: float
    cost: float
    k: int  # 0: drafting does not pay, decode plainly
    speedup: float
    tokens_per_step: float


def best_draft_length(acceptance: float, cost: float, k_max: int = 12) -> SpeculativeEstimate:
    """The k in 0..k_max that maximises `expected_speedup` (0 when none beats 1.0)."""
    best_k, best = 0, 1.0
    for k in range(1, k_max + 1):
        s = expected_speedup(acceptance, k, cost)
        if s > best:
            best_k, best = k, s
    return SpeculativeEstimate(acceptance, cost, best_k, best,
                               expected_tokens(acceptance, best_k))  # fmt: skip
