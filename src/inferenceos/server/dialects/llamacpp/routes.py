"""llama-server's own API dialect: /completion (and /completions), /tokenize,
/detokenize, /props, /slots, /apply-template, /chat/completions/input_tokens and
/v1/health, over the same engine, queue and safety rules as the OpenAI and Ollama routes.

Shapes follow llama-server (tools/server in the vendored llama.cpp): a completion is
`{content, tokens, stop, model, tokens_predicted, tokens_evaluated, generation_settings,
prompt, has_new_line, truncated, stop_type, stopping_word, tokens_cached, timings}`;
streams are SSE `data: {...}` events, one per token (`stop: false`), then the final
object (`stop: true`), with no `[DONE]`; several prompts (or `n_cmpl`) answer a list.
Errors use the OpenAI shape `{"error": {"message", "type", ...}}` as llama-server does.
What differs, and why, is in docs/api.md ("llama.cpp dialect").
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, Field

from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.engine.generation import TokenEvent
from inferenceos.engine.sampling import SamplingParams
from inferenceos.errors import UsageError
from inferenceos.registry.catalog import ResolvedModel
from inferenceos.server.dialects.llamacpp.schema import (
    CompletionParams,
    MediaPrompt,
    Prompt,
    parse_completion,
    parse_lora,
)
from inferenceos.server.dialects.openai.convert import chat_message
from inferenceos.server.dialects.openai.schema import ERROR_RESPONSES, ChatMessageIn
from inferenceos.server.direct_stream import direct_response
from inferenceos.server.errors import APIError, Dialect, route_class
from inferenceos.server.generation import (
    Done,
    GenRequest,
    Run,
    admitted_call,
    call_in_thread,
    model_and_vocab,
    progress_json,
    start_generation,
    until_disconnect,
)
from inferenceos.server.infill import Limits, extra_chunks, infill_prompt, require_fim, text_ids
from inferenceos.server.llama_shapes import (
    RANDOM_SEED,
    generation_settings,
    probabilities,
    stopping_word,
    timings,
)
from inferenceos.server.media_parts import decode_in_thread, media_set
from inferenceos.server.ops.health import health_body
from inferenceos.server.ops.reads import ops_call
from inferenceos.server.presets import lora_table
from inferenceos.server.reply import Final, reply_events
from inferenceos.server.rerank import is_reranker, parse_rerank, rerank_response, rerank_tokens
from inferenceos.server.sse import LLAMACPP_SSE, SSE_CONTENT
from inferenceos.server.state import ServerState, state_of
from inferenceos.server.tool_schema import ToolDef
from inferenceos.server.vocab import Vocab, vocab_for

# llama-server answers errors in OpenAI's shape
router = APIRouter(tags=["llama.cpp"], responses=ERROR_RESPONSES,
                   route_class=route_class(Dialect.OPENAI))

_STOP_TYPE = {"eos": "eos", "stop": "word", "length": "limit"}


async def _model(state: ServerState, requested: Any) -> tuple[str, Vocab]:
    """The model a request names (or the default), as the OpenAI routes spell it, and
    its vocabulary."""
    name = state.model_name(requested if isinstance(requested, str) else None)
    return name, (await model_and_vocab(state, name))[1]


@dataclasses.dataclass
class _Result:
    """One finished completion, ready to be shaped."""

    index: int
    prompt: Prompt
    content: str
    done: Done
    scored: list[TokenEvent]


def _final(p: CompletionParams, r: _Result, model: str, vocab: Vocab, stream: bool
           ) -> dict[str, Any]:
    m = r.done.metrics
    tail = vocab.detokenize(r.done.output_ids) if m.stop_reason == "stop" else ""
    res: dict[str, Any] = {
        "index": r.index, "content": "" if stream else r.content,
        "tokens": r.done.output_ids if p.return_tokens and not stream else [],
        "id_slot": -1, "stop": True, "model": model,
        "tokens_predicted": m.completion_tokens, "tokens_evaluated": m.prompt_tokens,
        "generation_settings": generation_settings(p.sampling, p.n_predict, stream, p.n_probs,
                                                   p.eog_bias, p.post_sampling_probs),
        "prompt": (r.prompt.text if isinstance(r.prompt, MediaPrompt)
                   else vocab.detokenize(r.prompt)),
        "has_new_line": "\n" in r.content,
        "truncated": False, "stop_type": _STOP_TYPE.get(m.stop_reason, "none"),
        "stopping_word": stopping_word(p.sampling.stop, m.stop_reason,
                                        tail[len(r.content):] if tail else ""),
        "tokens_cached": m.prompt_tokens + m.completion_tokens,
        "timings": timings(m),
    }
    if not stream and p.n_probs:
        res["completion_probabilities"] = probabilities(r.scored, p.post_sampling_probs)
    return _select(res, p.response_fields)


def _select(res: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama.cpp's `response_fields`: only those, `a/b` lifted from nested objects."""
    if not fields:
        return res
    out: dict[str, Any] = {}
    for f in fields:
        node: Any = res
        for part in f.split("/"):
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                break
        if node is not None:
            out[f] = node
    return out


