"""When a finished turn's KV state goes to the tiered store (kv_tiers.PendingStores):
never on the path of a turn that continues it, always before its cells are dropped,
and by itself once the worker is idle. Real llama.cpp on the tiny model, a real store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferenceos.engine.engine import Engine
from inferenceos.engine.kv import tiers as kv_tiers
from inferenceos.engine.kv.entry import SUFFIX, is_temporary
from inferenceos.engine.kv.store import KVStore
from inferenceos.engine.messages import TokenOut
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import Request, Scheduler
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams

MiB = 1 << 20
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def lm(tiny_llama: Path) -> Iterator[LoadedModel]:
    with LoadedModel(tiny_llama, LlamaParams(n_ctx=1024, n_batch=64, n_threads=1)) as model:
        yield model


class Spied:
    """A RAM-only store that remembers the token lists it was given."""

    def __init__(self) -> None:
        self.store = KVStore("test-key", None, 64 * MiB, 0)
        self.puts: list[list[int]] = []
        real = self.store.put

        def put(tokens: list[int], data: bytes, cost_s: float) -> Any:
            self.puts.append(list(tokens))
            return real(tokens, data, cost_s)

        self.store.put = put  # type: ignore[method-assign]


def run(sched: Scheduler, req_id: int, prompt: list[int]) -> list[int]:
    """Submit and step until the scheduler has nothing to do now; the reply's tokens."""
    sched.submit(Request(req_id, prompt, GREEDY))
    out: list[int] = []
    while sched.has_work():
        out += [ev.token for ev in sched.step() if isinstance(ev, TokenOut) and ev.token >= 0]
    return out


def test_a_returning_turn_claims_its_slot_and_the_older_state_is_never_copied(
        lm: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spied()
    sched = Scheduler(lm, 1, 64, kv_store=spy.store)
    first = lm.tokenize("hello abc " * 10)
    reply = run(sched, 1, first)
    assert spy.puts == [] and sched.store_due_in() is not None  # waiting, not copied
    second = first + reply + lm.tokenize(" and then?", add_special=False)
    run(sched, 2, second)
    assert spy.puts == []  # turn 1's state was continued in its slot, never copied
    monkeypatch.setattr(kv_tiers, "STORE_AFTER_IDLE_S", 0.0)
    assert sched.has_work()  # due now: the idle worker steps to store it
    sched.step()
    assert len(spy.puts) == 1 and spy.puts[0][:len(second)] == second
    assert sched.store_due_in() is None and not sched.has_work()


def test_a_diverging_request_stores_the_finished_state_before_dropping_its_cells(
        lm: LoadedModel) -> None:
    spy = Spied()
    sched = Scheduler(lm, 1, 64, kv_store=spy.store)
    first = lm.tokenize("hello abc " * 10)
    reply = run(sched, 1, first)
    run(sched, 2, lm.tokenize("zebra xyz " * 4))  # shares nothing: the slot is given up
    held = first + reply[:-1]  # the reply's last token was sampled, never evaluated
    assert spy.puts[0] == held
    # and the stored state serves the conversation's return, instead of a prefill
    sched.submit(Request(3, held + lm.tokenize(" more", add_special=False), GREEDY))
    sched.step()
    assert sched.running[0].metrics.cached_tokens == len(held)


def test_an_idle_worker_writes_the_finished_turn_by_itself(
        tiny_llama: Path, tmp_path: Path) -> None:
    root = tmp_path / "kv"
    with Engine(tiny_llama, LlamaParams(n_ctx=512, n_batch=64, n_threads=1),
                kv_cache_ram=64 * MiB, kv_cache_disk=64 * MiB, kv_cache_dir=root) as e:
        g = e.generate(e.tokenize("hello abc " * 10), GREEDY)
        assert len([ev for ev in g if ev.token >= 0]) == GREEDY.max_tokens
        deadline = time.monotonic() + kv_tiers.STORE_AFTER_IDLE_S + 20
        files: list[Path] = []
        while not files and time.monotonic() < deadline:  # no request, no stats call
            files = [p for p in root.rglob(f"*{SUFFIX}") if not is_temporary(p.name)]
            time.sleep(0.05)
        assert len(files) == 1
