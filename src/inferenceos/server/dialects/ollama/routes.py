"""Ollama-compatible generation routes under /api: generate, chat, embed, embeddings.
Streams are NDJSON (one JSON object per line), durations are nanoseconds, errors are
`{"error": "..."}`. Model management (tags, show, ps, pull, delete, copy) is
server/dialects/ollama/model_routes.py, under the same prefix and error dialect.

`think` (true, false, or a level) separates the reasoning of a model whose template
has a reasoning section (server/reasoning.py): `message.thinking` on /api/chat,
`thinking` on /api/generate, streamed and whole.

An empty prompt (or no messages) loads the model and returns at once, with
`done_reason: "load"`; adding `keep_alive: 0` unloads it instead (`"unload"`), as
Ollama does.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request

from inferenceos.engine.chat_template import ChatMessage
from inferenceos.engine.frame_spec import TIME, FrameSpec
from inferenceos.engine.generation import TokenEvent
from inferenceos.engine.sampling import SamplingParams
from inferenceos.errors import UsageError
from inferenceos.media.collect import check_text
from inferenceos.media.item import MediaItem
from inferenceos.server.dialects.ollama.schema import (
    ERRORS,
    ChatRequest,
    ChatResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    GenerateRequest,
    GenerateResponse,
    OllamaMessage,
)
from inferenceos.server.direct_stream import direct_response
from inferenceos.server.errors import APIError, Dialect, route_class
from inferenceos.server.generation import (
    Done,
    GenRequest,
    Run,
    admitted_call,
    call_in_thread,
    model_and_vocab,
    start_generation,
    until_disconnect,
)
from inferenceos.server.infill import Limits, infill_prompt, require_fim, text_ids
from inferenceos.server.json_grammar import output_grammar
from inferenceos.server.logprobs import entries
from inferenceos.server.media_parts import decode_in_thread, media_set, ollama_images
from inferenceos.server.options import ollama_options, parse_keep_alive
from inferenceos.server.reasoning import EFFORTS, Think, check_budget
from inferenceos.server.reply import Final, read_reply, reply_events
from inferenceos.server.rerank import refuse_embeddings
from inferenceos.server.sse import NDJSON
from inferenceos.server.state import ServerState, state_of
from inferenceos.server.tool_calls import ParsedCall
from inferenceos.server.tools import history_call, ollama_calls, tool_request
from inferenceos.units import iso_time

_NDJSON = {"application/x-ndjson": {"schema": {"type": "string"}}}
NS = 1_000_000_000

router = APIRouter(prefix="/api", tags=["ollama"], responses=ERRORS,
                   route_class=route_class(Dialect.OLLAMA))


def _ns(seconds: float) -> int:
    return max(0, int(seconds * NS))


def _refuse(fmt: Any, extra: str | None = None) -> None:
    if fmt not in (None, "", "json") and not isinstance(fmt, dict):
        raise APIError(400, "format: \"json\" or a JSON schema object")
    if extra:
        raise APIError(400, f"{extra} is not supported")


def _with_format(parsed: tuple[SamplingParams, dict[str, int]], fmt: Any,
                 logprobs: bool | None = None, top_logprobs: int | None = None
                 ) -> tuple[SamplingParams, dict[str, int]]:
    """format "json" constrains sampling to a JSON object, a schema object to the
    schema; `logprobs` asks for each token's (and the `top_logprobs` best ones')."""
    sampling, overrides = parsed
    if logprobs:
        sampling = dataclasses.replace(sampling, logprobs=top_logprobs or 0)
    if fmt == "json":
        sampling = dataclasses.replace(sampling, grammar=output_grammar("json_object"))
    elif isinstance(fmt, dict):
        sampling = dataclasses.replace(sampling, grammar=output_grammar("json_schema", fmt))
    return sampling, overrides


async def _load_or_unload(state: ServerState, name: str, keep_alive: float | None,
                          body: dict[str, Any]) -> dict[str, Any]:
    """Ollama's load-only and unload requests (empty prompt)."""
    if keep_alive == 0:
        await call_in_thread(lambda: state.manager.unload(name))
        reason = "unload"
    else:
        def load() -> None:
            state.manager.acquire(name, keep_alive).release()
        await admitted_call(state, load)
        reason = "load"
    return {"model": name, "created_at": iso_time(), **body, "done": True, "done_reason": reason}


