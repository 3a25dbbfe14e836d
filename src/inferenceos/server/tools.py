"""Function calling for both APIs: what a request asks for, what the model can do, and
the calls in each API's response shape.

A route turns its request into a `ToolRequest` (None when no tools are offered, or
when `tool_choice` is "none": then tools are not even rendered). Once the model is
leased, `plan_tools` checks that its chat template knows tools (400 "<model> does not
support tools", Ollama's words) and, for "required" or a named function, builds the
grammar that forces a call; for "auto" on templates with a call marker the same grammar
is lazy: it applies only once the model writes the marker. The reply is then read by
reply.py (`read_reply`, or `reply_events` while streaming) with
`tool_calls.parse_tool_calls` / `ToolCallStream` in the plan's format bound to the
declared tools: the one place, for every dialect, where calls in the template's markers
and JSON calls naming a declared tool (bare or fenced) are read.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferenceos.engine.chat_template import ToolCall
from inferenceos.server.errors import APIError
from inferenceos.server.tool_calls import ParsedCall, ToolFormat, detect_format
from inferenceos.server.tool_grammar import tool_call_grammar


@dataclass(frozen=True)
class ToolRequest:
    """Tools offered with a chat request.

    `tools` are `{"type": "function", "function": {name, description?, parameters?}}`
    (what templates render); `choice` is "auto" (the model decides; its reply is
    parsed), "required" (a call to any tool is forced) or "function" (a call to
    `function` is forced); `parallel` lets a forced reply hold several calls.
    """

    tools: tuple[dict[str, Any], ...]
    choice: str = "auto"
    function: str | None = None
    parallel: bool = False

    def functions(self) -> list[dict[str, Any]]:
        """The function definitions a forced call may use."""
        fns = [t["function"] for t in self.tools]
        return [f for f in fns if self.function is None or f["name"] == self.function]


@dataclass(frozen=True)
class ToolPlan:
    """How one generation handles tools: the format to parse, the grammar to force,
    and the trigger patterns that make that grammar lazy (for `auto`)."""

    format: ToolFormat
    grammar: str | None
    triggers: tuple[str, ...] = ()


def tool_request(tools: Sequence[dict[str, Any]] | None, choice: Any,
                 parallel: bool | None) -> ToolRequest | None:
    """A ToolRequest from OpenAI-style fields (`choice`: "none", "auto", "required"
    or `{"type": "function", "function": {"name": ...}}`); None when no tool is used.
    APIError 400 for a choice naming no offered tool."""
    if not tools or choice == "none":
        return None
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tool function names must be unique", "invalid_tools")
    if choice in (None, "auto", "required"):
        return ToolRequest(tuple(tools), choice or "auto", None, bool(parallel))
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if name not in names:
        raise APIError(400, f"tool_choice names a function not in tools: {name!r}"[:200],
                       "invalid_tool_choice")
    return ToolRequest(tuple(tools), "function", name, bool(parallel))


def plan_tools(template: str | None, req: ToolRequest, model: str) -> ToolPlan:
    """The plan for `req` on a model whose chat template is `template`."""
    detected = detect_format(template)
    if detected is None:
        raise APIError(400, f"{model} does not support tools", "tools_not_supported")
    # bound: an untagged JSON reply is a call only when it names one of these tools
    fmt = detected.bound([t["function"] for t in req.tools])
    if req.choice != "auto":
        return ToolPlan(fmt, tool_call_grammar(fmt, req.functions(), req.parallel))
    if fmt.name != "hermes" or fmt.open is None:
        # bare JSON has no marker to wait for, and Mistral's is a control token the
        # grammar does not contain: parse only
        return ToolPlan(fmt, None)
    try:
        grammar = tool_call_grammar(fmt, req.functions(), req.parallel)
    except APIError:  # a schema the converter cannot take: still fine to parse freely
        return ToolPlan(fmt, None)
    # free text until the call's opening marker, then a valid call (llama.cpp's lazy
    # grammar, fed from the marker on), as llama-server does for these templates
    trigger = r"[\s\S]*?(" + re.escape(fmt.open) + r")[\s\S]*"
    return ToolPlan(fmt, grammar, (trigger,))


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def openai_calls(calls: Sequence[ParsedCall], stream: bool = False) -> list[dict[str, Any]]:
    """OpenAI's `tool_calls` (arguments as JSON text); with `index` when streamed."""
    out = []
    for i, c in enumerate(calls):
        item: dict[str, Any] = {"id": call_id(), "type": "function",
                                "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
        out.append({"index": i, **item} if stream else item)
    return out


def ollama_calls(calls: Sequence[ParsedCall]) -> list[dict[str, Any]]:
    """Ollama's `tool_calls` (arguments as an object)."""
    return [{"function": {"index": i, "name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(calls)]


def parse_arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    """A request's tool-call arguments as a dict: OpenAI sends JSON text, Ollama an
    object. APIError 400 for text that is not a JSON object."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments or not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise APIError(400, "tool call arguments must be a JSON object", "invalid_tool_call")
    return value


def history_call(name: str, arguments: str | dict[str, Any] | None,
                 id: str | None = None) -> ToolCall:
    """A past call (from a request's assistant message) for the chat template."""
    return ToolCall(name, parse_arguments(arguments), id)
