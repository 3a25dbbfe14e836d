"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/embeddings,
/v1/models (and, as llama-server, the same but /completions without /v1). Streams are
SSE ending `data: [DONE]`; errors use OpenAI's error shape. llama.cpp's extensions are
honoured: `grammar`, top-level `json_schema`, `response_format: {type: json_object,
schema}`, and `timings` in responses."""

from __future__ import annotations

import base64
import functools
import struct
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from inferenceos.engine.chat_template import ChatMessage
from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.engine.generation import TokenEvent
from inferenceos.errors import UsageError
from inferenceos.hardware.llama_devices import package_version
from inferenceos.server.dialects.llamacpp.schema import embedding_input
from inferenceos.server.dialects.openai.convert import (
    chat_messages,
    constraint,
    has_media,
    sampling,
    think_of,
    tools_of,
    variants,
)
from inferenceos.server.dialects.openai.schema import (
    ERROR_RESPONSES,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    EmbeddingList,
    EmbeddingRequest,
    ModelCard,
    ModelList,
)
from inferenceos.server.direct_stream import direct_response
from inferenceos.server.errors import APIError, Dialect, route_class
from inferenceos.server.generation import (
    GenRequest,
    Run,
    admitted_call,
    call_in_thread,
    model_and_vocab,
    progress_json,
    start_generation,
    until_disconnect,
)
from inferenceos.server.infill import Limits, infill_prompt, require_fim, text_ids
from inferenceos.server.llama_shapes import timings
from inferenceos.server.logprobs import LegacyLogprobs, chat_top_n, entries
from inferenceos.server.media_parts import (
    decode_in_thread,
    media_set,
)
from inferenceos.server.ops.reads import ops_call
from inferenceos.server.reply import Final, read_reply, reply_events
from inferenceos.server.rerank import refuse_embeddings
from inferenceos.server.sse import OPENAI_SSE, SSE_CONTENT
from inferenceos.server.state import ServerState, state_of
from inferenceos.server.tools import ToolRequest, openai_calls

_SSE = SSE_CONTENT

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERROR_RESPONSES,
                   route_class=route_class(Dialect.OPENAI))
# the same routes without /v1, as llama-server serves them (/completions and /models
# there are llama.cpp's own: see llamacpp_routes)
bare_router = APIRouter(tags=["openai"], responses=ERROR_RESPONSES, include_in_schema=False,
                        route_class=route_class(Dialect.OPENAI))


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


@functools.cache
def fingerprint() -> str:
    """`system_fingerprint`: the llama.cpp build, spelled as llama-server does ("b...")."""
    return f"b{package_version() or 'unknown'}-inferenceos"


def _reply(text: str, run: Run, stop_reason: str) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason: tool calls read out of the text when
    tools were offered."""
    thought, text, calls = read_reply(text, run.tool_format, run.reasoning)
    reasoning = {"reasoning_content": thought} if thought else {}
    if calls:
        return {"role": "assistant", "content": text or None, **reasoning,
                "tool_calls": openai_calls(calls)}, "tool_calls"
    return {"role": "assistant", "content": text, **reasoning}, _finish(stop_reason)


def _ids(prefix: str) -> tuple[str, int]:
    return f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time())


@router.post("/chat/completions", response_model=ChatCompletion,
             responses={200: {"content": _SSE, "description": "A completion, or SSE chunks "
                              "(ChatCompletionChunk) when stream is true"}})
