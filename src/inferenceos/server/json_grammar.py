"""GBNF for "any JSON object" (OpenAI's json_object mode, Ollama's format "json").

The grammar is llama.cpp's own grammars/json.gbnf (object at the root). Sampling under
it can only produce a JSON object; the model may still stop early at max_tokens.
"""

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
