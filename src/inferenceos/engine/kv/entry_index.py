"""The KV store's entries by id, and by the first tokens they hold.

Every prefix question the store answers for a prompt (its longest cached prefix, where
it branches from a cached conversation, which entries it extends) is about entries
that share at least the prompt's first `head` tokens: a hit must share `min_gain`
tokens or more, a branch point or a superseded entry `min_tokens` or more (store.py).
Scanning every entry for them cost ~3 µs an entry in numpy calls, on the scheduler's
thread at each admission: 0.4-0.9 ms a request after a few hundred requests of
`overhead.py` (the tiny llama, one stream), growing with the store. `EntryIndex`
keeps the entries grouped by their first `head` tokens as they are added and removed,
so those questions look only at the entries that can answer them. When every entry
shares the head (one system prompt before every conversation; the tiny llama reads
bytes, so "Client 0 request ..." does), that is all of them: for the longest prefix,
the entries are also kept in the lexicographic order of their tokens, where the
longest common prefix of a prompt with any entry is that of one of its two neighbours
(`neighbours`): two comparisons instead of one per entry. The same order answers which
entries a new one extends (`prefixes`, `extended`): a put compared itself with its whole
group before, ~0.5 µs an entry, 2.2 ms a reply once 4,000 entries were held.
"""

from __future__ import annotations

import bisect
from typing import Any, Protocol, TypeVar

import numpy as np


class HasTokens(Protocol):
    """What the index reads of an entry: the token ids it holds, in order."""

    tokens: np.ndarray


E = TypeVar("E", bound=HasTokens)


class EntryIndex(dict[str, E]):
    """A dict of entries by id that also groups them by their first `head` tokens
    (entries shorter than `head` are in the dict but in no group: they can answer
    none of the questions above). Mutate it only through item assignment, `pop`,
    `del` and `clear`, which keep the groups in step."""

    def __init__(self, head: int) -> None:
        super().__init__()
        self.head = max(0, head)
        self._groups: dict[tuple[int, ...], dict[str, E]] = {}
        self._order: list[tuple[bytes, str]] = []  # (sort key of its tokens, id)

    def _key(self, tokens: Any) -> tuple[int, ...] | None:
        if len(tokens) < self.head:
            return None
        return tuple(int(t) for t in tokens[:self.head])

    def candidates(self, tokens: Any) -> list[E]:
        """The entries whose first `head` tokens are those of `tokens` (a list or an
        array of token ids), in a list of their own (the caller may change the index
        while it walks them); none when `tokens` is shorter than `head`."""
        key = self._key(tokens)
        group = self._groups.get(key) if key is not None else None
        return list(group.values()) if group else []

    def neighbours(self, tokens: Any) -> list[E]:
        """The entries just before and just after `tokens` in the lexicographic order
        of token sequences: between them, the longest common prefix of `tokens` with
        any entry (token ids >= 0; a negative one, a media cell, only makes the pick
        miss a prefix, never a wrong one: the caller compares the tokens)."""
        i = bisect.bisect_left(self._order, (_sort_key(tokens), ""))
        return [self[eid] for _, eid in self._order[max(0, i - 1):i + 1]]

    def prefixes(self, tokens: Any, min_len: int) -> list[E]:
        """The entries whose tokens are a proper prefix of `tokens`, of `min_len` tokens
        or more, longest first. Walks down the lexicographic order by jumps: the largest
        entry below `tokens[:n]` shares some `m < n` tokens with `tokens`, and any shorter
        prefix entry is at or below it (it starts with that prefix), so the next place to
        look is `tokens[:m]`: a bisection and one comparison per prefix length tried."""
        arr = np.asarray(tokens, dtype=np.int64)
        key = _sort_key(arr)
        out: list[E] = []
        n = arr.size
        while n >= min_len:
            i = bisect.bisect_left(self._order, (key[:4 * n], ""))
            if n < arr.size and i < len(self._order) and self._order[i][0] == key[:4 * n]:
                out.append(self[self._order[i][1]])
            if i == 0 or n == 0:
                break
            # the entry just below: when it is itself a prefix, the next turn finds it
            n = common_count(self[self._order[i - 1][1]].tokens, arr, n - 1)
        return out

    def extended(self, entry: E) -> bool:
        """Whether another entry holds all of `entry`'s tokens and more: the entries that
        start with them come right after it in the order."""
        key = _sort_key(entry.tokens)
        i = bisect.bisect_right(self._order, (key, "\uffff"))
        return i < len(self._order) and self._order[i][0].startswith(key)

    def __setitem__(self, eid: str, entry: E) -> None:
        if eid in self:
            self._ungroup(eid, super().__getitem__(eid))
        super().__setitem__(eid, entry)
        key = self._key(entry.tokens)
        if key is not None:
            self._groups.setdefault(key, {})[eid] = entry
        bisect.insort(self._order, (_sort_key(entry.tokens), eid))

    def __delitem__(self, eid: str) -> None:
        self._ungroup(eid, super().__getitem__(eid))
        super().__delitem__(eid)

    def pop(self, eid: str, *default: Any) -> Any:
        if eid in self:
            self._ungroup(eid, super().__getitem__(eid))
        return super().pop(eid, *default)

    def clear(self) -> None:
        super().clear()
        self._groups.clear()
        self._order.clear()

    def _ungroup(self, eid: str, entry: E) -> None:
        key = self._key(entry.tokens)
        group = self._groups.get(key) if key is not None else None
        if group is not None:
            group.pop(eid, None)
            if not group:
                del self._groups[key]  # type: ignore[arg-type]
        item = (_sort_key(entry.tokens), eid)
        i = bisect.bisect_left(self._order, item)
        if i < len(self._order) and self._order[i] == item:
            del self._order[i]


def common_count(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    """How many leading tokens the arrays `a` and `b` share, at most `limit` (in numpy:
    engine/kv/slots.shared_prefix is its form for lists)."""
    n = min(a.size, b.size, limit)
    diff = np.flatnonzero(a[:n] != b[:n])
    return n if diff.size == 0 else int(diff[0])


def _sort_key(tokens: Any) -> bytes:
    """Token ids as big-endian 32-bit words: bytes compare as the id sequences do
    (lexicographically, a prefix first), in C."""
    return np.asarray(tokens, dtype=np.int64).astype(">u4").tobytes()
