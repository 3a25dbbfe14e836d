"""What `inferenceos chat` does, apart from the terminal: history, options, backends.

A `ChatSession` holds the conversation (a list of {"role", "content"} dicts), the
sampling options set with `/set`, and a backend that streams a reply:
- `LocalBackend`: the model loaded in this process through the Python API;
- `ServerBackend`: a running InferenceOS (or Ollama) server, through Ollama's
  `/api/chat` (or `/api/generate` with `raw` for a model without a chat template).
Both yield text pieces and leave the reply's `ReplyStats` behind; a piece of the
model's reasoning (a thinking model's `<think>` section) is a `Thought`, which the
history leaves out (as chat templates drop past reasoning). A base model (no chat
template) is spoken to in a plain transcript ("User: ... / Assistant:") that stops
where the model would start the user's next line.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import inferenceos
from inferenceos.cli.server_client import ServerClient, ServerError, ServerHTTPError
from inferenceos.engine.generation import GenerationMetrics
from inferenceos.errors import InferenceOSError, UsageError

# /set KEY VALUE: the sampling options chat accepts, and their types
OPTION_TYPES: dict[str, type] = {
    "temperature": float, "top_k": int, "top_p": float, "min_p": float, "seed": int,
    "max_tokens": int, "repeat_penalty": float, "presence_penalty": float,
    "frequency_penalty": float, "stop": str, "reasoning_budget": int,
}
# options that are not Ollama's sampling options: how the reply reasons
_THINK_KEYS = ("think", "reasoning_budget")


class Thought(str):
    """A piece of the reply's reasoning (its `<think>` section), not of its answer."""

    __slots__ = ()
# the same options as Ollama's `options` names them
_OLLAMA_NAMES = {"max_tokens": "num_predict"}


REPLY_TIMEOUT_S = 600.0  # a reply's wait for its next line (a load, a long prefill)


class ContextFullError(InferenceOSError):
    """The server refused the prompt as longer than its context."""


_TOO_LONG = re.compile(r"prompt has \d+ tokens")


@dataclass
class ReplyStats:
    """Figures of the last reply, for `/stats`: its GenerationMetrics (what `run --json`
    reports; a served reply fills those the server reports) and the model's context.
    A reply stopped early (Ctrl-C) keeps what was measured of the part that ran; a
    figure never measured is 0 and shown as such in words, never as "0 ms" or
    "0.0 t/s". `prompt_known` False: the prompt's tokens are not known (a server
    reports them only when a reply ends)."""

    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)
    n_ctx: int = 0
    prompt_known: bool = True

    def lines(self) -> list[str]:
        m = self.metrics
        n_out = m.completion_tokens
        used = (m.prompt_tokens if self.prompt_known else 0) + n_out
        used = min(used, self.n_ctx) if self.n_ctx else used
        share = f" ({100 * used / self.n_ctx:.0f} %)" if self.n_ctx else ""
        cached = f", {m.cached_tokens} reused from the cache" if m.cached_tokens else ""
        stopped = m.stop_reason == "interrupted"
        if m.ttft_s > 0:
            ms = m.ttft_s * 1000
            ttft = f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"
        elif stopped and not n_out:
            ttft = "- (the reply was stopped before its first token)"
        else:
            ttft = "-"
        if not self.prompt_known:
            prompt = "? tokens (the server reports them when a reply ends)"
        else:
            prompt = _tokens(m.prompt_tokens) + (
                f" at {m.prompt_tps:.1f} t/s" if m.prompt_tps > 0 else
                " (stopped before it was read)" if stopped and not n_out else "") + cached
        if m.decode_tps > 0:
            speed = f" at {m.decode_tps:.1f} t/s"
        elif n_out == 1:
            speed = " (one token: no decode speed)"
        else:
            speed = ""
        return [
            f"TTFT          {ttft}",
            f"prompt        {prompt}",
            f"reply         {_tokens(n_out)}{speed} (stop: {m.stop_reason or '-'})",
            f"context used  {used} of {self.n_ctx or '?'} tokens{share}",
        ] + ([f"drafting      {m.draft}: {m.acceptance_rate:.0%} of drafts accepted, "
              f"{m.tokens_per_step:.2f} tokens per step"] if m.draft else [])


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


class Backend(Protocol):
    """Streams replies for one model."""

    name: str
    where: str  # "in-process" or the server's URL
    has_template: bool
    sees_images: bool | None  # whether it takes images (None: the server did not say)
    stats: ReplyStats

    def reply(self, messages: list[dict[str, Any]], options: dict[str, Any]) -> Iterator[str]:
        ...

    def close(self) -> None: ...


