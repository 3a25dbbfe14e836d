"""The engine loop: the one place that drives `Scheduler.step`.

The worker process (engine/worker/main.py), the in-process engine (local.py) and a
single sequence in process (`scheduler.generate_one`: `run`, `profile`) all step their
scheduler through `EngineCore.steps`, as vLLM's EngineCore is the one loop behind its
front ends. What differs between them is only what happens between two steps (the
worker reads its pipe, the in-process engine checks the caller's inbox and cancel) and
what a failed step means to them (`contain`); both are arguments here, not loops of
their own. tests/engine/test_engine_core.py checks that no other module calls `step`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.messages import Event, Failed
from inferenceos.engine.output import snapshot
from inferenceos.engine.running import RunningSequence


class Steppable(Protocol):
    """What the loop needs of `scheduler.Scheduler` (which imports this module)."""

    @property
    def running(self) -> Sequence[RunningSequence]: ...

    def has_work(self) -> bool: ...

    def step(self) -> list[Event]: ...

    def fail_all(self, message: str) -> list[Failed]: ...


def _always() -> bool:
    return True


class EngineCore:
    """Steps the scheduler that `scheduler()` returns now (None while a worker sleeps).

    `contain`: an exception in a step fails the running requests (their `Failed`
    events are that step's events) and the loop goes on; the worker contains, so a bug
    costs the requests in flight, not the process. Without it the exception propagates
    after the same failing (a `run` reports it; the in-process engine hands it to the
    caller that was stepping). A BaseException that is not an Exception (Ctrl-C, exit)
    always propagates. Either way `failed` holds the `Failed` events of the last failed
    step, and `cut` the metrics each of its requests had measured (TTFT, t/s) by then.
    """

    def __init__(self, scheduler: Callable[[], Steppable | None], contain: bool = False):
        self._scheduler = scheduler
        self.contain = contain
        self.failed: list[Event] = []
        self.cut: dict[int, GenerationMetrics] = {}

    def has_work(self) -> bool:
        """Whether the scheduler has something to step now."""
        sched = self._scheduler()
        return sched is not None and sched.has_work()

    def steps(self, go_on: Callable[[], bool] = _always) -> Iterator[list[Event]]:
        """Step while the scheduler has work and `go_on()` (asked before each step)
        says so, yielding each step's events (possibly none). Between two steps the
        caller runs whatever it yields to: nothing here waits or polls."""
        while go_on():
            sched = self._scheduler()
            if sched is None or not sched.has_work():
                return
            yield self._step(sched)

    def _step(self, sched: Steppable) -> list[Event]:
        try:
            return list(sched.step())
        except Exception as exc:
            # a step cut short: its KV cells cannot be trusted, so its requests end
            self._fail(sched, f"internal error in the scheduler: {exc!r}")
            if self.contain:
                return self.failed
            raise
        except BaseException:
            self._fail(sched, "the step was interrupted")
            raise

    def _fail(self, sched: Steppable, message: str) -> None:
        self.cut = {seq.req.id: snapshot(seq.metrics) for seq in sched.running}
        self.failed = list(sched.fail_all(message))
