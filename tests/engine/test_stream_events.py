"""Events, not polls (issue 48): a stream waiting for its next token, its cancel, or its
client's disconnect is woken by that event, never by a timer.

- a static check over the functions on the token and cancel path (engine and server):
  no `timeout=`, no sleep, no poll, no timed `wait(t)`; it is shown the old code and
  catches it;
- a stream queued behind another (no event of its own is coming) ends when its
  `CancelEvent` is set, having asked its queue for an event once, not 20 times a second;
- the same in LocalEngine, where the waiting thread steps the scheduler itself;
- a Ctrl-C lands within a second in a main thread blocked in the reply queue's `get()`
  (no timeout), with interrupt.py's handler and with Python's own.
The server's side (a client's disconnect) is tests/server/test_disconnect_events.py.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from cli_helpers import cli_env
from inferenceos.engine.base import Generation
from inferenceos.engine.cancel import CancelEvent
from inferenceos.engine.engine import Engine
from inferenceos.engine.local import LocalEngine
from inferenceos.engine.sampling import SamplingParams
from inferenceos.plan.llama_params import LlamaParams

# (module, qualified name or "*" for the whole module): what a token, a cancel or a
# disconnect passes through between the worker's pipe and the client's socket
TOKEN_PATH = [
    ("inferenceos.engine.cancel", "*"),
    ("inferenceos.engine.core", "*"),
    ("inferenceos.engine.base", "Events"),
    ("inferenceos.engine.base", "EngineBase._follow"),
    ("inferenceos.engine.base", "stream_event"),
    ("inferenceos.engine.base", "LoopInbox"),
    ("inferenceos.engine.base", "LoopEvents"),
    ("inferenceos.engine.engine", "Engine._start"),
    ("inferenceos.engine.engine", "Engine._abandon"),
    ("inferenceos.engine.local", "LocalEngine._start"),
    ("inferenceos.engine.local", "LocalEngine._next"),
    ("inferenceos.engine.local", "LocalEngine._abandon"),
    ("inferenceos.engine.worker.client", "Replies"),
    ("inferenceos.engine.worker.client", "WorkerClient._read"),
    ("inferenceos.engine.worker.client", "WorkerClient.send"),
    ("inferenceos.engine.worker.client", "WorkerClient.done"),
    ("inferenceos.server.bridge", "_Threads"),
    ("inferenceos.server.bridge", "ThreadStream._work"),
    ("inferenceos.server.bridge", "ThreadStream._put"),
    ("inferenceos.server.bridge", "ThreadStream.__anext__"),
    ("inferenceos.server.bridge", "ThreadStream.aclose"),
    ("inferenceos.server.generation", "_generate"),
    ("inferenceos.server.generation", "_OnLoop"),
    ("inferenceos.server.generation", "Run"),
    ("inferenceos.server.generation", "until_disconnect"),
    ("inferenceos.server.generation", "disconnected"),
    ("inferenceos.server.sse", "*"),
    ("inferenceos.server.reply", "*"),
]

# timed calls on the path that are no wake-up, each with why
ALLOWED = {
    "self.proc.join(5)": "the worker's pipe closed: one bounded wait for its exit code "
                         "before the streams are failed, not a loop",
}
# calls that are a timed wake-up (or a question asked again and again) by their name
_TIMED_NAMES = {"sleep", "poll", "is_disconnected", "wait_for"}

def _seconds(arg: ast.expr) -> bool:
    """Whether `arg` reads as a duration: a number, or a name like timeout / *_s."""
    if isinstance(arg, ast.Constant):
        return isinstance(arg.value, int | float) and not isinstance(arg.value, bool)
    name = arg.attr if isinstance(arg, ast.Attribute) else getattr(arg, "id", "")
    return "timeout" in name or name.endswith("_s") or name.isupper()


def timed_wakeups(source: str) -> list[str]:
    """The timed wake-ups in `source`: a call with a `timeout` keyword, a call named
    sleep / poll / is_disconnected / wait_for, an Event's or Condition's `.wait(t)` or a
    thread's `.join(t)` given a duration, and a `.get(block, timeout)` (queue.Queue's
    positional timeout)."""
    found = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        why = ""
        if any(k.arg == "timeout" for k in node.keywords):
            why = "timeout="
        elif name in _TIMED_NAMES:
            why = name
        elif name in ("wait", "join") and node.args and _seconds(node.args[0]):
            why = f"{name}(t)"
        elif name == "get" and isinstance(func, ast.Attribute) and len(node.args) == 2 \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, bool):
            why = "get(block, t)"
        if why and ast.unparse(node) not in ALLOWED:
            found.append(f"line {node.lineno}: {why}: {ast.unparse(node)}")
    return found


def _source(module: str, qualname: str) -> str:
    mod = importlib.import_module(module)
    if qualname == "*":
        return inspect.getsource(mod)
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return inspect.getsource(obj)


@pytest.mark.parametrize(("module", "qualname"), TOKEN_PATH,
                         ids=[f"{m.rsplit('.', 1)[1]}:{q}" for m, q in TOKEN_PATH])
def test_no_timed_wakeup_on_the_token_or_cancel_path(module: str, qualname: str) -> None:
    """Every piece of the path exists (a rename must update the list) and none wakes
    on a timer: a stream sleeps until its event, its cancel or its client's
    disconnect arrives."""
    assert timed_wakeups(_source(module, qualname)) == []


def test_the_check_catches_the_polls_that_were_there() -> None:
    """The two polls issue 48 named, as they were, and the other timed forms."""
    old_engine = """
        def next_event():
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                return None
    """
    old_server = """
        async def until_disconnect(request, work, poll_s=0.25):
            task = asyncio.ensure_future(work)
            while True:
                done, _ = await asyncio.wait({task}, timeout=poll_s)
                if await request.is_disconnected():
                    task.cancel()
    """
    others = """
        def f():
            cancel.wait(0.05)
            q.get(True, 0.05)
            time.sleep(0.01)
            conn.poll(0.1)
    """
    assert len(timed_wakeups(old_engine)) == 1
    assert len(timed_wakeups(old_server)) == 2
    assert len(timed_wakeups(others)) == 4
    assert timed_wakeups("q.get()\nevent.wait()\nd.get(key, 0)\n") == []


# -- behaviour: a cancelled stream ends without waiting --------------------------------

LONG = SamplingParams(temperature=0, max_tokens=100_000, ignore_eos=True)


@dataclass
class Waiter:
    """A consumer thread reading one generation. It counts what its thread calls: each
    `queue.Queue.get` is one wake-up of a stream waiting on its reply queue, each
    `EngineCore._step` (engine/core.py) a scheduler step it ran; `stepped` is set at
    STEPS of them."""

    gen: Generation
    tokens: int = 0
    gets: int = 0
    steps: int = 0
    ended: threading.Event = field(default_factory=threading.Event)
    stepped: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    STEPS = 32

    def start(self) -> Waiter:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _count(self, frame: FrameType, event: str, _arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_name == "get" and code.co_filename.endswith("queue.py"):
            self.gets += 1
        elif code.co_name == "_step" and code.co_filename.endswith("core.py"):
            self.steps += 1
            if self.steps >= self.STEPS:
                self.stepped.set()

    def _run(self) -> None:
        sys.setprofile(self._count)  # this thread only
        try:
            for ev in self.gen:
                self.tokens += ev.token >= 0
        except BaseException as exc:  # the test reports it
            self.error = exc
        finally:
            sys.setprofile(None)
            self.ended.set()


class Runner:
    """A long generation read in a thread; `reached(n)` is set once n tokens came;
    `stop()` cancels it and waits for its thread (only that thread may close it)."""

    def __init__(self, engine: Engine, prompt: str) -> None:
        self.cancel = CancelEvent()
        self.gen, self.tokens = engine.generate(prompt, LONG, cancel=self.cancel), 0
        self._marks: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.cancel.set()
        self._thread.join(30)

    def reached(self, n: int) -> threading.Event:
        with self._lock:
            mark = self._marks.setdefault(n, threading.Event())
            if self.tokens >= n:
                mark.set()
        return mark

    def _run(self) -> None:
        for ev in self.gen:
            with self._lock:
                self.tokens += ev.token >= 0
                for n, mark in self._marks.items():
                    if self.tokens >= n:
                        mark.set()


@pytest.fixture(scope="module")
def one_slot(tiny_wide: Path) -> Iterator[Engine]:
    """One slot: a second request waits in the worker's queue with no event coming."""
    with Engine(tiny_wide, LlamaParams(n_ctx=4096, n_batch=64, n_ubatch=64, n_threads=1),
                n_parallel=1, kv_policy="streaming") as e:
        yield e