def _template_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """The template variables `/think` and `reasoning_budget` ask of a model loaded in
    this process: thinking off for `think` false or a budget of 0 (the template's
    `enable_thinking`, engine/reasoning.apply_thinking where it has none), on for `think`
    true; none when neither is set. (A budget N > 0 is kept only by a served model.)"""
    think, budget = options.get("think"), options.get("reasoning_budget")
    if think is False or budget == 0:
        return {"enable_thinking": False}
    return {"enable_thinking": True} if think is True else {}


class LocalBackend:
    """The model loaded in this process (inferenceos.load)."""

    where = "in-process"

    def __init__(self, model: str, **load_options: Any) -> None:
        self.model = inferenceos.load(model, **load_options)
        self.name = self.model.name
        self.has_template = self.model.has_chat_template
        self.sees_images: bool | None = bool(self.model.engine.media_support.get("vision"))
        self.stats = ReplyStats(n_ctx=self.model.n_ctx)
        self._load_uid: str | None = None  # telemetry's record of this load

    def reply(self, messages: list[dict[str, Any]], options: dict[str, Any]) -> Iterator[str]:
        from inferenceos.engine.reasoning import Reasoning, ThinkingSplit

        kwargs = _template_kwargs(options)
        options = {k: v for k, v in options.items() if k not in _THINK_KEYS}
        split = None
        if "<think>" in (self.model.spec.chat_template or ""):  # a thinking model's reply
            prompt = self.model.chat_prompt(messages, media=[], template_kwargs=kwargs)
            split = ThinkingSplit(Reasoning(prompt.rstrip().endswith("<think>")))
        stream = self.model.chat(messages, stream=True, template_kwargs=kwargs, **options)
        try:
            for piece in stream:
                if split is None:
                    yield piece
                    continue
                thought, text = split.feed(piece)
                yield from [p for p in (Thought(thought), text) if p]
            if split is not None:
                thought, text = split.finish()
                yield from [p for p in (Thought(thought), text) if p]
        finally:
            stream.close()
            m = stream.metrics
            # each reply is a run the planner learns from (speed, the drafter), as `run`'s
            from inferenceos.app.run_telemetry import record_generation

            self._load_uid = record_generation(
                self.model.path, self.model.engine.settings, m, source="chat",
                load_uid=self._load_uid) or self._load_uid
            self.stats = ReplyStats(m, self.model.n_ctx)

    def count_tokens(self, messages: list[dict[str, Any]]) -> int:
        """Prompt tokens `messages` take under the model's template (images: the cells
        their encoder output takes)."""
        media: list[Any] = []
        text = self.model.chat_prompt(messages, media=media)
        return len(self.model.tokenize(text)) + sum(
            self.model.engine.media_tokens(item) for item in media)

    def close(self) -> None:
        self.model.close()


