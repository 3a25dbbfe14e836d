"""OpenAI's Responses API: `POST /v1/responses`, `GET /v1/responses/{id}`.

What `client.responses.create(...)` sends and parses: `input` as text or messages
(`input_text` / `output_text` parts), `instructions` (the system message),
`max_output_tokens`, `temperature`, `top_p`, `text.format` (json_object / json_schema,
enforced by a grammar), and `previous_response_id` to continue a stored response
(`store`, default true, keeps the last 256 per server in memory). Streamed, it is SSE
with named events, in OpenAI's order: response.created, response.in_progress,
response.output_item.added, response.content_part.added, response.output_text.delta...,
response.output_text.done, response.content_part.done, response.output_item.done,
response.completed (response.incomplete when max_output_tokens cut it; an `error`
event on failure).

Function tools (`{"type": "function", "name", "parameters"}`, `tool_choice` auto / none
/ required / `{"type": "function", "name"}`) go through the model's chat template as
chat completions' do; calls come back as `function_call` output items (`call_id`, `name`,
`arguments` as JSON text; streamed with response.function_call_arguments.delta/.done),
and `function_call` / `function_call_output` input items carry a call and its result
into the next turn. Other tool types (web search, files...) are refused with a 400.
"""

from __future__ import annotations

import collections
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request

from inferenceos.engine.chat_template import ChatMessage, ToolCall
from inferenceos.engine.sampling import SamplingParams
from inferenceos.media.collect import MediaSet
from inferenceos.media.item import MediaItem
from inferenceos.server.dialects.openai.schema import ERROR_RESPONSES
from inferenceos.server.dialects.responses.schema import InputItem, ResponseRequest
from inferenceos.server.errors import APIError, Dialect, route_class
from inferenceos.server.generation import (
    Done,
    GenRequest,
    Run,
    start_generation,
    until_disconnect,
)
from inferenceos.server.json_grammar import output_grammar
from inferenceos.server.media_parts import (
    RESPONSES_MEDIA_PARTS,
    content_text,
    decode_in_thread,
    media_set,
    responses_part,
)
from inferenceos.server.options import UNLIMITED, request_sampling
from inferenceos.server.reasoning import Think
from inferenceos.server.reply import Delta, Final, read_reply, reply_events
from inferenceos.server.sse import RESPONSES_SSE, stream_response
from inferenceos.server.state import state_of
from inferenceos.server.tool_calls import ParsedCall
from inferenceos.server.tools import ToolRequest, history_call, tool_request

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERROR_RESPONSES,
                   route_class=route_class(Dialect.OPENAI))

MAX_STORED = 256
MAX_STORED_MEDIA = 256 * 1024 * 1024  # bytes of decoded media the stored responses keep
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


_Stored = tuple[list[ChatMessage], dict[str, Any], tuple[MediaItem, ...]]


class ResponseStore:
    """Stored responses (for `previous_response_id` and GET): id → (the conversation
    that led to it plus its reply, the response object, the conversation's media in
    marker order). Oldest dropped past the cap, or past `media_cap` bytes of media."""

    def __init__(self, cap: int = MAX_STORED, media_cap: int = MAX_STORED_MEDIA) -> None:
        self.cap = cap
        self.media_cap = media_cap
        self._items: collections.OrderedDict[str, _Stored] = collections.OrderedDict()
        self._media_bytes = 0

    def put(self, rid: str, messages: list[ChatMessage], response: dict[str, Any],
            media: tuple[MediaItem, ...] = ()) -> None:
        self._items[rid] = (messages, response, media)
        self._media_bytes += _size(media)
        while len(self._items) > self.cap or (self._media_bytes > self.media_cap
                                              and len(self._items) > 1):
            self._media_bytes -= _size(self._items.popitem(last=False)[1][2])

    def get(self, rid: str) -> _Stored:
        try:
            return self._items[rid]
        except KeyError:
            raise APIError(404, f"no stored response {rid[:100]!r}", "response_not_found") from None


def _size(media: tuple[MediaItem, ...]) -> int:
    return sum(len(m.data) for m in media)


def _store(request: Request) -> ResponseStore:
    store = getattr(request.app.state, "responses", None)
    if store is None:
        store = request.app.state.responses = ResponseStore()
    return store


def _item_text(item: InputItem, media: MediaSet | None = None) -> str:
    """An item's text; with `media`, media parts become markers (items into `media`)."""
    return content_text(item.content, media, responses_part,
                        ("input_text", "output_text", "text"), "input")


