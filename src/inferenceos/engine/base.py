"""What `Engine` (a worker process) and `LocalEngine` (this process) share.

- `Generation`: an iterator of TokenEvents with live metrics, what `generate` returns;
  `Events`: its iterator, whose `close()` also ends a request never iterated.
- `stream_event`: one scheduler Event of a generation → the TokenEvent its caller sees.
- `EngineBase`: `generate` (validation, the Generate record, the stream loop),
  `chat_prompt` and the context manager; a subclass says how a Generate starts
  (`_start`) and what its special tokens' texts are; its abstract members are the
  rest of the interface callers use, under the name `engine.client.EngineClient`.
- `per_slot`: the context settings for `n_parallel` sequences of `n_ctx` each.
- `LoopEvents` / `LoopInbox`: a generation's events read on an asyncio event loop
  instead (`Events.on_loop`, where the engine can divert its replies: `Engine`), fed
  from the pipe's reader thread through one inbox per loop, one loop wake-up per burst
  of replies (the server's path, issue 44: no thread wakes per token).

Nothing on a stream's path wakes on a timer: a waiting stream sleeps until its next
event or its cancel (`engine.cancel.CancelEvent`, whose `set()` wakes it) arrives.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import inferenceos.errors as errors
from inferenceos.engine.cancel import CancelEvent
from inferenceos.engine.chat_template import ChatMessage, render_chat
from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.engine.generation import GenerationMetrics, TokenEvent
from inferenceos.engine.messages import (
    Failed,
    Finished,
    FromWorker,
    Generate,
    MediaSupport,
    Progress,
    StatsReport,
    TokenOut,
    Wrote,
)
from inferenceos.engine.sampling import SamplingParams
from inferenceos.media.item import MediaItem
from inferenceos.model.spec import ModelSpec
from inferenceos.plan.llama_params import LlamaParams

_E = TypeVar("_E", bound="EngineBase")


@dataclass(frozen=True)
class Handover:
    """How an engine hands a stream to its worker (`LoopEvents.attach`): `attach(frame,
    fd, written)` sends the Attach and the socket, False when it cannot now (never
    blocking: it runs on an event loop); `stop()` cancels the stream in the worker while
    its replies still come (the worker's Wrote, then its Finished)."""

    attach: Callable[[FrameSpec, int, int], bool]
    stop: Callable[[], None]


@dataclass
class Generation:
    """An in-progress generation: an iterator of TokenEvents with live metrics."""

    events: Iterator[TokenEvent]
    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)

    def __iter__(self) -> Iterator[TokenEvent]:
        return self.events

    def text(self) -> str:
        """Consume the rest of the generation and return its text."""
        return "".join(ev.text for ev in self.events)

    def close(self) -> None:
        close = getattr(self.events, "close", None)
        if close:
            close()


class Events:
    """A generation's event iterator whose `close()` also ends a request that was never
    iterated: a generator closed before its first `next` runs no `finally`, so without
    this a stream opened and dropped unread would keep its slot until it finished.

    `to_loop` (an engine whose replies can be diverted, `Engine`): `on_loop(loop)`
    hands the events to an event loop instead, as a `LoopEvents`; this iterator is
    then never used, and `close()` ends the request as the loop's reading left it."""

    def __init__(self, it: Iterator[TokenEvent], abandon: Callable[[], None],
                 to_loop: Callable[[asyncio.AbstractEventLoop], LoopEvents] | None = None
                 ) -> None:
        self._it, self._abandon = it, abandon
        self._started = False
        self._to_loop = to_loop
        self._on_loop: LoopEvents | None = None

    def __iter__(self) -> Events:
        return self

    def __next__(self) -> TokenEvent:
        if self._on_loop is not None:
            raise RuntimeError("this generation's events were handed to an event loop")
        self._started = True
        return next(self._it)

    def on_loop(self, loop: asyncio.AbstractEventLoop) -> LoopEvents | None:
        """The events, delivered on `loop` from now on (any thread may call this); None
        when they cannot be (iterated already, or no engine pipe to divert)."""
        if self._started or self._to_loop is None:
            return None
        self._started = True
        self._on_loop = self._to_loop(loop)
        return self._on_loop

    def close(self) -> None:
        if self._on_loop is not None:
            self._on_loop.end()
            return
        if not self._started:
            self._started = True
            self._abandon()
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


