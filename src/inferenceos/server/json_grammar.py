"""Output formats → GBNF: the one place a request's output constraint becomes a grammar.

Every dialect's format field comes here, translated into a kind and a schema:
OpenAI's `response_format` (and llama.cpp's top-level `json_schema`), the Responses
API's `text.format`, Ollama's `format` ("json" or a schema), Anthropic's
`output_config.format` and llama-server's `json_schema`.

"Any JSON object" is llama.cpp's own grammars/json.gbnf (object at the root); a schema
goes through the engine's JSON-Schema converter. Sampling under either can only produce
what it allows; the model may still stop early at max_tokens.

Beyond JSON: a client's GBNF (`grammar`, llama.cpp's; vLLM's `guided_grammar` and
`structured_outputs.grammar`) is checked by server/gbnf.py before it reaches
llama.cpp; a regex (`guided_regex`, `structured_outputs.regex`) and a choice
(`guided_choice`, `structured_outputs.choice`) become GBNF in server/regex_gbnf.py.
Each refusal is a 400 naming its field.
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


def gbnf_grammar(text: object, field: str = "grammar") -> str:
    """A client's GBNF grammar, checked (server/gbnf.py) before it reaches llama.cpp:
    APIError 400 naming `field` and what is wrong."""
    from inferenceos.server.errors import APIError
    from inferenceos.server.gbnf import GrammarError, check_gbnf

    if not isinstance(text, str):
        raise APIError(400, f"{field} must be GBNF text", "invalid_grammar")
    try:
        return check_gbnf(text)
    except GrammarError as exc:
        raise APIError(400, f"{field}: {exc}", "invalid_grammar") from None


def regex_grammar(pattern: object, field: str = "regex") -> str:
    """The grammar of a regex constraint (the output matches it whole); APIError 400
    for a regex outside the served subset (server/regex_gbnf.py)."""
    from inferenceos.server.errors import APIError
    from inferenceos.server.gbnf import GrammarError
    from inferenceos.server.regex_gbnf import regex_gbnf

    try:
        return regex_gbnf(pattern)  # type: ignore[arg-type]
    except GrammarError as exc:
        raise APIError(400, f"{field}: {exc}", "invalid_grammar") from None


def choice_grammar(choices: object, field: str = "choice") -> str:
    """The grammar of a choice constraint: exactly one of the given strings."""
    from inferenceos.server.errors import APIError
    from inferenceos.server.gbnf import GrammarError
    from inferenceos.server.regex_gbnf import choice_gbnf

    try:
        return choice_gbnf(choices)
    except GrammarError as exc:
        raise APIError(400, f"{field}: {exc}", "invalid_grammar") from None


def _json_spec(value: object, field: str) -> str:
    """vLLM's `json`: a schema object, or its JSON text."""
    import json

    from inferenceos.server.errors import APIError

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise APIError(400, f"{field} must be a JSON schema", "invalid_grammar") from None
    return grammar_for_schema(value)


STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def structured_grammar(spec: object, field: str = "structured_outputs") -> str | None:
    """vLLM's `structured_outputs` object → a grammar: exactly one of `json` (a
    schema), `regex`, `choice` (a list of strings), `grammar` (GBNF) or `json_object`
    (true: any JSON object); its other keys (backend options) are ignored. None for
    an empty object."""
    from inferenceos.server.errors import APIError

    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise APIError(400, f"{field} must be an object", "invalid_grammar")
    if spec.get("structural_tag") is not None:
        raise APIError(400, f"{field}.structural_tag is not supported", "unsupported_parameter")
    given = [k for k in STRUCTURED_KINDS if spec.get(k) not in (None, False)]
    if len(given) > 1:
        raise APIError(400, f"{field}: use one of {', '.join(given)}, not several",
                       "invalid_request")
    if not given:
        return None
    return kind_grammar(given[0], spec[given[0]], f"{field}.{given[0]}")


def kind_grammar(kind: str, value: object, field: str) -> str:
    """The grammar of one constraint of vLLM's kinds (STRUCTURED_KINDS) and its value:
    `json` a schema (an object or its JSON text), `regex`, `choice` (a list of strings),
    `grammar` (GBNF), `json_object` any JSON object (its value is not read). APIError
    400 naming `field` for a value that cannot be served; ValueError for another kind."""
    if kind == "json":
        return _json_spec(value, field)
    if kind == "regex":
        return regex_grammar(value, field)
    if kind == "choice":
        return choice_grammar(value, field)
    if kind == "grammar":
        return gbnf_grammar(value, field)
    if kind == "json_object":
        return JSON_OBJECT_GBNF
    raise ValueError(f"not a constraint kind: {kind!r}")
