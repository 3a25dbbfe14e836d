"""What crosses the worker pipe, as frozen dataclasses: a tagged union each way.

Parent → worker: one `ToWorker` per pipe message. Every request carries `req_id`
(keyword-only, so a request can be built first and numbered when it is sent:
`replace(msg, req_id=n)`). Three shapes:
- `Generate` opens a stream: the worker answers with `Event`s of that `req_id` until a
  `Finished` or `Failed`;
- an `Ask[R]` (Tokenize, Stats, Sleep, ...) is answered by exactly one `Result` whose
  `value` is an R, or by one `Failed`;
- `Cancel` ends the stream `req_id` (its `Finished` goes to that stream) and
  `Shutdown` ends the worker; neither has an answer of its own;
- `Attach` (a `Generate` sent with `direct`), followed on the pipe by a socket's file
  descriptor (SCM_RIGHTS): the worker writes the stream's token events to that socket
  itself from then on, and reports what it wrote in `Wrote`s, the last one `final`
  when it stops (before the stream's `Finished` / `Failed`, or before a migration
  exports it). An Attach the worker cannot take (the stream ended or moved) is answered
  by a `Wrote` marked `refused`; after the stream's end nobody reads it.

Worker → parent: each pipe message is a list of `FromWorker` (one list per scheduler
step or request handled; a step's list travels packed, its plain TokenOuts as tuples:
engine/worker/main.py `pack_step` / `unpack_step`). The first message is
`[Ready(info)]`, or `[Failed(0, ...)]` when the model did not load. A kind the worker
does not know is answered with `Failed(req_id, "UsageError", ...)`, never a crash.

The `Event`s (TokenOut, Progress, Finished, Failed) are also what the scheduler's
`step()` / `cancel()` return in process (LocalEngine, `run`): one type for both paths.
Everything here pickles (plain frozen dataclasses of picklable fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypedDict, TypeVar

import inferenceos.errors as errors
from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.engine.generation import GenerationMetrics, TokenEvent
from inferenceos.engine.live_state import LiveState
from inferenceos.engine.logprobs import TokenLogprob
from inferenceos.engine.sampling import SamplingParams
from inferenceos.media.item import MediaItem
from inferenceos.plan.llama_params import LlamaParams

R = TypeVar("R")

# -- replies' records ------------------------------------------------------------------


class MediaSupport(TypedDict, total=False):
    """What a model's projector takes; empty without one."""

    vision: bool
    audio: bool
    load_s: float  # seconds the projector took to load


class WorkerInfo(TypedDict, total=False):
    """The worker's facts: sent in `Ready`, updated by Sleep / Wake / Resize replies
    (which add "seconds", and Resize "carried": cached slots restored)."""

    pid: int
    n_ctx: int  # cells of the whole context
    n_ctx_slot: int  # cells of one sequence
    load_s: float
    bos_text: str
    eos_text: str
    asleep: bool
    draft_bytes: int
    buffers: dict[str, int]  # "kind:buffer type" -> bytes, from llama.cpp's log
    media: MediaSupport
    seconds: float
    carried: int


# The JSON-shaped figures of `Stats` (engine.kv_stats): "running", "waiting", "slots",
# "policy", "threads", "kv_cache", "weights" (a WeightStats), ...
StatsReport = dict[str, object]

# -- events: one generation's stream ---------------------------------------------------


@dataclass(frozen=True)
class TokenOut:
    """A chosen token and the text it made safe to emit (may be empty); token -1
    carries held-back text only. `logprob` / `top_logprobs`: when the request asked."""

    req_id: int
    token: int
    text: str
    logprob: TokenLogprob | None = None
    top_logprobs: tuple[TokenLogprob, ...] = ()

    def event(self) -> TokenEvent:
        return TokenEvent(self.token, self.text, self.logprob, self.top_logprobs)


@dataclass(frozen=True)
class Progress:
    """Prompt processing so far, for requests that asked (llama-server's
    `return_progress`): prompt tokens in all, of them from the cache, processed
    (the cached included), milliseconds since arrival."""

    req_id: int
    prompt_tokens: int
    cached: int
    processed: int
    ms: float

    def event(self) -> TokenEvent:
        return TokenEvent(-1, "", progress=(self.prompt_tokens, self.cached,
                                            self.processed, self.ms))


@dataclass(frozen=True)
class Finished:
    """The generation is over; `metrics` as the scheduler measured them (a snapshot
    rounded as GenerationMetrics.to_json rounds: what crossed the pipe as JSON)."""

    req_id: int
    metrics: GenerationMetrics


@dataclass(frozen=True)
class Failed:
    """A request failed: `error` names an `inferenceos.errors` class, `message` is its
    text. Ends a stream, or answers an Ask."""

    req_id: int
    error: str
    message: str

    @classmethod
    def of(cls, req_id: int, exc: BaseException) -> Failed:
        return cls(req_id, type(exc).__name__, str(exc))

    def exception(self) -> errors.InferenceOSError:
        """The exception to raise in the caller: the named class when it is one of
        `inferenceos.errors`, else GenerationError (a name from the worker is data)."""
        cls = getattr(errors, self.error, errors.GenerationError)
        if not (isinstance(cls, type) and issubclass(cls, errors.InferenceOSError)):
            cls = errors.GenerationError
        return cls(self.message)


