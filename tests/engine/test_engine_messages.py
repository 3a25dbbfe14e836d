"""The typed worker protocol (engine/messages.py): every message pickles, the worker
dispatches on types and answers what it does not know with a typed error, and the
caller's side turns events into TokenEvents and exceptions. No model needed."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest

import inferenceos.engine.messages as messages
from inferenceos.engine.base import Generation, stream_event
from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.logprobs import TokenLogprob
from inferenceos.engine.messages import (
    Ask,
    Attach,
    Cancel,
    Embed,
    ExportLive,
    ExportState,
    Failed,
    Finished,
    Generate,
    ImportLive,
    ImportState,
    LiveNeed,
    MediaTokens,
    Prefetch,
    Progress,
    Ready,
    Resize,
    Result,
    SetThreads,
    Shutdown,
    Sleep,
    Stats,
    Tokenize,
    TokenOut,
    ToWorker,
    Wake,
    Wrote,
    unknown,
)
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.worker.main import _dispatch
from inferenceos.engine.worker.migrate import LiveState
from inferenceos.errors import EngineBusyError, GenerationError, UsageError
from inferenceos.media.item import MediaItem
from inferenceos.plan.llama_params import LlamaParams

IMAGE = MediaItem("image", bytes(12), nx=2, ny=2)

# one of every request kind, numbered as Engine numbers them when it sends
REQUESTS: list[ToWorker] = [
    Generate("hi", SamplingParams(temperature=0, max_tokens=3), "streaming", "ngram",
             (IMAGE,), True, req_id=7),
    Cancel(req_id=7),
    Shutdown(),
    MediaTokens(IMAGE, req_id=8),
    Stats(req_id=9),
    Tokenize("hello", False, req_id=10),
    Embed(("a", [1, 2]), req_id=11),
    ExportState((1, 2, 3), req_id=12),
    ImportState((1, 2), b"\x00\x01", req_id=13),
    Sleep(req_id=14),
    Wake(req_id=15),
    Resize(LlamaParams(n_ctx=512), 2, req_id=16),
    LiveNeed(req_id=17),
    ExportLive(req_id=18),
    ImportLive(LiveState(), req_id=19),
    SetThreads(None, req_id=20),
    Prefetch((1, 2, 3), req_id=21),
    Attach(FrameSpec(("data: ", "\n\n"), ("text",)), 2, req_id=7),
]

LOGPROB = TokenLogprob(5, b"x", -0.5, 3.0)
FROM_WORKER = [
    TokenOut(7, 5, "x", LOGPROB, (LOGPROB,)),
    TokenOut(7, -1, "tail"),
    Progress(7, 10, 4, 6, 1.5),
    Finished(7, GenerationMetrics(prompt_tokens=3, stop_reason="eos")),
    Failed(7, "EngineBusyError", "queue full"),
    Result(8, {"running": 1}),
    Ready({"pid": 1, "n_ctx_slot": 256, "load_s": 0.1}),
    Wrote(7, (5, 6), "xy", b"3\r\nabc\r\n", ""),
]


def _request_kinds() -> set[type]:
    """Every concrete request class the module defines."""
    return {cls for _, cls in inspect.getmembers(messages, inspect.isclass)
            if issubclass(cls, ToWorker) and cls not in (ToWorker, Ask)}


def test_the_samples_cover_every_request_kind() -> None:
    assert {type(m) for m in REQUESTS} == _request_kinds()


@pytest.mark.parametrize("msg", REQUESTS + FROM_WORKER, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_pickle(msg: object) -> None:
    back = pickle.loads(pickle.dumps(msg))
    assert type(back) is type(msg)
    if type(msg) in (ImportLive, Resize):  # LiveState / LlamaParams: compare by fields
        assert dataclasses.asdict(back) == dataclasses.asdict(msg)  # type: ignore[call-overload]
    else:
        assert back == msg


def test_messages_are_frozen_and_numbered_by_replace() -> None:
    msg = Tokenize("hello")
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.text = "other"  # type: ignore[misc]
    numbered = dataclasses.replace(msg, req_id=42)
    assert (msg.req_id, numbered.req_id, numbered.text) == (0, 42, "hello")


def _runtime() -> SimpleNamespace:
    """A worker runtime with a stand-in model and scheduler: dispatch is under test,
    not what the scheduler does with a request."""
    sched = MagicMock()
    sched.cancel.return_value = []
    return SimpleNamespace(sched=sched, awake=lambda: sched, lm=MagicMock(),
                           lifecycle=lambda msg: [Result(msg.req_id, {})],
                           kv_store=None)


@pytest.mark.parametrize("msg", [m for m in REQUESTS if not isinstance(m, Attach)],
                         ids=lambda m: type(m).__name__)
def test_the_worker_knows_every_request_kind(msg: ToWorker) -> None:
    """(An Attach is the inbox's, which reads the descriptor after it:
    tests/engine/worker/test_direct_sinks.py.)"""
    out = _dispatch(msg, _runtime())  # type: ignore[arg-type]
    if isinstance(msg, Shutdown):
        assert out is None
        return
    assert out is not None
    for reply in out:
        assert reply.req_id == msg.req_id
        assert not (isinstance(reply, Failed) and "unknown request" in reply.message), reply


@dataclasses.dataclass(frozen=True)
class _FromTheFuture(ToWorker):
    """A request kind this worker has never heard of (a parent of another version)."""

    payload: str = ""


@pytest.mark.parametrize("msg", [_FromTheFuture(req_id=5), ("generate", 5, "hi")],
                         ids=["unknown-kind", "old-tuple"])
def test_an_unknown_message_gets_a_typed_error_reply(msg: object) -> None:
    out = _dispatch(msg, _runtime())  # type: ignore[arg-type]
    assert out is not None and len(out) == 1
    [reply] = out
    assert isinstance(reply, Failed) and reply.error == "UsageError"
    assert reply.req_id == (5 if isinstance(msg, ToWorker) else 0)
    assert isinstance(reply.exception(), UsageError)
    assert unknown(msg) == reply


def test_failed_rebuilds_only_inferenceos_errors() -> None:
    assert type(Failed(1, "EngineBusyError", "full").exception()) is EngineBusyError
    for name in ("NoSuchError", "OSError", "Failed"):  # a name from the worker is data
        exc = Failed(1, name, "boom").exception()
        assert type(exc) is GenerationError and str(exc) == "boom"
    assert Failed.of(3, UsageError("bad")) == Failed(3, "UsageError", "bad")


def test_stream_event_maps_events_to_what_the_caller_sees() -> None:
    gen = Generation(iter(()))
    ev = stream_event(TokenOut(1, 5, "x", LOGPROB, (LOGPROB,)), gen, 0.25)
    assert ev is not None and (ev.token, ev.text, ev.logprob, ev.top_logprobs) == (
        5, "x", LOGPROB, (LOGPROB,))
    tail = stream_event(TokenOut(1, -1, "!"), gen, 0.25)
    assert tail is not None and tail.text == "!"
    assert gen.metrics.completion_tokens == 1  # held-back text is no token
    prog = stream_event(Progress(1, 10, 4, 6, 1.5), gen, 0.25)
    assert prog is not None and (prog.token, prog.progress) == (-1, (10, 4, 6, 1.5))
    sent = GenerationMetrics(prompt_tokens=3, completion_tokens=1, stop_reason="eos")
    assert stream_event(Finished(1, sent), gen, 0.25) is None
    assert gen.metrics.stop_reason == "eos" and gen.metrics.load_s == 0.25
    assert sent.load_s == 0.0  # the event's own record is left as it came
    with pytest.raises(EngineBusyError, match="queue full"):
        stream_event(Failed(1, "EngineBusyError", "queue full"), gen, 0.25)
    with pytest.raises(GenerationError, match="Result"):
        stream_event(Result(1, None), gen, 0.25)


def test_a_stream_closed_after_a_progress_event_frees_its_slot(tiny_llama: Path) -> None:
    """A Progress is no end of the stream: closing the Generation right after one
    cancels the request (it once counted as finished and kept its slot running)."""
    from inferenceos.engine.local import LocalEngine

    endless = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    with LocalEngine(tiny_llama, LlamaParams(n_ctx=256, n_batch=64, n_threads=1)) as engine:
        gen = engine.generate("abc", endless, progress=True)
        first = next(iter(gen))
        assert first.progress is not None
        gen.close()
        assert engine.stats()["running"] == 0
        assert gen.metrics.stop_reason == "interrupted"
