"""References: every `$ref` resolves inside its document, and loops that never descend are refused.

Generated loop shapes (a chain of `$defs` whose links apply to the same instance location, or
descend into it) are refused exactly when no link descends; the ones that load must judge like
python-jsonschema, the reference implementation (an oracle here, not a dependency of callgate).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.contracts import load_registry
from worker.errors import SchemaLoadError
from worker.schemas.contract import Contract

ENGINES = ["fastjsonschema", "jsonschema-rs"]
FIXED = settings(derandomize=True, deadline=None, print_blob=True)
DRAFT7 = "http://json-schema.org/draft-07/schema#"


def load(directory: Path, schema: Any, engine: str) -> Contract:
    (directory / "d").mkdir(parents=True, exist_ok=True)
    (directory / "d" / "t.v1.schema.json").write_text(json.dumps(schema))
    found = load_registry(directory, engine=engine).resolve("t", None)
    assert isinstance(found, Contract)
    return found


# --- loops that never descend --------------------------------------------------------------------

LOOPS = [
    ({"$ref": "#"}, "/$ref"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}, "/$defs/"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "type": "object"}, "/$defs/a/$ref"),
    ({"allOf": [{"$ref": "#"}]}, "/allOf/0/$ref"),
    ({"anyOf": [{"type": "string"}, {"$ref": "#"}]}, "/anyOf/1/$ref"),
    ({"oneOf": [{"$ref": "#"}]}, "/oneOf/0/$ref"),
    ({"not": {"$ref": "#"}}, "/not/$ref"),
    ({"if": {"$ref": "#"}}, "/if/$ref"),
    ({"if": {"type": "object"}, "then": {"$ref": "#"}}, "/then/$ref"),
    ({"if": {"type": "object"}, "else": {"$ref": "#"}}, "/else/$ref"),
    ({"dependentSchemas": {"k": {"$ref": "#"}}}, "/dependentSchemas/k/$ref"),
    ({"$defs": {"x": {"$anchor": "x", "allOf": [{"$ref": "#x"}]}}}, "/$defs/x/allOf/0/$ref"),
    (
        {
            "$id": "https://example.com/root.json",
            "$defs": {"y": {"$ref": "root.json"}},
            "$ref": "#/$defs/y",
        },
        "/$ref",
    ),
    ({"$dynamicAnchor": "n", "$dynamicRef": "#n"}, "/$dynamicRef"),
    (
        {"$schema": DRAFT7, "definitions": {"a": {"allOf": [{"$ref": "#/definitions/a"}]}}},
        "/definitions/a/allOf/0/$ref",
    ),
    ({"$schema": DRAFT7, "dependencies": {"k": {"$ref": "#"}}}, "/dependencies/k/$ref"),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("schema", "where"), LOOPS)
def test_a_loop_that_never_descends_is_refused(
    tmp_path: Path, engine: str, schema: dict[str, Any], where: str
) -> None:
    with pytest.raises(SchemaLoadError) as caught:
        load(tmp_path, schema, engine)
    message = str(caught.value)
    assert caught.value.file is not None
    assert caught.value.file.endswith("t.v1.schema.json")
    if engine == "fastjsonschema" and any(k in json.dumps(schema) for k in ("$dynamic", "$anchor")):
        assert "is not enforced by engine 'fastjsonschema'" in message  # refused first
        return
    assert "without descending into the instance" in message
    assert where in message


def test_the_message_names_the_reference_and_the_whole_loop(tmp_path: Path) -> None:
    schema = {
        "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}}
    }
    with pytest.raises(SchemaLoadError) as caught:
        load(tmp_path, schema, "jsonschema-rs")
    message = str(caught.value)
    assert "/$defs/a/anyOf/0/$ref" in message
    assert "/$defs/b/not/$ref" in message


# --- unresolvable references -------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"$ref": "#/$defs/missing"}, "/$ref"),
        ({"properties": {"a": {"$ref": "#/properties"}}}, "/properties/a/$ref"),
        ({"items": {"$ref": "#nowhere"}}, "/items/$ref"),
        ({"$defs": {"l": {"enum": [{"type": "string"}]}}, "$ref": "#/$defs/l/enum/0"}, "/$ref"),
        ({"allOf": [{}], "$ref": "#/allOf/01"}, "/$ref"),
        ({"allOf": [{}], "$ref": "#/allOf/" + "9" * 5000}, "/$ref"),
    ],
)
def test_a_reference_that_names_nothing_is_refused(
    tmp_path: Path, engine: str, schema: dict[str, Any], where: str
) -> None:
    with pytest.raises(SchemaLoadError, match="names no schema in this document") as caught:
        load(tmp_path, schema, engine)
    assert f"at {where} " in str(caught.value)


@pytest.mark.parametrize("engine", ENGINES)
def test_escaped_and_percent_encoded_pointers_resolve(tmp_path: Path, engine: str) -> None:
    schema = {
        "$defs": {"a/b": {"type": "integer"}, "c~d": {"minimum": 0}, "e%f": {"maximum": 9}},
        "properties": {
            "x": {"$ref": "#/$defs/a~1b"},
            "y": {"$ref": "#/$defs/c~0d"},
            "z": {"$ref": "#/$defs/e%25f"},
        },
    }
    check = load(tmp_path, schema, engine).check
    assert check({"x": 1, "y": 1, "z": 1}) == ()
    assert [v.path for v in check({"x": "1", "y": -1, "z": 10})] == ["/x", "/y", "/z"]


# --- recursion that descends is judged right -----------------------------------------------------

TREE = {
    "type": "object",
    "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#"}},
    },
    "required": ["value"],
    "additionalProperties": False,
}


def tree(depth: int, bad_at: int | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"value": "x" if depth == bad_at else depth}
    if depth < 20:
        node["children"] = [tree(depth + 1, bad_at)]
    return node


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tree_schema_loads_and_judges_every_level(tmp_path: Path, engine: str) -> None:
    check = load(tmp_path, TREE, engine).check
    assert check(tree(0)) == ()
    violations = check(tree(0, bad_at=7))
    assert [(v.path, v.keyword) for v in violations] == [("/children/0" * 7 + "/value", "type")]
    assert check({"value": 1, "children": [{"children": []}]})[0].keyword == "required"


_SAME_PLACE: list[Callable[[Any], dict[str, Any]]] = [
    lambda x: x,
    lambda x: {"allOf": [x]},
    lambda x: {"anyOf": [{"type": "string"}, x]},
    lambda x: {"oneOf": [x]},
    lambda x: {"not": {"not": x}},
    lambda x: {"if": {"type": "object"}, "then": x},
    lambda x: {"if": {"type": "object"}, "else": x},
    lambda x: {"dependentSchemas": {"k": x}},
]
_DESCENDING: list[Callable[[Any], dict[str, Any]]] = [
    lambda x: {"properties": {"p": x}},
    lambda x: {"items": x},
    lambda x: {"additionalProperties": x},
    lambda x: {"patternProperties": {"^q": x}},
    lambda x: {"contains": x},
    lambda x: {"propertyNames": x},
]
_EXTRAS = st.sampled_from(
    [{}, {"maxProperties": 2}, {"minItems": 1}, {"type": ["object", "array"]}, {"maxLength": 1}]
)
_LINKS = st.lists(
    st.tuples(st.booleans(), st.integers(0, 7), st.integers(0, 5), _EXTRAS), min_size=1, max_size=4
)
_INSTANCES = st.recursive(
    st.none() | st.integers(-2, 2) | st.sampled_from(["", "q", "pq"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["p", "q", "k", "qq"]), inner, max_size=3)
    ),
    max_leaves=8,
)


def _chain(links: list[tuple[bool, int, int, dict[str, Any]]]) -> tuple[dict[str, Any], bool]:
    """A chain of $defs d0 -> d1 -> ... -> d0; each link same-place or descending."""
    defs: dict[str, Any] = {}
    for i, (descends, same, down, extra) in enumerate(links):
        ref = {"$ref": f"#/$defs/d{(i + 1) % len(links)}"}
        wrap = _DESCENDING[down] if descends else _SAME_PLACE[same]
        defs[f"d{i}"] = {**wrap(ref), **extra} if extra else wrap(ref)
    descends_somewhere = any(descends for descends, *_ in links)
    return {"$defs": defs, "$ref": "#/$defs/d0"}, descends_somewhere


@settings(FIXED, max_examples=120)
@given(links=_LINKS, instances=st.lists(_INSTANCES, min_size=1, max_size=4))
def test_generated_loops_are_refused_exactly_when_they_never_descend(
    tmp_path_factory: pytest.TempPathFactory,
    links: list[tuple[bool, int, int, dict[str, Any]]],
    instances: list[Any],
) -> None:
    schema, descends = _chain(links)
    for engine in ENGINES:
        directory = tmp_path_factory.mktemp(engine)
        if not descends:
            with pytest.raises(SchemaLoadError, match="without descending into the instance"):
                load(directory, schema, engine)
            continue
        check = load(directory, schema, engine).check
        oracle = jsonschema.Draft202012Validator(schema)
        for instance in instances:
            assert (check(instance) == ()) == oracle.is_valid(instance), (engine, instance)