def _has_media(body: ResponseRequest) -> bool:
    return not isinstance(body.input, str) and any(
        isinstance(i.content, list) and any(p.type in RESPONSES_MEDIA_PARTS for p in i.content)
        for i in body.input)


def _input_messages(body: ResponseRequest, media: MediaSet | None = None
                    ) -> list[ChatMessage]:
    """Chat messages from `input`: messages, and earlier function calls (joined onto an
    assistant message) with their outputs (tool messages naming their function); media
    parts as markers, their items gathered in `media`."""
    if isinstance(body.input, str):
        return [ChatMessage("user", body.input)]
    out: list[ChatMessage] = []
    names: dict[str, str] = {}  # call_id → function name, for the outputs
    for item in body.input:
        if item.type == "function_call":
            if not item.name or not item.call_id:
                raise APIError(400, "a function_call item needs name and call_id",
                               "invalid_input")
            call = history_call(item.name, item.arguments, item.call_id)
            names[item.call_id] = item.name
            if out and out[-1].role == "assistant":  # parallel calls: one message
                last = out.pop()
                out.append(ChatMessage("assistant", last.content, (*last.tool_calls, call)))
            else:
                out.append(ChatMessage("assistant", "", (call,)))
        elif item.type == "function_call_output":
            if not item.call_id:
                raise APIError(400, "a function_call_output item needs call_id",
                               "invalid_input")
            out.append(ChatMessage("tool", item.output or "", (), item.call_id,
                                   names.get(item.call_id)))
        elif item.type in (None, "message") and item.role in _ROLES:
            out.append(ChatMessage(_ROLES[item.role], _item_text(item, media)))
        else:
            raise APIError(400, f"input items of type {item.type or item.role!r} are not "
                           "supported", "unsupported_input")
    if not out:
        raise APIError(400, "input must not be empty", "invalid_input")
    return out


def _tools(body: ResponseRequest) -> ToolRequest | None:
    """The Responses API's flat function tools, as the chat machinery takes them."""
    if not body.tools:
        return None
    defs = []
    for t in body.tools:
        if t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise APIError(400, f"tools of type {str(t.get('type'))[:40]!r} are not "
                           "supported (function tools only)", "unsupported_parameter")
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        defs.append({"type": "function", "function": fn})
    choice = body.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise APIError(400, "tool_choice must be auto, none, required or a function",
                           "unsupported_parameter")
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return tool_request(defs, choice, body.parallel_tool_calls)


def _call_items(calls: list[ParsedCall]) -> list[dict[str, Any]]:
    return [{"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": "completed",
             "call_id": f"call_{uuid.uuid4().hex[:24]}", "name": c.name,
             "arguments": json.dumps(c.arguments)} for c in calls]


def _assistant(text: str, calls: list[dict[str, Any]]) -> ChatMessage:
    """The reply as history, for previous_response_id."""
    return ChatMessage("assistant", text, tuple(
        ToolCall(c["name"], json.loads(c["arguments"]), c["call_id"]) for c in calls))


def _grammar(body: ResponseRequest) -> str | None:
    """The grammar `text.format` asks for (json_object: any object, its schema unused)."""
    fmt = body.text.format if body.text else None
    if fmt is None:
        return None
    if fmt.type == "json_schema" and fmt.schema_ is None:
        raise APIError(400, "text.format json_schema needs a schema", "invalid_format")
    return output_grammar(fmt.type, fmt.schema_ if fmt.type == "json_schema" else None,
                          "text.format")


def _sampling(body: ResponseRequest) -> SamplingParams:
    return request_sampling(body, grammar=_grammar(body),
                            max_tokens=body.max_output_tokens or UNLIMITED)


def _think(body: ResponseRequest) -> Think:
    """`reasoning.effort`: "none" turns thinking off, a level reaches the template."""
    effort = body.reasoning.effort if body.reasoning else None
    if effort == "none":
        return Think(enabled=False)
    return Think(effort=effort)


