"""One generation request from admission to its last token, shared by both APIs.

`start_generation(state, request)` admits the request (429 when the queue is full),
leases the model in a worker thread (loading it if needed; a small request on a hot
model starts on the event loop itself, `_started_now`), and waits for the first
token, so that every error that can happen before output (unknown model, load failure,
prompt longer than the context) becomes a proper HTTP error. The returned `Run` then
yields `TokenEvent`s and finally one `Done`; it records the metrics (TTFT, inter-token
latency, token counts) and frees its queue slot when it ends, however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from inferenceos.engine.base import Generation, LoopEvents
from inferenceos.engine.cancel import CancelEvent
from inferenceos.engine.chat_template import ChatMessage
from inferenceos.engine.client import EngineClient
from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.engine.generation import GenerationMetrics, TokenEvent
from inferenceos.engine.sampling import SamplingParams
from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.media.item import MEDIA_MARKER, MediaItem, count_markers
from inferenceos.registry.catalog import ResolvedModel
from inferenceos.registry.leases import Lease, ResidentModel
from inferenceos.server.admission import Ticket
from inferenceos.server.bridge import ReadyStream, ThreadStream
from inferenceos.server.presets import with_preset
from inferenceos.server.reasoning import Reasoning, Think, prepare_prompt
from inferenceos.server.reasoning_budget import BudgetWatch, forced_text, merged_metrics
from inferenceos.server.request_telemetry import record_request
from inferenceos.server.state import ActiveGeneration, ServerState
from inferenceos.server.tool_calls import ToolFormat
from inferenceos.server.tools import ToolRequest, plan_tools
from inferenceos.server.vocab import Vocab, cached_vocab, vocab_for

T = TypeVar("T")


@dataclass(frozen=True)
class GenRequest:
    """What to generate. Exactly one of `text`, `messages`, `tokens` is the prompt;
    `context` (Ollama) is a token prefix placed before the rendered prompt. `media`:
    images / audio, one per `MEDIA_MARKER` in the text or messages, in order (a prompt
    with media stays text: no token ids, no `context`)."""

    model: str
    sampling: SamplingParams
    text: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    tokens: tuple[int, ...] | None = None
    context: tuple[int, ...] = ()
    keep_alive: float | None = None
    overrides: dict[str, Any] | None = None
    want_tokens: bool = False  # tokenize first, to report the prompt's ids (Ollama context)
    tools: ToolRequest | None = None  # chat only: tools rendered, maybe a call forced
    media: tuple[MediaItem, ...] = ()
    progress: bool = False  # prompt-processing progress events (llama.cpp's return_progress)
    prefill: str = ""  # chat only: the reply's start, after the generation prompt (Anthropic)
    think: Think | None = None  # chat only: what is asked of reasoning (None: the defaults)
    # llama-server's per-request `lora` ({adapter id: scale}; ids left out: 0), None for
    # the server's global scales (server/presets.py applies it, and the model's preset)
    lora: dict[int, float] | None = None
    # the stream may be handed to the model worker to write (server/direct_stream.py)
    direct: bool = False


def progress_json(progress: tuple[int, int, int, float]) -> dict[str, Any]:
    """llama-server's `prompt_progress` object from a TokenEvent's `progress`."""
    total, cache, processed, ms = progress
    return {"total": total, "cache": cache, "processed": processed, "time_ms": ms}


@dataclass
class Done:
    """The end of a generation: its metrics, load time, and token ids when asked for."""

    metrics: GenerationMetrics
    load_s: float
    model: ResidentModel
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)


@dataclass
class _Loaded:
    model: ResidentModel
    load_s: float
    tool_format: ToolFormat | None = None
    reasoning: Reasoning | None = None


def _check_ids(engine: EngineClient, ids: tuple[int, ...]) -> list[int]:
    """Token ids from a client, checked against the vocabulary: llama.cpp does not
    bounds-check them itself (an id past the vocabulary reads out of bounds)."""
    vocab = int(getattr(getattr(engine, "spec", None), "vocab_size", 0) or 0)
    bad = [t for t in ids if t < 0 or (vocab and t >= vocab)]
    if bad:
        raise UsageError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
    return list(ids)


def _chat_text(engine: EngineClient, req: GenRequest) -> tuple[str, Reasoning | None]:
    """The rendered chat prompt with the request's reasoning choice applied, and the
    reasoning its reply has (server/reasoning.py)."""
    assert req.messages is not None
    think = req.think or Think()
    tools = req.tools.tools if req.tools is not None else None
    kwargs = think.template_kwargs()
    text = (engine.chat_prompt(req.messages, tools=tools, template_kwargs=kwargs)
            if kwargs else engine.chat_prompt(req.messages, tools=tools))
    template = getattr(getattr(engine, "spec", None), "chat_template", None)
    text, reasoning = prepare_prompt(template, text, think, req.model)
    return text + req.prefill, reasoning


def _prompt(engine: EngineClient, req: GenRequest, now: bool = False
            ) -> tuple[str | list[int], Reasoning | None]:
    """The prompt to generate from (text or ids) and, for a chat, its reply's reasoning
    (`now`: on the event loop, see `_tokenize`)."""
    if req.tokens is not None:
        return _check_ids(engine, req.tokens), None
    text, reasoning = (_chat_text(engine, req) if req.messages is not None
                       else (req.text or "", None))
    if req.media:
        return _media_prompt(text, req), reasoning
    if req.context:
        return (_check_ids(engine, req.context) + _tokenize(engine, text, False, now),
                reasoning)
    if req.want_tokens:
        return _tokenize(engine, text, True, now), reasoning
    return text, reasoning


def _tokenize(engine: EngineClient, text: str, add_special: bool = True, now: bool = False
              ) -> list[int]:
    """`text`'s ids as the worker makes them, from the server's own vocabulary of the
    model (server/vocab.py, loaded once): the engine's tokenizer asks its worker, which
    answers between two steps (a step's wait before every Ollama /api/generate under
    load). The engine's where that vocabulary cannot be had; `now` (on the event
    loop): only a vocabulary loaded already, else _WouldWait."""
    spec = getattr(engine, "spec", None)
    vocab: Vocab | None = None
    if spec is not None:
        vocab = cached_vocab(spec.path)
        if vocab is None and not now:
            with contextlib.suppress(InferenceOSError):  # (the worker's tokenizer, then)
                vocab = vocab_for(spec.path)
    if vocab is not None:
        return vocab.prompt_ids(text, add_special)
    if now:
        raise _WouldWait
    return engine.tokenize(text, add_special=add_special)


def _media_prompt(text: str, req: GenRequest) -> str:
    """The rendered prompt of a request with media: text, with exactly one marker per
    item (the template could drop or repeat a message: refuse rather than misplace)."""
    if req.tokens is not None or req.context:
        raise UsageError("images and audio need a text prompt: token ids and a context "
                         "cannot carry them")
    found = count_markers(text)
    if found != len(req.media):
        raise UsageError(f"the rendered prompt holds {found} media markers for "
                         f"{len(req.media)} images / clips (the chat template dropped or "
                         "repeated a message that carries media)")
    return text


def _with_tools(engine: EngineClient, req: GenRequest) -> tuple[GenRequest, ToolFormat | None]:
    """`req` with its tools applied for this model: rendered with the messages and,
    when a call is forced, its grammar in the sampling. APIError 400 when the model's
    template knows no tools."""
    if req.tools is None:
        return req, None
    template = getattr(getattr(engine, "spec", None), "chat_template", None)
    plan = plan_tools(template, req.tools, req.model)
    sampling = req.sampling
    if plan.grammar is not None and not (plan.triggers and sampling.grammar):
        # a forced call overrides a response_format grammar; a lazy one (auto) does not
        sampling = dataclasses.replace(sampling, grammar=plan.grammar,
                                       grammar_triggers=plan.triggers)
    return dataclasses.replace(req, sampling=sampling), plan.format


class _WouldWait(Exception):
    """A job run on the event loop (`_job`'s `now`) met a step that would wait: nothing
    was sent, and the request starts from a thread instead."""


def _job(state: ServerState, req_as_sent: GenRequest,
         loop: asyncio.AbstractEventLoop | None = None, now: bool = False
         ) -> Callable[[CancelEvent], Iterator[Any]]:
    """The request's job: lease, prompt, generation (see `_generate`), run in a thread
    (`ThreadStream`). `now`: run on the event loop itself, for a `_quick` request;
    every step that would wait (a model to load, promote or re-plan, a context to
    grow, an engine that cannot start it at once) raises `_WouldWait` instead, before
    anything was sent to the model."""
    def job(cancel: CancelEvent) -> Iterator[Any]:
        t0 = time.perf_counter()
        req = with_preset(state, req_as_sent)  # its model's preset and LoRA adapters
        if req.messages is not None:  # serve --reasoning-budget where the request says none
            req = dataclasses.replace(req, think=(req.think or Think()).with_default_budget(
                state.settings.reasoning_budget))
        load = dict(req.overrides or {})
        policy = load.pop("kv_policy", None)  # a per-request choice, not a load setting
        lease = (_lease_now(state, req, load) if now
                 else state.manager.acquire(req.model, req.keep_alive, load or None))
        kept = False  # an _OnLoop yielded: its end releases the lease, not this job
        try:
            run_req, tool_format = _with_tools(lease.engine, req)
            prompt, reasoning = _prompt(lease.engine, run_req, now)
            fixed = "n_ctx" in load or bool(state.manager.base.n_ctx)  # num_ctx or --ctx
            bigger = 0 if fixed else _context_to_grow(lease, prompt, run_req.sampling,
                                                      run_req.media, now)
            if bigger and now:
                raise _WouldWait
            if bigger:  # the context follows the workload: a resize, not a refusal
                lease.release()
                lease = state.manager.acquire(
                    req.model, req.keep_alive, {**load, "n_ctx": bigger},
                    why=f"grown for a prompt that did not fit {lease.engine.n_ctx} tokens")
                run_req, tool_format = _with_tools(lease.engine, req)
                prompt, reasoning = _prompt(lease.engine, run_req)
            load_s = time.perf_counter() - t0 if lease.fresh else 0.0
            loaded = _Loaded(lease.loaded, load_s, tool_format, reasoning)
            budget = _budget(run_req, reasoning)
            watch = BudgetWatch(reasoning, budget) if reasoning and budget else None
            if watch is not None and now:  # (its reply is read on a thread)
                raise _WouldWait
            for item in _generate(state, lease, prompt, run_req, policy, cancel, loaded,
                                  watch, loop, now):
                kept = kept or isinstance(item, _OnLoop)
                yield item
        finally:
            if not kept:
                lease.release()
    return job


# A request this small starts on the event loop (`_quick`): its Generate fits the worker
# pipe's buffer at once (a send that waits for the worker to read would hold the loop).
_QUICK_PROMPT = 2048


def _quick(state: ServerState, req: GenRequest) -> bool:
    """Whether `req` may start on the event loop (`_job`'s `now`): a completion or a
    chat (its template compiled once: engine/chat_template.py) of a small prompt, no
    tools, no media, for a file the server serves (resolved from memory, not the
    registry's database)."""
    if req.tools is not None or req.media:
        return False
    size = (sum(len(m.content) for m in req.messages) if req.messages is not None
            else len(req.tokens) if req.tokens is not None else len(req.text or ""))
    model = state.catalog.alias(req.model)
    if size > _QUICK_PROMPT or model is None:
        return False
    # tokenized here only by the server's own vocabulary (`_tokenize`), never the worker
    return not (req.context or req.want_tokens) or cached_vocab(model.path) is not None


def _lease_now(state: ServerState, req: GenRequest, load: dict[str, Any]) -> Lease:
    """A lease on `req`'s hot model as it is loaded (`ModelManager.try_acquire`);
    _WouldWait where `acquire` would be needed (load settings asked, not hot)."""
    model = state.catalog.alias(req.model)
    lease = (state.manager.try_acquire(model.name, req.keep_alive)
             if model is not None and not load else None)
    if lease is None:
        raise _WouldWait
    return lease


def _budget(req: GenRequest, reasoning: Reasoning | None) -> int:
    """The reasoning budget a chat request's reply keeps (0: none to keep)."""
    if reasoning is None or req.think is None or req.think.budget is None:
        return 0
    return max(req.think.budget, 0)


@dataclass
class _OnLoop:
    """A generation whose tokens the event loop reads itself (`engine.base.LoopEvents`):
    `Run` reads `events` (keeping `out` and `active.tokens` through `_count`) and calls
    `end()` once it stopped reading (after a Finished: once the reply's last event is
    written, in `Run.close`), which ends the generation, stops tracking it and
    releases its lease (`finish`, once, on the calling thread: none of it waits). The
    job's thread is done once it yielded this: nothing wakes it at the reply's end,
    and `Run` makes the Done itself with `done()` (two wake-ups a request fewer, on a
    machine whose cores the compute threads hold: the client's next request waits for
    them). A cancel set elsewhere ends it too, unless the worker writes the stream:
    the reading then goes on to the worker's report."""

    events: LoopEvents
    gen: Generation
    out: list[int]
    active: ActiveGeneration
    done: Callable[[], Done]
    finish: Callable[[], None]
    _ended: threading.Lock = field(default_factory=threading.Lock)

    def end(self) -> None:
        """Run `finish` (the first call only; any thread)."""
        if self._ended.acquire(blocking=False):
            self.finish()


def _count(ev: TokenEvent, out: list[int], active: ActiveGeneration, gen: Generation) -> None:
    """Keep a read event's token in `out` and the live token count (`active.tokens`,
    what /api/ps shows), on whichever side reads the generation's events."""
    if ev.token >= 0:
        out.append(ev.token)
    elif ev.written is not None:  # the worker wrote these to the client itself
        out.extend(ev.written)
    active.tokens = gen.metrics.prompt_tokens + len(out)


def _generate(state: ServerState, lease: Lease, prompt: str | list[int], run_req: GenRequest,
              policy: str | None, cancel: CancelEvent, loaded: _Loaded,
              watch: BudgetWatch | None = None,
              loop: asyncio.AbstractEventLoop | None = None,
              now: bool = False) -> Iterator[Any]:
    """`loaded`, then the token events of one generation on a leased engine, then its
    Done. With a `watch`, a reasoning section still open after its budget is closed by
    force and the reply continues (server/reasoning_budget.py). With `loop` (and no
    watch), an engine that can deliver the tokens to the loop does: an `_OnLoop` is
    yielded right after `loaded` (one wake-up of the loop for both) and nothing after
    it; no thread wakes per token, nor at the end (the `_OnLoop` releases the lease).
    `now` (on the loop, with `loop` and no watch): `generate_now`, _WouldWait where
    the engine cannot start it at once."""
    active = ActiveGeneration(lease.loaded.model.name, lease.engine.n_ctx, cancel)
    state.track(active)
    extra: dict[str, Any] = {}
    if policy is not None:
        extra["kv_policy"] = policy
    if run_req.media:
        extra["media"] = run_req.media
    if run_req.progress:
        extra["progress"] = True
    if run_req.direct and loop is not None and watch is None:
        extra["direct"] = True  # (never with a watch: _continue reuses `extra`)
    try:
        if now:
            started = lease.engine.generate_now(prompt, run_req.sampling, cancel, **extra)
            if started is None:
                raise _WouldWait
            gen = started
        else:
            gen = lease.engine.generate(prompt, run_req.sampling, cancel, **extra)
    except BaseException:
        state.untrack(active)
        raise
    out: list[int] = []
    ids = prompt if isinstance(prompt, list) else []
    metrics: GenerationMetrics | None = None

    def done() -> Done:  # what ends the reply (the loop makes it too: _OnLoop.done)
        return Done(metrics or gen.metrics, loaded.load_s, lease.loaded, ids, out)

    on_loop = getattr(gen.events, "on_loop", None)
    events = on_loop(loop) if on_loop is not None and loop and watch is None else None
    assert events is not None or not now  # (generate_now's Generation: read on a loop)
    if events is not None:
        live = _on_loop(state, lease, gen, events, out, active, done)
        try:
            yield loaded
        except BaseException:  # (closed before the loop had it: nobody will end it)
            live.end()
            raise
        yield live
        return
    try:
        yield loaded
        for ev in gen:
            _count(ev, out, active, gen)
            yield ev
            if watch is not None and watch.feed(ev):
                gen.close()
                first = gen.metrics
                gen = _continue(lease, prompt, out, run_req, watch, cancel, extra)
                yield TokenEvent(-1, forced_text(run_req.think.message if run_req.think
                                                 else ""))
                for ev2 in gen:
                    if ev2.token >= 0:
                        out.append(ev2.token)
                    yield ev2
                metrics = merged_metrics(first, gen.metrics, len(out))
                break
    finally:
        gen.close()
        state.untrack(active)
    yield done()


def _on_loop(state: ServerState, lease: Lease, gen: Generation, events: LoopEvents,
             out: list[int], active: ActiveGeneration, done: Callable[[], Done]) -> _OnLoop:
    """The `_OnLoop` of a generation whose events `events` delivers to the loop."""
    unwake: list[Callable[[], None]] = []  # (on_set runs its hook at once if set)

    def finish() -> None:
        for f in unwake:
            f()
        gen.close()  # (LoopEvents.end: never waits for a migration)
        state.untrack(active)
        lease.release()

    live = _OnLoop(events, gen, out, active, done, finish)
    # the cancel ends it too, except while the worker writes the stream: the reading
    # then goes on to the worker's report (its end would drop it), and ends it itself
    unwake.append(active.cancel.on_set(
        lambda: None if live.events.handed_over else live.end()))
    return live


def _continue(lease: Lease, prompt: str | list[int], out: list[int], run_req: GenRequest,
              watch: BudgetWatch, cancel: CancelEvent, extra: dict[str, Any]) -> Any:
    """The generation that goes on after a forced end of reasoning: the prompt, the
    reply so far and the forced text, as token ids (as text for a prompt with media,
    which has no id form); the forced ids join `out`."""
    engine = lease.engine
    forced = engine.tokenize(forced_text(run_req.think.message if run_req.think else ""),
                             add_special=False)
    left = max(run_req.sampling.max_tokens - len(out) - len(forced), 0)
    sampling = dataclasses.replace(run_req.sampling, max_tokens=left)
    if isinstance(prompt, str) and run_req.media:
        out.extend(forced)
        return engine.generate(prompt + watch.text + forced_text(
            run_req.think.message if run_req.think else ""), sampling, cancel, **extra)
    ids = list(prompt) if isinstance(prompt, list) else engine.tokenize(prompt)
    cont = ids + out + forced
    out.extend(forced)
    return engine.generate(cont, sampling, cancel,
                           **{k: v for k, v in extra.items() if k != "media"})


MAX_GROWTH_OUTPUT = 1024  # tokens of output a grown context leaves room for, at most


def _context_to_grow(lease: Lease, prompt: str | list[int], sampling: SamplingParams,
                     media: tuple[MediaItem, ...] = (), now: bool = False) -> int:
    """A larger context per sequence for a prompt that does not fit the loaded one (a
    power of two with room for some output, within the training context), or 0: the
    prompt fits, or the model cannot hold it anyway. Media count with the cells their
    encoder tokens take (`engine.media_tokens`; UsageError without a projector).
    `now` (on the event loop): _WouldWait where its tokens must be counted (the
    engine's tokenizer asks its worker, between two steps)."""
    n_ctx = lease.engine.n_ctx
    if now and isinstance(prompt, str) and (media or len(prompt.encode()) + 8 >= n_ctx):
        raise _WouldWait
    if media and isinstance(prompt, str):
        cells = lease.engine.media_tokens
        n = (len(lease.engine.tokenize(prompt.replace(MEDIA_MARKER, "")))
             + sum(int(cells(m)) for m in media))
    elif isinstance(prompt, str):
        if len(prompt.encode()) + 8 < n_ctx:  # a token is at least one byte: it fits
            return 0
        n = len(lease.engine.tokenize(prompt))
    else:
        n = len(prompt)
    if n < n_ctx:
        return 0
    train = lease.loaded.model.context_length or 0
    want = 256
    while want < n + min(sampling.max_tokens, MAX_GROWTH_OUTPUT):
        want *= 2
    want = min(want, train) if train else want
    return want if want > n else 0


class Run:
    """An admitted, started generation (see the module contract)."""

    def __init__(self, state: ServerState, ticket: Ticket,
                 stream: ThreadStream[Any] | ReadyStream[Any], t_arrival: float) -> None:
        self.state = state
        self._ticket = ticket
        self._stream = stream
        self._t0 = t_arrival
        self._head: list[Any] = []
        self.model: ResidentModel | None = None
        self.load_s = 0.0
        self.tool_format: ToolFormat | None = None  # set when tools were offered
        self.reasoning: Reasoning | None = None  # set for a chat with a reasoning section
        self.scored: list[TokenEvent] = []  # collect(): the events carrying logprobs
        self._live: _OnLoop | None = None  # tokens the loop reads itself, while it does
        self._ending: _OnLoop | None = None  # read to its end; close() ends it

    async def _begin(self) -> None:
        loaded = await self._stream.__anext__()
        assert isinstance(loaded, _Loaded)
        self.model, self.load_s = loaded.model, loaded.load_s
        self.tool_format = loaded.tool_format
        self.reasoning = loaded.reasoning
        self._head.append(await self._next())  # first token (or Done)

    async def _next(self) -> Any:
        """The next TokenEvent or the Done: from the engine's `LoopEvents` while the
        job handed those over (`_OnLoop`), else from the job's thread."""
        while True:
            live = self._live
            if live is None:
                item = await self._stream.__anext__()
                if not isinstance(item, _OnLoop):
                    return item
                self._live = live = item
            try:
                ev = await live.events.__anext__()
            except StopAsyncIteration:  # its end (a Finished, or cancelled): the Done
                self._live = None
                if live.events.finished:  # ended in close(), after the last event's write
                    self._ending = live
                else:  # cancelled: the end marks it interrupted, as its Done says
                    live.end()
                return live.done()
            except BaseException:  # its error, or this consumer was cancelled
                self._live = None
                live.end()
                raise
            _count(ev, live.out, live.active, live.gen)
            return ev

    def attach(self, frame: FrameSpec, fd: int, unsent: Callable[[bytes], None]) -> bool:
        """Hand the rest of the stream to the model worker to write to the socket `fd`
        (`engine.base.LoopEvents.attach`: every event read so far must be written);
        False when it cannot (the engine cannot, or an event read here waits)."""
        live = self._live
        return (not self._head and live is not None
                and live.events.attach(frame, fd, unsent))

    def ready(self) -> bool:
        """Whether the next event is here already, read by the loop itself (the tokens
        the engine delivers to the loop; never on the thread path): the stream is
        behind its generation (server/sse.py then writes the waiting events at once)."""
        if self._head:
            return True
        live = self._live
        return live is not None and live.events.ready()

    async def events(self) -> AsyncGenerator[TokenEvent | Done, None]:
        """Every TokenEvent, then one Done. Closing early cancels the generation."""
        m = self.state.metrics
        name = self.model.model.name if self.model else ""
        last: float | None = None
        finished = False
        counted = 0  # tokens already in generation_tokens_total
        tokens: Any = None
        itl: Any = None
        try:
            while True:
                item = self._head.pop() if self._head else await self._next()
                now = time.perf_counter()
                if isinstance(item, Done):
                    finished = True
                    self._record(item, now, name, counted)
                    yield item
                    return
                if item.written is not None:  # the worker wrote them: counted, no latencies
                    m.direct_tokens.labels(model_name=name).inc(len(item.written))
                    m.generation_tokens.labels(model_name=name).inc(len(item.written))
                    counted += len(item.written)
                    last = None if last is None else now  # no gap across its writes
                elif item.token >= 0:
                    # counted as generated, so that a rate read from the counter (monitor,
                    # /ui) moves while a request runs, and an abandoned one counts too
                    # (the labelled children looked up once a run, not once a token)
                    if tokens is None:
                        tokens, itl = (m.generation_tokens.labels(model_name=name),
                                       m.itl.labels(model_name=name))
                    tokens.inc()
                    counted += 1
                    if last is None:
                        m.ttft.labels(model_name=name).observe(now - self._t0)
                    else:
                        itl.observe(now - last)
                    last = now
                yield item
        except StopAsyncIteration:
            return
        finally:
            if not finished:  # the client went away (or an error): vLLM calls it abort
                m.success.labels(model_name=name, finished_reason="abort").inc()
            await self.close()

    def _record(self, done: Done, now: float, name: str, counted: int = 0) -> None:
        """A finished request's figures (`counted`: its tokens already counted)."""
        m, g = self.state.metrics, done.metrics
        m.prompt_tokens.labels(model_name=name).inc(g.prompt_tokens)
        if g.completion_tokens > counted:
            m.generation_tokens.labels(model_name=name).inc(g.completion_tokens - counted)
        m.decode_steps.labels(model_name=name).inc(g.decode_steps)
        if g.draft_tokens:
            m.draft_tokens.labels(model_name=name, drafter=g.draft).inc(g.draft_tokens)
            m.accepted_tokens.labels(model_name=name, drafter=g.draft).inc(g.draft_accepted)
        reason = {"eos": "stop", "stop": "stop", "length": "length"}.get(g.stop_reason, "abort")
        m.success.labels(model_name=name, finished_reason=reason).inc()
        m.e2e.labels(model_name=name).observe(now - self._t0)
        record_request(done, total_s=now - self._t0, concurrency=self.state.admission.running)

    async def collect(self) -> tuple[str, Done]:
        """Consume the whole generation: its text and its Done (and, in `scored`, the
        events with logprobs, when the sampling asked for them)."""
        parts: list[str] = []
        done: Done | None = None
        async for item in self.events():
            if isinstance(item, Done):
                done = item
            else:
                parts.append(item.text)
                if item.logprob is not None:
                    self.scored.append(item)
        assert done is not None
        return "".join(parts), done

    async def close(self) -> None:
        if self._ending is not None:  # (nothing in it waits: see _OnLoop)
            self._ending.end()
        await self._stream.aclose()
        self._ticket.leave()


async def _admit(state: ServerState) -> Ticket:
    """A running slot in the bounded queue; a refusal (429/503) is counted, then raised."""
    state.check_accepting()
    try:
        return await state.admission.enter()
    except Exception:
        state.metrics.rejected.labels(reason="queue_full").inc()
        raise


async def start_generation(state: ServerState, req: GenRequest) -> Run:
    """Admit `req`, lease its model and wait for its first token (see module contract)."""
    t0 = time.perf_counter()
    ticket = await _admit(state)
    loop = asyncio.get_running_loop()
    try:
        stream = _started_now(state, req, loop) or ThreadStream(_job(state, req, loop))
    except BaseException:
        ticket.leave()
        raise
    run = Run(state, ticket, stream, t0)
    try:
        await run._begin()
    except BaseException:
        await run.close()
        raise
    return run


def _started_now(state: ServerState, req: GenRequest, loop: asyncio.AbstractEventLoop
                 ) -> ReadyStream[Any] | None:
    """`req` started on the event loop (a `_quick` request on a hot model: two thread
    hops fewer, ~0.5 ms of its first token and of the loop's CPU on a machine whose
    cores the compute threads hold, issue 44), as the stream of the job's items; None:
    it starts from a thread (nothing was sent). Errors are the job's, as from the
    thread."""
    if not _quick(state, req):
        return None
    cancel = CancelEvent()
    try:
        return ReadyStream(list(_job(state, req, loop, now=True)(cancel)), cancel)
    except _WouldWait:
        return None


class ClientDisconnected(asyncio.CancelledError):
    """The client went away before its (non-streamed) answer was ready. A CancelledError,
    so the request unwinds as a cancellation; the access log turns it into one line (the
    request is over, nobody reads a response) instead of uvicorn's full traceback."""


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client goes away first, cancel it (which cancels the
    generation) and raise ClientDisconnected. The disconnect is a message, not a
    question asked on a timer: a task waits on the connection's `http.disconnect`
    (`disconnected`) beside `work`, and whichever ends first decides."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():  # finished as the client left: the answer still stands
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise ClientDisconnected("client disconnected")
    finally:
        for t in (task, gone):
            if not t.done():
                t.cancel()


async def disconnected(request: Request) -> None:
    """Return when the client has gone: the ASGI server sends `http.disconnect` on the
    request's receive channel (uvicorn as the connection is lost, or once the response
    is complete). Call it only after the body was read (the routes parse it first):
    any `http.request` still coming is dropped. Cancelling it consumes nothing, so a
    later listener (a StreamingResponse's) still gets the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def call_in_thread(fn: Callable[[], T], name: str = "blocking-call") -> T:
    """Run the blocking `fn` in its own thread (not the shared default pool, which has
    only a few workers on small machines) and return its result."""
    def job(_: CancelEvent) -> Iterator[T]:
        yield fn()

    stream: ThreadStream[T] = ThreadStream(job, name=name)
    async for result in stream:
        return result
    raise RuntimeError("worker thread produced no result")  # pragma: no cover


async def model_and_vocab(state: ServerState, name: str) -> tuple[ResolvedModel, Vocab]:
    """The model called `name` and its vocabulary: on the event loop when it is a file
    the server serves and its vocabulary is loaded (most requests), else in one thread
    hop (the registry is SQLite, a first vocabulary a file load). A hop per request was
    ~0.2 ms of the HTTP process's CPU and latency on a /completion (issue 44)."""
    model = state.catalog.alias(name)
    vocab = cached_vocab(model.path) if model is not None else None
    if model is not None and vocab is not None:
        return model, vocab

    def both() -> tuple[ResolvedModel, Vocab]:
        found = state.catalog.resolve(name)
        return found, vocab_for(found.path)

    return await call_in_thread(both)


async def admitted_call(state: ServerState, fn: Callable[[], T]) -> T:
    """`call_in_thread` behind the bounded queue (for embeddings: they use the engine)."""
    ticket = await _admit(state)
    try:
        return await call_in_thread(fn)
    finally:
        ticket.leave()
