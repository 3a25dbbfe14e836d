"""Speculative decoding, per sequence, inside the continuous-batching step.

A drafting sequence's pending token rides in the step's one llama_batch followed by k
draft tokens, every row with logits; the verifier then walks the rows:

- greedy: the draft token is accepted while it equals the argmax of the row before it;
  the first row whose argmax differs gives the correction, and when every draft is
  accepted the last row gives one token more. The output is the one plain greedy
  decoding would produce (up to the batch-shape rounding llama.cpp's kernels have
  anyway, see docs/engine.md);
- sampling (standard speculative sampling, Leviathan et al. 2023 / Chen et al. 2023):
  draft token d is accepted with probability min(1, p(d) / q(d)), where p is the target
  distribution after the request's own top-k / top-p / min-p / temperature; on rejection
  the token is drawn from the residual max(0, p - q), normalised. Every drafter here
  drafts deterministically, so q is a point mass at d: accept with p(d), else draw from
  p with d removed. The accepted tokens then follow p exactly.

Rejected draft cells are removed from the KV cache after the step. The draft length
adapts per sequence (`DraftState`): it grows while drafts are accepted and falls back
to what was accepted otherwise; a sequence whose drafts keep failing stops drafting
for a cooldown that doubles each time.

Drafters are plugins (entry-point group `inferenceos.drafters`), like the KV policies;
see engine/spec/drafters.py for `ngram`, `self` and a draft model file. engine/spec/decode.py's
`SpeculativeDecoder` applies these rules for the scheduler each step.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from inferenceos.engine.sampling import SamplingParams
from inferenceos.plan.speculative import best_draft_length, can_pay

ENTRY_POINT_GROUP = "inferenceos.drafters"
NO_DRAFT = ("", "none")
NEVER = 1 << 62  # DraftState.paused_until for a drafter that cannot pay


@dataclass(frozen=True)
class DraftAsk:
    """A request for up to `k` draft tokens following `tokens` (the sequence so far, its
    pending token last), for the sequence in slot `key`. `min_match` > 0: propose only a
    draft that continues an earlier occurrence of at least that many of the last tokens
    (a drafter that matches, see `DraftState.sure_ask`); others propose nothing then.
    `spare` > 0: a drafter that has them for free may add up to that many tokens beyond
    k (and beyond its own trust in the draft); the scheduler uses them only to round the
    step's rows to a shape the kernels like (engine/spec/row_shape.py), and a drafter may
    ignore it."""

    key: int
    tokens: Sequence[int]
    k: int
    min_match: int = 0
    spare: int = 0


class Drafter(Protocol):
    """Proposes draft tokens. `propose` answers every ask of a step at once (a model
    drafter batches them into one decode per draft position) with at most `k` tokens
    each (possibly none). `release(key)` says the slot's sequence ended. `footprint_bytes`
    is the memory the drafter holds (weights and KV), for the planner."""

    name: str
    footprint_bytes: int
    # optional: `k_max` (int), the longest draft worth verifying at once, `k_start`
    # (int), the first draft length of a sequence, and `costly` (bool): every ask costs
    # a decode, answered or not (a draft model), so an empty answer is a failed draft

    def propose(self, asks: Sequence[DraftAsk]) -> list[list[int]]: ...

    def release(self, key: int) -> None: ...

    def close(self) -> None: ...




def can_draft(sp: SamplingParams) -> bool:
    """Whether a request's sampling can be verified here: greedy, or a top-k-first chain
    without grammar, logit bias or penalties (their state depends on every token, and
    their distribution is not a pure function of one row's logits)."""
    if sp.grammar or sp.logit_bias:
        return False
    if sp.repeat_penalty != 1.0 or sp.frequency_penalty or sp.presence_penalty:
        return False
    return sp.temperature == 0 or sp.top_k > 0


# -- the target distribution and the acceptance rule ---------------------------------------


def target_distribution(logits: np.ndarray, sp: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probabilities) that the request's sampler chain draws from, computed
    as llama.cpp's chain does: top-k, then top-p and min-p on the softmax of the raw
    logits (top-p keeps the smallest prefix reaching p, min-p the tokens with
    p >= min_p * p_max), then temperature and softmax. Requires sp.top_k > 0."""
    k = min(sp.top_k, len(logits))
    ids = np.argpartition(logits, -k)[-k:]
    order = np.argsort(-logits[ids], kind="stable")
    ids = ids[order]
    lg = logits[ids].astype(np.float64)
    if sp.top_p < 1.0:
        p = np.exp(lg - lg[0])
        p /= p.sum()
        last = int(np.searchsorted(np.cumsum(p), sp.top_p)) + 1
        ids, lg = ids[:last], lg[:last]
    if sp.min_p > 0.0:
        keep = max(1, int(np.count_nonzero(lg >= lg[0] + np.log(sp.min_p))))
        ids, lg = ids[:keep], lg[:keep]
    z = lg / sp.temperature
    probs = np.exp(z - z.max())
    return ids, probs / probs.sum()


def accept_or_resample(
    ids: np.ndarray, probs: np.ndarray, draft: int, rng: np.random.Generator,
    q: np.ndarray | None = None,
) -> tuple[bool, int]:
    """The speculative sampling rule for one draft token under target (ids, probs).

    `q`: the draft distribution over the same ids, None for a point mass at `draft`.
    Returns (accepted, token): the draft itself when accepted, else a token drawn from
    the normalised residual max(0, p - q)."""
    where = np.flatnonzero(ids == draft)
    p_d = float(probs[where[0]]) if where.size else 0.0
    q_d = 1.0 if q is None else (float(q[where[0]]) if where.size else 0.0)
    if q_d > 0 and rng.random() < min(1.0, p_d / q_d):
        return True, draft
    if q is None:
        residual = probs.copy()
        if where.size:
            residual[where[0]] = 0.0
    else:
        residual = np.maximum(probs - q, 0.0)
    total = residual.sum()
    if total <= 0:  # p == q: nothing to correct (cannot happen after a rejection)
        residual, total = probs, probs.sum()
    return False, int(ids[rng.choice(len(ids), p=residual / total)])


def sample_target(ids: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> int:
    return int(ids[rng.choice(len(ids), p=probs)])


# -- per-sequence adaptation ----------------------------------------------------------------


@dataclass
class DraftState:
    """How much one sequence drafts. `k` doubles after a fully accepted draft (up to
    `k_max`, the drafter's own when it names one) and drops to accepted + 1 otherwise.
    After `patience` verifications in a row with an acceptance below `min_rate`, or once
    the measured acceptance and `cost` say no draft length beats plain decoding
    (plan.speculative), drafting pauses for `cooldown` generated tokens (doubling each
    time): a sequence whose drafts keep failing, or do not pay, stops drafting.

    Before anything is measured, `cost` starts at the drafter's `cost_prior` (when it
    names one); a drafter that could not pay even at a high acceptance
    (plan.speculative.can_pay) never drafts: a layer-skipped copy of a model whose output
    head dominates costs about a decode step per draft token, and merely catching its
    context up with the prompt would cost more than its drafts could save. A cost the
    scheduler measured (`learn_cost`) that cannot pay stops a drafter the same way,
    except one with a `sure_match` (n-gram): that one is held (`cost_held`), drafting
    only sure matches, until a later measurement says it can pay. Its lookups are free,
    so what the measurement saw was wall-clock noise, not the drafter: on a loaded
    machine one disturbed prefill step beside one lucky one-row step made a row look
    dearer than a decode step, and a permanent stop then left a reply that copied its
    prompt at 0 % drafted.

    Once running, the sequence also times its own steps (the interval between two
    `want` calls is one scheduler step): tokens per second over its recent drafted steps
    against its recent plain steps. Drafting that is measured slower pauses like failing
    drafts do. This catches what a fixed row cost cannot: on Gemma 3 270M under load a
    2-row verification step took 1.5-3x a 1-row step (the 262k-token output head's
    kernels for few rows), so accepted one-token drafts on free text still lost time
    (0.87x plain, paired, before this check). A drafter that proposes at every step (a
    draft model) would leave no plain step to compare with, so after two drafted steps
    the sequence decodes two plainly, once, to have them: without that, Qwen2.5-Coder
    0.5B drafting for the 1.5B ran at 0.69x plain on free text (2 cores), never paused."""

    drafter: Drafter
    k: int = 4
    k_max: int = 12
    min_rate: float = 0.3
    patience: int = 3
    cooldown: int = 32
    proposed: int = 0
    accepted: int = 0
    verifications: int = 0
    _bad: int = 0
    paused_until: int = 0  # completion token count before which no drafting
    rate: float = 1.0  # moving average of the acceptance rate
    # cost of one more draft token (drafting it and verifying one more row) relative to a
    # plain decode step, measured by the scheduler
    cost: float = 0.0
    history: list[tuple[int, int]] = field(default_factory=list)
    clock: Callable[[], float] = time.perf_counter
    window: int = 8  # recent steps of each kind the timing compares
    _t_last: float | None = None  # when the step in progress began (its `want` call)
    _step_tokens: int = 0  # tokens the step in progress verified (0: a plain step)
    _plain_s: deque[float] = field(default_factory=deque)
    _drafted: deque[tuple[float, int]] = field(default_factory=deque)  # (seconds, tokens)
    # a measured cost said no draft length pays: only sure matches draft until a later
    # measurement says otherwise (learn_cost, update); never for a drafter without them
    cost_held: bool = False

    def __post_init__(self) -> None:
        prior = getattr(self.drafter, "cost_prior", None)
        if prior is not None and not self.cost:
            self.cost = float(prior)
        if self.cost and not can_pay(self.cost, self.k_max):
            self.stop()

    def learn_cost(self, cost: float | None) -> None:
        """Before the sequence's first verification: the cost of a draft token as the
        scheduler measured it so far (None: keep the prior). Called at every step until
        then, so each call decides afresh from the latest measurement.

        At a cost that could not pay even at a high acceptance, a drafter without a
        `sure_match` (a draft model) stops for good: starting would first cost its
        catch-up with the prompt. A drafter with one is held instead (`cost_held`): it
        drafts only sure matches, and drafts by length again once a measurement says it
        can pay. The measurement is wall-clock time on a machine others share, and a
        contended step only ever looks dearer; a held n-gram drafter loses nothing that
        a stop would have saved (its lookups are free), while a stop also gave up the
        copy a sure match finds."""
        if cost is None or self.verifications:
            return
        self.cost = cost
        pays = can_pay(cost, self.k_max)
        if self._sure_match():
            self.cost_held = not pays
        elif not pays:
            self.stop()

    def _sure_match(self) -> int:
        """The drafter's `sure_match` (0: it has none)."""
        return int(getattr(self.drafter, "sure_match", 0))

    def stop(self) -> None:
        """Decode plainly for the rest of the sequence."""
        self.paused_until = NEVER

    @property
    def stopped(self) -> bool:
        """Whether the sequence decodes plainly for good (`stop`)."""
        return self.paused_until == NEVER

    def want(self, generated: int, room: int) -> int:
        """Draft tokens to ask for now (0: not drafting), at most `room`. Called once
        per step of the sequence: it also closes the timing of the previous step."""
        self._time_step()
        if generated < self.paused_until or self.cost_held:
            return 0
        self.paused_until = 0  # resumed (`resuming` said so before this call)
        if len(self._plain_s) < 2 and len(self._drafted) >= 2:
            # a drafter that always proposes (a draft model) leaves no plain step to
            # compare with: decode two plainly, once, to time what drafting must beat
            return 0
        if self._drafting_is_slower():
            self._pause(generated)
            return 0
        return max(0, min(self.k, room))

    def resuming(self, generated: int) -> bool:
        """Whether the next `want` ends a pause (`_pause`): a drafter with cells of its
        own (a draft model) must then catch up with every token generated meanwhile."""
        return 0 < self.paused_until <= generated

    def sure_ask(self, generated: int, room: int) -> tuple[int, int]:
        """While drafting is paused: (k, n), ask for up to k tokens but only a draft that
        continues a match of at least n tokens (the drafter's `sure_match`); (0, 0) when
        not paused (nor `cost_held`), or the drafter has no such notion, or it cannot
        pay at all (`stop`).

        A pause is learned from the drafts the sequence made, and on free text those
        are short-match guesses (a bigram's continuation is right a third of the time).
        A match of `sure_match` tokens is another regime: the text repeats itself (a
        greedy loop, a quote, a list) and its continuation is nearly always accepted.
        Pausing those too cost Gemma's free-text run its greedy loop: llama-server's
        ngram-simple, which only drafts after 12 matching tokens, ran it at 53.7 t/s
        with every draft accepted while ours, paused, decoded plainly at 32.1."""
        sure = self._sure_match()
        if not sure or self.stopped or (generated >= self.paused_until and not self.cost_held):
            return 0, 0
        return max(0, min(self.k_max, room)), sure

    def _time_step(self) -> None:
        now = self.clock()
        if self._t_last is not None:
            dt = now - self._t_last
            if self._step_tokens:
                self._drafted.append((dt, self._step_tokens))
            else:
                self._plain_s.append(dt)
            for q in (self._drafted, self._plain_s):
                while len(q) > self.window:
                    q.popleft()
        self._t_last, self._step_tokens = now, 0

    def _drafting_is_slower(self) -> bool:
        """Whether the recent drafted steps gave fewer tokens per second than the
        recent plain ones (needs a few of each)."""
        if len(self._drafted) < 2 or len(self._plain_s) < 2:
            return False
        plain = sorted(self._plain_s)[len(self._plain_s) // 2]  # median: one slow step
        seconds = sum(dt for dt, _ in self._drafted)
        tokens = sum(n for _, n in self._drafted)
        return seconds > 0 and tokens / seconds < 1.0 / plain

    def _pause(self, generated: int) -> None:
        self._bad = 0
        self.k = 1
        self.paused_until = generated + self.cooldown
        self.cooldown *= 2
        self._drafted.clear()  # the next drafting spell is judged on its own steps

    def missed(self, generated: int) -> None:
        """The drafter was asked and proposed nothing. A `costly` drafter (a draft model
        whose first token fell below its p_min) paid a draft decode for it: the step
        counts as a failed draft for `patience` and is timed as a drafted step of one
        token, so a drafter that keeps declining pauses instead of decoding beside every
        token (its cells wait, and catch up in one batch if it resumes). A free
        drafter's empty answer (an n-gram lookup that found nothing) counts for nothing."""
        if not getattr(self.drafter, "costly", False):
            return
        self._step_tokens = 1
        self._bad += 1
        if self._bad >= self.patience:
            self._pause(generated)

    def update(self, n_proposed: int, n_accepted: int, generated: int) -> None:
        if n_proposed <= 0:
            return
        self._step_tokens = 1 + n_accepted
        self.proposed += n_proposed
        self.accepted += n_accepted
        self.verifications += 1
        if n_accepted == n_proposed:
            self.k = min(self.k_max, 2 * self.k)
        else:
            self.k = max(1, n_accepted + 1)
        if self.cost_held:  # a sure draft: its step measured the cost again (`cost`)
            self.cost_held = not can_pay(self.cost, self.k_max)
        rate = n_accepted / n_proposed
        self.rate = rate if self.verifications == 1 else 0.7 * self.rate + 0.3 * rate
        self._bad = self._bad + 1 if rate < self.min_rate else 0
        # or it does not pay at what one draft token costs (plan.speculative's model)
        losing = self.verifications >= self.patience and best_draft_length(
            self.rate, self.cost, self.k_max).k == 0
        if self._bad >= self.patience or losing:
            self._pause(generated)

