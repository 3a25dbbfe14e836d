"""Text to token ids through llama.cpp, the one way both processes do it: the model
worker's `LoadedModel` (engine/session.py) and the server's vocabulary-only load
(server/vocab.py) give the same ids for the same prompt.
"""

from __future__ import annotations

from typing import Any

from inferenceos.engine.llama.lib import lib


def tokenize(vocab: Any, text: str, add_special: bool, parse_special: bool) -> list[int] | None:
    """`llama_tokenize` of `text` with `vocab` (a `llama_vocab` pointer), retried once
    with the size it asks for; None where llama.cpp refuses the text. Not thread-safe
    for one vocab (llama.cpp's tokenizer caches): the caller holds its lock."""
    ll = lib()
    data = text.encode("utf-8")
    n_max = len(data) + 8
    for _ in range(2):
        arr = (ll.llama_token * n_max)()
        n = ll.llama_tokenize(vocab, data, len(data), arr, n_max, add_special, parse_special)
        if n >= 0:
            return list(arr[:n])
        n_max = -n  # the buffer was too small: -n is the size needed
    return None


def prompt_ids(tokens: list[int], bos: int) -> list[int]:
    """A prompt's ids as the worker generates from them: a BOS written by the chat
    template and another added by the tokenizer become one."""
    if bos >= 0 and len(tokens) > 1 and tokens[0] == bos and tokens[1] == bos:
        return tokens[1:]
    return tokens