class LoopInbox:
    """One event loop's inbox from other threads: `put(deliver, item)` runs
    `deliver(item)` on the loop. Every put that arrives while a drain is pending rides
    along with it (one `call_soon_threadsafe`, a self-pipe write and one loop wake-up
    per burst): a scheduler step gives every stream its token at the same moment, and
    a wake-up per token per stream was a syscall each (issue 44).

    The mark is cleared before the items are taken, so an item appended after that
    schedules another drain: none is ever left behind."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: collections.deque[tuple[Callable[[Any], None], Any]] = (
            collections.deque())
        self._scheduled = False

    def put(self, deliver: Callable[[Any], None], item: Any) -> bool:
        """Run `deliver(item)` on the loop, soon; False when the loop is gone."""
        self._items.append((deliver, item))
        if self._scheduled:
            return not self._loop.is_closed()
        self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is gone (shutdown): nobody is listening
            return False
        return True

    def _drain(self) -> None:
        self._scheduled = False
        items = self._items
        while items:
            deliver, item = items.popleft()
            deliver(item)


_INBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopInbox] = (
    weakref.WeakKeyDictionary())
_INBOXES_LOCK = threading.Lock()


def loop_inbox(loop: asyncio.AbstractEventLoop) -> LoopInbox:
    """`loop`'s one inbox (made on first use)."""
    with _INBOXES_LOCK:
        inbox = _INBOXES.get(loop)
        if inbox is None:
            inbox = _INBOXES[loop] = LoopInbox(loop)
        return inbox


