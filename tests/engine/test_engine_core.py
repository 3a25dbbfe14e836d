"""The engine loop (engine/core.py): the one driver of `Scheduler.step`, what it does
between steps, and what a failed step costs (tiny model, real llama.cpp)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferenceos.engine.core import EngineCore
from inferenceos.engine.messages import Failed, Finished, TokenOut
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import Request, Scheduler
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams

SRC = Path(__file__).resolve().parents[2] / "src" / "inferenceos"
GREEDY = SamplingParams(temperature=0, max_tokens=8)


def test_only_the_engine_loop_calls_step() -> None:
    """Every `<x>.step(...)` call in src/ is in engine/core.py: the worker, the
    in-process engine and `run` go through EngineCore, none steps a scheduler itself."""
    callers = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "step"):
                callers.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert len(callers) == 1 and callers[0].startswith("engine/core.py:"), callers


@pytest.fixture(scope="module")
def lm(tiny_llama: Path) -> Iterator[LoadedModel]:
    settings = LlamaParams(n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=2, n_threads=1)
    with LoadedModel(tiny_llama, settings) as model:
        yield model


def _scheduler(lm: LoadedModel, n: int = 2) -> Scheduler:
    sched = Scheduler(lm, 2, 64)
    for i in range(1, n + 1):
        sched.submit(Request(i, lm.tokenize(f"request {i}"), GREEDY))
    return sched


def test_steps_run_until_no_work_and_ask_before_each(lm: LoadedModel) -> None:
    sched = _scheduler(lm)
    asked = 0

    def go_on() -> bool:
        nonlocal asked
        asked += 1
        return True

    steps = list(EngineCore(lambda: sched).steps(go_on))
    finished = {ev.req_id for events in steps for ev in events if isinstance(ev, Finished)}
    assert finished == {1, 2} and not sched.has_work()
    assert asked == len(steps) + 1  # once before each step, and once more to end
    sched.close()


def test_go_on_stops_the_loop_between_steps(lm: LoadedModel) -> None:
    sched = _scheduler(lm)
    core = EngineCore(lambda: sched)
    first = next(core.steps())
    assert list(core.steps(lambda: False)) == []  # asked first: no step taken
    assert sched.has_work() and first is not None
    sched.close()


def test_a_sleeping_worker_has_no_work() -> None:
    core = EngineCore(lambda: None)
    assert not core.has_work() and list(core.steps()) == []


class _Broken(Exception):
    pass


def _break_once(sched: Scheduler, exc: BaseException) -> None:
    """The next step raises `exc` from inside the scheduler, after it admitted."""
    real = sched.executor.decode

    def decode(*args: object, **kw: object) -> object:
        sched.executor.decode = real  # type: ignore[method-assign]
        raise exc

    sched.executor.decode = decode  # type: ignore[method-assign]


def test_contained_failure_fails_the_requests_not_the_loop(lm: LoadedModel) -> None:
    sched = _scheduler(lm)
    core = EngineCore(lambda: sched, contain=True)
    next(core.steps())  # both admitted and running
    _break_once(sched, _Broken("boom"))
    events = next(core.steps())
    assert {ev.req_id for ev in events if isinstance(ev, Failed)} == {1, 2}
    assert all("internal error in the scheduler" in ev.message
               for ev in events if isinstance(ev, Failed))
    assert set(core.cut) == {1, 2}
    sched.submit(Request(3, lm.tokenize("after"), GREEDY))  # the loop goes on
    later = [ev for evs in core.steps() for ev in evs]
    assert any(isinstance(ev, TokenOut) and ev.req_id == 3 for ev in later)
    sched.close()


@pytest.mark.parametrize(("exc", "contain"), [(_Broken("boom"), False),
                                              (KeyboardInterrupt(), True)])
def test_uncontained_failure_propagates_after_failing(lm: LoadedModel, exc: BaseException,
                                                      contain: bool) -> None:
    """An error outside the worker, or Ctrl-C anywhere (contained or not), propagates;
    the requests of the cut step are failed first, for the caller to deliver."""
    sched = _scheduler(lm)
    core = EngineCore(lambda: sched, contain=contain)
    next(core.steps())
    _break_once(sched, exc)
    with pytest.raises(type(exc)):
        next(core.steps())
    assert {ev.req_id for ev in core.failed} == {1, 2}
    assert not sched.running
    sched.close()
