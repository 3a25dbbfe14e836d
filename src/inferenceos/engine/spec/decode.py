"""The speculative decoder: what the drafting sequences draft each step, and which of
the drafted tokens the target model accepts.

It sits beside the scheduler (scheduler.py), as vLLM's spec-decode worker sits beside
its scheduler. The scheduler owns admission, the step loop and the batch; each step it
calls
- `propose(running)` before planning: every generating sequence that may draft asks its
  drafter (one `propose` call per drafter, so a draft model batches the step's asks),
  and the drafts are shaped so that the step's logit rows are a multiple of the CPU
  kernels' tile (engine/spec/row_shape.py), with guessed free rows for greedy sequences that are not
  drafting (`ngram.free_guess`). It sets each sequence's `draft` (and `guessed`);
- `verify(seq, rows)` after the decode, for a sequence whose draft rode in the batch:
  the accepted prefix plus the one token the first unaccepted row gives (the rules are
  engine/spec/speculative.py's), as a `Verdict` the scheduler emits and cuts the slot's cells by.

It also owns the drafters (created on first use, shared by every slot), their measured
cost per draft token, and which drafter a request gets (`draft_for`; `check` refuses at
submit time what cannot be served). Per-sequence drafting state (`DraftState`: draft
length, pauses) lives on the RunningSequence (running.py).
"""

from __future__ import annotations

import collections
import functools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from inferenceos.engine.running import Request, RunningSequence
from inferenceos.engine.session import LoadedModel
from inferenceos.engine.spec.drafters import DraftSetup, make_drafter
from inferenceos.engine.spec.ngram import free_guess
from inferenceos.engine.spec.row_shape import head_type, row_multiple, shape_drafts
from inferenceos.engine.spec.speculative import (
    NO_DRAFT,
    DraftAsk,
    Drafter,
    accept_or_resample,
    can_draft,
    sample_target,
    target_distribution,
)
from inferenceos.errors import GenerationError, UsageError
from inferenceos.plan.speculative import (
    OPTIMISTIC_ACCEPTANCE,
    PLANNED,
    PRIORS,
    best_draft_length,
)

# what verifying one more row costs against a one-token decode step: the batched rows
# share the weight reads but not the compute, dominated on small-vocabulary-heavy models
# by the output head (Gemma 3 270M, 2 threads: llama-server's 48-token n-gram drafts ran
# 3.6x plain, about 0.25 of a step per row); plan.speculative.VERIFY_ROW_COST is the same
ROW_COST = 0.25
MAX_ROWS_TIMED = 16  # steps of more rows (long prefill chunks) are cheaper per row
MIN_ROW_COST = 0.02  # rows on a GPU are nearly free, never quite
# one-row steps shorter than this are not timed for the row cost: on a tiny model a
# step takes ~0.1 ms, and one preemption of a busy machine in the prompt's prefill step
# made its rows look dearer than drafting could pay (n-gram never started: seen once in
# the suite); real models' steps take 20-80 ms here
MIN_TIMED_STEP_S = 0.002
# a draft model starts, and resumes after a pause, only if drafting would pay at the
# free-text prior acceptance (plan.speculative.PRIORS), not an optimistic one: starting
# costs a catch-up with the prompt, resuming one with every token of the pause, and a
# row cost measured before any verification is a prefill's (a lower bound). Started at
# 0.9, Qwen2.5-Coder-0.5B for the 1.5B (2 cores) caught up, missed twice and paused on
# free text: 0.982x plain, three paired rounds. Where a draft token is cheap (a GPU) it
# starts and probes again.
RESUME_ACCEPTANCE = PRIORS[("model", "free")].acceptance
WAIT_FOR_ONE_ROW = 3  # a sequence's tokens before a draft model starts unmeasured

# (sequence, its draft, the tokens its drafter was asked for: 0 for a free row's guess)
Drafting = tuple[RunningSequence, list[int], int]


@dataclass(frozen=True)
class Verdict:
    """What verifying one sequence's draft decided: the tokens to emit, each with the
    batch row it was chosen from, and how many cells the slot keeps (the pending token
    and the accepted drafts; the rejected drafts' cells go)."""

    chosen: list[tuple[int, int]]
    keep: int


