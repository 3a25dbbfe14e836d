"""N-gram (prompt-lookup) drafting: the match, the draft it earns, and the drafter.

A leaf (numpy and the drafter protocol's `DraftAsk` only), so the output processor can
replay what this drafter would have drafted on a finished generation (engine/spec/ngram_replay.py)
without loading anything. `engine/spec/drafters.py` registers `NgramDrafter`; import the match
helpers (`ngram_match`, `ngram_lookup`, `continuation`, `free_guess`, `draft_cap`)
from here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inferenceos.engine.spec.speculative import DraftAsk

MATCH_CAP = 64  # how far back a match's length is measured


def ngram_match(tokens: Sequence[int], n_max: int = 4, n_min: int = 2) -> tuple[int, int]:
    """(start, length): `start` is where the continuation of the most recent earlier
    occurrence of the last n tokens of `tokens` begins, for the largest n in n_max..n_min
    that occurs, and `length` how many tokens before `start` agree with the end of
    `tokens` (at least n, measured up to MATCH_CAP). (0, 0) if none."""
    arr = np.asarray(tokens, dtype=np.int64)
    size = len(arr)
    for n in range(n_max, n_min - 1, -1):
        if size <= n:
            continue
        tail = arr[size - n :]
        hit = np.ones(size - n, dtype=bool)  # window i = arr[i:i+n], followed by arr[i+n]
        for j in range(n):
            hit &= arr[j : size - n + j] == tail[j]
        found = np.flatnonzero(hit)
        if found.size:
            start = int(found[-1]) + n
            back = min(start, MATCH_CAP)  # compare backwards from both ends
            same = arr[start - back : start][::-1] == arr[size - back :][::-1]
            length = back if same.all() else int(np.argmin(same))
            return start, max(length, n)
    return 0, 0


class NgramIndex:
    """`ngram_match` over a sequence that only grows, in O(new tokens) per match: the
    latest start of every n-gram (n_min..n_max) seen before the sequence's last token,
    kept in a dict, instead of a scan of the whole sequence per match. The n-gram
    replay (ngram_replay.py) matches once per step of a finished reply: a scan per
    step cost ~0.1 ms each (18 ms for a 128-token reply), inside the scheduler's loop."""

    def __init__(self, tokens: Sequence[int], n_max: int = 4, n_min: int = 2) -> None:
        self.tokens = [int(t) for t in tokens]
        self.n_max, self.n_min = n_max, n_min
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> its latest start
        self._indexed = dict.fromkeys(range(n_min, n_max + 1), 0)  # windows added per n

    def extend(self, new: Sequence[int]) -> None:
        self.tokens.extend(int(t) for t in new)

    def match(self) -> tuple[int, int]:
        """`ngram_match(self.tokens, n_max, n_min)`, the same answer."""
        arr, size, latest = self.tokens, len(self.tokens), self._latest
        for n in range(self.n_max, self.n_min - 1, -1):
            if size <= n:
                continue
            # window i = arr[i:i+n], followed by arr[i+n]: every i <= size - n - 1
            for i in range(self._indexed[n], size - n):
                latest[tuple(arr[i:i + n])] = i
            self._indexed[n] = max(self._indexed[n], size - n)
            i = latest.get(tuple(arr[size - n:]), -1)
            if i < 0:
                continue
            start = i + n
            back = min(start, MATCH_CAP)  # compare backwards from both ends
            length = back
            for j in range(1, back + 1):
                if arr[start - j] != arr[size - j]:
                    length = j - 1
                    break
            return start, max(length, n)
        return 0, 0


def ngram_lookup(tokens: Sequence[int], k: int, n_max: int = 4, n_min: int = 2) -> list[int]:
    """Up to `k` tokens that followed the most recent earlier occurrence of the last n
    tokens of `tokens`, for the largest n in n_max..n_min that occurs; [] if none."""
    if k <= 0:
        return []
    start, length = ngram_match(tokens, n_max, n_min)
    return continuation(tokens, start, k) if length else []


def continuation(tokens: Sequence[int], start: int, k: int) -> list[int]:
    """The `k` tokens that follow a match whose continuation begins at `start`. Where
    they run past the end of `tokens` the text is a loop of period len - start (the
    match's end is the sequence's own end), so the continuation repeats: a greedy loop
    of 6 tokens is drafted 48 at a time, not 6."""
    cont = [int(t) for t in tokens[start : start + k]]
    period = len(cont)
    return [cont[i % period] for i in range(k)] if 0 < period < k else cont


def free_guess(tokens: Sequence[int], k: int) -> tuple[list[int], int]:
    """(up to `k` tokens, the match length they continue) to verify where a row costs
    nothing (engine/spec/row_shape.py): the continuation of the latest earlier occurrence of the
    last 4 down to 1 tokens, else the last token repeated (length 0). A guess, not a
    trusted draft; the length says which of several guesses is likelier."""
    if k <= 0 or not tokens:
        return [], 0
    start, length = ngram_match(tokens, 4, 1)
    if length:
        return continuation(tokens, start, k), length
    return [int(tokens[-1])] * k, 0


def draft_cap(length: int, k_max: int) -> int:
    """How many tokens a match of `length` tokens is trusted for: 2^(length - 2), from
    1 for a bigram (on free text a bigram's continuation is right about a third of the
    time, and each rejected row costs a share of a decode step) up to `k_max` for a
    match of 8 tokens or more (the text is being copied)."""
    return max(1, min(k_max, 1 << max(0, length - 2)))


class NgramDrafter:
    """Prompt-lookup drafting from the sequence's own tokens (module docstring).

    A draft is as long as its match earns (`draft_cap`): a bigram's continuation gets
    one token, a match of 8 tokens or more gets up to `k_max`; the sequence's DraftState
    caps that further after rejections. llama.cpp's ngram-simple drafts 48 tokens after
    a 12-token match: a copy is found later there (12 plain steps first) and a short
    match is never tried."""

    name = "ngram"
    footprint_bytes = 0
    # a lookup costs nothing, and a copied passage is accepted whole: draft long runs (as
    # llama.cpp's ngram-simple, 48), as far as the match length allows from the start;
    # a failed run costs only its verification rows, and the length then falls at once
    k_max = 48
    k_start = 48
    cost_prior = 0.15  # one verification row against a decode step (plan/speculative.py)
    # a match this long is a copy (draft_cap gives it k_max): drafted even while the
    # sequence's drafting is paused (DraftState.sure_ask)
    sure_match = 8

    def __init__(self, setup: object | None = None, n_max: int = 4, n_min: int = 2) -> None:
        """`setup` (a drafters.DraftSetup) is not needed: the lookup reads only the asks."""
        self.n_max, self.n_min = n_max, n_min

    def propose(self, asks: Sequence[DraftAsk]) -> list[list[int]]:
        drafts = []
        for a in asks:
            start, length = ngram_match(a.tokens, self.n_max, self.n_min) if a.k > 0 else (0, 0)
            k = min(a.k, draft_cap(length, self.k_max)) if length >= max(1, a.min_match) else 0
            drafts.append(continuation(a.tokens, start, k + a.spare) if k else [])
        return drafts

    def release(self, key: int) -> None:
        pass

    def close(self) -> None:
        pass
