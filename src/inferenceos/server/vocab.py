"""A model's vocabulary in the server process, for llama.cpp's token-level API.

llama-server answers /tokenize, /detokenize, token prompts mixed with text, string
logit biases and `ignore_eos` from its vocabulary without touching a slot. We do the
same: `vocab_for(path)` loads the GGUF with `vocab_only` (no weights, no context; Gemma
3's 262 144 tokens in about a second), once per file, and keeps a few. Every call holds
the vocabulary's lock: llama.cpp's tokenizer keeps caches that are not documented as
thread-safe.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections import OrderedDict
from pathlib import Path

from inferenceos.engine.llama.lib import lib, log
from inferenceos.engine.llama.structs import vocab_only_params
from inferenceos.engine.llama.tokens import prompt_ids, tokenize
from inferenceos.errors import ModelLoadError, UsageError

_MAX_CACHED = 4
_cache: OrderedDict[Path, Vocab] = OrderedDict()
_cache_lock = threading.Lock()


class Vocab:
    """Tokenize, detokenize and describe tokens of one GGUF file (see module contract)."""

    def __init__(self, path: Path) -> None:
        ll = lib()
        mark = log().mark()
        self._model = ll.llama_model_load_from_file(str(path).encode(), vocab_only_params())
        if not self._model:
            why = "; ".join(log().errors_since(mark)[-3:]) or "see --verbose"
            raise ModelLoadError(f"llama.cpp could not read the vocabulary of {path}: {why}")
        self._ll = ll
        self._vocab = ll.llama_model_get_vocab(self._model)
        self._lock = threading.Lock()
        self.path = path
        self.n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))
        self.bos = int(ll.llama_vocab_bos(self._vocab))
        self.eos = int(ll.llama_vocab_eos(self._vocab))
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self._vocab))

    @functools.cached_property
    def eog(self) -> tuple[int, ...]:
        """End-of-generation tokens (a scan of the vocabulary: computed once, on demand)."""
        with self._lock:
            return tuple(t for t in range(self.n_vocab)
                         if self._ll.llama_vocab_is_eog(self._vocab, t))

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True
                 ) -> list[int]:
        """Text → token ids (a BOS first when `add_special` and the model wants one)."""
        with self._lock:
            ids = tokenize(self._vocab, text, add_special, parse_special)
        if ids is None:
            raise UsageError("the text could not be tokenized")
        return ids

    def prompt_ids(self, text: str, add_special: bool = True) -> list[int]:
        """The ids the model worker makes of the prompt `text` (`LoadedModel.tokenize`:
        special tokens parsed, a doubled BOS made one)."""
        return prompt_ids(self.tokenize(text, add_special), self.bos)

    def check(self, ids: list[int]) -> list[int]:
        """`ids` unchanged; UsageError for an id outside the vocabulary (llama.cpp does
        not bounds-check ids itself)."""
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.n_vocab:
                raise UsageError(f"token id {t!r} is outside the vocabulary "
                                 f"(0..{self.n_vocab - 1})"[:200])
        return ids

    def piece(self, token: int, special: bool = True) -> bytes:
        """The bytes of one token (control tokens as their text when `special`)."""
        self.check([token])
        with self._lock:
            buf = ctypes.create_string_buffer(64)
            n = self._ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)]

    def detokenize(self, ids: list[int], special: bool = True) -> str:
        """Token ids → text, as llama.cpp's `common_detokenize` (invalid UTF-8 replaced)."""
        self.check(ids)
        if not ids:
            return ""
        arr = (self._ll.llama_token * len(ids))(*ids)
        with self._lock:
            size = len(ids) * 8 + 16
            buf = ctypes.create_string_buffer(size)
            n = self._ll.llama_detokenize(self._vocab, arr, len(ids), buf, size, False, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._ll.llama_detokenize(self._vocab, arr, len(ids), buf, -n, False,
                                              special)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", errors="replace")

    @functools.cached_property
    def specials(self) -> dict[str, int]:
        """The special tokens infill and rerank prompts are built of (-1 where the model
        has none): `fim_pre`, `fim_suf`, `fim_mid`, `fim_pad`, `fim_rep`, `fim_sep`
        (llama.cpp reads them from `tokenizer.ggml.fim_*_token_id`), `sep`; and the
        vocabulary's `add_eos` / `add_sep` flags as 0 or 1."""
        ll, v = self._ll, self._vocab
        with self._lock:
            out = {name: int(getattr(ll, f"llama_vocab_{name}")(v))
                   for name in ("fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep",
                                "fim_sep", "sep")}
            out["add_eos"] = int(bool(ll.llama_vocab_get_add_eos(v)))
            out["add_sep"] = int(bool(ll.llama_vocab_get_add_sep(v)))
        return out

    def meta(self, key: str) -> str | None:
        """The GGUF metadata value at `key` as text (None when the file has none)."""
        with self._lock:
            buf = ctypes.create_string_buffer(256)
            n = self._ll.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
            if n >= len(buf):
                buf = ctypes.create_string_buffer(n + 1)
                n = self._ll.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def close(self) -> None:
        with self._lock:
            if self._model:
                self._ll.llama_model_free(self._model)
                self._model = None

    def __del__(self) -> None:  # pragma: no cover - interpreter teardown order varies
        with contextlib.suppress(Exception):
            self.close()


def cached_vocab(path: Path) -> Vocab | None:
    """The vocabulary of the GGUF at `path` when it is cached (then the most recently
    used), else None. Never blocks on the file (only on the cache's lock, held for dict
    operations): for an event loop, where `vocab_for`'s load would stall every stream."""
    key = Path(path)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
        return hit


def vocab_for(path: Path) -> Vocab:
    """The (cached) vocabulary of the GGUF at `path`. Blocking: call from a thread."""
    key = Path(path)
    hit = cached_vocab(key)
    if hit is not None:
        return hit
    vocab = Vocab(key)  # outside the lock: a second file need not wait for this one
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            vocab.close()
            return hit
        _cache[key] = vocab
        while len(_cache) > _MAX_CACHED:
            _cache.popitem(last=False)[1].close()
    return vocab