@bare_router.post("/chat/completions", response_model=ChatCompletion)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    """Chat completion, streamed as SSE when `stream` is true."""
    state = state_of(request)
    media = media_set(state.settings) if has_media(body.messages) else None
    # decoding images is CPU work on untrusted bytes: a worker thread, not the loop
    messages = (await decode_in_thread(lambda: chat_messages(body, media)) if media
                else chat_messages(body))
    items = tuple(media.items) if media else ()
    tools = tools_of(body)
    name = state.model_name(body.model)
    grammar = constraint(body, body.response_format)
    limit = body.max_completion_tokens or body.max_tokens
    if limit is None and state.settings.n_predict >= 0:
        limit = state.settings.n_predict  # llama-server's --n-predict covers chat too
    params = sampling(body, limit, grammar, chat_top_n(body.logprobs, body.top_logprobs))
    think = think_of(body)
    progress = body.stream and body.return_progress
    # one plain choice streamed: the worker may write its tokens (server/direct_stream.py)
    direct = (state.settings.direct_writes and body.stream and body.n == 1
              and not body.logprobs and not tools and not progress)
    reqs = [GenRequest(name, s, messages=messages, tools=tools, media=items,
                       progress=progress, think=think, direct=direct)
            for s in variants(params, body.n)]
    cid, created = _ids("chatcmpl")
    if body.stream:
        first = await until_disconnect(request, start_generation(state, reqs[0]))
        usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = _ChatChunks(cid, created, name, usage)
        return direct_response(_chat_stream(state, first, reqs, chunks), OPENAI_SSE,
                               first.close, run=lambda: first,
                               frame=lambda: chunks.frame(first), enabled=direct)

    async def whole() -> dict[str, Any]:
        choices, p_tok, c_tok = [], 0, 0
        for i, r in enumerate(reqs):
            run = await start_generation(state, r)
            text, done = await run.collect()
            p_tok, c_tok = done.metrics.prompt_tokens, c_tok + done.metrics.completion_tokens
            message, finish = _reply(text, run, done.metrics.stop_reason)
            logprobs = {"content": entries(run.scored)} if body.logprobs else None
            choices.append({"index": i, "finish_reason": finish, "message": message,
                            "logprobs": logprobs})
        return {"id": cid, "object": "chat.completion", "created": created, "model": name,
                "choices": choices, "system_fingerprint": fingerprint(),
                "usage": _usage(p_tok, c_tok, done.metrics.cached_tokens),
                "timings": timings(done.metrics)}

    result = await until_disconnect(request, whole())
    if not body.verbose:
        return result
    # llama.cpp's debugging extension: the prompt the template made (outside the
    # response model, which has no place for a field named __verbose)
    prompt = await call_in_thread(lambda: _rendered(state, name, messages, tools))
    result["__verbose"] = {"prompt": prompt, "content": result["choices"][0]["message"][
        "content"], "timings": result["timings"]}
    return JSONResponse(result)


def _rendered(state: ServerState, name: str, messages: tuple[ChatMessage, ...],
              tools: ToolRequest | None) -> str:
    with state.manager.acquire(name) as lease:
        return lease.engine.chat_prompt(messages, tools=tools.tools if tools else None)


class _ChatChunks:
    """A streamed chat's chunks (`chunk`), and for the worker (server/direct_stream.py)
    the FrameSpec of its content deltas: a plain reply only (no reasoning section, no
    tools: their text is split or held back here first)."""

    def __init__(self, cid: str, created: int, model: str, include_usage: bool) -> None:
        self.base = {"id": cid, "object": "chat.completion.chunk", "created": created,
                     "model": model, "system_fingerprint": fingerprint()}
        self.include_usage = include_usage
        self.extra = {"usage": None} if include_usage else {}
        self.scored: list[TokenEvent] = []  # tokens whose logprobs ride on the next chunk

    def chunk(self, i: int, delta: dict[str, Any], finish: str | None = None
              ) -> dict[str, Any]:
        logprobs = {"content": entries(self.scored)} if self.scored else None
        self.scored.clear()
        return {**self.base, "choices": [{"index": i, "delta": delta, "finish_reason": finish,
                                          "logprobs": logprobs}], **self.extra}

    def frame(self, run: Run) -> FrameSpec | None:
        if run.reasoning is not None or run.tool_format is not None:
            return None
        return FrameSpec.sample(lambda text, _, __: OPENAI_SSE.frame(
            self.chunk(0, {"content": text}), 0), skip_empty=True)


async def _chat_stream(state: ServerState, first: Run, reqs: list[GenRequest],
                       chunks: _ChatChunks) -> AsyncIterator[dict[str, Any]]:
    p_tok = c_tok = cached = 0
    metrics = None
    chunk, scored = chunks.chunk, chunks.scored
    for i, r in enumerate(reqs):
        run = first if i == 0 else await start_generation(state, r)
        yield chunk(i, {"role": "assistant", "content": None})  # as OpenAI and llama-server
        async with aclosing(reply_events(run)) as replies:
            async for d in replies:
                if isinstance(d, Final):
                    g = d.done.metrics
                    p_tok, c_tok = g.prompt_tokens, c_tok + g.completion_tokens
                    cached, metrics = g.cached_tokens, g
                    finish = _finish(g.stop_reason)
                    if d.thought:
                        yield chunk(i, {"reasoning_content": d.thought})
                    if d.text:
                        yield chunk(i, {"content": d.text})
                    if d.calls:  # the whole calls in one delta, once the reply is complete
                        finish = "tool_calls"
                        yield chunk(i, {"tool_calls": openai_calls(d.calls, stream=True)})
                    yield chunk(i, {}, finish)
                    continue
                if d.event.progress is not None:
                    yield {**chunk(i, {}), "prompt_progress": progress_json(d.event.progress)}
                    continue
                if d.event.written is not None:  # the worker wrote these itself
                    continue
                if d.event.logprob is not None:
                    scored.append(d.event)
                if d.thought:  # llama-server's and DeepSeek's reasoning delta
                    yield chunk(i, {"reasoning_content": d.thought})
                if d.text:
                    yield chunk(i, {"content": d.text})
    if chunks.include_usage:  # llama-server adds its timings to the usage chunk
        yield {**chunks.base, "choices": [], "usage": _usage(p_tok, c_tok, cached),
               **({"timings": timings(metrics)} if metrics else {})}