def test_a_queued_stream_ends_when_cancelled_having_woken_once(one_slot: Engine) -> None:
    """B waits behind A, which holds the only slot: nothing comes on B's queue. While A
    decodes for at least 0.3 s (measured by A's tokens, not a sleep), B's thread asks
    its queue for an event once; its cancel then ends it at once, A goes on."""
    runner = Runner(one_slot, "hello")
    try:
        assert runner.reached(1).wait(60)
        cancel = CancelEvent()
        t0 = time.perf_counter()
        b = Waiter(one_slot.generate("world", LONG, cancel=cancel)).start()
        start = runner.tokens
        step = 16
        while time.perf_counter() - t0 < 0.3:  # A's tokens are the clock
            assert runner.reached(start + step).wait(60)
            step += 16
        assert not b.ended.is_set() and b.tokens == 0  # still queued behind A
        at_cancel = time.perf_counter()
        cancel.set()
        assert b.ended.wait(10), "the cancelled stream did not end"
        woke_in = time.perf_counter() - at_cancel
        assert runner.reached(runner.tokens + 1).wait(10)  # A goes on
    finally:
        runner.stop()
    assert b.error is None and b.tokens == 0
    assert b.gen.metrics.stop_reason == "interrupted"
    assert b.gets <= 2, f"the waiting stream woke {b.gets} times in {at_cancel - t0:.2f} s"
    assert woke_in < 1.0
    assert one_slot.generate("abc", SamplingParams(temperature=0, max_tokens=4)).text()


