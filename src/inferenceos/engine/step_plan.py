"""What one scheduler step evaluates: a pure function from sequence states to a StepPlan.

`schedule()` knows nothing of llama.cpp: it takes what each running sequence needs
(`SeqNeeds`) and a token budget, and returns the batch to build, in order:

1. every generating sequence's pending token, followed by its draft tokens when it is
   speculating (all with logits: the verifier reads each row); decode goes first, so
   running streams never stall behind a long prompt, and drafts are trimmed (never the
   pending token) so the batch stays within `max_tokens`;
2. prefill chunks of admitted prompts, oldest first, up to the step's token budget
   (which the decodes and drafts count against), logits only for a prompt's last token.

The executor fills one llama_batch from the plan, in exactly this row order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SeqNeeds:
    """What one running sequence needs this step (`key`: its slot index)."""

    key: int
    n_past: int  # cells it holds now
    prompt: Sequence[int]
    n_prefilled: int  # prompt tokens already in its cells
    pending: int | None = None  # sampled, emitted, not yet evaluated
    draft: tuple[int, ...] = ()  # proposed tokens that follow `pending`


@dataclass(frozen=True)
class DecodeWork:
    """Evaluate `tokens` (the pending token, then the drafts) at positions pos.. pos+n-1."""

    key: int
    pos: int
    tokens: tuple[int, ...]

    @property
    def n_draft(self) -> int:
        return len(self.tokens) - 1


@dataclass(frozen=True)
class PrefillWork:
    """Evaluate prompt tokens [start, start + len(tokens)); `last`: the chunk ends the
    prompt, so its final row needs logits (the first sampled token)."""

    key: int
    start: int
    tokens: tuple[int, ...]
    last: bool


@dataclass(frozen=True)
class StepPlan:
    decodes: tuple[DecodeWork, ...] = ()
    prefills: tuple[PrefillWork, ...] = ()

    @property
    def n_tokens(self) -> int:
        return sum(len(d.tokens) for d in self.decodes) + sum(len(p.tokens) for p in self.prefills)

    @property
    def n_decode_tokens(self) -> int:
        return sum(len(d.tokens) for d in self.decodes)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills)


def schedule(seqs: Sequence[SeqNeeds], budget: int, max_tokens: int) -> StepPlan:
    """The step's batch (see module docstring). `budget`: tokens the step may evaluate,
    decodes included; `max_tokens`: the hard limit of one batch (n_batch). Pending tokens
    are always taken (the caller never has more generating sequences than max_tokens)."""
    generating = [s for s in seqs if s.pending is not None]
    room = max_tokens - len(generating)  # what drafts may use
    decodes = []
    for s in generating:
        assert s.pending is not None
        draft = s.draft[: max(0, room)]
        room -= len(draft)
        decodes.append(DecodeWork(s.key, s.n_past, (s.pending, *draft)))
    used = sum(len(d.tokens) for d in decodes)
    left = min(budget, max_tokens) - used
    prefills = []
    for s in seqs:
        if left <= 0:
            break
        if s.n_prefilled >= len(s.prompt):
            continue
        end = min(len(s.prompt), s.n_prefilled + left)
        prefills.append(PrefillWork(s.key, s.n_prefilled, tuple(s.prompt[s.n_prefilled:end]),
                                    end == len(s.prompt)))  # fmt: skip
        left -= end - s.n_prefilled
    return StepPlan(tuple(decodes), tuple(prefills))
