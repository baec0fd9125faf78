"""Compatibility rules: each breaking change is found, with its path; safe changes are not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.datafiles import SCHEMAS
from worker.schemas.compat import Mode, compare


def obj(properties: dict[str, Any], required: list[str], closed: bool = True) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if closed:
        schema["additionalProperties"] = False
    return schema


def rules(old: Any, new: Any, mode: Mode = Mode.BACKWARD) -> set[tuple[str, str]]:
    return {(c.path, c.rule) for c in compare(old, new, mode)}


S = {"type": "string"}


def test_identical_and_widened_schemas_are_compatible() -> None:
    v1 = obj({"a": S, "e": {"enum": ["x"]}}, ["a"])
    assert rules(v1, v1, Mode.FULL) == set()
    wider = obj({"a": {"type": ["string", "null"]}, "e": {"enum": ["x", "y"]}}, [], closed=False)
    assert rules(v1, wider) == set()


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (obj({"a": S, "b": S}, ["a"]), obj({"a": S}, ["a"]), ("/properties/b", "property-removed")),
        (obj({"a": S}, []), obj({"a": {"type": "integer"}}, []), ("/properties/a/type", "retyped")),
        (
            obj({"a": {"type": ["string", "null"]}}, []),
            obj({"a": S}, []),
            ("/properties/a/type", "null-removed"),
        ),
        (
            obj({"a": {"enum": ["x", "y"]}}, []),
            obj({"a": {"enum": ["x"]}}, []),
            ("/properties/a/enum", "enum-narrowed"),
        ),
        (obj({"a": S}, []), obj({"a": S}, ["a"]), ("/properties/a", "newly-required")),
        (
            obj({"a": S}, [], closed=False),
            obj({"a": S}, []),
            ("/additionalProperties", "additional-properties-tightened"),
        ),
        (
            obj({"a": {"type": "string", "maxLength": 10}}, []),
            obj({"a": {"type": "string", "maxLength": 5}}, []),
            ("/properties/a/maxLength", "bound-tightened"),
        ),
        (
            obj({}, [], closed=False),
            obj({"n": {"type": "integer"}}, [], closed=False),
            ("/properties/n/type", "type-added"),
        ),
        (
            obj({"l": {"type": "array", "items": S}}, []),
            obj({"l": {"type": "array", "items": {"type": "integer"}}}, []),
            ("/properties/l/items/type", "retyped"),
        ),
        (
            {"$defs": {"c": {"enum": [1, 2]}}, "properties": {"c": {"$ref": "#/$defs/c"}}},
            {"$defs": {"c": {"enum": [1]}}, "properties": {"c": {"$ref": "#/$defs/c"}}},
            ("/properties/c/enum", "enum-narrowed"),
        ),
        ({"anyOf": [S]}, {"anyOf": [S, {"type": "null"}]}, ("/anyOf", "composition-changed")),
    ],
)
def test_breaking_changes_are_found_at_their_path(
    old: Any, new: Any, expected: tuple[str, str]
) -> None:
    assert expected in rules(old, new)


def test_forward_and_full_look_the_other_way() -> None:
    v1 = obj({"a": S}, ["a"])
    v2 = obj({"a": S, "b": S}, ["a"])
    assert rules(v1, v2, Mode.BACKWARD) == set()
    assert rules(v1, v2, Mode.FORWARD) == {("/properties/b", "property-removed")}
    assert {c.direction for c in compare(v2, v1, Mode.FULL)} == {Mode.BACKWARD}


def test_shipped_weather_v2_reads_v1_calls_but_not_the_reverse() -> None:
    v1 = json.loads((SCHEMAS / "weather/get_weather.v1.schema.json").read_text())
    v2 = json.loads((SCHEMAS / "weather/get_weather.v2.schema.json").read_text())
    assert rules(v1, v2) == set()
    assert rules(v1, v2, Mode.FORWARD) == {("/properties/days", "property-removed")}
