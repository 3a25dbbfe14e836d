"""The lenient JSON Schema check that decides whether untagged JSON is a tool call."""

from __future__ import annotations

from typing import Any

import pytest

from inferenceos.server.schema_fit import fits

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["city"], "additionalProperties": False}


@pytest.mark.parametrize("value, ok", [
    ({"city": "Berlin"}, True),
    ({"city": "Berlin", "unit": "celsius", "days": 3, "tags": ["a"]}, True),
    ({"city": "Berlin", "days": 3.0}, True),  # JSON: 3.0 is an integer
    ({}, False),  # required
    ({"city": 3}, False),
    ({"city": "Berlin", "unit": "kelvin"}, False),
    ({"city": "Berlin", "days": True}, False),  # a bool is no number
    ({"city": "Berlin", "days": 2.5}, False),
    ({"city": "Berlin", "tags": [1]}, False),
    ({"city": "Berlin", "wind": 1}, False),  # additionalProperties false
    ([], False),
])
def test_object_schema(value: Any, ok: bool) -> None:
    assert fits(WEATHER, value) is ok


def test_missing_empty_and_boolean_schemas() -> None:
    assert fits(None, {"x": 1}) and fits({}, {"x": 1}) and fits(True, 1)
    assert not fits(False, 1)
    assert fits({"type": "object"}, {"anything": [1, 2]})


def test_refs_combinators_and_unknown_keywords() -> None:
    schema = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
              "$defs": {"P": {"anyOf": [{"type": "integer"}, {"const": "none"}]}}}
    assert fits(schema, {"p": 3}) and fits(schema, {"p": "none"})
    assert not fits(schema, {"p": "some"})
    assert fits({"$ref": "#/$defs/missing"}, 1)  # unresolvable: no reason to refuse
    assert not fits({"allOf": [{"type": "string"}, {"enum": ["a"]}]}, "b")
    assert fits({"type": "string", "format": "email", "minLength": 99}, "x")  # ignored
    assert fits({"type": ["string", "null"]}, None) and not fits({"type": ["string"]}, 1)
    assert not fits({"enum": [1]}, True) and fits({"const": True}, True)


def test_a_cyclic_ref_ends() -> None:
    schema = {"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}
    assert fits(schema, 1)