def _prompts(body: CompletionRequest) -> list[str | list[int]]:
    p = body.prompt
    if isinstance(p, str):
        return [p]
    if all(isinstance(x, int) for x in p):
        return [list(p)]  # type: ignore[arg-type]
    out: list[str | list[int]] = []
    for x in p:
        if isinstance(x, list) and not x:
            raise APIError(400, "a token prompt must not be empty", "invalid_prompt")
        out.append(x if isinstance(x, str) else list(x))  # type: ignore[arg-type]
    return out


@router.post("/completions", response_model=Completion,
             responses={200: {"content": _SSE, "description": "A completion, or SSE chunks "
                              "of the same shape when stream is true"}})
async def completions(body: CompletionRequest, request: Request) -> Any:
    """Text completion of a raw prompt (no chat template)."""
    state = state_of(request)
    if (body.best_of or 1) > 1:
        raise APIError(400, "best_of is not supported", "unsupported_parameter")
    prompts = _prompts(body)
    if body.echo and not all(isinstance(p, str) for p in prompts):
        raise APIError(400, "echo needs text prompts", "unsupported_parameter")
    if len(prompts) * body.n > 16:
        raise APIError(400, "at most 16 choices (prompts × n) per request", "too_many_choices")
    name = state.model_name(body.model)
    choices = variants(sampling(body, body.max_tokens, constraint(body, body.response_format),
                                logprobs=body.logprobs), body.n)
    # with a suffix, each prompt becomes the prefix of a FIM prompt (echo: the prompt)
    runs = await _with_suffix(state, body, prompts) if body.suffix else prompts
    # one plain choice streamed: the worker may write its tokens (server/direct_stream.py)
    direct = (state.settings.direct_writes and body.stream
              and len(runs) * len(choices) == 1 and body.logprobs is None)
    reqs = [GenRequest(name, s, text=p if isinstance(p, str) else None,
                       tokens=None if isinstance(p, str) else tuple(p), direct=direct)
            for p in runs for s in choices]
    echo = [p if body.echo and isinstance(p, str) else "" for p in prompts for _ in choices]
    cid, created = _ids("cmpl")
    if body.stream:
        first = await until_disconnect(request, start_generation(state, reqs[0]))
        usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = _TextChunks(cid, created, name, usage, body.logprobs is not None)
        return direct_response(_completion_stream(state, first, reqs, echo, chunks),
                               OPENAI_SSE, first.close, run=lambda: first,
                               frame=chunks.frame, enabled=direct)

    async def whole() -> dict[str, Any]:
        choices, p_tok, c_tok, cached = [], 0, 0, 0
        for i, r in enumerate(reqs):
            run = await start_generation(state, r)
            text, done = await run.collect()
            p_tok += done.metrics.prompt_tokens
            c_tok += done.metrics.completion_tokens
            cached += done.metrics.cached_tokens
            logprobs = (LegacyLogprobs(len(echo[i])).chunk(run.scored)
                        if body.logprobs is not None else None)
            choices.append({"index": i, "text": echo[i] + text, "logprobs": logprobs,
                            "finish_reason": _finish(done.metrics.stop_reason)})
        return {"id": cid, "object": "text_completion", "created": created, "model": name,
                "choices": choices, "system_fingerprint": fingerprint(),
                "usage": _usage(p_tok, c_tok, cached), "timings": timings(done.metrics)}

    return await until_disconnect(request, whole())


async def _with_suffix(state: ServerState, body: CompletionRequest,
                       prompts: list[str | list[int]]) -> list[str | list[int]]:
    """Each prompt (text or ids) and `suffix` as the model's fill-in-the-middle prompt
    (server/infill.py); 400 for a model without FIM tokens."""
    _, vocab = await model_and_vocab(state, state.model_name(body.model))
    fim = require_fim(vocab, "suffix (fill in the middle) is not supported by this model")

    def build() -> list[list[int]]:
        suffix = text_ids(vocab, body.suffix or "", "suffix")
        return [infill_prompt(vocab, fim, text_ids(vocab, p, "prompt"), suffix, Limits(0))
                for p in prompts]

    built: list[str | list[int]] = list(await call_in_thread(build))
    return built