class ServerBackend:
    """A model served by a running server, spoken to through Ollama's API (the server's
    errors as `ServerClient` words them; a prompt longer than its context is a
    ContextFullError)."""

    def __init__(self, url: str, model: str, api_key: str = "") -> None:
        self.client = ServerClient(url.rstrip("/"), api_key, timeout=REPLY_TIMEOUT_S)
        self.url = self.where = self.client.base
        if not model:  # the server's default: a load request (empty prompt) names it
            model = str(self.client.post_json(
                "/api/generate", {"model": "", "prompt": "", "stream": False}
            ).get("model") or "")
        shown = self.client.post_json("/api/show", {"model": model}, timeout=60)
        self.name = model
        self.has_template = bool(shown.get("template"))
        caps = shown.get("capabilities")  # Ollama's list; "vision" with a projector
        self.sees_images: bool | None = "vision" in caps if isinstance(caps, list) else None
        self.stats = ReplyStats()

    def _n_ctx(self) -> int:
        try:
            models = self.client.get_json("/api/ps", timeout=5).get("models", [])
        except ServerError:
            return 0
        for m in models:
            if self.name in (m.get("name"), m.get("model")) or len(models) == 1:
                return int(m.get("context_length") or 0)
        return 0

    def reply(self, messages: list[dict[str, Any]], options: dict[str, Any]) -> Iterator[str]:
        from inferenceos.api import TRANSCRIPT_STOP, _messages, transcript

        opts = {_OLLAMA_NAMES.get(k, k): v for k, v in options.items() if k != "think"}
        if self.has_template:
            path, key = "/api/chat", "message"
            body: dict[str, Any] = {"model": self.name, "messages": messages}
            if options.get("think") is not None:
                body["think"] = options["think"]
        else:
            path, key = "/api/generate", "response"
            stop = opts.get("stop") or []
            opts["stop"] = [*([stop] if isinstance(stop, str) else stop), TRANSCRIPT_STOP]
            body = {"model": self.name, "prompt": transcript(_messages(messages)), "raw": True}
        body.update(stream=True, options=opts)
        t0 = time.perf_counter()
        final: dict[str, Any] = {}
        n_out, first, last = 0, 0.0, 0.0  # pieces streamed, when the first and last came
        try:
            with contextlib.closing(self.client.stream_lines(path, body)) as lines:
                for line in lines:
                    if not line.strip():
                        continue
                    msg = json.loads(line)
                    if msg.get("error"):
                        raise InferenceOSError(f"the server failed: {msg['error']}")
                    piece = msg.get(key)
                    text = piece.get("content", "") if isinstance(piece, dict) else piece or ""
                    thought = (piece.get("thinking") if isinstance(piece, dict)
                               else msg.get("thinking")) or ""
                    if thought:
                        yield Thought(thought)
                    if not msg.get("done"):
                        last = time.perf_counter()
                        first, n_out = first or last, n_out + 1
                    if text:
                        yield text
                    if msg.get("done"):
                        final = msg
                        break
        except ServerHTTPError as exc:  # a server that counted: the caller makes room
            raise (ContextFullError(str(exc)) if _TOO_LONG.search(exc.detail) else exc) from None
        except (KeyboardInterrupt, GeneratorExit):
            # stopped early: the server's figures come only with the last line, so
            # what this side measured stands in (one streamed line per token)
            self.stats = ReplyStats(GenerationMetrics(
                completion_tokens=n_out, ttft_s=first - t0 if n_out else 0.0,
                decode_tps=(n_out - 1) / (last - first) if n_out > 1 and last > first else 0.0,
                stop_reason="interrupted"), self.stats.n_ctx, prompt_known=False)
            raise
        self.stats = self._stats(final, time.perf_counter() - t0)

    def _stats(self, final: dict[str, Any], wall_s: float) -> ReplyStats:
        ns = 1e-9
        prompt, ttft = int(final.get("prompt_eval_count", 0)), final.get("prompt_eval_duration", 0)
        out, decode = int(final.get("eval_count", 0)), final.get("eval_duration", 0) * ns
        ttft_s = ttft * ns or wall_s
        return ReplyStats(GenerationMetrics(
            prompt_tokens=prompt, completion_tokens=out, ttft_s=ttft_s,
            prompt_tps=prompt / ttft_s if ttft_s else 0.0,
            decode_tps=(out - 1) / decode if decode and out > 1 else 0.0,
            stop_reason=str(final.get("done_reason", ""))), self._n_ctx())

    def close(self) -> None:
        pass


def parse_option(key: str, value: str) -> Any:
    """A `/set KEY VALUE` value, typed; UsageError for an unknown key or a bad value."""
    kind = OPTION_TYPES.get(key)
    if kind is None:
        raise UsageError(f"unknown option {key!r}; options: {', '.join(OPTION_TYPES)}, system")
    try:
        return kind(value)
    except ValueError:
        raise UsageError(f"{key} takes a {kind.__name__}, not {value!r}") from None


