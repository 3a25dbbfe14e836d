"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/embeddings,
/v1/models (and, as llama-server, the same but /completions without /v1). Streams are
SSE ending `data: [DONE]`; errors use OpenAI's error shape. llama.cpp's extensions are
honoured: `grammar`, top-level `json_schema`, `response_format: {type: json_object,
schema}`, and `timings` in responses."""

from __future__ import annotations

import base64
import dataclasses
import functools
import struct
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from inferenceos.engine.chat_template import ChatMessage, ToolCall
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.session import TokenEvent
from inferenceos.errors import UsageError
from inferenceos.media.collect import MediaSet, check_text
from inferenceos.server.errors import APIError
from inferenceos.server.generation import (
    Done,
    GenRequest,
    Run,
    admitted_call,
    call_in_thread,
    progress_json,
    start_generation,
    until_disconnect,
)
from inferenceos.server.json_grammar import JSON_OBJECT_GBNF, grammar_for_schema
from inferenceos.server.llamacpp_schema import embedding_input
from inferenceos.server.llamacpp_shapes import timings
from inferenceos.server.llamacpp_vocab import vocab_for
from inferenceos.server.logprobs import LegacyLogprobs, chat_top_n, entries
from inferenceos.server.media_parts import (
    OPENAI_MEDIA_PARTS,
    decode_in_thread,
    media_set,
    openai_part,
)
from inferenceos.server.openai_schema import (
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessageIn,
    Completion,
    CompletionRequest,
    EmbeddingList,
    EmbeddingRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    SamplingFields,
)
from inferenceos.server.options import UNLIMITED, sampling_from, stops
from inferenceos.server.sse import sse_response
from inferenceos.server.state import ServerState
from inferenceos.server.tool_calls import ParsedCall, ToolCallStream, parse_tool_calls
from inferenceos.server.tools import ToolRequest, history_call, openai_calls, tool_request

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text} for code, text in (
        (400, "Invalid request"), (401, "Missing or wrong API key"),
        (403, "Host not allowed"), (404, "Model not found"), (413, "Body too large"),
        (429, "Queue full; see Retry-After"), (500, "Engine error"),
        (503, "Shutting down or no room to load the model; see Retry-After"))
}
_SSE = {"text/event-stream": {"schema": {"type": "string"}}}

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERROR_RESPONSES)
# the same routes without /v1, as llama-server serves them (/completions and /models
# there are llama.cpp's own: see llamacpp_routes)
bare_router = APIRouter(tags=["openai"], responses=ERROR_RESPONSES, include_in_schema=False)


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.ios
    return state


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


@functools.cache
def fingerprint() -> str:
    """`system_fingerprint`: the llama.cpp build, spelled as llama-server does ("b...")."""
    from importlib.metadata import version

    return f"b{version('llama-cpp-python')}-inferenceos"


def _logit_bias(body: SamplingFields) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias in -100..100}; -100 bans the token."""
    out = []
    for key, bias in (body.logit_bias or {}).items():
        if not key.isdigit() or not -100 <= bias <= 100:
            raise APIError(400, "logit_bias maps token ids to biases in [-100, 100]",
                           "invalid_logit_bias")
        out.append((int(key), float("-inf") if bias <= -100 else float(bias)))
    return tuple(out)


def _sampling(body: SamplingFields, max_tokens: int | None,
              grammar: str | None = None, logprobs: int | None = None) -> SamplingParams:
    return sampling_from({
        "grammar": grammar, "logit_bias": _logit_bias(body), "logprobs": logprobs,
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
        "min_p": body.min_p, "repeat_penalty": body.repeat_penalty, "seed": body.seed,
        "presence_penalty": body.presence_penalty, "frequency_penalty": body.frequency_penalty,
        "stop": stops(body.stop), "max_tokens": UNLIMITED if max_tokens is None else max_tokens,
        "draft": body.draft,
    })


def _variants(sampling: SamplingParams, n: int) -> list[SamplingParams]:
    """n samplings; with a fixed seed each choice gets its own (seed + i)."""
    if sampling.seed is None:
        return [sampling] * n
    return [dataclasses.replace(sampling, seed=(sampling.seed + i) % (2**32 - 1))
            for i in range(n)]


