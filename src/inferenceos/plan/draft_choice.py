"""The drafter as a plan decision: which speculative drafter, if any, decodes fastest.

`--draft auto` (LoadRequest.draft) leaves the choice to the plan. Every candidate
(`ngram`, `self`, draft model files the caller names) is priced with the speculative
model of plan/speculative.py:

- **cost per draft token** c = the drafter's own work (a draft model's weight bytes over
  the target's, as its decode is memory-bound; nothing for n-gram lookup) plus one
  verification row. The row is priced by the cost model, not a constant: one more row
  in a decode step costs what a prompt token costs in prefill, so c_row = predicted
  prefill seconds per token / predicted decode seconds per step (Gemma 3 270M on 2 CPU
  threads: 0.18; Qwen2.5-Coder-1.5B: 0.52; the engine measured 0.15-0.25 and ~0.6);
- **acceptance**: what this model's recorded runs measured with the drafter (for n-gram
  also the replays of plain runs, engine/spec/ngram_replay.py), else the free-text prior;
- **measured beats modelled**: once the drafter really ran beside plain runs of the
  model, the price is corrected by what those runs measured against what their own
  counters priced (plan/speculative.DraftEvidence.speedup). Replays count acceptance,
  not time: on Qwen2.5-Coder-0.5B returning an edited function they promised 1.19x where
  drafting measured 0.85x, so one losing run turns auto back to plain decoding, and
  only replays that promise clearly more bring it back;
- **memory**: a draft model holds its weights and an f16 KV cache of the target's
  context in RAM; one that does not fit in what the plan leaves of the RAM budget is
  not a candidate.

Only a drafter priced from this model's own runs is chosen, from `MIN_EVIDENCE_TOKENS`
output tokens of them on (a prior never promises what free text may not give; the
options table shows the priors beside). The fastest
predicted decode wins when it beats plain decoding by `MARGIN` (the
engine's own rule pauses a drafter that stops paying, so a small predicted gain is not
worth a drafter's load time and memory); otherwise the plan decodes plainly. Under the
`capacity` policy only drafters that hold no memory compete. A drafter the user names is
kept as asked and priced beside the rest, so the plan line says what it should give.
Pure: telemetry is read through `evidence` (default plan.speculative.learned_draft).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from inferenceos.plan import speculative as spec
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.units import format_bytes

AUTO = "auto"
NONE = "none"
MARGIN = 1.10  # predicted speedup a drafter must reach to be chosen over plain decoding
# output tokens of evidence (pooled runs) before auto drafts: one sampled 64-token reply
# of Gemma 3 270M (`make run`) promised a gain its next sample did not give (0.82x)
MIN_EVIDENCE_TOKENS = 128
MIN_ROW_COST, MAX_ROW_COST = 0.02, 2.0  # a row on a GPU is nearly free, never quite
SELF_KEEP = 0.83  # the share of blocks a self-draft keeps (engine/spec/self_draft.py)

Evidence = Callable[[str, str], "spec.DraftEvidence | None"]


@dataclass(frozen=True)
class DraftOption:
    """One drafter priced for this plan."""

    drafter: str  # "none", "ngram", "self" or a draft model path
    speedup: float  # predicted decode speed over plain decoding
    basis: str  # "learned from 3 runs (2 replayed)", "prior for free text", ...
    cost: float  # c: one draft token against a plain decode step
    memory: int  # bytes the drafter holds (draft weights and KV)
    fits: bool = True
    learned: bool = False  # priced from this model's recorded (or replayed) runs
    evidence_tokens: int = 0  # output tokens of those runs

    @property
    def label(self) -> str:
        return self.drafter if self.drafter in (NONE, "ngram", "self") else Path(
            self.drafter).name

    def to_json(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "speedup": round(self.speedup, 3),
                "basis": self.basis, "cost": round(self.cost, 3), "memory": self.memory,
                "fits": self.fits, "learned": self.learned,
                "evidence_tokens": self.evidence_tokens}


PLAIN = DraftOption(NONE, 1.0, "plain decoding", 0.0, 0)


@dataclass(frozen=True)
class DraftPlan:
    """The plan's drafter: `drafter` None decodes plainly. `asked` is what the request
    said (auto, or the user's drafter); `options` every candidate as priced."""

    drafter: str | None
    speedup: float
    basis: str
    asked: str
    options: tuple[DraftOption, ...] = ()

    def option(self, drafter: str) -> DraftOption | None:
        """How `drafter` was priced for this plan (None: it was not a candidate)."""
        return next((o for o in self.options if o.drafter == drafter), None)

    @property
    def memory(self) -> int:
        """Bytes the chosen drafter will hold in RAM as priced (draft weights and KV;
        0 without one, for n-gram, or for a drafter left unpriced)."""
        chosen = self.option(self.drafter) if self.drafter is not None else None
        return chosen.memory if chosen is not None else 0

    def line(self) -> str:
        """The plan line's part: 'draft ngram (1.42x, learned from 3 runs)'."""
        if self.drafter is None:
            best = max((o for o in self.options if o.learned),
                       key=lambda o: o.speedup, default=None)
            why = (f"best {best.label} {best.speedup:.2f}x, {best.basis}" if best else
                   "no drafted or replayed runs of this model yet")
            if best and not best.fits:
                why += f"; it needs {format_bytes(best.memory)} of RAM the plan has not got"
            elif best and best.evidence_tokens < MIN_EVIDENCE_TOKENS:
                why += f"; {best.evidence_tokens} of {MIN_EVIDENCE_TOKENS} tokens seen"
            return f"no drafter (auto: {why})"
        who = "yours" if self.asked != AUTO else "auto"
        name = self.drafter if self.drafter in ("ngram", "self") else Path(self.drafter).name
        return f"draft {name} ({who}: {self.speedup:.2f}x, {self.basis})"

    def to_json(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "asked": self.asked,
                "speedup": round(self.speedup, 3), "basis": self.basis,
                "options": [o.to_json() for o in self.options]}


def row_cost(prefill_s_per_token: float, decode_s: float) -> float:
    """One more verification row against a plain decode step (module docstring)."""
    if decode_s <= 0 or prefill_s_per_token <= 0:
        return spec.VERIFY_ROW_COST
    return min(MAX_ROW_COST, max(MIN_ROW_COST, prefill_s_per_token / decode_s))


def _priced(name: str, c: float, memory: int, evidence: spec.DraftEvidence | None) -> DraftOption:
    """`name` at cost `c`: from its recorded runs when there are some, else the prior."""
    if evidence is not None:
        return DraftOption(name, evidence.speedup(c), evidence.basis, c, memory, learned=True,
                           evidence_tokens=evidence.output_tokens)
    kind = spec.drafter_kind(name)
    prior = spec.PRIORS.get((kind, "free"), spec.DraftPrior(0.5, c, 12))
    est = spec.best_draft_length(prior.acceptance, c, prior.k_max)
    return DraftOption(name, est.speedup, "prior for free text", c, memory)


def price_drafters(
    facts: ModelFacts,
    candidates: Sequence[str],
    c_row: float,
    n_ctx: int,
    ram_left: int,
    draft_facts: Callable[[str], ModelFacts],
    evidence: Evidence | None = None,
) -> list[DraftOption]:
    """Every candidate priced (module docstring); `draft_facts` reads a draft model's
    header, `evidence(model, drafter)` its recorded runs (None: the priors only)."""
    model = str(facts.spec.path)
    target = max(facts.spec.tensor_bytes, 1)
    out = [PLAIN]
    for name in dict.fromkeys(candidates):  # once each, in order
        kind = spec.drafter_kind(name)
        if kind == "ngram":
            c, memory = c_row, 0
        elif kind == "self":
            own = spec.self_draft_bytes(facts, SELF_KEEP)
            c = own / target + c_row
            memory = own + spec.draft_kv_bytes(facts.spec, n_ctx, SELF_KEEP)
        elif kind != "model":  # a plugin drafter: the engine checks it, nothing prices it
            out.append(DraftOption(name, 1.0, "a plugin drafter: not priced", 0.0, 0))
            continue
        else:
            try:
                df = draft_facts(name)
            except Exception as exc:  # the engine says what is wrong with it at load
                out.append(DraftOption(name, 1.0, f"not priced: {exc}", 0.0, 0))
                continue
            c = df.spec.tensor_bytes / target + c_row
            memory = df.spec.tensor_bytes + spec.draft_kv_bytes(df.spec, n_ctx)
        option = _priced(name, c, memory, evidence(model, name) if evidence else None)
        # a drafter that holds nothing fits even a plan that streams weights from disk
        out.append(option if memory == 0 or memory <= ram_left else replace(option, fits=False))
    return out


def choose_draft(options: Sequence[DraftOption], asked: str, policy: str) -> DraftPlan:
    """The plan's drafter among priced `options` for a request that `asked` for
    auto or for one drafter (kept as asked)."""
    opts = tuple(options)
    if asked != AUTO:
        mine = next((o for o in opts if o.drafter == asked), None)
        if mine is None or asked == NONE:
            return DraftPlan(None, 1.0, "asked for", asked, opts)
        return DraftPlan(asked, mine.speedup, mine.basis, asked, opts)
    usable = [o for o in opts if o.fits and o.learned and o.drafter != NONE
              and o.evidence_tokens >= MIN_EVIDENCE_TOKENS
              and (policy != "capacity" or o.memory == 0)]
    best = max(usable, key=lambda o: o.speedup, default=None)
    if best is None or best.speedup < MARGIN:
        return DraftPlan(None, 1.0, "plain decoding", AUTO, opts)
    return DraftPlan(best.drafter, best.speedup, best.basis, AUTO, opts)