class SpeculativeDecoder:
    """Drafting and verification for one scheduler (see module docstring)."""

    def __init__(self, model: LoadedModel, n_slots: int, n_ctx_slot: int,
                 step_times: collections.deque[float], draft: str | None = None,
                 draft_options: dict[str, dict[str, Any]] | None = None,
                 guesses: bool = True,
                 step_shapes: collections.deque[tuple[float, int]] | None = None) -> None:
        """`draft` names the default drafter ("ngram", "self", a plugin, or a .gguf draft
        model; None or "none": none), which requests may override; `draft_options` maps
        a drafter name to its constructor options (e.g. p_min). `step_times`: the
        executor's recent step durations (a drafter's cost is measured against them).
        `guesses`: whether free rows may carry guesses (not under an attention-tracking
        KV policy). `step_shapes`: the executor's recent (seconds, rows) steps, from
        which the cost of one more verification row is measured (row_cost). A bad
        default drafter fails here, at load time."""
        self.model = model
        self.step_shapes = step_shapes if step_shapes is not None else collections.deque()
        self.n_slots, self.n_ctx_slot = n_slots, n_ctx_slot
        self.step_times = step_times
        self.guesses = guesses
        self.drafters: dict[str, Drafter] = {}
        self.draft_cost: dict[str, float] = {}  # drafter name → relative cost per token
        self.draft_options = draft_options or {}
        # a plan's own choice (`--draft auto`, plan.speculative.PLANNED) drafts for every
        # request but a seeded sampled one, whose seed must replay (draft_name)
        self.planned = bool(draft and draft.startswith(PLANNED))
        if draft and self.planned:
            draft = draft[len(PLANNED):]
        self.default_draft = draft if draft not in (None, *NO_DRAFT) else None
        if self.default_draft is not None:
            self.drafter(self.default_draft)
        if n_slots > 1 or self.default_draft is not None:
            _ = self.row_multiple  # read now, at load time, not in a request's step

    @cached_property
    def row_multiple(self) -> int:
        """What a step's logit rows are rounded to (engine/spec/row_shape.py): the CPU kernels'
        column tile when the CPU computes the output head, else 1. The head's type costs
        a walk over the file's metadata (0.25 s on Gemma), so a decoder that can batch
        rows reads it at load time; a one-slot one without a drafter (`run`) only when a
        request drafts."""
        ll = self.model._ll
        info = ll.llama_print_system_info()
        info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
        on_cpu = self.model.settings.n_gpu_layers == 0
        return row_multiple(info, _head_type(self.model.path), on_cpu)

    # -- which drafter -------------------------------------------------------------------

    def drafter(self, name: str) -> Drafter:
        """The drafter `name`, created on first use and shared by every slot."""
        if name not in self.drafters:
            setup = DraftSetup(self.model.path, self.model.settings, self.n_slots,
                               self.model.n_vocab)
            self.drafters[name] = make_drafter(name, setup, **self.draft_options.get(name, {}))
        return self.drafters[name]

    def draft_name(self, req: Request) -> str | None:
        """The request's drafter: its own choice, its sampling's, else the default (not
        a planned default for a seeded sampled request: drafted, it would draw another
        sample than the seed gives plainly)."""
        for name in (req.draft, req.sampling.draft):
            if name is not None:
                return name
        sp = req.sampling
        if self.planned and sp.temperature != 0 and sp.seed is not None:
            return None
        return self.default_draft

    def draft_for(self, req: Request) -> Drafter | None:
        """The drafter a request admitted now drafts with (None: it decodes plainly)."""
        name = self.draft_name(req)
        if name in (None, *NO_DRAFT) or not can_draft(req.sampling):
            return None
        assert name is not None
        return self.drafter(name)

    def check(self, req: Request) -> None:
        """Refuse (UsageError) a request whose drafter cannot be served here."""
        draft = self.draft_name(req)
        if draft not in (None, *NO_DRAFT, "ngram", self.default_draft):
            # a model drafter holds memory the planner must have counted at load time
            raise UsageError(f"the model was loaded without the {draft!r} drafter: load it "
                             f"with --draft {draft} (a request may ask for ngram or none)")
        if draft not in (None, *NO_DRAFT):
            assert draft is not None
            self.drafter(draft)  # unknown, or cannot be built here

    def footprint_bytes(self) -> int:
        """Memory the drafters hold (draft model weights and KV), for the planner."""
        return sum(d.footprint_bytes for d in self.drafters.values())

    # -- before the step: drafts -----------------------------------------------------------

    def propose(self, running: Sequence[RunningSequence]) -> None:
        """Set this step's draft of every running sequence (see module docstring)."""
        asks: dict[int, list[tuple[RunningSequence, DraftAsk]]] = {}
        generating = 0
        for seq in running:
            seq.draft, seq.guessed = (), False
            if seq.pending is None:
                continue
            generating += 1
            ask = self._ask(seq)
            if ask is not None:
                assert seq.spec is not None
                asks.setdefault(id(seq.spec.drafter), []).append((seq, ask))
        drafting: list[Drafting] = []
        for group in asks.values():
            drafting += self._drafts(group)
        rows = generating + sum(min(len(d), k) for _, d, k in drafting)
        if rows > 1 and self.row_multiple > 1 and rows % self.row_multiple:
            drafting += self._free_rows(running, rows, {id(seq) for seq, _, _ in drafting})
        if not drafting:
            return
        shaped = shape_drafts([d for _, d, _ in drafting], [k for _, _, k in drafting],
                              generating - len(drafting), self.row_multiple)
        for (seq, _, wanted), draft in zip(drafting, shaped, strict=True):
            seq.draft, seq.guessed = tuple(draft), wanted == 0

    def _ask(self, seq: RunningSequence) -> DraftAsk | None:
        """What a generating sequence asks its drafter for this step, or None."""
        if seq.spec is None or seq.pending is None:
            return None
        spec = seq.spec
        done = seq.metrics.completion_tokens
        left = seq.req.sampling.max_tokens - done
        room = min(self.n_ctx_slot - seq.n_past - 1, left - 1)
        if spec.resuming(done):
            cost = self.draft_cost.get(spec.drafter.name, spec.cost)
            if not self.catch_up_pays(seq, cost, left, RESUME_ACCEPTANCE):
                spec.stop()
        elif (spec.verifications == 0 and not spec.stopped  # not measured yet
              and not self._may_start(seq, done, left)):
            return None
        k, min_match = spec.want(done, room), 0
        if k == 0:
            k, min_match = seq.spec.sure_ask(done, room)
        if k <= 0:
            return None
        spare = max(0, min(self.row_multiple - 1, room - k))
        return DraftAsk(seq.slot.index, [*seq.slot.cached, seq.pending], k, min_match, spare)

    def _may_start(self, seq: RunningSequence, done: int, left: int) -> bool:
        """Before a sequence's first verification: learn the drafter's cost (stopping a
        drafter that cannot pay, or whose catch-up with the prompt would not pay);
        False to wait one step. A drafter with a catch-up (a draft model) waits for a
        measured one-row step, briefly: priced by ROW_COST instead, Qwen2.5-Coder-0.5B
        caught up with the 1.5B's prompt (0.11 s, 2 loaded cores) and then stopped as
        soon as the first one-row step said it could not pay."""
        assert seq.spec is not None
        drafter = seq.spec.drafter
        if (getattr(drafter, "behind", None) is not None and self.one_row_s() is None
                and done < WAIT_FOR_ONE_ROW):
            return False
        cost = self._cost_before_drafting(drafter)
        seq.spec.learn_cost(cost)
        if cost is not None and not self.catch_up_pays(seq, cost, left, RESUME_ACCEPTANCE):
            seq.spec.stop()
        return True

    def _drafts(self, group: list[tuple[RunningSequence, DraftAsk]]) -> list[Drafting]:
        """One drafter's answers to its asks (a failed draft context: no drafts this
        step), its cost per draft token measured on the way."""
        drafter = group[0][0].spec.drafter  # type: ignore[union-attr]
        t0 = time.perf_counter()
        try:
            drafts = drafter.propose([a for _, a in group])
        except GenerationError:  # the draft context failed: decode plainly this step
            drafts = [[] for _ in group]
        n = sum(min(len(d), a.k) for (_, a), d in zip(group, drafts, strict=True))
        if n:
            self._measure_cost(drafter, (time.perf_counter() - t0) / n)
        out: list[Drafting] = []
        for (seq, ask), draft in zip(group, drafts, strict=True):
            assert seq.spec is not None
            seq.spec.cost = self.draft_cost.get(drafter.name, ROW_COST)
            if draft:
                out.append((seq, list(draft[: ask.k + ask.spare]), ask.k))
            elif not ask.min_match:  # asked by length and declined: a miss, maybe dear
                seq.spec.missed(seq.metrics.completion_tokens)
        return out

    def _free_rows(self, running: Sequence[RunningSequence], rows: int,
                   drafting: set[int]) -> list[Drafting]:
        """Guesses for greedy sequences that are not drafting this step, to round an odd
        step up (engine/spec/row_shape.py): on AVX2 three streams plus one guessed row took 60 ms
        where the three alone took 78 (seven: 93 against 107), and a guess that happens
        to be right is one token more. Entries as `propose`'s (seq, tokens, wanted 0):
        the guesses are spares, used only to round up. Not for sampled sequences (a
        verified draft consumes randomness: a fixed seed would no longer replay), nor
        under an attention-tracking KV policy."""
        if not self.guesses:
            return []
        short = -rows % self.row_multiple
        guesses: list[tuple[int, RunningSequence, list[int]]] = []  # (match length, ...)
        for seq in running:
            sp = seq.req.sampling
            if (seq.pending is None or id(seq) in drafting or sp.temperature != 0
                    or not can_draft(sp)):
                continue
            left = sp.max_tokens - seq.metrics.completion_tokens
            room = min(self.n_ctx_slot - seq.n_past - 1, left - 1, short)
            if room > 0:
                guess, length = free_guess([*seq.slot.cached, seq.pending], room)
                guesses.append((length, seq, guess))
        guesses.sort(key=lambda g: -g[0])  # the likeliest guesses take the free rows
        out: list[Drafting] = []
        for _, seq, guess in guesses:
            if short <= 0:
                break
            out.append((seq, guess[:short], 0))
            short -= len(out[-1][1])
        return out

    def row_cost(self) -> float:
        """One more verification row against a one-row decode step, measured on this
        model and machine: the recent steps of 2..MAX_ROWS_TIMED rows (a verification's
        size; a short prompt's prefill counts) against the one-row steps, or without
        those the longer prefill steps (cheaper per row: a lower bound, enough to see
        that a drafter cannot pay); ROW_COST until a step of each kind was seen. On CPU
        it is the model's: 0.25 is Gemma 3 270M's (its output head dominates),
        Qwen2.5-Coder-1.5B's rows cost about 0.5 of a step (2 threads), which is what
        made its 0.5B draft model lose there."""
        one = self.one_row_s()
        many = ([(t, n) for t, n in self.step_shapes if 1 < n <= MAX_ROWS_TIMED]
                or [(t, n) for t, n in self.step_shapes if n > MAX_ROWS_TIMED])
        if one is None or one < MIN_TIMED_STEP_S or not many:
            return ROW_COST
        extra = statistics.median((t - one) / (n - 1) for t, n in many)
        return max(MIN_ROW_COST, extra / one) if one > 0 else ROW_COST

    def one_row_s(self) -> float | None:
        """The median of the recent one-row steps' seconds (a plain decode step of one
        sequence), or None before there was one."""
        ones = [t for t, n in self.step_shapes if n == 1]
        return statistics.median(ones) if ones else None

    def catch_up_pays(self, seq: RunningSequence, cost: float, left: int,
                      acceptance: float = OPTIMISTIC_ACCEPTANCE) -> bool:
        """Whether drafting could win back what the drafter must evaluate before its
        next draft (a draft model catching up with the prompt: ~1 s for Qwen 0.5B on a
        110-token prompt here; or, resuming, with the tokens of its pause): the saving
        over the reply's `left` tokens at `acceptance` (an optimistic one before the
        first draft; RESUME_ACCEPTANCE after a pause) against that catch-up, both from
        this model's measured steps. True for a drafter with nothing to catch up
        (n-gram, self)."""
        assert seq.spec is not None and seq.pending is not None
        drafter = seq.spec.drafter
        behind = getattr(drafter, "behind", None)
        ratio = getattr(drafter, "size_ratio", None)
        one = self.one_row_s()
        if behind is None or ratio is None or one is None:
            return True
        est = best_draft_length(acceptance, cost, seq.spec.k_max)
        saving = left * one * (1.0 - 1.0 / est.speedup) if est.k else 0.0
        n = behind(seq.slot.index, [*seq.slot.cached, seq.pending])
        return saving > n * self.row_cost() * one * float(ratio)

    def _cost_before_drafting(self, drafter: Drafter) -> float | None:
        """The cost of one draft token before this drafter's own drafts were timed: the
        measured one when it drafted here before, else its prior with the measured row
        cost in place of ROW_COST (None for a drafter without a prior)."""
        if drafter.name in self.draft_cost:
            return self.draft_cost[drafter.name]
        prior = getattr(drafter, "cost_prior", None)
        return None if prior is None else max(0.0, float(prior) - ROW_COST) + self.row_cost()

    def _measure_cost(self, drafter: Drafter, s_per_token: float) -> None:
        """Cost of one more draft token relative to a decode step: drafting it (measured)
        plus verifying one more row (row_cost, measured)."""
        if not self.step_times:
            return
        # against a one-row step: a prompt's prefill among step_times made a draft token
        # look nearly free (Qwen 1.5B: 0.59 of a step measured where 3.8 was true)
        step = self.one_row_s() or statistics.median(self.step_times)
        row = self.row_cost()
        cost = row + s_per_token / step if step > 0 else row
        old = self.draft_cost.get(drafter.name)
        self.draft_cost[drafter.name] = cost if old is None else 0.8 * old + 0.2 * cost

    # -- after the step: verification ---------------------------------------------------

    def verify(self, seq: RunningSequence, rows: Sequence[int]) -> Verdict:
        """Accept a prefix of the sequence's draft from its rows' logits, plus the one
        token the first unaccepted row (or the row after the last draft) gives (see
        engine/spec/speculative.py for the rule). Updates the drafting metrics and state (not for a
        free row's guess) and clears the draft."""
        draft, sp = seq.draft, seq.req.sampling
        assert len(rows) == len(draft) + 1
        greedy = sp.temperature == 0
        chosen: list[tuple[int, int]] = []  # (token, row it was chosen from)
        for i, row in enumerate(rows):
            logits = self.model.logits_row(row)
            if greedy:
                tok = int(logits.argmax())
                ok = i < len(draft) and tok == draft[i]
            else:
                assert seq.rng is not None  # sampled sequences draft only with a drafter
                ids, probs = target_distribution(logits, sp)
                if i < len(draft):
                    ok, tok = accept_or_resample(ids, probs, draft[i], seq.rng)
                else:
                    ok, tok = False, sample_target(ids, probs, seq.rng)
            chosen.append((tok, row))
            if not ok:
                break
        n_acc = len(chosen) - 1
        m = seq.metrics
        if not seq.guessed:  # a free row's guess is neither the drafter's nor its record
            m.draft_tokens += len(draft)
            m.draft_accepted += n_acc
            if seq.spec is not None:
                seq.spec.update(len(draft), n_acc, m.completion_tokens)
        seq.guessed, seq.draft = False, ()
        base = seq.n_past - len(rows)  # position of the pending token
        return Verdict(chosen, base + 1 + n_acc)

    # -- ends ------------------------------------------------------------------------------

    def release(self, seq: RunningSequence) -> None:
        """The sequence left its slot: its drafter forgets the slot."""
        if seq.spec is not None:
            seq.spec.drafter.release(seq.slot.index)

    def close(self) -> None:
        for drafter in self.drafters.values():
            drafter.close()


@functools.lru_cache(maxsize=16)
def _head_type(path: Any) -> Any:
    """row_shape.head_type, read once per model file and process (a walk over the
    file's metadata, which each wake's new scheduler paid again)."""
    return head_type(path)
