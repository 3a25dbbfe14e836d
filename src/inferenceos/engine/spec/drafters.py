"""The built-in drafters (speculative.Drafter): `ngram`, `self` and a draft model file.

- `NgramDrafter` (prompt lookup, Saxena 2023; llama.cpp's ngram-simple): finds the most
  recent earlier occurrence of the sequence's last n tokens (n from `n_max` down to
  `n_min`) in its own tokens, prompt and output, and proposes what followed it. No
  model, no memory; it shines when the answer quotes its prompt (editing, summaries,
  code, RAG answers).
- `ModelDrafter`: a small model with the same vocabulary (ids must mean the same
  tokens; a draft may have fewer, see engine/spec/self_draft.py) in the same worker
  process, with its own context of the target's size and one sequence per slot. Each
  step it catches up every asking sequence in one batched decode, then drafts greedily
  one position at a time for all of them together, stopping a sequence's draft once
  its top token's probability falls below `p_min` (llama.cpp's --draft-p-min).
- `SelfDrafter`: a ModelDrafter on the model's own layer-skipped copy (engine/spec/self_draft.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from inferenceos.engine import plugins
from inferenceos.engine.kv.slots import shared_prefix
from inferenceos.engine.llama.batch import TokenBatch
from inferenceos.engine.session import LoadedModel, decode_failed
from inferenceos.engine.spec.ngram import NgramDrafter
from inferenceos.engine.spec.speculative import ENTRY_POINT_GROUP, DraftAsk
from inferenceos.errors import GenerationError, ModelLoadError
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.plan.speculative import draft_kv_bytes, model_draft_cost


@dataclass(frozen=True)
class DraftSetup:
    """What a drafter may need to know about the engine it drafts for."""

    model_path: Path  # the target model
    settings: LlamaParams  # the target context's (n_ctx: all slots together)
    n_slots: int
    n_vocab: int
    draft_path: Path | None = None  # a draft model file (ModelDrafter)


class ModelDrafter:
    """Drafts with a small model of the same vocabulary (module docstring)."""

    name = "model"
    costly = True  # every ask costs a draft decode, answered or not (DraftState.missed)

    def __init__(self, setup: DraftSetup, path: Path | None = None, p_min: float = 0.5,
                 cost: float | None = None) -> None:
        """`cost`: one draft token's cost relative to a target decode step, before it is
        measured (None: plan.speculative.model_draft_cost from the two files' sizes). A
        drafter that could not pay even at a high acceptance never drafts (DraftState)."""
        path = Path(path or setup.draft_path or "")
        if not path.is_file():
            raise ModelLoadError(f"draft model {path} not found")
        draft_bytes, target_bytes = path.stat().st_size, Path(setup.model_path).stat().st_size
        # the draft's weight bytes over the target's: what one of its tokens costs
        # against one of the target's (decode and prefill are both weight-bound here)
        self.size_ratio = draft_bytes / max(1, target_bytes)
        self.cost_prior = cost if cost is not None else model_draft_cost(
            draft_bytes, target_bytes)
        s = setup.settings
        settings = replace(s, n_seq_max=setup.n_slots, kv_unified=True, tensor_buft_overrides=(),
                           tensor_split=(), type_k="f16", type_v="f16")
        self.lm = LoadedModel(path, settings)
        self.cut = self.lm.n_vocab  # ids from `cut` on are unknown to the draft
        if self.cut > setup.n_vocab:
            self.lm.close()
            raise ModelLoadError(
                f"the draft model's vocabulary ({self.cut} tokens) is not the model's "
                f"({setup.n_vocab}): a draft model must share the tokenizer"
            )
        unk = int(self.lm._ll.llama_vocab_unk(self.lm.vocab) if hasattr(
            self.lm._ll, "llama_vocab_unk") else 0)
        self.unk = unk if 0 <= unk < self.cut else 0
        self.p_min = p_min
        self.mem = self.lm._ll.llama_get_memory(self.lm.ctx)
        self.batch = TokenBatch(s.n_batch, setup.n_slots)
        self.cached: dict[int, list[int]] = {}
        from inferenceos.model.spec import load_spec

        # weights, and an f16 KV cache over every layer (the planner prices the same)
        kv = draft_kv_bytes(load_spec(path), self.lm.n_ctx)
        self.footprint_bytes = path.stat().st_size + kv

    # -- drafting ---------------------------------------------------------------------

    def behind(self, key: int, tokens: Sequence[int]) -> int:
        """How many of `tokens` the draft context of slot `key` has not evaluated: what
        its next draft must catch up on first (a whole prompt, for a new sequence)."""
        return len(tokens) - self._cached_prefix(key, self._mapped(tokens))

    def _mapped(self, tokens: Sequence[int]) -> list[int]:
        """`tokens` as the draft knows them (ids past its vocabulary as its unknown)."""
        return [t if t < self.cut else self.unk for t in tokens]

    def _cached_prefix(self, key: int, toks: list[int]) -> int:
        """How many leading tokens of `toks` (mapped) slot `key`'s draft cells hold."""
        return shared_prefix(self.cached.get(key, []), toks)

    def _sync(self, a: DraftAsk) -> list[int]:
        """Make the draft's cells for slot a.key a prefix of a.tokens; returns the
        tokens still to feed (at least the last, whose logits give the first draft)."""
        toks = self._mapped(a.tokens)
        cached = self.cached.setdefault(a.key, [])
        n = min(self._cached_prefix(a.key, toks), len(toks) - 1)
        if n < len(cached):
            self.lm._ll.llama_memory_seq_rm(self.mem, a.key, n, -1)
            del cached[n:]
        return toks[n:]

    def _choose(self, row: int) -> tuple[int, float]:
        """The draft's greedy token at batch row `row` and its probability."""
        logits = self.lm.logits_row(row)
        best = int(logits.argmax())
        p = 1.0 / float(np.exp(logits - logits[best]).sum())
        return best, p

    def _decode(self) -> None:
        rc = self.lm._ll.llama_decode(self.lm.ctx, self.batch.raw)
        if rc != 0:
            self.cached.clear()
            self.lm._ll.llama_memory_clear(self.mem, True)
            decode_failed(rc)
            raise GenerationError("the draft model's llama_decode failed")

    def propose(self, asks: Sequence[DraftAsk]) -> list[list[int]]:
        drafts: dict[int, list[int]] = {a.key: [] for a in asks}
        want = {a.key: a.k for a in asks if a.k > 0}
        feeds = [(a.key, self._sync(a)) for a in asks if a.k > 0]
        # catch up: every feed in as few decodes as the batch allows
        b = self.batch
        b.clear()
        ends: list[tuple[int, int]] = []  # (key, row) of feeds that end in this batch
        for key, feed in feeds:
            cached = self.cached[key]
            for i, tok in enumerate(feed):
                if b.free == 0:
                    self._decode()
                    self._first_drafts(ends, drafts)
                    b.clear()
                    ends = []
                last = i == len(feed) - 1
                row = b.add(tok, len(cached), key, last)
                cached.append(tok)
                if last:
                    ends.append((key, row))
        if b.n:
            self._decode()
            self._first_drafts(ends, drafts)
        # then one position at a time, all drafting sequences in one batch
        active = [k for k, d in drafts.items() if d and len(d) < want.get(k, 0)]
        while active:
            b.clear()
            rows = []
            for key in active:
                cached = self.cached[key]
                rows.append(b.add(drafts[key][-1], len(cached), key, True))
                cached.append(drafts[key][-1])
            self._decode()
            still = []
            for key, row in zip(active, rows, strict=True):
                tok, p = self._choose(row)
                if p >= self.p_min:
                    drafts[key].append(tok)
                    if len(drafts[key]) < want[key]:
                        still.append(key)
            active = still
        return [drafts[a.key] for a in asks]

    def _first_drafts(self, ends: list[tuple[int, int]], drafts: dict[int, list[int]]) -> None:
        for key, row in ends:
            tok, p = self._choose(row)
            if p >= self.p_min:
                drafts[key] = [tok]

    def release(self, key: int) -> None:
        pass  # the cells stay: the slot's next prompt may share their prefix

    def close(self) -> None:
        self.batch.close()
        self.lm.close()


class SelfDrafter(ModelDrafter):
    """Drafts with the model's own layer-skipped copy (engine/spec/self_draft.py), built
    on first use."""

    name = "self"

    def __init__(self, setup: DraftSetup, keep: float = 0.83, vocab: int = 0,
                 p_min: float = 0.5, cost: float | None = None) -> None:
        from inferenceos.engine.spec.self_draft import self_draft_path

        super().__init__(setup, self_draft_path(setup.model_path, keep, vocab), p_min, cost)


def available_drafters() -> dict[str, str]:
    """Installed drafter names → 'module:Class' (from the entry-point group)."""
    return plugins.registered(ENTRY_POINT_GROUP)


def drafter_class(name: str) -> Any:
    """The class registered as `name`; a name ending in .gguf is a draft model file."""
    if name.endswith(".gguf"):
        return ModelDrafter
    builtin = {"ngram": NgramDrafter, "self": SelfDrafter}
    return plugins.find(ENTRY_POINT_GROUP, name, builtin, "drafter", " or a .gguf path")


def make_drafter(name: str, setup: DraftSetup, **options: Any) -> Any:
    """The drafter `name` ('ngram', 'self', a registered plugin, or a .gguf path)."""
    cls = drafter_class(name)
    if cls is ModelDrafter or name.endswith(".gguf"):
        return ModelDrafter(replace(setup, draft_path=Path(name)), **options)
    return cls(setup, **options)