# -- /completion -----------------------------------------------------------------------


def _multimodal(prompt: Any) -> bool:
    """Whether a /completion prompt carries multimodal_data (one object or a list)."""
    items = prompt if isinstance(prompt, list) else [prompt]
    return any(isinstance(x, dict) and bool(x.get("multimodal_data")) for x in items)


def _requests(p: CompletionParams, name: str, direct: bool = False
              ) -> list[tuple[int, GenRequest]]:
    """(prompt index, request) per completion: prompts × n_cmpl, each extra completion
    of a seeded request with its own seed (seed + k), as the OpenAI routes do;
    `direct`: streams the worker may write (GenRequest.direct)."""
    out = []
    for i, prompt in enumerate(p.prompts):
        for k in range(p.n_cmpl):
            s = p.sampling
            if k and s.seed is not None:
                s = dataclasses.replace(s, seed=(s.seed + k) % RANDOM_SEED)
            progress = p.stream and p.return_progress
            out.append((i, GenRequest(name, s, text=prompt.text, media=prompt.items,
                                      progress=progress, lora=p.lora, direct=direct)
                        if isinstance(prompt, MediaPrompt)
                        else GenRequest(name, s, tokens=tuple(prompt), progress=progress,
                                        lora=p.lora, direct=direct)))
    return out


async def _whole(state: ServerState, index: int, prompt: Prompt, req: GenRequest
                 ) -> _Result:
    run = await start_generation(state, req)
    text, done = await run.collect()
    return _Result(index, prompt, text, done, run.scored)


_SSE: dict[int | str, dict[str, Any]] = {200: {
    "content": SSE_CONTENT,
    "description": "A completion (a list of them for several prompts), or SSE events when "
                   "stream is true"}}


# A body this light parses in less time than a thread hop takes (tokenizing 2,000
# characters: ~0.1 ms; a hop to a thread and back: ~0.2 ms of the loop's CPU): parsed
# on the event loop. Anything heavier (a long prompt, a grammar or schema to convert,
# biases to tokenize, media to decode) goes to a thread, so no stream waits on it.
_LIGHT_PROMPT = 2048
_HEAVY_FIELDS = ("grammar", "json_schema", "logit_bias")


def _light(body: dict[str, Any]) -> bool:
    """Whether `body` is light enough to parse on the event loop (see above)."""
    if any(body.get(f) for f in _HEAVY_FIELDS):
        return False
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt) <= _LIGHT_PROMPT
    return (isinstance(prompt, list) and len(prompt) <= _LIGHT_PROMPT
            and all(type(t) is int for t in prompt))