def _text_of(m: ChatMessageIn, media: MediaSet | None = None) -> str:
    """A message's text; with `media` (a request that carries some), each media part
    becomes its marker at its place and its item joins `media`."""
    if m.content is None or isinstance(m.content, str):
        text = m.content or ""
        return check_text(text) if media is not None else text
    parts = []
    for p in m.content:
        if media is not None:
            parts.append(openai_part(p, media))
            continue
        if p.type != "text":
            raise APIError(400, f"content parts of type {p.type!r} are not supported",
                           "unsupported_content")
        parts.append(p.text or "")
    return "".join(parts)


def has_media(messages: list[ChatMessageIn]) -> bool:
    """Whether any message carries an image, audio or video part."""
    return any(not isinstance(m.content, str) and m.content is not None
               and any(p.type in OPENAI_MEDIA_PARTS for p in m.content) for m in messages)


def chat_message(m: ChatMessageIn, media: MediaSet | None = None) -> ChatMessage:
    """One request message for the template: past tool calls with their arguments
    parsed (OpenAI sends JSON text), a tool result with the call it answers; media
    parts as markers (their items gathered in `media`)."""
    role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
    calls: tuple[ToolCall, ...] = ()
    if m.tool_calls and role == "assistant":
        calls = tuple(history_call(c.function.name, c.function.arguments, c.id)
                      for c in m.tool_calls)
    return ChatMessage(role, _text_of(m, media), calls,
                       m.tool_call_id if role == "tool" else None,
                       m.name if role == "tool" else None)


def _chat_messages(body: ChatCompletionRequest, media: MediaSet | None = None
                   ) -> tuple[ChatMessage, ...]:
    if body.continue_final_message and body.add_generation_prompt:
        raise APIError(400, "add_generation_prompt and continue_final_message exclude each "
                       "other", "invalid_request")
    if body.continue_final_message or not body.add_generation_prompt:
        raise APIError(400, "continuing the final assistant message is not supported "
                       "(add_generation_prompt must be true)", "unsupported_parameter")
    fmt = body.response_format.type if body.response_format else "text"
    if fmt not in ("text", "json_object", "json_schema"):
        raise APIError(400, f"response_format {fmt!r} is not supported",
                       "unsupported_parameter")
    if [m.role for m in body.messages[-2:]] == ["assistant", "assistant"]:
        # llama-server's rule (its words): the last one would be the reply's prefix
        raise APIError(400, "Cannot have 2 or more assistant messages at the end of the "
                       "list.", "invalid_request")
    return tuple(chat_message(m, media) for m in body.messages)


def _tools(body: ChatCompletionRequest) -> ToolRequest | None:
    choice = body.tool_choice
    return tool_request([t.for_template() for t in body.tools or ()],
                        choice.model_dump() if choice is not None and not isinstance(choice, str)
                        else choice, body.parallel_tool_calls)


def _reply(text: str, run: Run, stop_reason: str) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason: tool calls parsed out of the text
    when tools were offered."""
    calls: list[ParsedCall] = []
    if run.tool_format is not None:
        text, calls = parse_tool_calls(text, run.tool_format)
    if calls:
        return {"role": "assistant", "content": text or None,
                "tool_calls": openai_calls(calls)}, "tool_calls"
    return {"role": "assistant", "content": text}, _finish(stop_reason)


def _grammar(fmt: Any) -> str | None:
    """The grammar a response_format asks for: none, any JSON object (or, llama.cpp's
    extension, one valid under its `schema`), or a json_schema."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return JSON_OBJECT_GBNF if fmt.schema_ is None else grammar_for_schema(fmt.schema_)
    if fmt.type != "json_schema":
        raise APIError(400, f"response_format {fmt.type!r} is not supported",
                       "unsupported_parameter")
    schema = (fmt.json_schema or {}).get("schema")
    if schema is None:
        raise APIError(400, "response_format json_schema needs json_schema.schema")
    return grammar_for_schema(schema)


def _constraint(body: SamplingFields, fmt: Any = None) -> str | None:
    """The grammar of a request: llama.cpp's `grammar` (GBNF) or top-level `json_schema`
    extensions, or its response_format; at most one of them. A schema that cannot be
    turned into a grammar is a 400 here, a grammar that does not parse a 400 when the
    engine builds its sampler: neither is ever ignored."""
    from_format = _grammar(fmt)
    given = [n for n, v in (("grammar", body.grammar), ("json_schema", body.json_schema),
                            ("response_format", from_format)) if v not in (None, "")]
    if len(given) > 1:
        raise APIError(400, f"use one of {' and '.join(given)}, not both",
                       "invalid_request")
    if body.grammar:
        return body.grammar
    if body.json_schema is not None:
        return grammar_for_schema(body.json_schema or {"type": "object"})
    return from_format