class LoopEvents:
    """One generation's TokenEvents read on an event loop: an async iterator fed by
    `put` from any thread (the reply sink an engine diverts a request's replies to),
    through the loop's `LoopInbox`, so no thread wakes per token between the worker's
    pipe and the loop. It ends as `EngineBase._follow` does: at the Finished (metrics in
    `gen.metrics`), with the reported error at a Failed, and once `cancel` is set.
    `end()` (any thread, once the reading stopped) ends the request: `end(finished)`
    as `_follow` calls it; the engine's `end` must not wait (it runs on the loop).
    `ready()`: whether an event waits to be read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, gen: Generation,
                 cancel: CancelEvent | None, load_s: float,
                 end: Callable[[bool], None], handover: Handover | None = None) -> None:
        self._loop, self._inbox = loop, loop_inbox(loop)
        self._gen, self._cancel, self._load_s, self._end = gen, cancel, load_s, end
        self._items: collections.deque[FromWorker | None] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._over = False  # the Finished / Failed was read
        self.finished = False  # the stream reached its Finished / Failed
        self._ended = threading.Lock()
        self._handover = handover  # None: the engine cannot hand the stream over
        self._taken = 0  # TokenOuts read (the reader has written them)
        self._held: list[FromWorker | None] | None = None  # while handed over: the worker's
        self._unsent: Callable[[bytes], None] | None = None
        self._attached = self._stop_sent = False

    def put(self, item: FromWorker | None) -> None:
        """Deliver a reply (any thread; never blocks)."""
        self._inbox.put(self._feed, item)

    def _feed(self, item: FromWorker | None) -> None:
        held = self._held
        if held is not None and item is not None and not self._handed(item, held):
            return
        self._items.append(item)
        self._wake()

    def _handed(self, item: FromWorker, held: list[FromWorker | None]) -> bool:
        """While handed over (`attach`): whether `item` goes on to the reader."""
        if type(item) is TokenOut:
            held.append(item)  # the worker writes it again itself
            return False
        if type(item) is Wrote:
            if item.refused:  # it never took the stream: what it sent is ours to write
                self._items.extend(held)
                self._held = None
                self._wake()
                return False
            if item.final:  # it stopped writing: what follows is ours
                self._held = None
        elif isinstance(item, Failed) and item.error == "WorkerDiedError":
            # it may have written what it was sent: never written twice; the error
            # follows in-band (a client reading slowly may have been left part of a
            # chunk by a worker that died mid-send: its framing then breaks)
            self._held = None
        elif isinstance(item, (Finished, Failed)):  # the end, no Wrote: never took over
            self._items.extend(held)
            self._held = None
        return True

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def ready(self) -> bool:
        """Whether the next read returns at once with an event (a token or a progress
        is first in line): the reader is behind the generation."""
        items = self._items
        return bool(items) and isinstance(items[0], (TokenOut, Progress))

    def attach(self, frame: FrameSpec, fd: int, unsent: Callable[[bytes], None]) -> bool:
        """Hand the stream to the worker, to write to the socket `fd` (ours still) as
        `frame` says, from the next token on: every event read so far must be written
        already, and nothing else may write to the socket until this stream's next
        event (after which the worker has stopped). On the loop; False when it cannot
        (an engine without a pipe, handed over once already, or the stream is ending).

        The worker reports what it wrote as TokenEvents (token -1, `written` its ids,
        `text` theirs); before the last is read, `unsent(data)` is called with the bytes
        the socket had not taken: write them first. With no report (the worker refused,
        or the stream ended first), the stream's tokens come as before: the events it
        sent are kept. A worker that dies meanwhile may have written what it was sent:
        that is dropped, and its error follows."""
        handover = self._handover
        if handover is None or self._over or self._attached \
                or any(type(it) is not TokenOut for it in self._items):
            return False
        # published before the cancel is looked at: a cancel from now on leaves the end
        # of the reading to the reader, which waits for the worker's report
        self._held = list(self._items)  # sent before the worker took over: it resends
        cancel = self._cancel
        sent = False
        if not (cancel is not None and cancel.is_set()) and not self._ended.locked():
            # a dead worker: its Failed follows through the reader
            with contextlib.suppress(errors.WorkerDiedError):
                sent = handover.attach(frame, fd, self._taken)
        if not sent:
            self._held = None
            return False
        self._attached = True
        self._items.clear()
        self._unsent = unsent
        return True

    @property
    def handed_over(self) -> bool:
        """Whether the worker writes the stream now (attached, its final Wrote not yet
        here): the reading must go on to that report."""
        return self._held is not None

    def _stopping(self) -> bool:
        """Whether the reading stops for `cancel`: at once, unless the worker writes
        the stream; then only after its final Wrote is read (nothing may write to the
        socket while it does, and its unsent bytes come first), the worker asked to
        stop first."""
        cancel = self._cancel
        if cancel is None or not cancel.is_set():
            return False
        if self._held is None:
            return not any(type(it) is Wrote for it in self._items)
        if not self._stop_sent and self._handover is not None:
            self._stop_sent = True
            with contextlib.suppress(errors.WorkerDiedError):
                self._handover.stop()
        return False

    def __aiter__(self) -> LoopEvents:
        return self

    async def __anext__(self) -> TokenEvent:
        while not self._over and not self._stopping():
            if not self._items:
                self._waiter = self._loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
                continue
            ev = self._items.popleft()
            if ev is None:  # a wake-up (its cancel): the loop's test sees why
                continue
            if type(ev) is Wrote:  # (a final one's unsent bytes are written first)
                if ev.refused:  # (after the stream's end: nothing to count)
                    continue
                if ev.unsent and self._unsent is not None:
                    self._unsent(ev.unsent)
                self._gen.metrics.completion_tokens += len(ev.ids)
                return TokenEvent(-1, ev.text, written=ev.ids)
            self._taken += type(ev) is TokenOut
            # a Progress is no end: a stream closed after one still holds its slot
            self.finished = self._over = not isinstance(ev, (TokenOut, Progress))
            event = stream_event(ev, self._gen, self._load_s)
            if event is not None:
                return event
        raise StopAsyncIteration

    def end(self) -> None:
        """End the request as the reading left it (once; later calls do nothing)."""
        if self._ended.acquire(blocking=False):
            self._end(self.finished)


def stream_event(ev: FromWorker, gen: Generation, load_s: float) -> TokenEvent | None:
    """One event of `gen`'s request: the TokenEvent to yield for a TokenOut (and a
    Progress: token -1, no text, `progress` set); None for Finished (the final metrics
    are then in `gen.metrics`); raises the reported error for Failed, and
    GenerationError for anything else (a worker answering out of protocol)."""
    match ev:
        case TokenOut():
            gen.metrics.completion_tokens += 1 if ev.token >= 0 else 0
            return ev.event()
        case Progress():
            return ev.event()
        case Finished():
            gen.metrics = replace(ev.metrics, load_s=load_s)
            return None
        case Failed():
            raise ev.exception()
    raise errors.GenerationError(f"the engine sent {type(ev).__name__} to a generation")


def per_slot(settings: LlamaParams, n_parallel: int) -> LlamaParams:
    """Settings for `n_parallel` sequences of `settings.n_ctx` cells each, in one shared
    KV pool (unified) unless `settings` turn kv_unified off. One stream per slot
    (llama-server's -np N) lets a sequence attend over its own cells only; llama.cpp
    then evaluates a batch in micro-batches of consecutive, increasing sequence ids
    (engine/executor.py lays rows out in slot order for it), so a step with a prompt
    chunk costs one more pass over the weights. In process, 1 thread, a new request
    whenever one ends (CPU per token): the tiny 2-layer model gained (363 against 573
    µs at 32 streams, 479 against 545 at 8), Gemma 3 270M lost 4-6 % at 4, 8 and 16
    streams in that churn; through `serve` (4 streams, 64-token replies) the real
    models were within the noise of the shared pool, so the plan asks for a stream per
    slot, as llama-server -np N has (docs/engine.md, issue 44). LlamaParams' own
    default stays the shared pool."""
    return replace(settings, n_ctx=settings.n_ctx * n_parallel, n_seq_max=n_parallel,
                   kv_unified=settings.kv_unified or n_parallel <= 1)


def _message(prompt: str | list[int], sampling: SamplingParams, cancel: CancelEvent | None,
             kv_policy: str | None, draft: str | None, media: Sequence[MediaItem],
             progress: bool, direct: bool) -> Generate:
    """`generate`'s arguments checked (UsageError for bad sampling settings) and made
    into its Generate."""
    sampling.validate()
    if cancel is not None and not isinstance(cancel, CancelEvent):
        raise TypeError("generate(cancel=...) takes an engine.cancel.CancelEvent, "
                        f"not {type(cancel).__name__}: a plain Event cannot wake a "
                        "stream waiting for its next token")
    return Generate(prompt, sampling, kv_policy, draft, tuple(media), progress, direct)


class EngineBase(ABC):
    """The shared half of both engines (see the module docstring), and the interface
    every caller above the engine uses (`engine.client.EngineClient`): the abstract
    members below are what each engine provides."""

    spec: ModelSpec  # what the GGUF header says

    @property
    @abstractmethod
    def n_ctx(self) -> int:
        """Context of one sequence."""

    @property
    @abstractmethod
    def load_s(self) -> float: ...

    @property
    @abstractmethod
    def settings(self) -> LlamaParams:
        """The llama parameters it was loaded with (n_ctx counts every slot's cells)."""

    @property
    @abstractmethod
    def media_support(self) -> MediaSupport:
        """{"vision", "audio", "load_s"} when the model has a projector, else {}."""

    @abstractmethod
    def media_tokens(self, item: MediaItem) -> int:
        """Context cells `item` takes in a prompt (UsageError without a projector)."""

    @abstractmethod
    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...

    @abstractmethod
    def embed(self, texts: Sequence[str | list[int]]) -> list[list[float]]:
        """Mean-pooled, L2-normalised vectors, one per text (or token ids), in order."""

    @abstractmethod
    def stats(self) -> StatsReport: ...

    @abstractmethod
    def export_state(self, tokens: Sequence[int]) -> tuple[list[int], bytes] | None: ...

    @abstractmethod
    def import_state(self, tokens: Sequence[int], data: bytes) -> int: ...

    @property
    @abstractmethod
    def kv_tiers(self) -> bool:
        """Whether finished conversations go to the tiered KV cache (engine/kv/tiers.py)."""

    @abstractmethod
    def prefetch(self, tokens: Sequence[int]) -> int: ...

    @abstractmethod
    def _special_texts(self) -> tuple[str, str]:
        """The texts of the BOS and EOS tokens (for chat templates); raises
        WorkerDiedError once the engine is closed."""

    @abstractmethod
    def _start(self, msg: Generate, cancel: CancelEvent | None) -> Generation:
        """Submit a validated `msg` and return its Generation (see `generate`). A
        stream waiting for its next event must wake when `cancel` is set, by a wake-up
        registered with `cancel.on_set` or by a step boundary: never by a timer."""

    @abstractmethod
    def close(self) -> None: ...

    def generate(
        self,
        prompt: str | list[int],
        sampling: SamplingParams,
        cancel: CancelEvent | None = None,
        kv_policy: str | None = None,
        draft: str | None = None,
        media: Sequence[MediaItem] = (),
        progress: bool = False,
        direct: bool = False,
    ) -> Generation:
        """Start generating for `prompt` (text or token ids): iterate the Generation for
        TokenEvents; closing it early, or setting `cancel`, ends the request and frees
        its slot at once. `cancel` is a `CancelEvent` (TypeError for a plain
        threading.Event, which cannot wake a waiting stream): its `set()`, from any
        thread, wakes the stream's waiting consumer at once.

        `media`: images / audio for a text prompt holding one `MEDIA_MARKER` per item,
        in order (the model needs a projector: UsageError otherwise).
        `progress`: also yield TokenEvents of token -1 carrying `progress` (prompt
        tokens, cached, processed, ms) as the prompt is processed, llama-server's
        `return_progress`.
        `direct`: the stream may be handed to the worker to write to its client
        (`LoopEvents.attach`); ignored by an engine that cannot.

        `draft` overrides the engine's drafter for this request ("ngram", "self",
        "none"; a draft model file only when it is the engine's own).

        `kv_policy` overrides the engine's KV policy for this request ("none",
        "streaming", or "h2o" when the engine was started with it). Raises UsageError
        for bad sampling settings here; errors found at submission (prompt too long,
        queue full, unknown policy) are raised when the Generation is first iterated
        by `Engine`, here at once by `LocalEngine`.
        """
        return self._start(_message(prompt, sampling, cancel, kv_policy, draft, media,
                                    progress, direct), cancel)

    def generate_now(
        self,
        prompt: str | list[int],
        sampling: SamplingParams,
        cancel: CancelEvent | None = None,
        kv_policy: str | None = None,
        draft: str | None = None,
        media: Sequence[MediaItem] = (),
        progress: bool = False,
        direct: bool = False,
    ) -> Generation | None:
        """`generate` from an event loop: the same Generation, whose events are read
        there (`Events.on_loop`), or None where starting it would wait for anything (a
        lock, a worker's start; here: always, an engine whose requests run in this
        process) and nothing was sent: call `generate` from a thread then."""
        return self._start_now(_message(prompt, sampling, cancel, kv_policy, draft, media,
                                        progress, direct), cancel)

    def _start_now(self, msg: Generate, cancel: CancelEvent | None) -> Generation | None:
        """`_start`, or None where it would wait (see `generate_now`)."""
        return None

    def _follow(self, next_event: Callable[[], FromWorker | None],
                cancel: CancelEvent | None, gen: Generation,
                end: Callable[[bool], None]) -> Iterator[TokenEvent]:
        """The TokenEvents of one request: `next_event()` blocks until its next event,
        and returns None when something other than an event woke it (its `cancel` was
        set; anything else is waited through: the flag is looked at again);
        `end(finished)` runs when the stream stops, with False when it stopped before
        its Finished / Failed (closed early or cancelled: the request must be
        cancelled)."""
        finished = False
        try:
            while not (cancel is not None and cancel.is_set()):
                ev = next_event()
                if ev is None:  # a wake-up, not an event: the loop's test sees why
                    continue
                # a Progress is no end: a stream closed after one still holds its slot
                finished = not isinstance(ev, (TokenOut, Progress))
                event = stream_event(ev, gen, self.load_s)
                if event is None:
                    return
                yield event
        finally:
            end(finished)

    def chat_prompt(
        self,
        messages: Sequence[ChatMessage],
        template: str | None = None,
        tools: Sequence[dict[str, object]] | None = None,
        template_kwargs: Mapping[str, object] | None = None,
    ) -> str:
        """The prompt text for `messages` (and `tools`, OpenAI-style definitions) under
        the model's template, or the named built-in one (which takes no tools);
        `template_kwargs`: further variables for a Jinja template (enable_thinking)."""
        bos, eos = self._special_texts()
        text, _ = render_chat(self.spec.chat_template, messages, bos_token=bos,
                              eos_token=eos, builtin=template, tools=tools,
                              kwargs=template_kwargs)
        return text

    def __enter__(self: _E) -> _E:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
