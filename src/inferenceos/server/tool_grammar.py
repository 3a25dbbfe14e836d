"""GBNF grammars that force a tool call (`tool_choice: "required"` or a named function).

The call object is described as one JSON Schema — `{"name": <const>, <args key>:
<the function's parameters>}`, an `anyOf` over the functions offered — and converted
by the engine's JSON-Schema converter; its root rule is renamed and wrapped in the
format's markers. Sampling under the grammar can only produce a call that parses in
that format, to an offered function, with arguments valid under its schema (within
what the converter supports).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from inferenceos.engine.sampling import grammar_from_json_schema
from inferenceos.errors import UsageError
from inferenceos.server.errors import APIError
from inferenceos.server.tool_calls import ToolFormat

_CALL_RULE = "tool-call"
# GBNF tokens: a quoted literal, a character class, a name, or any other character
_GBNF_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z0-9_-]+|\s+|.')


def _rename_rule(gbnf: str, old: str, new: str) -> str:
    """Rename rule `old` (its definition and references), leaving literals alone."""
    return "".join(new if tok == old else tok for tok in _GBNF_TOKEN.findall(gbnf))


def _call_schema(fmt: ToolFormat, function: dict[str, Any],
                 defs: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of one call to `function`; its `$defs` move to `defs` so that
    `#/$defs/...` references still resolve from the combined schema's root."""
    params = dict(function.get("parameters") or {"type": "object", "properties": {}})
    for key in ("$defs", "definitions"):
        defs.update(params.pop(key, None) or {})
    return {"type": "object",
            "properties": {"name": {"const": function["name"]}, fmt.args_key: params},
            "required": ["name", fmt.args_key], "additionalProperties": False}


def _wrap(fmt: ToolFormat, parallel: bool) -> str:
    """The root rule: one call (or several when `parallel`) in the format's markers.
    Mistral's `[TOOL_CALLS]` is a control token a grammar cannot emit: the list alone."""
    if fmt.name == "hermes":
        one = f'"<tool_call>\\n" {_CALL_RULE} "\\n</tool_call>"'
        return f'root ::= {one} ("\\n" {one})*' if parallel else f"root ::= {one}"
    if fmt.name == "mistral":
        more = f' ("," " "? {_CALL_RULE})*' if parallel else ""
        return f'root ::= "[" {_CALL_RULE}{more} "]"'
    return f"root ::= {_CALL_RULE}"  # Llama 3 and bare JSON: one call is the reply


def tool_call_grammar(fmt: ToolFormat, functions: Sequence[dict[str, Any]],
                      parallel: bool = False) -> str:
    """GBNF accepting exactly a call (or calls, when `parallel`) in format `fmt` to one
    of `functions` (each `{"name", "parameters"?}`). APIError 400 when a function's
    parameters are not a schema the converter handles."""
    if not functions:
        raise APIError(400, "tool_choice needs at least one tool", "invalid_tool_choice")
    defs: dict[str, Any] = {}
    calls = [_call_schema(fmt, f, defs) for f in functions]
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if defs:
        schema = {**schema, "$defs": defs}
    try:
        body = grammar_from_json_schema(json.dumps(schema))
    except UsageError as exc:
        raise APIError(400, f"tool parameters: {exc}", "invalid_tools") from None
    return _rename_rule(body, "root", _CALL_RULE) + "\n" + _wrap(fmt, parallel) + "\n"
