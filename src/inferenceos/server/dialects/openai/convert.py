"""An OpenAI chat / text completion request → the dialect core's inputs: chat messages,
tools, sampling and its grammar.

- `messages`: roles as templates name them (`developer` → system, `function` → tool);
  content a string or parts, text parts joined; media parts (when the request carries
  any) become markers at their place (media_parts.py); an assistant's `tool_calls`
  become its calls (arguments parsed: OpenAI sends JSON text), a tool message names the
  call it answers.
- `tools` / `tool_choice` / `parallel_tool_calls` → a `ToolRequest` (tools.py).
- sampling fields, `logit_bias` (-100 bans), `n` seeded variants (seed + i).
- the output constraint: llama.cpp's `grammar` (GBNF) or top-level `json_schema`, vLLM's
  `structured_outputs` / `guided_*`, or `response_format`; at most one of them.
- reasoning: `chat_template_kwargs`, `reasoning_effort`, `reasoning_format` and the
  reasoning budget → a `Think` (server/reasoning.py).

Also used by llama-server's chat helpers (/apply-template, input_tokens), which take
OpenAI's messages.
"""

from __future__ import annotations

import dataclasses

from inferenceos.engine.chat_template import ChatMessage, ToolCall
from inferenceos.engine.sampling import SamplingParams
from inferenceos.media.collect import MediaSet
from inferenceos.server.dialects.openai.schema import (
    ChatCompletionRequest,
    ChatMessageIn,
    ResponseFormat,
    SamplingFields,
)
from inferenceos.server.errors import APIError
from inferenceos.server.json_grammar import kind_grammar, output_grammar, structured_grammar
from inferenceos.server.media_parts import OPENAI_MEDIA_PARTS, content_text, openai_part
from inferenceos.server.options import UNLIMITED, request_sampling, stops
from inferenceos.server.reasoning import Think, check_budget, check_format
from inferenceos.server.tools import ToolRequest, history_call, tool_request


def _logit_bias(body: SamplingFields) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias in -100..100}; -100 bans the token."""
    out = []
    for key, bias in (body.logit_bias or {}).items():
        if not key.isdigit() or not -100 <= bias <= 100:
            raise APIError(400, "logit_bias maps token ids to biases in [-100, 100]",
                           "invalid_logit_bias")
        out.append((int(key), float("-inf") if bias <= -100 else float(bias)))
    return tuple(out)


def sampling(body: SamplingFields, max_tokens: int | None,
             grammar: str | None = None, logprobs: int | None = None) -> SamplingParams:
    """The request's sampling; `max_tokens` None is unlimited (the context caps it)."""
    return request_sampling(body, grammar=grammar, logit_bias=_logit_bias(body),
                            logprobs=logprobs, stop=stops(body.stop),
                            max_tokens=UNLIMITED if max_tokens is None else max_tokens)


def variants(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n samplings; with a fixed seed each choice gets its own (seed + i)."""
    if params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=(params.seed + i) % (2**32 - 1))
            for i in range(n)]


def _text_of(m: ChatMessageIn, media: MediaSet | None = None) -> str:
    """A message's text; with `media` (a request that carries some), each media part
    becomes its marker at its place and its item joins `media`."""
    return content_text(m.content, media, openai_part, ("text",), "content")


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


def chat_messages(body: ChatCompletionRequest, media: MediaSet | None = None
                  ) -> tuple[ChatMessage, ...]:
    """The conversation of a chat completion request (APIError 400 for what is not
    served: continuing the final message, an unknown response_format, two assistant
    messages at the end)."""
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


def tools_of(body: ChatCompletionRequest) -> ToolRequest | None:
    """The request's tools and tool_choice as the core takes them."""
    choice = body.tool_choice
    return tool_request([t.for_template() for t in body.tools or ()],
                        choice.model_dump() if choice is not None and not isinstance(choice, str)
                        else choice, body.parallel_tool_calls)


def _grammar(fmt: ResponseFormat | None) -> str | None:
    """The grammar a response_format asks for: none, any JSON object (or, llama.cpp's
    extension, one valid under its `schema`), or a json_schema."""
    if fmt is None:
        return None
    schema = fmt.schema_
    if fmt.type == "json_schema":
        schema = (fmt.json_schema or {}).get("schema")
        if schema is None:
            raise APIError(400, "response_format json_schema needs json_schema.schema")
    return output_grammar(fmt.type, schema, "response_format")


# the request fields that are one constraint kind of json_grammar.kind_grammar each
_GUIDED_KINDS = {"grammar": "grammar", "guided_grammar": "grammar", "guided_regex": "regex",
                 "guided_choice": "choice"}


def constraint(body: SamplingFields, fmt: ResponseFormat | None = None) -> str | None:
    """The grammar of a request: llama.cpp's `grammar` (GBNF) or top-level `json_schema`
    extensions, vLLM's `structured_outputs` or `guided_json` / `guided_regex` /
    `guided_choice` / `guided_grammar`, or its response_format; at most one of them.
    Each is checked here (json_grammar.py): a schema, grammar or regex that cannot be
    served is a 400, never ignored and never passed on to llama.cpp."""
    from_format = _grammar(fmt)
    given = [(n, v) for n, v in (
        ("grammar", body.grammar), ("json_schema", body.json_schema),
        ("structured_outputs", body.structured_outputs or None),
        ("guided_json", body.guided_json), ("guided_regex", body.guided_regex),
        ("guided_choice", body.guided_choice), ("guided_grammar", body.guided_grammar),
        ("response_format", from_format)) if v not in (None, "")]
    if len(given) > 1:
        raise APIError(400, f"use one of {' and '.join(n for n, _ in given)}, not both",
                       "invalid_request")
    if not given:
        return None
    name, value = given[0]
    if name in _GUIDED_KINDS:
        return kind_grammar(_GUIDED_KINDS[name], value, name)
    if name == "json_schema":
        return output_grammar("json_schema", value or {"type": "object"})
    if name == "guided_json":
        return structured_grammar({"json": value}, name)
    if name == "structured_outputs":
        return structured_grammar(value, name)
    return from_format


def think_of(body: ChatCompletionRequest) -> Think:
    """What a chat request asks of reasoning, in llama-server's spellings:
    `chat_template_kwargs` (its `enable_thinking` a boolean), `reasoning_effort`
    ("none" turns thinking off), `reasoning_budget_tokens` (or
    `thinking_budget_tokens`), `reasoning_budget_message`, `reasoning_format`."""
    kwargs = dict(body.chat_template_kwargs or {})
    enabled = kwargs.pop("enable_thinking", None)
    if enabled is not None and not isinstance(enabled, bool):
        raise APIError(400, 'invalid type for "enable_thinking" (expected boolean, got '
                       f"{type(enabled).__name__})", "invalid_request")
    effort = body.reasoning_effort
    if effort == "none":
        enabled, effort = False, None
    budget = body.reasoning_budget_tokens
    if budget is None:
        budget = body.thinking_budget_tokens
    return Think(enabled=enabled, effort=effort,
                 budget=check_budget(budget, "reasoning_budget_tokens"),
                 message=body.reasoning_budget_message or "",
                 split=check_format(body.reasoning_format), kwargs=kwargs)
