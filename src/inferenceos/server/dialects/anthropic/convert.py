"""An Anthropic Messages request → the dialect core's inputs: chat messages, tools,
sampling.

- `system`: a string or text blocks, one system message first.
- `messages`: user / assistant turns; content a string or blocks. `text` blocks join
  into the turn's text; `image` blocks (base64 or, when the server fetches, url
  sources) become media markers at their place; an assistant's `tool_use` blocks are
  its calls; each `tool_result` block becomes a `tool` message answering its call
  (named after it), its content text (and images) inside. Earlier `thinking` /
  `redacted_thinking` blocks are dropped (chat templates drop past reasoning too).
  Other block types (documents, search results, server tools' blocks) are refused.
- `tools`: client tools → the function definitions templates render; `tool_choice`
  auto / any / tool / none → the core's auto / required / function / no tools;
  `disable_parallel_tool_use` → one call at most when a call is forced.
- `output_config.format` (`json_schema`) constrains the reply by a grammar.
- A last assistant turn is a prefill: its text is written after the template's
  generation prompt and the reply continues from it (the reply does not repeat it).
"""

from __future__ import annotations

from typing import Any

from inferenceos.engine.chat_template import ChatMessage, ToolCall
from inferenceos.engine.sampling import SamplingParams
from inferenceos.media.collect import MediaSet, check_text
from inferenceos.server.dialects.anthropic.schema import (
    ContentBlockIn,
    CountTokensRequest,
    MessageIn,
    MessagesRequest,
)
from inferenceos.server.errors import APIError
from inferenceos.server.json_grammar import output_grammar
from inferenceos.server.options import request_sampling, stops
from inferenceos.server.tools import ToolRequest, tool_request

_DROPPED = frozenset({"thinking", "redacted_thinking"})


def _bad(message: str) -> APIError:
    return APIError(400, message[:300], "invalid_request")


def _image(block: ContentBlockIn, media: MediaSet | None) -> str:
    """An image block's marker (its item joins `media`)."""
    src = block.source
    if media is None or src is None:
        raise _bad("an image block needs a source: {\"type\": \"base64\", \"media_type\", "
                   "\"data\"} or {\"type\": \"url\", \"url\"}")
    if src.type == "base64":
        if not src.data or not src.media_type:
            raise _bad("a base64 image source needs media_type and data")
        return media.image(f"data:{src.media_type};base64,{src.data}", bare_base64=False)
    if src.type == "url":
        if not src.url:
            raise _bad("a url image source needs url")
        return media.image(src.url, bare_base64=False)
    raise _bad(f"image sources of type {src.type[:40]!r} are not supported (base64, url)")


def _text(blocks: str | list[ContentBlockIn] | None, media: MediaSet | None,
          where: str) -> str:
    """The text of content that may hold only text and image blocks."""
    if blocks is None or isinstance(blocks, str):
        text = blocks or ""
        return check_text(text) if media is not None else text
    parts = []
    for b in blocks:
        if b.type == "text":
            parts.append(check_text(b.text or "") if media is not None else b.text or "")
        elif b.type == "image":
            parts.append(_image(b, media))
        elif b.type not in _DROPPED:
            raise _bad(f"{where} blocks of type {b.type!r} are not supported (text, image)")
    return "".join(parts)


def has_media(body: CountTokensRequest) -> bool:
    """Whether any message (or tool result in one) carries an image block."""
    def any_image(blocks: Any) -> bool:
        return isinstance(blocks, list) and any(
            b.type == "image" or (b.type == "tool_result" and any_image(b.content))
            for b in blocks)
    return any(any_image(m.content) for m in body.messages)


def _user_turn(m: MessageIn, names: dict[str, str], media: MediaSet | None
               ) -> list[ChatMessage]:
    """A user turn: its tool results as tool messages, its other blocks as one user
    message, in the order they come."""
    if isinstance(m.content, str):
        return [ChatMessage("user", _text(m.content, media, "user"))]
    out: list[ChatMessage] = []
    pending: list[ContentBlockIn] = []
    for b in [*m.content, None]:
        if b is not None and b.type != "tool_result":
            pending.append(b)
            continue
        if pending:
            out.append(ChatMessage("user", _text(pending, media, "user message")))
            pending = []
        if b is not None:
            if not b.tool_use_id:
                raise _bad("a tool_result block needs tool_use_id")
            text = _text(b.content, media, "tool_result content")
            if b.is_error:  # the template has no place for the flag: say it in words
                text = f"Error: {text}"
            out.append(ChatMessage("tool", text, (), b.tool_use_id, names.get(b.tool_use_id)))
    return out