def _ids(prefix: str) -> tuple[str, int]:
    return f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time())


@router.post("/chat/completions", response_model=ChatCompletion,
             responses={200: {"content": _SSE, "description": "A completion, or SSE chunks "
                              "(ChatCompletionChunk) when stream is true"}})
@bare_router.post("/chat/completions", response_model=ChatCompletion)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    """Chat completion, streamed as SSE when `stream` is true."""
    state = _state(request)
    media = media_set(state.settings) if has_media(body.messages) else None
    # decoding images is CPU work on untrusted bytes: a worker thread, not the loop
    messages = (await decode_in_thread(lambda: _chat_messages(body, media)) if media
                else _chat_messages(body))
    items = tuple(media.items) if media else ()
    tools = _tools(body)
    name = state.model_name(body.model)
    grammar = _constraint(body, body.response_format)
    limit = body.max_completion_tokens or body.max_tokens
    if limit is None and state.settings.n_predict >= 0:
        limit = state.settings.n_predict  # llama-server's --n-predict covers chat too
    sampling = _sampling(body, limit, grammar,
                         chat_top_n(body.logprobs, body.top_logprobs))
    reqs = [GenRequest(name, s, messages=messages, tools=tools, media=items,
                       progress=body.stream and body.return_progress)
            for s in _variants(sampling, body.n)]
    cid, created = _ids("chatcmpl")
    if body.stream:
        first = await until_disconnect(request, start_generation(state, reqs[0]))
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(_chat_stream(state, first, reqs, cid, created, name, usage),
                            first.close)

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


