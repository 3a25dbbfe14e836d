"""Entries at the prefixes conversations share (KVStore.branch_point): where only
whole entries restore (windowed models), the second conversation that parts from a
stored one stores the shared prefix once, and every later one restores it whole; with
full attention every conversation restores it from any entry holding it. Real
llama.cpp on the tiny model, a real store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferenceos.engine.kv.store import KVStore, entry_id
from inferenceos.engine.messages import TokenOut
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import Request, Scheduler
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams

MiB = 1 << 20
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
SYSTEM = "You are terse. Answer in one word. " * 4


@pytest.fixture(scope="module")
def lm(tiny_llama: Path) -> Iterator[LoadedModel]:
    with LoadedModel(tiny_llama, LlamaParams(n_ctx=1024, n_batch=64, n_threads=1)) as model:
        yield model


def chat(lm: LoadedModel, user: str) -> list[int]:
    return lm.tokenize(SYSTEM + "User: " + user)


def turn(sched: Scheduler, req_id: int, prompt: list[int]) -> int:
    """Run one request to its end and store its turn; the prompt tokens it reused."""
    sched.submit(Request(req_id, prompt, GREEDY))
    cached = 0
    while sched.has_work():
        for ev in sched.step():
            if isinstance(ev, TokenOut) and sched.running:
                cached = sched.running[0].metrics.cached_tokens
    sched.store_finished()
    return cached


def shared(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def test_branch_point_is_where_a_prompt_and_an_entry_part() -> None:
    s = KVStore("k", None, 64 * MiB, 0, min_tokens=4)
    s.put(list(range(40)), b"x" * 100, 1.0)
    assert s.branch_point([*list(range(20)), 99, 98, 97]) == 20
    assert s.branch_point([*list(range(3)), 99, 98]) == 0  # shorter than min_tokens
    assert s.branch_point(list(range(50))) == 0  # it extends the entry: a plain hit
    assert s.branch_point(list(range(30))) == 0  # inside the entry: nothing parts
    s.put(list(range(20)), b"y" * 50, 1.0)
    assert s.branch_point([*list(range(20)), 99, 98, 97]) == 0  # held already


def test_a_shared_prefix_outlives_the_turns_that_extend_it() -> None:
    s = KVStore("k", None, 64 * MiB, 0, min_tokens=4)
    a, b = list(range(40)), list(range(20)) + list(range(100, 120))
    s.put(a, b"a" * 100, 1.0)
    s.put(a[:20], b"s" * 50, 1.0)  # the branch point's entry
    s.put(b, b"b" * 100, 1.0)  # extends the shared prefix: must not supersede it
    s.put([*b, 7, 7], b"c" * 100, 1.0)  # extends b alone: b goes
    ids = set(s.entries)
    key = np.asarray(a[:20], dtype=np.int32)
    assert entry_id("k", key) in ids and entry_id("k", np.asarray(b, dtype=np.int32)) not in ids


@pytest.mark.parametrize("partial", [True, False], ids=["full-attention", "windowed"])
def test_the_second_conversation_stores_the_system_prompt_and_the_third_restores_it(
        lm: LoadedModel, partial: bool) -> None:
    store = KVStore("test-key", None, 64 * MiB, 0, partial=partial)
    first, second, third = (chat(lm, u) for u in ("red?", "blue?", "green?"))
    common = shared(first, second)
    assert common == shared(first, third) >= store.min_tokens
    turn(Scheduler(lm, 1, 64, kv_store=store), 1, first)
    assert [e.n_tokens for e in store.entries.values()] == [len(first) + 3]
    # a fresh context each time (a new worker): only the store holds anything
    restored = turn(Scheduler(lm, 1, 64, kv_store=store), 2, second)
    sizes = sorted(e.n_tokens for e in store.entries.values())
    # windowed: the shared prefix, stored when the second conversation parted; full
    # attention: the second restored it from the first's entry, no copy was needed
    assert (common in sizes) != partial and restored == (common if partial else 0)
    assert turn(Scheduler(lm, 1, 64, kv_store=store), 3, third) == common