def _timings(done: Done, t0: float, t_first: float | None, t_end: float) -> dict[str, Any]:
    """The final line's figures. As Ollama's: prompt_eval_count is the whole prompt,
    cached part included; prompt_eval_cached_count the part read from the KV cache,
    left out when there was none (Ollama's omitempty)."""
    g = done.metrics
    out = {
        "done_reason": "length" if g.stop_reason == "length" else "stop",
        "total_duration": _ns(t_end - t0), "load_duration": _ns(done.load_s),
        "prompt_eval_count": g.prompt_tokens, "prompt_eval_duration": _ns(g.ttft_s),
        "eval_count": g.completion_tokens,
        "eval_duration": _ns(t_end - t_first if t_first else 0.0),
    }
    cached = min(g.cached_tokens, g.prompt_tokens)
    if cached > 0:
        out["prompt_eval_cached_count"] = cached
    return out


async def _respond(request: Request, state: ServerState, req: GenRequest, stream: bool,
                   piece_key: str, context: bool) -> Any:
    """Run `req` and answer as Ollama does, streamed (NDJSON) or whole. A plain stream
    (no tools, no logprobs; no reasoning section, seen once it runs) may be written by
    the model worker itself (server/direct_stream.py)."""
    t0 = time.perf_counter()
    if stream and state.settings.direct_writes and req.tools is None \
            and req.sampling.logprobs is None:  # (0: each token's own, no top ones)
        req = dataclasses.replace(req, direct=True)
    run = await until_disconnect(request, start_generation(state, req))
    scored: list[TokenEvent] = []  # tokens whose logprobs ride on the next line

    def piece(text: str, calls: list[ParsedCall] | None = None, thought: str = "",
              at: str | None = None) -> dict[str, Any]:
        body: Any = text
        line: dict[str, Any] = {"model": req.model, "created_at": at or iso_time()}
        if piece_key == "message":
            body = {"role": "assistant", "content": text}
            if thought:
                body["thinking"] = thought
            if calls:
                body["tool_calls"] = ollama_calls(calls)
        elif thought:
            line["thinking"] = thought
        line.update({piece_key: body, "done": False})
        if scored:
            line["logprobs"] = entries(scored)
            scored.clear()
        return line

    def final(done: Done, t_first: float | None, text: str,
              calls: list[ParsedCall] | None = None, thought: str = "") -> dict[str, Any]:
        out = {**piece(text, calls, thought), "done": True,
               **_timings(done, t0, t_first, time.perf_counter())}
        if context:
            out["context"] = done.prompt_ids + done.output_ids
        return out

    async def lines(run: Run) -> AsyncIterator[dict[str, Any]]:
        t_first = None
        async with aclosing(reply_events(run)) as replies:
            async for d in replies:
                if isinstance(d, Final):
                    if d.text or d.calls or d.thought:  # the calls on a line of their own
                        yield piece(d.text, d.calls, d.thought)
                    yield final(d.done, t_first, "")
                else:
                    t_first = t_first or time.perf_counter()
                    if d.event.written is not None:  # the worker wrote these itself
                        continue
                    if d.event.logprob is not None:
                        scored.append(d.event)
                    if d.text or d.thought:
                        yield piece(d.text, thought=d.thought)

    def frame() -> FrameSpec | None:
        if run.reasoning is not None or run.tool_format is not None:
            return None
        return FrameSpec.sample(lambda text, _, __: NDJSON.frame(piece(text, at=TIME), 0),
                                skip_empty=True)

    if stream:
        return direct_response(lines(run), NDJSON, run.close, run=lambda: run, frame=frame,
                               enabled=req.direct)

    async def whole() -> dict[str, Any]:
        parts: list[str] = []
        t_first: float | None = None
        async for item in run.events():
            if isinstance(item, Done):
                thought, text, calls = read_reply("".join(parts), run.tool_format,
                                                  run.reasoning)
                return final(item, t_first, text, calls, thought)
            t_first = t_first or time.perf_counter()
            if item.logprob is not None:
                scored.append(item)
            parts.append(item.text)
        raise APIError(500, "generation ended without a result")

    return await until_disconnect(request, whole())