def _assistant_turn(m: MessageIn, names: dict[str, str]) -> ChatMessage:
    """An earlier assistant turn: its text and its tool_use calls."""
    if isinstance(m.content, str):
        return ChatMessage("assistant", m.content)
    text, calls = [], []
    for b in m.content:
        if b.type == "text":
            text.append(b.text or "")
        elif b.type == "tool_use":
            if not b.id or not b.name:
                raise _bad("a tool_use block needs id and name")
            names[b.id] = b.name
            calls.append(ToolCall(b.name, dict(b.input or {}), b.id))
        elif b.type not in _DROPPED:
            raise _bad(f"assistant blocks of type {b.type!r} are not supported (text, "
                       "tool_use, thinking)")
    return ChatMessage("assistant", "".join(text), tuple(calls))


def chat_messages(body: CountTokensRequest, media: MediaSet | None = None
                  ) -> tuple[list[ChatMessage], str]:
    """The conversation for the chat template and the prefill (the text of a final
    assistant turn, "" when the last turn is the user's); see the module docstring.
    Media blocks become markers, their items gathered in `media` (None: no media)."""
    out: list[ChatMessage] = []
    if isinstance(body.system, list) and any(b.type != "text" for b in body.system):
        raise _bad("system blocks must be text blocks")
    system = _text(body.system, media, "system")
    if system:
        out.append(ChatMessage("system", system))
    names: dict[str, str] = {}  # tool_use id → tool name, for the results
    for m in body.messages:
        if m.role == "assistant":
            out.append(_assistant_turn(m, names))
        else:
            out.extend(_user_turn(m, names, media))
    if body.messages[-1].role != "assistant":
        return out, ""
    last = out.pop()
    if last.tool_calls:
        raise _bad("a final assistant message (a prefill) may hold text only, not tool_use")
    if not any(m.role != "system" for m in out):
        raise _bad("messages must hold a user message before a final assistant message")
    return out, last.content


def tools_of(body: CountTokensRequest) -> ToolRequest | None:
    """The request's client tools and tool_choice as the core takes them."""
    defs = []
    for t in body.tools or ():
        if t.type not in (None, "custom"):
            raise _bad(f"tools of type {t.type!r} are not supported (client tools with "
                       "name and input_schema only)")
        fn: dict[str, Any] = {"name": t.name,
                              "parameters": t.input_schema or {"type": "object"}}
        if t.description:
            fn["description"] = t.description
        defs.append({"type": "function", "function": fn})
    choice = body.tool_choice
    if choice is not None and choice.type != "auto" and not defs:
        raise _bad(f"tool_choice {choice.type!r} needs tools")
    kind: Any = {None: "auto", "auto": "auto", "any": "required", "none": "none"}.get(
        choice.type if choice else None)
    if choice is not None and choice.type == "tool":
        if not choice.name:
            raise _bad("tool_choice of type tool needs name")
        kind = {"type": "function", "function": {"name": choice.name}}
    parallel = not (choice is not None and choice.disable_parallel_tool_use)
    return tool_request(defs, kind, parallel)


def _grammar(body: MessagesRequest) -> str | None:
    fmt = body.output_config.format if body.output_config else None
    if fmt is None:
        return None
    if fmt.type != "json_schema" or fmt.schema_ is None:
        raise _bad("output_config.format must be {\"type\": \"json_schema\", \"schema\": "
                   "{...}}")
    return output_grammar("json_schema", fmt.schema_)


def sampling_of(body: MessagesRequest) -> SamplingParams:
    """Sampling from the request; temperature defaults to 1.0, as Anthropic's does."""
    return request_sampling(
        body, temperature=1.0 if body.temperature is None else body.temperature,
        max_tokens=body.max_tokens, stop=stops(body.stop_sequences), grammar=_grammar(body))
