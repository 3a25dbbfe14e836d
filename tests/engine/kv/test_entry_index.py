"""The KV store's entry index: the groups by first tokens and the lexicographic order
stay in step with the dict through every mutation, and the neighbours of a prompt hold
the longest common prefix any entry has with it (what KVStore.lookup relies on)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from inferenceos.engine.kv.entry_index import EntryIndex


@dataclass(eq=False)
class E:
    tokens: np.ndarray


def lcp(a: np.ndarray, b: list[int]) -> int:
    n = min(a.size, len(b))
    diff = np.flatnonzero(a[:n] != np.asarray(b[:n]))
    return n if diff.size == 0 else int(diff[0])


seqs = st.lists(st.integers(0, 4), min_size=0, max_size=12)  # few ids: many shared prefixes


@settings(max_examples=200, deadline=None)
@given(st.lists(seqs, max_size=30), st.lists(st.integers(0, 40), max_size=20), seqs)
def test_neighbours_hold_the_longest_common_prefix(entries: list[list[int]],
                                                   drops: list[int], prompt: list[int]) -> None:
    idx: EntryIndex[E] = EntryIndex(2)
    for i, toks in enumerate(entries):
        idx[f"e{i}"] = E(np.asarray(toks, dtype=np.int32))
    for d in drops:  # removals by pop and del, some of ids not there
        if d % 2:
            idx.pop(f"e{d}", None)
        elif f"e{d}" in idx:
            del idx[f"e{d}"]
    if not idx:
        assert idx.neighbours(prompt) == []
        return
    best = max(lcp(e.tokens, prompt) for e in idx.values())
    near = idx.neighbours(prompt)
    held = {id(e) for e in idx.values()}
    assert 1 <= len(near) <= 2 and all(id(e) in held for e in near)
    assert max(lcp(e.tokens, prompt) for e in near) == best
    # the groups: exactly the entries sharing the prompt's first 2 tokens
    want = {id(e) for e in idx.values() if len(prompt) >= 2 and e.tokens.size >= 2
            and list(e.tokens[:2]) == prompt[:2]}
    assert {id(e) for e in idx.candidates(prompt)} == want


def test_a_replaced_entry_leaves_no_trace_and_clear_empties_all() -> None:
    idx: EntryIndex[E] = EntryIndex(1)
    idx["a"] = E(np.array([1, 2, 3], dtype=np.int32))
    idx["a"] = E(np.array([7, 8], dtype=np.int32))  # same id, other tokens
    assert [list(e.tokens) for e in idx.neighbours([1, 2, 3])] == [[7, 8]]
    assert list(idx.candidates([1, 2])) == [] and len(list(idx.candidates([7]))) == 1
    idx.clear()
    assert idx.neighbours([7, 8]) == [] and list(idx.candidates([7])) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(seqs, max_size=30), seqs, st.integers(0, 4))
def test_prefixes_and_extended_agree_with_a_scan_of_every_entry(
        entries: list[list[int]], tokens: list[int], min_len: int) -> None:
    """What a put supersedes (KVStore._supersede): every entry that is a proper prefix
    of the new tokens, of min_len or more, longest first; and whether another entry
    extends one."""
    idx: EntryIndex[E] = EntryIndex(2)
    for toks in entries:
        idx["-".join(map(str, toks))] = E(np.asarray(toks, dtype=np.int32))
    want = sorted((e for e in idx.values()
                   if min_len <= e.tokens.size < len(tokens)
                   and list(e.tokens) == tokens[:e.tokens.size]),
                  key=lambda e: -e.tokens.size)
    assert [id(e) for e in idx.prefixes(tokens, min_len)] == [id(e) for e in want]
    for e in idx.values():
        longer = any(o is not e and o.tokens.size > e.tokens.size
                     and list(o.tokens[:e.tokens.size]) == list(e.tokens)
                     for o in idx.values())
        assert idx.extended(e) == longer