@router.post("/generate", response_model=GenerateResponse, response_model_exclude_none=True,
             responses={200: {"content": _NDJSON,
                              "description": "The response, or NDJSON lines when streaming"}})
async def generate(body: GenerateRequest, request: Request) -> Any:
    """Complete a prompt (templated unless `raw`)."""
    state = state_of(request)
    _refuse(body.format, "template" if body.template else None)
    name = state.model_name(body.model)
    keep_alive = parse_keep_alive(body.keep_alive)
    sampling, overrides = _with_format(ollama_options(body.options), body.format,
                                       body.logprobs, body.top_logprobs)
    if not body.prompt and not body.images:
        return await _load_or_unload(state, name, keep_alive, {"response": ""})
    if body.suffix and not body.raw:  # as Ollama: raw leaves the suffix out
        return await _respond(request, state, await _infill(state, name, body, sampling,
                                                            overrides, keep_alive),
                              body.stream, "response", context=True)
    prompt, items = body.prompt or "", tuple[MediaItem, ...]()
    if body.images:  # Ollama puts the images before the prompt text
        if body.context:
            raise APIError(400, "images cannot be combined with context (token ids "
                           "cannot carry them); send the conversation to /api/chat")
        prompt, items = await decode_in_thread(
            lambda: _with_images(state, body.images, prompt))
    if body.raw:
        req = GenRequest(name, sampling, text=prompt, keep_alive=keep_alive,
                         overrides=overrides or None, want_tokens=not items,
                         context=tuple(body.context or ()), media=items)
    else:
        msgs = [ChatMessage("system", body.system)] if body.system else []
        msgs.append(ChatMessage("user", prompt))
        req = GenRequest(name, sampling, messages=tuple(msgs), keep_alive=keep_alive,
                         overrides=overrides or None, want_tokens=not items,
                         context=tuple(body.context or ()), media=items,
                         think=_think(body.think, body.options))
    # a prompt with images has no token-id form: no `context` in the answer
    return await _respond(request, state, req, body.stream, "response", context=not items)


async def _infill(state: ServerState, name: str, body: GenerateRequest,
                  sampling: SamplingParams, overrides: dict[str, int],
                  keep_alive: float | None) -> GenRequest:
    """`prompt` then `suffix` as a fill-in-the-middle prompt of the model's FIM tokens
    (server/infill.py; `context` first, as Ollama puts it before the rendered template;
    `system` is not part of Ollama's insert templates); 400 "does not support insert"
    for a model without them."""
    if body.images:
        raise APIError(400, "images cannot be combined with suffix")
    _, vocab = await model_and_vocab(state, name)
    fim = require_fim(vocab, f'"{body.model or name}" does not support insert')

    def build() -> list[int]:
        return infill_prompt(vocab, fim, text_ids(vocab, body.prompt or "", "prompt"),
                             text_ids(vocab, body.suffix or "", "suffix"), Limits(0))

    tokens = list(body.context or ()) + await call_in_thread(build)
    return GenRequest(name, sampling, tokens=tuple(tokens), keep_alive=keep_alive,
                      overrides=overrides or None)


def _with_images(state: ServerState, images: list[str] | None, text: str
                 ) -> tuple[str, tuple[MediaItem, ...]]:
    """`text` after one marker per image (Ollama's order), and the decoded images."""
    media = media_set(state.settings)
    markers = ollama_images(images, media)
    return markers + check_text(text), tuple(media.items)


@router.post("/chat", response_model=ChatResponse, response_model_exclude_none=True,
             responses={200: {"content": _NDJSON,
                              "description": "The message, or NDJSON lines when streaming"}})
async def chat(body: ChatRequest, request: Request) -> Any:
    """Chat through the model's template."""
    state = state_of(request)
    _refuse(body.format)
    name = state.model_name(body.model)
    keep_alive = parse_keep_alive(body.keep_alive)
    sampling, overrides = _with_format(ollama_options(body.options), body.format,
                                       body.logprobs, body.top_logprobs)
    if not body.messages:
        return await _load_or_unload(state, name, keep_alive,
                                     {"message": {"role": "assistant", "content": ""}})
    items: tuple[MediaItem, ...] = ()
    if any(m.images for m in body.messages):
        msgs, items = await decode_in_thread(
            lambda: _with_media(state, body.messages or []))
    else:
        msgs = tuple(_chat_message(m) for m in body.messages)
    tools = tool_request([t.for_template() for t in body.tools or ()], "auto", False)
    req = GenRequest(name, sampling, messages=msgs, keep_alive=keep_alive,
                     overrides=overrides or None, tools=tools, media=items,
                     think=_think(body.think, body.options))
    return await _respond(request, state, req, body.stream, "message", context=False)


