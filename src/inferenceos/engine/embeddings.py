"""Pooled embeddings of texts, on a second llama.cpp context beside a model's main one.

`Embedder(lm)` creates its context on `lm`'s weights the first time it is asked
(llama.cpp's mean pooling, L2-normalised here) and frees it on `close()`. A reranker
(a GGUF whose `<arch>.pooling_type` is 4, LLAMA_POOLING_TYPE_RANK) gets a rank-pooled
context instead: each "text" is then a query and document pair already formatted as
one token sequence (server/rerank.py), and its vector is the classification head's
raw output (`n_cls_out` floats, not normalised; the relevance score is the first, as
llama-server reads it). `rank` tells which a model is. `LoadedModel`
owns one and keeps `embed` / `embed_many` as its own verbs, which call it. This module
knows the model only as `EmbeddingHost`, the few members it reads (session.py imports
this one, so it cannot import session's class back). Up to
`SEQS` texts share one llama_decode; a text must fit whole in one micro-batch, so the
context is at most 2048 cells.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from inferenceos import interrupt
from inferenceos.engine.llama.batch import TokenBatch
from inferenceos.engine.llama.lib import lib
from inferenceos.engine.llama.structs import embedding_context_params
from inferenceos.errors import GenerationError, ModelLoadError, UsageError
from inferenceos.plan.llama_params import LlamaParams

MAX_CELLS = 2048  # the embedding context's size cap (each text whole in one ubatch)
POOLING_RANK = 4  # llama.h's LLAMA_POOLING_TYPE_RANK, as a GGUF's pooling_type spells it


def pooling_type(model: Any) -> int | None:
    """The `<arch>.pooling_type` a loaded llama_model's GGUF declares (None: none)."""
    ll = lib()

    def meta(key: str) -> str | None:
        buf = ctypes.create_string_buffer(128)
        n = ll.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
        return buf.value.decode() if 0 <= n < len(buf) else None

    arch = meta("general.architecture")
    value = meta(f"{arch}.pooling_type") if arch else None
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


class EmbeddingHost(Protocol):
    """What an Embedder reads of its model (session.LoadedModel is one)."""

    @property
    def path(self) -> Path: ...
    @property
    def settings(self) -> LlamaParams: ...
    @property
    def model(self) -> Any: ...  # the llama_model pointer
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    def tokenize(self, text: str) -> list[int]: ...


class Embedder:
    """The embedding context of one LoadedModel. Not thread-safe (as the model)."""

    SEQS = 8  # texts pooled in one llama_decode

    def __init__(self, lm: EmbeddingHost) -> None:
        self._lm = lm
        self._ll = lib()
        self._ctx: Any = None
        self._rank: bool | None = None

    @property
    def rank(self) -> bool:
        """Whether the model is a reranker (its vectors are scores, see the module)."""
        if self._rank is None:
            self._rank = pooling_type(self._lm.model) == POOLING_RANK
        return self._rank

    def _context(self) -> Any:
        if self._ctx is None:
            lm = self._lm
            n_ctx = min(lm.n_ctx, MAX_CELLS)
            params = embedding_context_params(lm.settings, n_ctx, self.SEQS, self.rank)
            ctx = self._ll.llama_init_from_model(lm.model, params)
            if not ctx:
                why = f"llama.cpp could not create an embedding context for {lm.path}"
                raise ModelLoadError(why)
            self._ctx = ctx
        return self._ctx

    def close(self) -> None:
        """Free the context (a later call creates it again)."""
        if self._ctx is not None:
            self._ll.llama_free(self._ctx)
            self._ctx = None

    def embed_many(self, texts: Sequence[str | list[int]]) -> list[list[float]]:
        """Embeddings of `texts`, in order. An item may be token ids (llama.cpp's API),
        checked against the vocabulary; UsageError for an empty or too long text."""
        ctx = self._context()
        limit = int(self._ll.llama_n_ctx(ctx))
        token_lists = [self._tokens(text, limit) for text in texts]
        out: list[list[float]] = []
        group: list[list[int]] = []
        for tokens in token_lists:  # greedy packing: up to SEQS texts, `limit` tokens
            if group and (len(group) == self.SEQS or sum(map(len, group)) + len(tokens) > limit):
                out += self._embed_group(ctx, group)
                group = []
            group.append(tokens)
        if group:
            out += self._embed_group(ctx, group)
        return out

    def _tokens(self, text: str | list[int], limit: int) -> list[int]:
        lm = self._lm
        if not text:
            raise UsageError("cannot embed an empty text")
        if isinstance(text, list):
            bad = next((t for t in text if not 0 <= t < lm.n_vocab), None)
            if bad is not None:
                raise UsageError(f"token id {bad} is outside the vocabulary "
                                 f"(0..{lm.n_vocab - 1})")
        tokens = list(text) if isinstance(text, list) else lm.tokenize(text)
        if len(tokens) > limit:
            raise UsageError(f"a text has {len(tokens)} tokens; embeddings take at most {limit}")
        return tokens

    def _embed_group(self, ctx: Any, group: list[list[int]]) -> list[list[float]]:
        ll = self._ll
        ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
        batch = TokenBatch(sum(map(len, group)), self.SEQS)
        try:
            for seq, tokens in enumerate(group):
                for pos, tok in enumerate(tokens):
                    batch.add(tok, pos, seq, True)
            rc = ll.llama_decode(ctx, batch.raw)
            if rc != 0:
                if rc == 2:  # aborted: a Ctrl-C asked (session.decode_failed, which
                    interrupt.check()  # this module cannot import: session imports it)
                raise GenerationError("llama_decode failed while embedding")
        finally:
            batch.close()
        rank = self.rank
        model = self._lm.model
        n_out = int(ll.llama_model_n_cls_out(model) if rank else ll.llama_model_n_embd(model))
        vectors = []
        for seq in range(len(group)):
            ptr = ll.llama_get_embeddings_seq(ctx, seq)
            if not ptr:
                raise GenerationError("llama.cpp returned no pooled embedding")
            vec = [float(ptr[i]) for i in range(max(n_out, 1))]
            norm = 1.0 if rank else sum(v * v for v in vec) ** 0.5 or 1.0
            vectors.append([v / norm for v in vec])
        return vectors