def _reasoning_item(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    """The reply's reasoning as an output item (its text whole, as gpt-oss servers
    give it: `content` of `reasoning_text`, no summary)."""
    return {"id": rid, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def _message_item(mid: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": mid, "type": "message", "role": "assistant", "status": status,
            "content": content if status != "in_progress" else []}


class _Reply:
    """The response object as it grows (ids, times, settings echoed back)."""

    def __init__(self, body: ResponseRequest, model: str) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.msg_id = f"msg_{uuid.uuid4().hex}"
        self.rs_id = f"rs_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.body = body
        self.model = model
        self.reasoning_tokens = 0  # tokens of the reply inside its reasoning section

    def obj(self, status: str, output: list[dict[str, Any]],
            done: Done | None = None) -> dict[str, Any]:
        b = self.body
        usage = incomplete = None
        if done is not None:
            g = done.metrics
            usage = {"input_tokens": g.prompt_tokens,
                     "input_tokens_details": {"cached_tokens": g.cached_tokens},
                     "output_tokens": g.completion_tokens,
                     "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                     "total_tokens": g.prompt_tokens + g.completion_tokens}
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
        fmt = b.text.format.model_dump(by_alias=True, exclude_none=True) if (
            b.text and b.text.format) else {"type": "text"}
        return {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": status, "model": self.model, "output": output,
            "output_text": "".join(c["text"] for o in output if o["type"] == "message"
                                   for c in o.get("content") or []),
            "instructions": b.instructions, "max_output_tokens": b.max_output_tokens,
            "previous_response_id": b.previous_response_id, "temperature": b.temperature,
            "top_p": b.top_p, "parallel_tool_calls": bool(b.parallel_tool_calls),
            "tool_choice": b.tool_choice if b.tool_choice is not None else (
                "auto" if b.tools else "none"),
            "tools": b.tools or [], "text": {"format": fmt}, "store": b.store, "error": None,
            "incomplete_details": incomplete, "metadata": b.metadata or {}, "usage": usage,
            "completed_at": int(time.time()) if done is not None else None,
        }


def _status(done: Done) -> str:
    return "incomplete" if done.metrics.stop_reason == "length" else "completed"


@router.post("/responses")
async def create_response(body: ResponseRequest, request: Request) -> Any:
    """A model response (OpenAI Responses API), streamed as named SSE events when
    `stream` is true."""
    state = state_of(request)
    tools = _tools(body)
    store = _store(request)
    history, _, earlier = (store.get(body.previous_response_id) if body.previous_response_id
                           else ([], {}, ()))
    messages = list(history)
    if body.instructions:
        messages = [m for m in messages if m.role != "system"]
        messages.insert(0, ChatMessage("system", body.instructions))
    if _has_media(body):  # decoding is CPU work on untrusted bytes: not on the loop
        media = media_set(state.settings)
        messages += await decode_in_thread(lambda: _input_messages(body, media))
        items = (*earlier, *media.items)
    else:
        messages += _input_messages(body, media_set(state.settings) if earlier else None)
        items = earlier
    name = state.model_name(body.model)
    req = GenRequest(name, _sampling(body), messages=tuple(messages), tools=tools,
                     media=items, think=_think(body))
    reply = _Reply(body, name)
    run = await until_disconnect(request, start_generation(state, req))

    def keep(text: str, calls: list[dict[str, Any]], obj: dict[str, Any]) -> None:
        if body.store:
            store.put(reply.id, [*messages, _assistant(text, calls)], obj, items)

    if body.stream:
        return stream_response(_events(run, reply, keep), RESPONSES_SSE, run.close)

    async def whole() -> dict[str, Any]:
        raw, done = await run.collect()
        thought, text, parsed = read_reply(raw, run.tool_format, run.reasoning)
        calls = _call_items(parsed)
        status = _status(done) if not calls else "completed"
        output = [_reasoning_item(reply.rs_id, thought)] if thought else []
        if text or not (calls or thought):
            output.append(_message_item(reply.msg_id, text, status))
        obj = reply.obj(status, output + calls, done)
        keep(text, calls, obj)
        return obj

    return await until_disconnect(request, whole())


@router.get("/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> Any:
    """A stored response (404 when unknown or dropped)."""
    return _store(request).get(response_id)[1]


async def _events(run: Run, reply: _Reply, keep: Any) -> AsyncIterator[dict[str, Any]]:
    """The Responses API's event sequence for one generation (see module docstring).
    Reasoning comes first as a `reasoning` item (`response.reasoning_text.delta`
    events). With tools offered, text that may be a call is held back (as chat
    completions do) and the calls come as function_call items once the reply is
    complete."""
    yield {"type": "response.created", "response": reply.obj("in_progress", [])}
    yield {"type": "response.in_progress", "response": reply.obj("in_progress", [])}
    msg = _MessageEvents(reply)
    thinking = _ReasoningEvents(reply)
    if run.tool_format is None and run.reasoning is None:  # the message is certain
        for ev in msg.announce(0):
            yield ev
    async with aclosing(reply_events(run)) as replies:
        async for d in replies:
            if d.thought:
                reply.reasoning_tokens += 1 if isinstance(d, Delta) else 0
                for ev in thinking.delta(d.thought):
                    yield ev
            if d.text or isinstance(d, Final):
                for ev in thinking.close():
                    yield ev
            for ev in msg.delta(d.text, thinking.count) if d.text else []:
                yield ev
            if isinstance(d, Delta):
                continue
            output = thinking.items()
            text, calls = "".join(msg.parts), _call_items(d.calls)
            status = _status(d.done) if not calls else "completed"
            for ev in msg.close(status):
                yield ev
                if ev["type"] == "response.output_item.done":
                    output.append(ev["item"])
            for call in calls:
                for ev in _call_events(len(output), call):
                    yield ev
                output.append(call)
            obj = reply.obj(status, output, d.done)
            keep(text, calls, obj)
            yield {"type": f"response.{status}", "response": obj}


class _ReasoningEvents:
    """The reasoning item's events: added with its first text, done before the answer."""

    def __init__(self, reply: _Reply) -> None:
        self.rid = reply.rs_id
        self.parts: list[str] = []
        self.open = self.done = False

    @property
    def count(self) -> int:
        """Output items before the message: 1 once there was reasoning."""
        return 1 if self.parts else 0

    def delta(self, piece: str) -> list[dict[str, Any]]:
        out = []
        if not self.open:
            self.open = True
            out.append({"type": "response.output_item.added", "output_index": 0,
                        "item": _reasoning_item(self.rid, "", "in_progress")})
        self.parts.append(piece)
        out.append({"type": "response.reasoning_text.delta", "item_id": self.rid,
                    "output_index": 0, "content_index": 0, "delta": piece})
        return out

    def close(self) -> list[dict[str, Any]]:
        if not self.open or self.done:
            return []
        self.done = True
        text = "".join(self.parts)
        return [{"type": "response.reasoning_text.done", "item_id": self.rid,
                 "output_index": 0, "content_index": 0, "text": text},
                {"type": "response.output_item.done", "output_index": 0,
                 "item": _reasoning_item(self.rid, text)}]

    def items(self) -> list[dict[str, Any]]:
        return [_reasoning_item(self.rid, "".join(self.parts))] if self.parts else []


class _MessageEvents:
    """The message item's events: announced once before its first text, then deltas,
    then done."""

    def __init__(self, reply: _Reply) -> None:
        self.mid = reply.msg_id
        self.parts: list[str] = []
        self.index = -1  # its output_index once announced
        self.part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}

    def ids(self) -> dict[str, Any]:
        return {"item_id": self.mid, "output_index": self.index, "content_index": 0}

    def announce(self, index: int) -> list[dict[str, Any]]:
        if self.index >= 0:
            return []
        self.index = index
        return [{"type": "response.output_item.added", "output_index": index,
                 "item": _message_item(self.mid, "", "in_progress")},
                {"type": "response.content_part.added", **self.ids(), "part": self.part}]

    def delta(self, piece: str, index: int) -> list[dict[str, Any]]:
        self.parts.append(piece)
        return [*self.announce(index), {"type": "response.output_text.delta", **self.ids(),
                                        "delta": piece, "logprobs": []}]

    def close(self, status: str) -> list[dict[str, Any]]:
        if self.index < 0:
            return []
        text = "".join(self.parts)
        return [{"type": "response.output_text.done", **self.ids(), "text": text,
                 "logprobs": []},
                {"type": "response.content_part.done", **self.ids(),
                 "part": {**self.part, "text": text}},
                {"type": "response.output_item.done", "output_index": self.index,
                 "item": _message_item(self.mid, text, status)}]


def _call_events(n: int, call: dict[str, Any]) -> list[dict[str, Any]]:
    """A function_call item's events at output_index `n`."""
    return [{"type": "response.output_item.added", "output_index": n,
             "item": {**call, "arguments": "", "status": "in_progress"}},
            {"type": "response.function_call_arguments.delta", "output_index": n,
             "item_id": call["id"], "delta": call["arguments"]},
            {"type": "response.function_call_arguments.done", "output_index": n,
             "item_id": call["id"], "arguments": call["arguments"]},
            {"type": "response.output_item.done", "output_index": n, "item": call}]