@dataclass
class ChatSession:
    """The conversation, its options and its backend (see the module docstring)."""

    backend: Backend
    system: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0  # messages dropped so far to fit the context
    images: list[str] = field(default_factory=list)  # base64, for the next user message
    thinking: str = ""  # the last reply's reasoning (/think show)

    def messages(self, user_text: str | None = None) -> list[dict[str, Any]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        tail: list[dict[str, Any]] = []
        if user_text is not None:
            tail = [{"role": "user", "content": user_text,
                     **({"images": list(self.images)} if self.images else {})}]
        if self.backend.sees_images is not False:
            return head + self.history + tail
        # a model that cannot see (after /switch): the text of every message, its images
        # kept in the history for a model that can
        return [{k: v for k, v in m.items() if k != "images"}
                for m in head + self.history + tail]

    def attach_image(self, path: Path) -> str:
        """`/image FILE`: check the image now and send it with the next message (as
        Ollama's chat does); what to tell the user. UsageError, and nothing attached,
        when the model cannot see images (no projector)."""
        import base64

        from inferenceos.media.files import decode_media, read_media_bytes

        if self.backend.sees_images is False:
            raise UsageError(f"{self.backend.name} cannot see images: it has no multimodal "
                             "projector (start chat with --mmproj FILE); nothing attached")
        data = read_media_bytes(path, "image")
        item = decode_media(data, "image")  # a bad file fails here, not mid-reply
        self.images.append(base64.b64encode(data).decode())
        return (f"image {Path(path).name} ({item.nx}x{item.ny}) goes with your next "
                f"message ({len(self.images)} attached)")

    def unseen_images(self) -> int:
        """Images in the conversation (and attached) that the backend cannot see, and
        that `messages` therefore leaves out."""
        if self.backend.sees_images is not False:
            return 0
        return len(self.images) + sum(len(m.get("images") or ()) for m in self.history)

    def ask(self, text: str) -> Iterator[str]:
        """Stream the reply to `text`. The exchange joins the history when the reply
        ends, or is cut short (Ctrl-C) with what was shown of it; not when it failed.
        When the conversation outgrows the context, the oldest exchanges are dropped
        (`dropped` counts them) so that the reply still has room."""
        parts: list[str] = []
        thought: list[str] = []
        done = False
        try:
            while True:
                try:
                    for piece in self.backend.reply(self.fit(text), self.options):
                        (thought if isinstance(piece, Thought) else parts).append(piece)
                        self.thinking = "".join(thought)
                        yield piece
                    break
                except ContextFullError:  # a server that counted: drop an exchange, retry
                    if parts or not self.history:
                        raise
                    del self.history[:2]
                    self.dropped += 2
            done = True
        except (KeyboardInterrupt, GeneratorExit):
            done = True
            raise
        finally:
            if done:
                self.history.append(self.messages(text)[-1])  # with its images
                self.images.clear()
                self.history.append({"role": "assistant", "content": "".join(parts).strip()})

    def fit(self, text: str) -> list[dict[str, Any]]:
        """The messages to send for `text`, the oldest exchanges dropped from the
        history while the prompt leaves the reply less than a quarter of the context
        (or its max_tokens, when smaller)."""
        count = getattr(self.backend, "count_tokens", None)
        n_ctx = self.backend.stats.n_ctx
        if count is None or not n_ctx:
            return self.messages(text)
        reserve = min(int(self.options.get("max_tokens") or n_ctx), n_ctx // 4)
        while count(self.messages(text)) > n_ctx - reserve and self.history:
            del self.history[:2]
            self.dropped += 2
        return self.messages(text)

    def set_option(self, key: str, value: str) -> str:
        """Apply `/set KEY VALUE`; returns what changed, for the user."""
        if key == "system":
            self.system = value
            return "system message set"
        typed = parse_option(key, value)
        from inferenceos.api import sampling_params

        trial = {**self.options, key: typed}
        if key == "reasoning_budget" and typed < -1:
            raise UsageError("reasoning_budget is -1 (unrestricted), 0 (off) or N tokens")
        # validated as the engine would: a bad value is refused now
        sampling_params({k: v for k, v in trial.items() if k not in _THINK_KEYS})
        self.options = trial
        return f"{key} = {typed!r}"

    def think(self, mode: str) -> str:
        """`/think on|off`: ask a thinking model to reason or not (a served model: its
        template's enable_thinking); what to tell the user. UsageError for another word."""
        if mode not in ("on", "off"):
            raise UsageError("usage: /think on|off|show")
        self.options["think"] = mode == "on"
        return f"thinking {mode}"

    def clear(self) -> None:
        self.history.clear()
        self.images.clear()

    def save(self, path: Path) -> None:
        from inferenceos.atomic import write_text_atomic

        data = {"model": self.backend.name, "system": self.system, "options": self.options,
                "messages": self.history}
        write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")

    def load(self, path: Path) -> int:
        """Replace the conversation with a `/save` file; returns its message count."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
        except ValueError:
            raise UsageError(f"{path} is not a saved chat (not JSON)") from None
        msgs = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(msgs, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in msgs):
            raise UsageError(f"{path} is not a saved chat (no list of messages)")
        options = data.get("options") or {}
        for key, value in options.items():
            parse_option(key, str(value))
        self.history = [{"role": m["role"], "content": m["content"]} for m in msgs]
        self.system = str(data.get("system") or "")
        self.options = dict(options)
        return len(self.history)
