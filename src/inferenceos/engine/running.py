"""A scheduler request's sequence while it runs in a slot.

`Request` (request.py, importable from here too) is what a caller submits (prompt
token ids, sampling, per-request choices); `prompt_request` builds one from text or
token ids and media items. `RunningSequence` is the scheduler's record of an admitted
request: its slot, how much of the prompt its cells hold, the token sampled but not
yet evaluated, its sampler chain, its output stream (text, stop strings, metrics;
output.py) and, when it drafts, its drafting state (engine/spec/speculative.py) and this step's
draft. The scheduler (scheduler.py) and the speculative decoder (engine/spec/decode.py) both
read and update it; neither owns it alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.kv.policies import KVPolicy
from inferenceos.engine.kv.slots import Slot
from inferenceos.engine.output import OutputStream
from inferenceos.engine.request import Request as Request  # re-exported
from inferenceos.engine.sampling import SamplerChain, SamplingParams
from inferenceos.engine.session import LoadedModel
from inferenceos.engine.spec.ngram_replay import ReplayBudget
from inferenceos.engine.spec.speculative import Drafter, DraftState, can_draft
from inferenceos.engine.step_plan import SeqNeeds
from inferenceos.errors import UsageError

NO_PROJECTOR = ("this model cannot see images or hear audio: it was loaded without a "
                "projector (give one with --mmproj FILE)")


def prompt_request(req_id: int, prompt: str | Sequence[int], sampling: SamplingParams,
                   lm: LoadedModel, media: Any, items: Sequence[Any], **kw: Any) -> Request:
    """The scheduler Request for a prompt (text, or token ids) with optional media items
    (MediaItems; text prompts only, one media marker per item; `media`: the model's
    MediaEncoder or None). The request owns the media runs: the scheduler frees them."""
    if not items:
        tokens = lm.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        return Request(req_id, tokens, sampling, **kw)
    if not isinstance(prompt, str):
        raise UsageError("media inputs need a text prompt (with one marker per item)")
    if media is None:
        raise UsageError(NO_PROJECTOR)
    tokens, runs = media.tokenize(prompt, list(items))
    return Request(req_id, tokens, sampling, media=runs, **kw)


class RunningSequence:
    """A request being served in a slot (see module docstring)."""

    def __init__(
        self,
        req: Request,
        slot: Slot,
        reused: int,
        model: LoadedModel,
        policy: KVPolicy,
        drafter: Drafter | None = None,
        replays: ReplayBudget | None = None,
    ) -> None:
        """`replays`: the scheduler's n-gram replay budget (engine/spec/ngram_replay.py)."""
        self.req = req
        self.slot = slot
        self.sampler = SamplerChain(req.sampling, model.vocab)
        self.policy = policy
        self.n_prefilled = reused  # prompt tokens already in the KV cache
        self.pending: int | None = None  # sampled, emitted, not yet evaluated
        self.out = OutputStream(req.id, req.sampling, len(req.prompt), reused, req.arrival,
                                model.piece, model.is_eog,
                                # only a reply that could have drafted teaches drafting
                                prompt=req.prompt if _could_draft(req) else None,
                                replays=replays)
        self.spec = (DraftState(drafter, k=getattr(drafter, "k_start", 4),
                                k_max=getattr(drafter, "k_max", 12))
                     if drafter is not None else None)
        self.draft: tuple[int, ...] = ()  # proposed for this step
        self.guessed = False  # the draft is a free row's guess (SpeculativeDecoder)
        self.media = req.spans
        self.embd: dict[int, np.ndarray] = {}  # encoder output of the span being prefilled
        # verifying a sampled draft draws from this (the sampler's seed: a seed replays)
        self.rng = np.random.default_rng(self.sampler.seed) if drafter is not None else None
        self.kv_edited = False  # a KV policy moved cells: they are no prefill's state
        # a prompt length whose state goes to the tiered store when the prefill reaches
        # it: where this prompt leaves a prefix other conversations share (engine/kv/tiers.py)
        self.checkpoint = 0
        if drafter is not None:
            self.out.metrics.draft = drafter.name

    @property
    def metrics(self) -> GenerationMetrics:
        return self.out.metrics

    @property
    def prefilling(self) -> bool:
        return self.n_prefilled < len(self.req.prompt)

    @property
    def n_past(self) -> int:
        return len(self.slot.cached)

    def needs(self) -> SeqNeeds:
        return SeqNeeds(self.slot.index, self.n_past, self.req.prompt, self.n_prefilled,
                        self.pending, self.draft, self.media, self.checkpoint)


def _could_draft(req: Request) -> bool:
    """Whether n-gram drafting could have run on this request: its sampling can be
    verified (speculative.can_draft) and it holds no media (the scheduler drafts none)."""
    return can_draft(req.sampling) and not req.spans
