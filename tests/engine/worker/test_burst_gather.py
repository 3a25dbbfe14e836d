"""An idle worker whose last step ended several streams together waits, after the
first of their next requests, for the rest before its next step (engine/worker/
main.py, `_Inbox.take`, GATHER_S): on the real pipe, the message handling replaced by
a recorder (the inbox's timing is under test, not the scheduler)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from types import SimpleNamespace
from typing import Any

import pytest

import inferenceos.engine.worker.main as main
from inferenceos.engine.messages import Generate, ToWorker
from inferenceos.engine.sampling import SamplingParams


class Worker:
    """An `_Inbox` on a real pipe whose Generates are recorded (`got`); `first` is set
    as the first is handled (a sender waits on it, not on a sleep)."""

    def __init__(self, child: Connection) -> None:
        self.got: list[ToWorker] = []
        self.first = threading.Event()
        sched = SimpleNamespace(has_work=lambda: bool(self.got), store_due_in=lambda: None)
        self.inbox = main._Inbox(child, SimpleNamespace(sched=sched))  # type: ignore[arg-type]

    def dispatch(self, msg: ToWorker, rt: Any) -> list[Any]:
        self.got.append(msg)
        self.first.set()
        return []


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Worker, Connection]]:
    parent, child = mp.get_context("spawn").Pipe()
    w = Worker(child)
    monkeypatch.setattr(main, "_dispatch", w.dispatch)
    monkeypatch.setattr(main, "GATHER_S", 30.0)  # what a slow machine might need, and more
    yield w, parent
    parent.close()
    child.close()


def _gen(rid: int) -> Generate:
    return Generate([1, 2], SamplingParams(max_tokens=4), req_id=rid)


def _after_first(w: Worker, parent: Connection, rids: list[int]) -> threading.Thread:
    """Send `rids` once the first request was handled (the rest of a burst, late)."""
    def send() -> None:
        assert w.first.wait(30)
        for rid in rids:
            parent.send(_gen(rid))
    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


def test_the_rest_of_a_returning_burst_joins_the_first(
        worker: tuple[Worker, Connection]) -> None:
    w, parent = worker
    w.inbox.returned(3, main.STEP_S)  # the step that left it idle ended three streams
    parent.send(_gen(1))
    t = _after_first(w, parent, [2, 3])
    t0 = time.monotonic()
    assert w.inbox.take(block=True)
    assert [m.req_id for m in w.got] == [1, 2, 3]  # all three before the next step
    assert time.monotonic() - t0 < 20  # not the whole window: it ended with the third
    t.join(5)


def test_a_lone_end_a_late_return_or_a_short_step_does_not_wait(worker: tuple[Worker, Connection]
                                                   ) -> None:
    w, parent = worker
    for ended, step_s, ago in ((1, 1.0, 0.0), (4, 1.0, main.RETURN_S + 1),
                               (4, main.STEP_S / 2, 0.0)):
        w.got.clear()
        w.inbox.returned(ended, step_s)
        w.inbox._ended_at -= ago  # (ended that long ago)
        parent.send(_gen(1))
        t0 = time.monotonic()
        assert w.inbox.take(block=True)
        assert len(w.got) == 1 and time.monotonic() - t0 < 20  # no window at all


def test_a_burst_that_does_not_come_back_waits_one_window(
        worker: tuple[Worker, Connection], monkeypatch: pytest.MonkeyPatch) -> None:
    w, parent = worker
    monkeypatch.setattr(main, "GATHER_S", 0.05)
    w.inbox.returned(2, main.STEP_S)
    parent.send(_gen(1))
    t0 = time.monotonic()
    assert w.inbox.take(block=True)
    assert len(w.got) == 1 and time.monotonic() - t0 >= 0.04  # (poll's ms, rounded up)
    w.got.clear()
    monkeypatch.setattr(main, "GATHER_S", 30.0)
    parent.send(_gen(2))  # the window is spent: the next request waits for nothing
    t0 = time.monotonic()
    assert w.inbox.take(block=True) and len(w.got) == 1
    assert time.monotonic() - t0 < 20
