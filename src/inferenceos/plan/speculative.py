"""What speculative decoding should gain: a pure model for the planner and `simulate`.

With a per-token acceptance rate a (drafts accepted independently, Leviathan et al.
2023), a verification of k draft tokens yields (1 - a^(k+1)) / (1 - a) tokens on
average, and costs 1 + c·k plain decode steps, where c is the cost of drafting one token
and verifying one more row, relative to one plain step. The speedup is their ratio.

Figures measured by benchmarks/speculative.py on Gemma 3 270M, 2 CPU threads (the basis
of `PRIORS`): n-gram drafting costs c ≈ 0.15-0.25 (verification rows only: the lookup is
free, but each row computes the 262k-token output head) with a near 1 on text that
quotes its prompt and near 0.15 on free text; a layer-skipped self-draft costs c ≈ 1.2
on that model (its output head, 178 MB of the model's 250, is paid by every draft
token), so no acceptance makes it pay. A draft model's c is its weight bytes over the
target's (decode is memory-bound) plus one verification row.

Learned figures (`learned_draft`): every drafted generation telemetry recorded for the
model (its `extra` holds draft, draft_tokens, draft_accepted and decode_steps): the
measured tokens per verification step and draft tokens per step give the speedup
directly, tokens_per_step / (1 + c·drafts_per_step). The model's recorded traffic is its
task mix; `--task` picks a prior instead.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the cost of one more verification row against a one-token decode step; the engine's
# scheduler measures drafting on top of it (engine.spec_decode.ROW_COST, same value)
VERIFY_ROW_COST = 0.25
# the acceptance assumed before a drafter has been measured: only a drafter that could
# not pay even at this rate skips drafting from the start
OPTIMISTIC_ACCEPTANCE = 0.9
TASKS = ("copy", "free")  # output that quotes its prompt (edits, RAG, code), or free text
# the engine's default drafter as a plan chose it by itself (`--draft auto`): the prefix
# tells the engine that a seeded sampled request decodes plainly (its seed replays, as
# the user asked; a drafter the user named drafts it too)
PLANNED = "auto:"


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
                               expected_tokens(acceptance, best_k))


def can_pay(cost: float, k_max: int, acceptance: float = OPTIMISTIC_ACCEPTANCE) -> bool:
    """Whether drafting at `cost` per token could beat plain decoding at `acceptance`
    (by default an optimistic one): False means do not even start."""
    return best_draft_length(acceptance, cost, k_max).k > 0


def model_draft_cost(draft_bytes: int, target_bytes: int) -> float:
    """Prior cost of one draft token from a draft model: one decode of the draft reads
    its weights once (memory-bound, so its bytes over the target's), plus the row that
    verifies it."""
    return draft_bytes / max(target_bytes, 1) + VERIFY_ROW_COST


# -- priors and what telemetry taught --------------------------------------------------


@dataclass(frozen=True)
class DraftPrior:
    """A drafter's expected per-token acceptance on a task, its cost, and the longest
    draft it verifies at once."""

    acceptance: float
    cost: float
    k_max: int


# Gemma 3 270M, 2 threads (module docstring); a draft model's cost comes from its size
PRIORS: dict[tuple[str, str], DraftPrior] = {
    ("ngram", "copy"): DraftPrior(0.95, 0.15, 48),
    ("ngram", "free"): DraftPrior(0.15, 0.15, 48),
    ("self", "copy"): DraftPrior(0.6, 1.2, 12),
    ("self", "free"): DraftPrior(0.25, 1.2, 12),
    # a small sibling of the same family (Leviathan et al. report 0.5-0.8)
    ("model", "copy"): DraftPrior(0.8, VERIFY_ROW_COST, 12),
    ("model", "free"): DraftPrior(0.6, VERIFY_ROW_COST, 12),
}


def drafter_kind(name: str) -> str:
    """'ngram', 'self' or 'model' (a .gguf path) for a `--draft` value."""
    return "model" if name.endswith(".gguf") else name


def self_draft_bytes(facts: Any, keep: float = 0.83) -> int:
    """Bytes the `self` draft reads per token: everything but the skipped layers'
    (engine.self_draft keeps `keep` of the blocks)."""
    layer = sum(t.n_bytes for t in facts.tensors if t.layer >= 0)
    return int(facts.spec.tensor_bytes - layer * (1.0 - keep))


def draft_kv_bytes(spec: Any, n_ctx: int, keep: float = 1.0) -> int:
    """A draft context's f16 KV cache: `n_ctx` cells over `keep` of the model's layers
    (a ModelSpec's), every layer at full size (an upper bound). What the engine charges
    a draft model (engine/drafters.ModelDrafter) and the plan prices it at."""
    per_cell = sum(layer.head_count_kv for layer in spec.layers) * (
        spec.key_length + spec.value_length) * 2
    return int(per_cell * n_ctx * keep)


def counted_speedup(draft_tokens: int, accepted: int, steps: int, cost: float) -> float:
    """Tokens per verification step over the step's work, 1 + cost x drafts per step."""
    if steps <= 0:
        return 1.0
    return (steps + accepted) / steps / (1.0 + cost * draft_tokens / steps)


@dataclass(frozen=True)
class DraftEvidence:
    """Drafted generations of one model with one drafter, pooled."""

    runs: int
    draft_tokens: int
    draft_accepted: int
    decode_steps: int
    output_tokens: int
    replayed: int = 0  # of `runs`: plain runs whose tokens were replayed (ngram only)
    # the drafter's measured speedup: the median decode t/s of the runs that really
    # drafted with it over that of the model's plain runs (None: not both recorded)
    measured: float | None = None
    # (draft tokens, accepted, verification steps) of the runs that really drafted, in
    # the pooled counters' measure (for ngram their replays, as for the plain runs)
    drafted: tuple[int, int, int] = (0, 0, 0)

    @property
    def basis(self) -> str:
        """'learned from 3 runs', '... (2 replayed)', or '... measured 0.94x'."""
        text = f"learned from {self.runs} run{'s' * (self.runs != 1)}"
        text += f" ({self.replayed} replayed)" if self.replayed else ""
        return text + (f", measured {self.measured:.2f}x" if self.measured else "")

    def speedup(self, cost: float) -> float:
        """Decode speed over plain decoding: the pooled counters priced at `cost` per
        draft token, corrected by what the drafted runs measured against what their
        own counters priced (the correction is 1 until the drafter really ran beside
        plain runs; with no replays the answer is the measured ratio itself)."""
        pooled = counted_speedup(self.draft_tokens, self.draft_accepted, self.decode_steps,
                                 cost)
        if self.measured is None or self.drafted[2] <= 0:
            return pooled
        return pooled * self.measured / counted_speedup(*self.drafted, cost)

    @property
    def acceptance(self) -> float:
        return self.draft_accepted / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        return (self.decode_steps + self.draft_accepted) / self.decode_steps

    @property
    def drafts_per_step(self) -> float:
        return self.draft_tokens / self.decode_steps


def _counters(x: dict[str, Any], kind: str, own: bool) -> dict[str, Any] | None:
    """The draft counters one telemetry `extra` holds for drafter `kind` (`own`: the
    run drafted with it). For 'ngram' only the replay of n-gram drafting on the run's
    tokens (engine.ngram_replay), drafted or not: one measure for every run, so that
    the drafted runs' measured speed corrects exactly the replays' bias (a run without
    one, interrupted or older, is left out). For another kind its own counters when it
    drafted with it. None otherwise. `replayed` marks a plain run's replay."""
    if kind == "ngram":
        replay = x.get("ngram_replay")
        return {**replay, "replayed": not own} if isinstance(replay, dict) else None
    return x if own else None


def pool_evidence(extras: Iterable[dict[str, Any]], drafter: str) -> DraftEvidence | None:
    """Sum the draft counters of the telemetry `extra` dicts recorded with `drafter`
    (its kind: a draft model file counts as 'model'; for 'ngram' also the replays of
    plain runs); None without any. Dicts that carry `decode_tps` also give the measured
    speedup (`DraftEvidence.measured`)."""
    runs = tokens = accepted = steps = out = replayed = 0
    kind = drafter_kind(drafter)
    drafted_tps: list[float] = []
    plain_tps: list[float] = []
    drafted = (0, 0, 0)
    for x in extras:
        if not isinstance(x, dict):
            continue
        own = drafter_kind(str(x.get("draft") or "")) == kind
        c = _counters(x, kind, own)
        tps = x.get("decode_tps")
        # speeds compare like with like: one stream at a time, a drafted run only with
        # the counters it is pooled by
        if isinstance(tps, int | float) and tps > 0 and (x.get("concurrency") or 1) <= 1:
            if own and c is not None:
                drafted_tps.append(tps)
            elif not x.get("draft"):
                plain_tps.append(tps)
        if c is None:
            continue
        try:
            n, a, s = int(c["draft_tokens"]), int(c["draft_accepted"]), int(c["decode_steps"])
        except (KeyError, TypeError, ValueError):
            continue
        if s <= 0 or not 0 <= a <= n:
            continue
        runs, tokens, accepted, steps = runs + 1, tokens + n, accepted + a, steps + s
        replayed += bool(c.get("replayed"))
        if own:
            drafted = (drafted[0] + n, drafted[1] + a, drafted[2] + s)
        out += int(x.get("output_tokens") or 0)
    if not runs:
        return None
    measured = (statistics.median(drafted_tps) / statistics.median(plain_tps)
                if drafted_tps and plain_tps else None)
    return DraftEvidence(runs, tokens, accepted, steps, out, replayed, measured, drafted)


def learned_draft(model: str | Path, drafter: str, limit: int = 200) -> DraftEvidence | None:
    """What telemetry recorded for `model` drafted by `drafter` on this kind of machine
    (the newest `limit` generations); None without history. Never raises."""
    try:
        import inferenceos.telemetry as telemetry

        rows = telemetry.generations(model=Path(model), machine="kind", limit=limit)
    except Exception:  # no history is a valid answer
        return None
    return pool_evidence(({**r.extra, "output_tokens": r.output_tokens,
                           "decode_tps": r.decode_tps, "concurrency": r.concurrency}
                          for r in rows
                          if isinstance(r.extra, dict)), drafter)


@dataclass(frozen=True)
class DraftPrediction:
    """What `simulate --draft` prints beside plain decode."""

    drafter: str
    task: str
    basis: str  # "learned from N runs" or "prior (...)"
    acceptance: float
    cost: float
    k: float  # draft tokens per verification step (the mean, when learned)
    tokens_per_step: float
    speedup: float

    def to_json(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "task": self.task, "basis": self.basis,
                "acceptance": round(self.acceptance, 4), "cost": round(self.cost, 4),
                "draft_tokens_per_step": round(self.k, 2),
                "tokens_per_step": round(self.tokens_per_step, 3),
                "speedup": round(self.speedup, 3)}


def predict_draft(drafter: str, task: str | None, cost: float | None = None,
                  evidence: DraftEvidence | None = None) -> DraftPrediction:
    """The speedup `drafter` should give: from `evidence` when there is some and no
    `task` was named, else from the task's prior (default 'free': never promise what
    free text does not give). `cost` overrides the prior's (a draft model's size)."""
    kind = drafter_kind(drafter)
    if task is not None and task not in TASKS:
        from inferenceos.errors import UsageError

        raise UsageError(f"unknown task {task!r} (use {' or '.join(TASKS)})")
    prior = PRIORS.get((kind, task or "free"), DraftPrior(0.5, VERIFY_ROW_COST, 12))
    c = prior.cost if cost is None else cost
    if evidence is not None and task is None:
        speedup = evidence.speedup(c)
        return DraftPrediction(drafter, "recorded", evidence.basis, evidence.acceptance, c,
                               evidence.drafts_per_step, evidence.tokens_per_step,
                               speedup)
    est = best_draft_length(prior.acceptance, c, prior.k_max)
    return DraftPrediction(drafter, task or "free", f"prior for {task or 'free'} text",
                           prior.acceptance, c, est.k, est.tokens_per_step,
                           est.speedup)