class _TextChunks:
    """A streamed completion's chunks (`chunk`), and for the worker (server/direct_stream.py)
    the FrameSpec of its text chunks."""

    def __init__(self, cid: str, created: int, model: str, include_usage: bool,
                 logprobs: bool) -> None:
        self.base = {"id": cid, "object": "text_completion", "created": created,
                     "model": model, "system_fingerprint": fingerprint()}
        self.include_usage, self.logprobs = include_usage, logprobs
        self.extra = {"usage": None} if include_usage else {}
        self.scored: list[TokenEvent] = []  # tokens whose logprobs ride on the next chunk
        self.legacy = LegacyLogprobs()

    def chunk(self, i: int, text: str, reason: str | None) -> dict[str, Any]:
        lp = self.legacy.chunk(self.scored) if self.logprobs and self.scored else None
        self.scored.clear()
        return {**self.base, "choices": [{"index": i, "text": text, "finish_reason": reason,
                                          "logprobs": lp}], **self.extra}

    def frame(self) -> FrameSpec | None:
        return FrameSpec.sample(lambda text, _, __: OPENAI_SSE.frame(
            self.chunk(0, text, None), 0), skip_empty=True)


async def _completion_stream(state: ServerState, first: Run, reqs: list[GenRequest],
                             echo: list[str], chunks: _TextChunks
                             ) -> AsyncIterator[dict[str, Any]]:
    p_tok = c_tok = 0
    chunk, scored = chunks.chunk, chunks.scored
    for i, r in enumerate(reqs):
        run = first if i == 0 else await start_generation(state, r)
        chunks.legacy = LegacyLogprobs(len(echo[i]))
        if echo[i]:
            yield chunk(i, echo[i], None)
        async with aclosing(reply_events(run)) as replies:
            async for d in replies:
                if isinstance(d, Final):
                    p_tok += d.done.metrics.prompt_tokens
                    c_tok += d.done.metrics.completion_tokens
                    yield chunk(i, "", _finish(d.done.metrics.stop_reason))
                    continue
                if d.event.written is not None:  # the worker wrote these itself
                    continue
                if d.event.logprob is not None:
                    scored.append(d.event)
                if d.text:
                    yield chunk(i, d.text, None)
    if chunks.include_usage:
        yield {**chunks.base, "choices": [], "usage": _usage(p_tok, c_tok)}


@router.post("/embeddings", response_model=EmbeddingList)
@bare_router.post("/embeddings", response_model=EmbeddingList)
async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
    """Mean-pooled, L2-normalised embeddings; `encoding_format` float or base64."""
    state = state_of(request)
    raw = body.input
    # a flat list of ids (and texts) is one input, as llama.cpp reads it
    items = ([raw] if not isinstance(raw, list) or any(isinstance(x, int) for x in raw)
             else raw)
    if not items or len(items) > 256:
        raise APIError(400, "input must be a string or a list of 1 to 256 inputs",
                       "invalid_input")
    name = state.model_name(body.model)
    _, vocab = await model_and_vocab(state, name)
    refuse_embeddings(vocab, name)
    inputs = [embedding_input(t, vocab) for t in items]

    def work() -> tuple[list[list[float]], int]:
        with state.manager.acquire(name) as lease:
            vectors = lease.engine.embed(inputs)
            count = sum(len(t) if isinstance(t, list) else len(lease.engine.tokenize(t))
                        for t in inputs)
            return vectors, count

    try:
        vectors, count = await admitted_call(state, work)
    except UsageError as exc:
        if "embeddings take at most" in str(exc):  # llama-server's words for it
            raise APIError(400, f"input is too large to process: {exc}", "input_too_large"
                           ) from None
        raise
    if body.dimensions is not None and vectors and body.dimensions != len(vectors[0]):
        raise APIError(400, f"this model's embeddings have {len(vectors[0])} dimensions; "
                       "dimensions cannot change it", "unsupported_parameter")
    data = [{"object": "embedding", "index": i,
             "embedding": _b64(v) if body.encoding_format == "base64" else v}
            for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": name,
            "usage": {"prompt_tokens": count, "total_tokens": count}}


def _b64(vector: list[float]) -> str:
    """Little-endian float32, base64: what the openai client decodes."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


@router.get("/models", response_model=ModelList)
async def list_models(request: Request) -> Any:
    """Every model a request may name."""
    state = state_of(request)
    models = await _catalog_names(state)
    return {"object": "list", "data": [
        ModelCard(id=m.name, created=int(m.modified_at)).model_dump() for m in models]}


@router.get("/models/{model:path}", response_model=ModelCard)
@bare_router.get("/models/{model:path}", response_model=ModelCard)
async def get_model(model: str, request: Request) -> Any:
    """One model by name (404 when unknown)."""
    m = await call_in_thread(lambda: state_of(request).catalog.resolve(model))
    return ModelCard(id=m.name, created=int(m.modified_at)).model_dump()


async def _catalog_names(state: ServerState) -> list[Any]:
    """The catalog's listing (a registry read), on the operations' executor."""
    return await ops_call(state.catalog.names)