def test_a_plain_event_is_refused(one_slot: Engine) -> None:
    """A threading.Event cannot wake a waiting stream: refused at once, not ignored."""
    with pytest.raises(TypeError, match="CancelEvent"):
        one_slot.generate("abc", LONG, cancel=threading.Event())  # type: ignore[arg-type]


def test_cancel_event_wakes_registered_and_late_wakeups() -> None:
    """The CancelEvent contract: each wake-up runs once, after set(); one registered
    after set() runs at once; one removed first never runs."""
    ran: list[str] = []
    cancel = CancelEvent()
    cancel.on_set(lambda: ran.append("a"))
    remove = cancel.on_set(lambda: ran.append("b"))
    remove()
    cancel.set()
    cancel.set()
    cancel.on_set(lambda: ran.append("c"))
    assert ran == ["a", "c"] and cancel.is_set()


def test_local_engine_queued_stream_ends_at_the_next_step(tiny_wide: Path) -> None:
    """In the caller's process B's thread, waiting in the queue behind A, steps the
    scheduler for A itself (holding the engine's lock); once cancelled it stops after
    the step that runs then, instead of stepping A until a slot frees; A goes on."""
    settings = LlamaParams(n_ctx=4096, n_batch=64, n_ubatch=64, n_threads=1)
    with LocalEngine(tiny_wide, settings, n_parallel=1, kv_policy="streaming") as engine:
        a = engine.generate("hello", LONG)
        a_events = iter(a)
        first = next(a_events)  # A holds the slot
        cancel = CancelEvent()
        b = Waiter(engine.generate("world", LONG, cancel=cancel)).start()
        assert b.stepped.wait(60)  # B's thread is stepping for A
        cancel.set()
        assert b.ended.wait(10), "the cancelled stream did not end"
        more = [next(a_events) for _ in range(b.steps + 2)]  # A's piled-up events, then new
        a.close()
    assert first.token >= 0 and all(ev.token >= 0 for ev in more)
    assert b.error is None and b.tokens == 0
    assert b.gen.metrics.stop_reason == "interrupted"


# -- Ctrl-C in a main thread blocked on the reply queue ---------------------------------

_CHILD = textwrap.dedent("""
    import os, sys, threading, time
    from inferenceos import interrupt
    from inferenceos.engine.engine import Engine
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.plan.llama_params import LlamaParams


    def report_blocked(main):
        # tell the parent once the main thread waits inside the reply queue's get():
        # a queue.Queue's Python frames, or a SimpleQueue's C call from _follow
        while True:
            frame, names = sys._current_frames().get(main), []
            while frame is not None:
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            if names[:2] == ["wait", "get"] or names[:1] == ["_follow"]:
                print("blocked", flush=True)
                return
            time.sleep(0.001)


    def main():
        if sys.argv[2] == "ours":
            assert interrupt.install()
        engine = Engine(sys.argv[1], LlamaParams(n_ctx=128, n_batch=32, n_ubatch=32,
                                                 n_threads=1), n_parallel=1)
        print(engine.worker_pid, flush=True)
        sys.stdin.readline()  # the parent has stopped the worker: no event will come
        threading.Thread(target=report_blocked, args=(threading.get_ident(),),
                         daemon=True).start()
        gen = engine.generate("abc", SamplingParams(temperature=0, max_tokens=8))
        try:
            next(iter(gen))
            print("a token came")
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            os._exit(130)


    if __name__ == "__main__":  # the worker is spawned: it imports this file again
        main()
""")



def _sleeping(pid: int) -> bool:
    """Whether the process's main thread is asleep in the kernel (state S)."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "S"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("handler", ["ours", "python"])
def test_ctrl_c_lands_in_a_main_thread_blocked_on_the_reply_queue(
        handler: str, tiny_llama: Path, tmp_path: Path) -> None:
    """The stream's q.get() has no timeout: SIGINT must still interrupt it at once
    (CPython's lock wait ends on EINTR and runs the handler), within a second, with
    interrupt.py's handler installed (as `inferenceos.load` does) and with Python's."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    child = subprocess.Popen([sys.executable, str(script), str(tiny_llama), handler],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=cli_env())
    assert child.stdin is not None and child.stdout is not None
    worker = 0
    try:
        first = child.stdout.readline()
        assert first.strip().isdigit(), child.stderr.read() if child.stderr else first
        worker = int(first)
        os.kill(worker, signal.SIGSTOP)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "blocked"
        deadline = time.monotonic() + 5  # the last bytecodes before the kernel wait
        while not _sleeping(child.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        t0 = time.perf_counter()
        child.send_signal(signal.SIGINT)
        child.wait(timeout=10)
        took = time.perf_counter() - t0
    finally:
        if worker:  # it holds the child's output pipes open while it lives
            for sig in (signal.SIGKILL, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker, sig)
        if child.poll() is None:
            child.kill()
    out, err = child.communicate(timeout=30)
    assert (child.returncode, out.strip()) == (130, "interrupted"), err[-2000:]
    assert took < 1.0, f"Ctrl-C took {took:.2f} s to land"
