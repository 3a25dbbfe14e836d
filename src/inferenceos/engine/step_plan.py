"""What one scheduler step evaluates: a pure function from sequence states to a StepPlan.

`schedule()` knows nothing of llama.cpp: it takes what each running sequence needs
(`SeqNeeds`) and a token budget, and returns the batch to build, in order:

1. every generating sequence's pending token, followed by its draft tokens when it is
   speculating (all with logits: the verifier reads each row); decode goes first, so
   running streams never stall behind a long prompt, and drafts are trimmed (never the
   pending token) so the batch stays within `max_tokens`;
2. prefill chunks of admitted prompts, oldest first, up to the step's token budget
   (which the decodes and drafts count against), logits only for a prompt's last token.
   When the prompt's sequence is the only one running, that last token is evaluated in
   a step of its own (after the rest of the prompt), as it must be when the rest was
   cached: llama.cpp's CPU kernels give a row slightly different sums in a batch of one
   than in a batch of many, so a temperature-0 request answered differently the second
   time, from the cache, than the first (docs/engine.md, "Same request, same answer").
   One more decode step on a cold prompt buys that. Beside other sequences (decoding,
   or with prompts of their own) every row of the reply is batched with theirs
   whatever this step does, so the step buys nothing there and is not taken: the first
   token comes one step sooner, as llama-server's does.

Media (an image's or audio clip's encoder outputs, `SeqNeeds.media` spans of the prompt)
cannot share a llama_batch with tokens: a batch carries either token ids or embeddings.
A text chunk therefore stops where a media span begins, and a span is evaluated in a
step of its own (`StepPlan.media`), chunked by the same budget unless the projector
needs its cells in one batch (`atomic`: non-causal attention among them). The caller
alternates: with `media_first` a waiting span goes first, so media steps interleave
with the other sequences' decode steps instead of stalling them for a whole image.

The executor fills one llama_batch from the plan, in exactly this row order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

# the last prompt token in a step of its own (module doc, 2.); benchmarks/determinism.py
# turns it off for its baseline, and benchmarks/lora_parity.py (which evaluates prompts as
# llama-server does, in one batch) with INFERENCEOS_SEPARATE_LAST_TOKEN=0 in the
# environment, which the engine's spawned worker processes inherit
SEPARATE_LAST_TOKEN = os.environ.get("INFERENCEOS_SEPARATE_LAST_TOKEN", "1") != "0"


@dataclass(frozen=True)
class SeqNeeds:
    """What one running sequence needs this step (`key`: its slot index)."""

    key: int
    n_past: int  # cells it holds now
    prompt: Sequence[int]
    n_prefilled: int  # prompt tokens already in its cells
    pending: int | None = None  # sampled, emitted, not yet evaluated
    draft: tuple[int, ...] = ()  # proposed tokens that follow `pending`
    media: tuple[MediaSpan, ...] = ()  # the prompt's media runs, in order
    checkpoint: int = 0  # a prefill chunk ends here (its state is stored): 0, none


@dataclass(frozen=True)
class MediaSpan:
    """Prompt positions [start, end) hold one media chunk's embeddings; `atomic`: they
    must be evaluated in one batch."""

    start: int
    end: int
    atomic: bool = False


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
class MediaWork(PrefillWork):
    """Evaluate prompt positions [start, start + len(tokens)) of the media span
    `span` (its tokens are the span's key) from the encoder's embeddings."""

    span: MediaSpan = MediaSpan(0, 0)


@dataclass(frozen=True)
class StepPlan:
    decodes: tuple[DecodeWork, ...] = ()
    prefills: tuple[PrefillWork, ...] = ()
    media: MediaWork | None = None  # when set, the step's only work

    @property
    def n_tokens(self) -> int:
        if self.media is not None:
            return len(self.media.tokens)
        return sum(len(d.tokens) for d in self.decodes) + sum(len(p.tokens) for p in self.prefills)

    @property
    def n_decode_tokens(self) -> int:
        return sum(len(d.tokens) for d in self.decodes)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills or self.media)


def _span_at(s: SeqNeeds, pos: int) -> MediaSpan | None:
    return next((m for m in s.media if m.start <= pos < m.end), None)


def _text_end(s: SeqNeeds, end: int) -> int:
    """`end` cut back to the start of the first media span after the prefilled part."""
    nxt = next((m.start for m in s.media if m.start >= s.n_prefilled), end)
    return min(end, nxt)


def media_step(seqs: Sequence[SeqNeeds], budget: int, max_tokens: int) -> StepPlan:
    """A media-only step for the oldest sequence waiting at a media span, or an empty
    plan. Atomic spans go whole (the caller checked at admission that one fits)."""
    for s in seqs:
        if s.pending is not None or s.n_prefilled >= len(s.prompt):
            continue
        span = _span_at(s, s.n_prefilled)
        if span is None:
            continue
        end = span.end if span.atomic else min(span.end, s.n_prefilled + min(budget, max_tokens))
        work = MediaWork(s.key, s.n_prefilled, tuple(s.prompt[s.n_prefilled:end]),
                         end == len(s.prompt), span)
        return StepPlan(media=work)
    return StepPlan()


def schedule(seqs: Sequence[SeqNeeds], budget: int, max_tokens: int,
             media_first: bool = False) -> StepPlan:
    """The step's batch (see module docstring). `budget`: tokens the step may evaluate,
    decodes included; `max_tokens`: the hard limit of one batch (n_batch). Pending tokens
    are always taken (the caller never has more generating sequences than max_tokens).
    `media_first`: a sequence waiting at a media span gets this step (`media_step`)."""
    if media_first and (plan := media_step(seqs, budget, max_tokens)):
        return plan
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
    # alone: no other sequence decodes or waits for its prompt (module doc, 2.)
    alone = not decodes and sum(s.n_prefilled < len(s.prompt) for s in seqs) <= 1
    prefills = []
    for s in seqs:
        if left <= 0:
            break
        if s.n_prefilled >= len(s.prompt) or _span_at(s, s.n_prefilled) is not None:
            continue  # done, or waiting for a media step
        end = _text_end(s, min(len(s.prompt), s.n_prefilled + left))
        if s.n_prefilled < s.checkpoint < end:
            end = s.checkpoint  # the state at the checkpoint is copied after this step
        if (SEPARATE_LAST_TOKEN and alone and end == len(s.prompt)
                and end - s.n_prefilled > 1 and _span_at(s, end - 1) is None):
            end -= 1  # the last prompt token in a step of its own (module doc, 2.)
        prefills.append(PrefillWork(s.key, s.n_prefilled, tuple(s.prompt[s.n_prefilled:end]),
                                    end == len(s.prompt)))
        left -= end - s.n_prefilled
    return StepPlan(tuple(decodes), tuple(prefills))
