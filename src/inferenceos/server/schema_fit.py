"""Does a JSON value fit a JSON Schema? A small, lenient checker for tool arguments.

It decides whether a JSON object a model wrote outside its call markers is a call: the
arguments must fit the declared tool's `parameters`. The keywords that tell a call from
a look-alike are checked — `type`, `enum`, `const`, `properties`, `required`,
`additionalProperties`, `items`, `anyOf` / `oneOf` / `allOf`, local `$ref`s
(`#/$defs/...`, `#/definitions/...`) — and every other keyword (formats, bounds,
patterns) is ignored: a value is refused only for a reason the schema states in those
terms. No dependency: the runtime has no JSON Schema library, and this needs little.
"""

from __future__ import annotations

from typing import Any

_MAX_DEPTH = 64  # a schema nested (or $ref-cycled) deeper than this is not followed

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    # JSON has one number type: bool is not one, 1.0 is an integer
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def fits(schema: Any, value: Any) -> bool:
    """True when `value` satisfies `schema` as far as the keywords listed in the module
    docstring say. A missing schema, `{}` and `true` accept everything, `false` nothing."""
    return _fits(schema, value, schema, 0)


def _fits(schema: Any, value: Any, root: Any, depth: int) -> bool:
    if schema is None or schema is True:
        return True
    if schema is False:
        return False
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return True  # not a schema we can read: no reason to refuse
    ref = schema.get("$ref")
    if isinstance(ref, str) and not _fits(_resolve(ref, root), value, root, depth + 1):
        return False
    checks = (_type_ok, _enum_ok, _object_ok, _array_ok, _combinators_ok)
    return all(check(schema, value, root, depth) for check in checks)


def _resolve(ref: str, root: Any) -> Any:
    """The schema a local `#/...` reference points at; None (accept) when it is not
    local or does not resolve."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _type_ok(schema: dict[str, Any], value: Any, root: Any, depth: int) -> bool:
    t = schema.get("type")
    names = t if isinstance(t, list) else [t] if isinstance(t, str) else []
    known = [n for n in names if n in _TYPES]
    return not known or any(_TYPES[n](value) for n in known)


def _enum_ok(schema: dict[str, Any], value: Any, root: Any, depth: int) -> bool:
    if "const" in schema and not _same(schema["const"], value):
        return False
    enum = schema.get("enum")
    return not isinstance(enum, list) or any(_same(e, value) for e in enum)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _object_ok(schema: dict[str, Any], value: Any, root: Any, depth: int) -> bool:
    if not isinstance(value, dict):
        return True
    required = schema.get("required")
    if isinstance(required, list) and any(k not in value for k in required):
        return False
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        sub = props.get(key, extra)
        if not _fits(sub, item, root, depth + 1):
            return False
    return True


def _array_ok(schema: dict[str, Any], value: Any, root: Any, depth: int) -> bool:
    items = schema.get("items")
    if not isinstance(value, list) or not isinstance(items, (dict, bool)):
        return True
    return all(_fits(items, v, root, depth + 1) for v in value)


def _combinators_ok(schema: dict[str, Any], value: Any, root: Any, depth: int) -> bool:
    for key in ("anyOf", "oneOf"):  # oneOf read as anyOf: lenient, as the module says
        options = schema.get(key)
        if isinstance(options, list) and options and not any(
                _fits(o, value, root, depth + 1) for o in options):
            return False
    parts = schema.get("allOf")
    return not isinstance(parts, list) or all(_fits(p, value, root, depth + 1) for p in parts)
