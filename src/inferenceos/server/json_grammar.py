"""Output formats → GBNF: the one place a request's JSON format becomes a grammar.

Every dialect's format field comes here, translated into a kind and a schema:
OpenAI's `response_format` (and llama.cpp's top-level `json_schema`), the Responses
API's `text.format`, Ollama's `format` ("json" or a schema), Anthropic's
`output_config.format` and llama-server's `json_schema`.

"Any JSON object" is llama.cpp's own grammars/json.gbnf (object at the root); a schema
goes through the engine's JSON-Schema converter. Sampling under either can only produce
what it allows; the model may still stop early at max_tokens.
"""

from __future__ import annotations

JSON_OBJECT_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
"""


def grammar_for_schema(schema: object) -> str:
    """A GBNF grammar for a JSON Schema given by a client; APIError 400 when unusable."""
    import json

    from inferenceos.engine.sampling import grammar_from_json_schema
    from inferenceos.errors import UsageError
    from inferenceos.server.errors import APIError

    if not isinstance(schema, dict):
        raise APIError(400, "a JSON schema must be an object")
    try:
        return grammar_from_json_schema(json.dumps(schema))
    except UsageError as exc:
        raise APIError(400, str(exc)) from None


def output_grammar(kind: str | None, schema: object = None, field: str = "format"
                   ) -> str | None:
    """The grammar an output format asks for. `kind`: None or "text", free text (no
    grammar); "json_object", any JSON object, or one valid under `schema` when given
    (llama.cpp's extension of OpenAI's json_object); "json_schema", JSON valid under
    `schema` (a dialect says in its own words when its request lacks one). Any other
    kind is a 400 naming the request's `field`."""
    from inferenceos.server.errors import APIError

    if kind is None or kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_GBNF if schema is None else grammar_for_schema(schema)
    if kind != "json_schema":
        raise APIError(400, f"{field} {kind!r} is not supported", "unsupported_parameter")
    return grammar_for_schema(schema)