def _think(value: bool | str | None, options: dict[str, Any] | None = None) -> Think:
    """Ollama's `think`: true or false, or a level ("low", "medium", "high") for
    templates that take one (as `reasoning_effort`; to others it is true). Asking a
    model without a reasoning section to think is a 400, as Ollama answers. The
    InferenceOS option `reasoning_budget` (-1, 0 or N tokens) bounds the reasoning."""
    try:
        budget = check_budget((options or {}).get("reasoning_budget"),
                              "option reasoning_budget")
    except UsageError as exc:
        raise APIError(400, str(exc)) from None
    if value is None:
        return Think(budget=budget)
    if isinstance(value, bool):
        return Think(enabled=value, required=value, budget=budget)
    if value not in EFFORTS:
        raise APIError(400, f'invalid think value: "{value[:40]}" (must be "high", '
                       '"medium", "low", true, or false)')
    return Think(enabled=True, effort=value, required=True, budget=budget)


def _chat_message(m: OllamaMessage, prefix: str = "") -> ChatMessage:
    """A request message for the template: past calls on assistant messages, the
    answering tool's name on tool messages; `prefix`: its images' markers."""
    calls = tuple(history_call(c.function.name, c.function.arguments)
                  for c in m.tool_calls or ()) if m.role == "assistant" else ()
    return ChatMessage(m.role, prefix + (m.content or ""), calls,
                       name=m.tool_name if m.role == "tool" else None)


def _with_media(state: ServerState, messages: list[OllamaMessage]
                ) -> tuple[tuple[ChatMessage, ...], tuple[MediaItem, ...]]:
    """Messages whose `images` (base64) are decoded, as markers before each text."""
    media = media_set(state.settings)
    out = []
    for m in messages:
        check_text(m.content or "")
        out.append(_chat_message(m, ollama_images(m.images, media)))
    return tuple(out), tuple(media.items)


async def _embed(state: ServerState, name: str, texts: list[str],
                 keep_alive: float | None) -> tuple[list[list[float]], int, float]:
    _, vocab = await model_and_vocab(state, name)
    refuse_embeddings(vocab, name)

    def work() -> tuple[list[list[float]], int, float]:
        t0 = time.perf_counter()
        with state.manager.acquire(name, keep_alive) as lease:
            load_s = time.perf_counter() - t0 if lease.fresh else 0.0
            if not texts:
                return [], 0, load_s
            vectors = lease.engine.embed(texts)
            count = sum(len(lease.engine.tokenize(t)) for t in texts)
            return vectors, count, load_s
    return await admitted_call(state, work)


@router.post("/embed", response_model=EmbedResponse)
async def embed(body: EmbedRequest, request: Request) -> Any:
    """Embeddings for one text or a list (mean-pooled, L2-normalised)."""
    state = state_of(request)
    name = state.model_name(body.model)
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    texts = [t for t in texts if t != ""] if texts == [""] else texts
    if len(texts) > 256:
        raise APIError(400, "at most 256 inputs per request")
    t0 = time.perf_counter()
    vectors, count, load_s = await _embed(state, name, texts, parse_keep_alive(body.keep_alive))
    if body.dimensions and vectors and body.dimensions != len(vectors[0]):
        raise APIError(400, f"this model's embeddings have {len(vectors[0])} dimensions")
    return {"model": name, "embeddings": vectors, "total_duration": _ns(time.perf_counter() - t0),
            "load_duration": _ns(load_s), "prompt_eval_count": count}


@router.post("/embeddings", response_model=EmbeddingsResponse)
async def embeddings(body: EmbeddingsRequest, request: Request) -> Any:
    """The older single-text embedding route."""
    state = state_of(request)
    name = state.model_name(body.model)
    texts = [body.prompt] if body.prompt else []
    vectors, _, _ = await _embed(state, name, texts, parse_keep_alive(body.keep_alive))
    return {"embedding": vectors[0] if vectors else []}