@router.post("/completion", summary="llama.cpp completion", responses=_SSE)
@router.post("/completions", summary="llama.cpp completion (as llama-server)", responses=_SSE)
async def completion(request: Request, body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
    """Complete a raw prompt (text, token ids or both) in llama-server's shape; SSE
    when `stream` is true. See the module contract."""
    state = state_of(request)
    name, vocab = await _model(state, body.get("model"))
    s = state.settings
    def parse() -> CompletionParams:
        return parse_completion(body, vocab, s.n_predict, s.seed, lambda: media_set(s))

    # decoding multimodal_data is CPU work on untrusted bytes: within a decode slot
    p = (parse() if _light(body) else
         await (decode_in_thread if _multimodal(body.get("prompt")) else call_in_thread)(parse))
    check_lora_ids(state, name, p.lora)
    # a stream the worker may write (server/direct_stream.py)
    direct = p.stream and not p.n_probs and not p.return_progress and s.direct_writes
    reqs = _requests(p, name, direct)
    if p.stream:
        first = await until_disconnect(request, start_generation(state, reqs[0][1]))
        runs = [first]  # the run streaming now: its waiting tokens go out in one write
        shapes: list[_Chunks] = []  # the completion streaming now: its tokens' shape
        return direct_response(
            _stream(state, runs, reqs, p, name, vocab, shapes), LLAMACPP_SSE, first.close,
            run=lambda: runs[-1], frame=lambda: shapes[-1].frame() if shapes else None,
            enabled=direct, ready=lambda: runs[-1].ready())

    async def all_of_them() -> list[_Result]:
        tasks = [asyncio.ensure_future(_whole(state, i, p.prompts[i], r)) for i, r in reqs]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for t in tasks:
                t.cancel()

    results = await until_disconnect(request, all_of_them())
    shaped = [_final(p, dataclasses.replace(r, index=k), name, vocab, False)
              for k, r in enumerate(results)]
    return shaped[0] if len(shaped) == 1 else shaped


@dataclasses.dataclass
class _Chunks:
    """The token events of completion `index` (of a prompt of `evaluated` tokens), and
    their FrameSpec for the worker (server/direct_stream.py) from token `n_tokens` on."""

    index: int
    evaluated: int
    n_tokens: int = 0

    def chunk(self, text: str, tokens: list[int], n: int) -> dict[str, Any]:
        return {"index": self.index, "content": text, "tokens": tokens, "stop": False,
                "id_slot": -1, "tokens_predicted": n, "tokens_evaluated": self.evaluated}

    def frame(self) -> FrameSpec | None:
        return FrameSpec.sample(lambda text, tokens, n: LLAMACPP_SSE.frame(
            self.chunk(text, tokens, n), 0), self.n_tokens)


async def _stream(state: ServerState, runs: list[Run], reqs: list[tuple[int, GenRequest]],
                  p: CompletionParams, model: str, vocab: Vocab, shapes: list[_Chunks]
                  ) -> AsyncIterator[dict[str, Any]]:
    """One event per generated token (every engine event its own: server/sse.py may
    write the waiting ones at once), then the final object, for each completion in
    turn (`index` tells them apart). `runs` starts with the first completion's run;
    each later one is appended as it starts, and its `_Chunks` to `shapes`. Tokens the
    worker wrote itself come as one event (`written`): counted, not sent."""
    for k, (i, req) in enumerate(reqs):
        if k:
            runs.append(await start_generation(state, req))
        run = runs[-1]
        parts: list[str] = []
        shape = _Chunks(k, len(p.prompts[i]))
        shapes.append(shape)
        async with aclosing(reply_events(run)) as replies:
            async for d in replies:
                if isinstance(d, Final):
                    r = _Result(k, p.prompts[i], "".join(parts), d.done, [])
                    yield _final(p, r, model, vocab, True)
                    continue
                item = d.event
                if item.progress is not None:
                    yield {"index": k, "content": "", "tokens": [], "stop": False,
                           "id_slot": -1, "tokens_predicted": 0,
                           "tokens_evaluated": len(p.prompts[i]),
                           "prompt_progress": progress_json(item.progress)}
                    continue
                if item.written is not None:
                    parts.append(item.text)
                    shape.n_tokens += len(item.written)
                    continue
                if item.token < 0 and not item.text:
                    continue
                parts.append(item.text)
                shape.n_tokens += item.token >= 0  # a flush of held-back text: no token
                chunk = shape.chunk(item.text, [item.token] if item.token >= 0 else [],
                                    shape.n_tokens)
                if p.n_probs and item.logprob is not None:
                    chunk["completion_probabilities"] = probabilities([item],
                                                                      p.post_sampling_probs)
                yield chunk


# -- /infill --------------------------------------------------------------------------


@router.post("/infill", summary="llama.cpp code infill (fill in the middle)", responses=_SSE)
async def infill(request: Request, body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
    """Complete the middle between `input_prefix` and `input_suffix` (`input_extra`:
    other files, `prompt`: the middle's start) with the model's FIM tokens, answered
    as /completion answers; 400 for a model without them (server/infill.py)."""
    state = state_of(request)
    name, vocab = await _model(state, body.get("model"))
    fim = require_fim(vocab, "Infill is not supported by this model")
    for field in ("input_prefix", "input_suffix"):
        if field not in body:
            raise APIError(400, f'"{field}" is required', "invalid_request")
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise APIError(400, '"prompt" must be a string', "invalid_request")
    _, n_ctx = await _facts(state, name)
    limits = Limits(n_ctx, n_predict=state.settings.n_predict)

    def build() -> list[int]:
        return infill_prompt(
            vocab, fim, text_ids(vocab, body["input_prefix"], "input_prefix"),
            text_ids(vocab, body["input_suffix"], "input_suffix"), limits,
            prompt=vocab.tokenize(prompt, add_special=False), extra=extra_chunks(
                body.get("input_extra")))

    tokens = await call_in_thread(build)
    return await completion(request, {**body, "model": name, "prompt": tokens})


# -- /rerank ---------------------------------------------------------------------------


@router.post("/rerank", summary="Rerank documents for a query (reranker GGUFs)")
@router.post("/reranking", include_in_schema=False)
@router.post("/v1/rerank", summary="Rerank documents for a query (as /rerank)")
@router.post("/v1/reranking", include_in_schema=False)
async def rerank(request: Request, body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
    """Score each of `documents` (or TEI's `texts`) against `query` on a reranker GGUF
    (its pooling type is rank), best first, cut to `top_n`, in llama-server's and
    Jina's shape (server/rerank.py); 400 for a model that is not a reranker. Scheduled
    as embeddings are: one admitted call on the model's embedding context."""
    state = state_of(request)
    name, vocab = await _model(state, body.get("model"))
    if not await call_in_thread(lambda: is_reranker(vocab)):
        raise APIError(400, f"{name} does not support reranking: its GGUF's pooling type "
                       "is not rank (llama-server: a model run with --reranking)",
                       "not_supported")
    req = parse_rerank(body)

    def work() -> tuple[list[float], int]:
        pairs = [rerank_tokens(vocab, req.query, d) for d in req.documents]
        with state.manager.acquire(name) as lease:
            outputs = lease.engine.embed(pairs)
        return [v[0] for v in outputs], sum(map(len, pairs))

    scores, n_tokens = await admitted_call(state, work)  # a UsageError is a 400
    model = body["model"] if isinstance(body.get("model"), str) else name
    return rerank_response(req, model, scores, n_tokens)


# -- tokens ----------------------------------------------------------------------------


def _tokenize_content(content: Any, vocab: Vocab, add_special: bool, parse_special: bool
                      ) -> list[int]:
    if isinstance(content, str):
        return vocab.tokenize(content, add_special, parse_special)
    if isinstance(content, list) and all(isinstance(x, (int, str)) and not isinstance(x, bool)
                                         for x in content):
        out: list[int] = []
        for i, x in enumerate(content):
            out += (vocab.check([x]) if isinstance(x, int)
                    else vocab.tokenize(x, add_special and i == 0, parse_special))
        return out
    raise APIError(400, '"content" must be text (or text and token ids mixed)',
                   "invalid_request")


def _piece_json(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)  # part of a character: its bytes, as llama-server does


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise APIError(400, f'"{name}" must be true or false', "invalid_request")
    return value


@router.post("/tokenize")
async def tokenize(request: Request, body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
    """`{content, add_special=false, parse_special=true, with_pieces=false}` →
    `{tokens: [id, ...]}` or, with pieces, `[{id, piece}]` (a piece that is not whole
    UTF-8 comes as its byte values)."""
    _, vocab = await _model(state_of(request), body.get("model"))
    if "content" not in body:
        return {"tokens": []}
    add_special = _bool(body, "add_special", False)
    parse_special = _bool(body, "parse_special", True)
    with_pieces = _bool(body, "with_pieces", False)

    def work() -> list[Any]:
        ids = _tokenize_content(body["content"], vocab, add_special, parse_special)
        if not with_pieces:
            return list(ids)
        return [{"id": t, "piece": _piece_json(vocab.piece(t))} for t in ids]

    return {"tokens": await call_in_thread(work)}


@router.post("/detokenize")
async def detokenize(request: Request, body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
    """`{tokens: [id, ...]}` → `{content}` (each token's piece, special ones as text)."""
    _, vocab = await _model(state_of(request), body.get("model"))
    ids = body.get("tokens", [])
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in ids):
        raise APIError(400, '"tokens" must be a list of token ids', "invalid_request")

    def work() -> str:
        vocab.check(ids)
        return b"".join(vocab.piece(t) for t in ids).decode("utf-8", errors="replace")

    try:
        return {"content": await call_in_thread(work)}
    except UsageError as exc:
        raise APIError(400, str(exc), "invalid_request") from None


# -- chat helpers --------------------------------------------------------------------


class TemplateRequest(BaseModel):
    model: str = Field("", max_length=200)
    messages: list[ChatMessageIn] = Field(..., min_length=1)
    tools: list[ToolDef] | None = Field(None, max_length=128)  # rendered as chat does


async def _chat_prompt(state: ServerState, body: TemplateRequest) -> tuple[str, int]:
    """The rendered chat prompt for `body` (its tools included, as a chat completion
    renders them) under the model's template, and its tokens."""
    name = state.model_name(body.model)
    messages = [chat_message(m) for m in body.messages]
    tools = [t.for_template() for t in body.tools] if body.tools else None

    def work() -> tuple[str, int]:
        with state.manager.acquire(name) as lease:
            text = lease.engine.chat_prompt(messages, tools=tools)
            return text, len(lease.engine.tokenize(text))

    return await call_in_thread(work)


@router.post("/apply-template")
async def apply_template(body: TemplateRequest, request: Request) -> Any:
    """The prompt text the chat template makes of `messages` (nothing is generated)."""
    text, _ = await _chat_prompt(state_of(request), body)
    return {"prompt": text}


@router.post("/chat/completions/input_tokens")
@router.post("/v1/chat/completions/input_tokens")
async def chat_input_tokens(body: TemplateRequest, request: Request) -> Any:
    """How many tokens the chat prompt for `messages` takes."""
    _, n = await _chat_prompt(state_of(request), body)
    return {"input_tokens": n}


# -- server facts ----------------------------------------------------------------------


async def _facts(state: ServerState, requested: str | None = None
                 ) -> tuple[ResolvedModel, int]:
    """The model a request names (the default one when None) and the context of one
    sequence (the engine's own figure when loaded, else what a load would give)."""
    name = state.model_name(requested)
    model, _ = await model_and_vocab(state, name)  # a served file's: no thread hop
    for lm in state.manager.loaded():
        if lm.model.name == model.name:
            return model, lm.engine.n_ctx
    plan = await call_in_thread(lambda: state.manager.plan_for(model.name))
    return model, plan.ctx.n_ctx // state.manager.slots


@router.get("/props")
async def props(request: Request) -> Any:
    """llama-server's server properties for the default model (read-only)."""
    state = state_of(request)
    model, n_ctx = await _facts(state)
    vocab = await call_in_thread(lambda: vocab_for(model.path))
    defaults = SamplingParams(seed=state.settings.seed)
    return {
        "default_generation_settings": {
            "params": generation_settings(defaults, state.settings.n_predict, False),
            "n_ctx": n_ctx},
        "total_slots": state.manager.slots, "model_alias": model.name,
        "model_ftype": model.file_type, "model_path": str(model.path),
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": True,
        "ui": False, "chat_template": "", "chat_template_caps": {},
        "bos_token": vocab.token_text(vocab.bos) if vocab.bos >= 0 else "",
        "eos_token": vocab.token_text(vocab.eos) if vocab.eos >= 0 else "",
        "build_info": f"inferenceos {state.settings.version}", "is_sleeping": False,
        "cors_proxy_enabled": False,
    }


@router.get("/slots")
async def slots(request: Request, fail_on_no_slot: bool = False) -> Any:
    """The default model's sequences (slots): which are busy. Read-only; no prompt
    text is shown. With `fail_on_no_slot`, 503 when every slot is busy."""
    state = state_of(request)
    _, n_ctx = await _facts(state)
    n = state.manager.slots
    busy = min(n, state.admission.running)
    if fail_on_no_slot and busy >= n:
        raise APIError(503, "no slot available", "unavailable_error")
    return [{"id": i, "n_ctx": n_ctx, "speculative": False, "is_processing": i < busy}
            for i in range(n)]


@router.get("/models")
async def models(request: Request) -> Any:
    """Every model a request may name, as llama-server lists them: OpenAI's `data`
    plus llama.cpp's `models`, names without the default `:latest` tag (both spellings
    name the same model, and both are its `aliases`; `tags`, llama-server's `--tags`
    labels, are none)."""
    state = state_of(request)
    listed = await ops_call(state.catalog.names)
    short = [(m, m.name.removesuffix(":latest")) for m in listed]
    return {
        "object": "list",
        "data": [{"id": name, "aliases": sorted({name, m.name}), "tags": [],
                  "object": "model", "created": int(m.modified_at),
                  "owned_by": "inferenceos"} for m, name in short],
        "models": [{"name": name, "model": name, "modified_at": int(m.modified_at),
                    "size": m.size, "digest": m.digest, "type": "model",
                    "capabilities": ["completion"]} for m, name in short],
    }


@router.get("/v1/health")
async def health_v1(request: Request) -> Any:
    """The same as /health (llama-server answers both)."""
    return await health_body(state_of(request))


# -- LoRA adapters ---------------------------------------------------------------------


def check_lora_ids(state: ServerState, name: str, lora: dict[int, float] | None) -> None:
    """400 unless every id of a request's `lora` names one of the server's adapters
    (`serve --lora`, for the default model)."""
    if lora is None:
        return
    table = lora_table(state)
    n = len(table) if table.serves(name) else 0
    bad = next((i for i in lora if not 0 <= i < n), None)
    if bad is not None:
        raise APIError(400, f"invalid adapter id {bad}: this server has {n} LoRA adapters "
                       f"for {name} (GET /lora-adapters)", "invalid_request")


@router.get("/lora-adapters", summary="llama.cpp: the LoRA adapters and their scales")
async def lora_adapters(request: Request) -> Any:
    """[{id, path, scale}] of the adapters given with `serve --lora` (the default model's)."""
    return [{**a, "task_name": "", "prompt_prefix": ""}
            for a in lora_table(state_of(request)).listing()]


@router.post("/lora-adapters", summary="llama.cpp: set the adapters' global scales")
async def set_lora_adapters(request: Request, body: Any = Body(...)) -> Any:  # noqa: B008
    """[{id, scale}] → the global scales (ids left out: 0, as llama-server); requests
    without their own `lora` use them from now on."""
    if not isinstance(body, list):
        raise APIError(400, "Request body must be an array", "invalid_request")
    state = state_of(request)
    scales = parse_lora(body) or {}
    table = lora_table(state)
    check_lora_ids(state, table.model, scales)
    table.set_scales(scales, reset=True)
    return {"success": True}