async def _chat_stream(state: ServerState, first: Run, reqs: list[GenRequest], cid: str,
                       created: int, model: str, include_usage: bool
                       ) -> AsyncIterator[dict[str, Any]]:
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": fingerprint()}
    extra = {"usage": None} if include_usage else {}
    p_tok = c_tok = cached = 0
    metrics = None
    scored: list[TokenEvent] = []  # tokens whose logprobs ride on the next chunk

    def chunk(i: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        logprobs = {"content": entries(scored)} if scored else None
        scored.clear()
        return {**base, "choices": [{"index": i, "delta": delta, "finish_reason": finish,
                                     "logprobs": logprobs}], **extra}

    for i, r in enumerate(reqs):
        run = first if i == 0 else await start_generation(state, r)
        held = ToolCallStream(run.tool_format) if run.tool_format else None
        yield chunk(i, {"role": "assistant", "content": None})  # as OpenAI and llama-server
        async for item in _closing(run):
            if not isinstance(item, Done) and item.progress is not None:
                yield {**chunk(i, {}), "prompt_progress": progress_json(item.progress)}
                continue
            if not isinstance(item, Done) and item.logprob is not None:
                scored.append(item)
            if isinstance(item, Done):
                p_tok, c_tok = item.metrics.prompt_tokens, c_tok + item.metrics.completion_tokens
                cached, metrics = item.metrics.cached_tokens, item.metrics
                finish = _finish(item.metrics.stop_reason)
                rest, calls = held.finish() if held else ("", [])
                if rest:
                    yield chunk(i, {"content": rest})
                if calls:  # the whole calls in one delta, once the reply is complete
                    finish = "tool_calls"
                    yield chunk(i, {"tool_calls": openai_calls(calls, stream=True)})
                yield chunk(i, {}, finish)
            elif item.text:
                text = held.feed(item.text) if held else item.text
                if text:
                    yield chunk(i, {"content": text})
    if include_usage:  # llama-server adds its timings to the usage chunk
        yield {**base, "choices": [], "usage": _usage(p_tok, c_tok, cached),
               **({"timings": timings(metrics)} if metrics else {})}


async def _closing(run: Run) -> AsyncIterator[TokenEvent | Done]:
    """`run.events()`, closed explicitly (not left to the garbage collector) when the
    consumer stops early."""
    events = run.events()
    try:
        async for item in events:
            yield item
    finally:
        await events.aclose()
        await run.close()


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
    state = _state(request)
    if body.suffix or (body.best_of or 1) > 1:
        raise APIError(400, "suffix and best_of are not supported", "unsupported_parameter")
    prompts = _prompts(body)
    if body.echo and not all(isinstance(p, str) for p in prompts):
        raise APIError(400, "echo needs text prompts", "unsupported_parameter")
    if len(prompts) * body.n > 16:
        raise APIError(400, "at most 16 choices (prompts × n) per request", "too_many_choices")
    name = state.model_name(body.model)
    variants = _variants(_sampling(body, body.max_tokens,
                                   _constraint(body, body.response_format),
                                   logprobs=body.logprobs), body.n)
    reqs = [GenRequest(name, s, text=p if isinstance(p, str) else None,
                       tokens=None if isinstance(p, str) else tuple(p))
            for p in prompts for s in variants]
    echo = [p if body.echo and isinstance(p, str) else "" for p in prompts for _ in variants]
    cid, created = _ids("cmpl")
    if body.stream:
        first = await until_disconnect(request, start_generation(state, reqs[0]))
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(_completion_stream(state, first, reqs, echo, cid, created, name,
                                               usage, body.logprobs is not None), first.close)

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


async def _completion_stream(state: ServerState, first: Run, reqs: list[GenRequest],
                             echo: list[str], cid: str, created: int, model: str,
                             include_usage: bool, logprobs: bool
                             ) -> AsyncIterator[dict[str, Any]]:
    base = {"id": cid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": fingerprint()}
    extra = {"usage": None} if include_usage else {}
    p_tok = c_tok = 0
    scored: list[TokenEvent] = []  # tokens whose logprobs ride on the next chunk
    legacy = LegacyLogprobs()

    def chunk(i: int, text: str, reason: str | None) -> dict[str, Any]:
        lp = legacy.chunk(scored) if logprobs and scored else None
        scored.clear()
        return {**base, "choices": [{"index": i, "text": text, "finish_reason": reason,
                                     "logprobs": lp}], **extra}

    for i, r in enumerate(reqs):
        run = first if i == 0 else await start_generation(state, r)
        legacy = LegacyLogprobs(len(echo[i]))
        if echo[i]:
            yield chunk(i, echo[i], None)
        async for item in _closing(run):
            if isinstance(item, Done):
                p_tok += item.metrics.prompt_tokens
                c_tok += item.metrics.completion_tokens
                yield chunk(i, "", _finish(item.metrics.stop_reason))
                continue
            if item.logprob is not None:
                scored.append(item)
            if item.text:
                yield chunk(i, item.text, None)
    if include_usage:
        yield {**base, "choices": [], "usage": _usage(p_tok, c_tok)}


@router.post("/embeddings", response_model=EmbeddingList)
@bare_router.post("/embeddings", response_model=EmbeddingList)
async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
    """Mean-pooled, L2-normalised embeddings; `encoding_format` float or base64."""
    state = _state(request)
    raw = body.input
    # a flat list of ids (and texts) is one input, as llama.cpp reads it
    items = ([raw] if not isinstance(raw, list) or any(isinstance(x, int) for x in raw)
             else raw)
    if not items or len(items) > 256:
        raise APIError(400, "input must be a string or a list of 1 to 256 inputs",
                       "invalid_input")
    name = state.model_name(body.model)
    model = await call_in_thread(lambda: state.catalog.resolve(name))
    vocab = await call_in_thread(lambda: vocab_for(model.path))
    inputs = [embedding_input(t, vocab) for t in items]

    def work() -> tuple[list[list[float]], int]:
        with state.manager.acquire(name) as lease:
            vectors = lease.engine.embed(inputs)  # type: ignore[arg-type]
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
    state = _state(request)
    models = await _catalog_names(state)
    return {"object": "list", "data": [
        ModelCard(id=m.name, created=int(m.modified_at)).model_dump() for m in models]}


@router.get("/models/{model:path}", response_model=ModelCard)
@bare_router.get("/models/{model:path}", response_model=ModelCard)
async def get_model(model: str, request: Request) -> Any:
    """One model by name (404 when unknown)."""
    from inferenceos.server.generation import call_in_thread

    m = await call_in_thread(lambda: _state(request).catalog.resolve(model))
    return ModelCard(id=m.name, created=int(m.modified_at)).model_dump()


async def _catalog_names(state: ServerState) -> list[Any]:
    from inferenceos.server.generation import call_in_thread

    return await call_in_thread(state.catalog.names)