@dataclass(frozen=True)
class Wrote:
    """What the worker wrote of stream `req_id` to its client's socket (`Attach`) since
    its last report: the tokens `ids`, their text `text`. With `final`, it stopped
    writing: `unsent` is what the socket did not take yet (the client reads slower),
    to be written before anything else, and `error` why it stopped early ("" when it
    did not: the stream ended or moves to another worker). Without, it writes on (a
    report every half second at most, so live counts move). `refused`: the worker did
    not take the stream at all (it had ended, or moved here from another worker, or
    the socket could not be used): it wrote nothing, the parent writes what it kept."""

    req_id: int
    ids: tuple[int, ...]
    text: str
    unsent: bytes = b""
    error: str = ""
    final: bool = True
    refused: bool = False


Event = TokenOut | Progress | Finished | Failed

# -- other answers -----------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """The answer to an `Ask[R]`: `value` is an R (the worker's contract)."""

    req_id: int
    value: object


@dataclass(frozen=True)
class Ready:
    """The worker loaded its model; always alone in the first pipe message."""

    info: WorkerInfo
    req_id: int = 0


FromWorker = TokenOut | Progress | Finished | Failed | Result | Ready | Wrote

# -- requests --------------------------------------------------------------------------


@dataclass(frozen=True)
class ToWorker:
    """Every request to the worker; `req_id` routes its answers back."""

    req_id: int = field(default=0, kw_only=True)


@dataclass(frozen=True)
class Ask(ToWorker, Generic[R]):
    """A request answered by one `Result` holding an R (or one `Failed`)."""


@dataclass(frozen=True)
class Generate(ToWorker):
    """Generate for `prompt` (text or token ids). `kv_policy` / `draft`: None for the
    engine's own. `media`: items for a text prompt holding one media marker each, in
    order. `progress`: also stream `Progress` while the prompt is processed. `direct`:
    an `Attach` may follow (the worker keeps the stream's token events until then)."""

    prompt: str | list[int]
    sampling: SamplingParams
    kv_policy: str | None = None
    draft: str | None = None
    media: tuple[MediaItem, ...] = ()
    progress: bool = False
    direct: bool = False


@dataclass(frozen=True)
class Attach(ToWorker):
    """Write stream `req_id`'s token events to a socket from its `written`-th on (the
    ones the parent wrote come first), as `frame` says; the socket's descriptor follows
    this message on the pipe. See the module contract."""

    frame: FrameSpec
    written: int


@dataclass(frozen=True)
class Cancel(ToWorker):
    """End the stream `req_id` now (queued or running); its slot is free at once."""


@dataclass(frozen=True)
class Shutdown(ToWorker):
    """Stop serving and exit (the worker finishes its KV store's disk writes first)."""


@dataclass(frozen=True)
class MediaTokens(Ask[int]):
    """Context cells `item` takes in a prompt (UsageError without a projector)."""

    item: MediaItem


@dataclass(frozen=True)
class Stats(Ask[StatsReport]):
    """KV usage per slot, running and waiting requests (a warm worker stays warm)."""


@dataclass(frozen=True)
class Tokenize(Ask[list[int]]):
    text: str
    add_special: bool = True


@dataclass(frozen=True)
class Embed(Ask[list[list[float]]]):
    """Mean-pooled, L2-normalised embeddings, one per text (or token ids)."""

    texts: tuple[str | list[int], ...]


@dataclass(frozen=True)
class ExportState(Ask["tuple[list[int], bytes] | None"]):
    """The KV state of the idle slot sharing the longest prefix with `tokens`."""

    tokens: tuple[int, ...]


@dataclass(frozen=True)
class ImportState(Ask[int]):
    """Restore an ExportState result into an idle slot; answers the tokens cached."""

    tokens: tuple[int, ...]
    data: bytes


@dataclass(frozen=True)
class Prefetch(Ask[int]):
    """Bring the tiered KV cache's longest prefix of `tokens` into an idle slot now;
    answers the tokens of it an idle slot holds."""

    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Sleep(Ask[WorkerInfo]):
    """Free the context, keep the weights (a warm model); only while idle."""


@dataclass(frozen=True)
class Wake(Ask[WorkerInfo]):
    """Open a context on the kept weights (warm → hot)."""


@dataclass(frozen=True)
class Resize(Ask[WorkerInfo]):
    """A new context of `settings` (n_ctx counts every slot's cells) and `n_slots` on
    the same weights, cached slots' KV carried over; only while idle."""

    settings: LlamaParams
    n_slots: int


@dataclass(frozen=True)
class LiveNeed(Ask[int]):
    """Cells per sequence the live requests were promised (engine.migrate)."""


@dataclass(frozen=True)
class ExportLive(Ask[LiveState]):
    """Detach every running and queued request at this step boundary (engine.migrate);
    their streams get no event here: they continue where the state is imported."""


@dataclass(frozen=True)
class ImportLive(Ask["dict[str, int]"]):
    """Resume an ExportLive state here; answers its counts ("restored", ...)."""

    state: LiveState


@dataclass(frozen=True)
class SetThreads(Ask[int]):
    """Compute with `n` threads from the next step on (None: the settings' own again);
    answers the decode thread count now in force."""

    n: int | None


def unknown(msg: object) -> Failed:
    """The answer to a message the worker does not know (a bug in the parent, or a
    parent of another version): a typed error for that request, never a crash."""
    req_id = msg.req_id if isinstance(msg, ToWorker) else 0
    return Failed(req_id, "UsageError", f"unknown request {type(msg).__name__}")
