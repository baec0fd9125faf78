"""Compatibility rules: each breaking change is found, with its path; safe changes are not."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS
from tests.support.contracts import LIMITS
from worker.errors import SchemaLoadError
from worker.schemas.compat import Mode, compare
from worker.schemas.engines import compile_check
from worker.schemas.grammars import input_check
from worker.schemas.registry import contract_meta
from worker.schemas.vetting import JSONSCHEMA_RS


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


# --- breaking changes compat once called compatible ------------------------------------------

DRAFT7 = "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # true is not 1: JSON values are compared as JSON, not as Python's ==
        ({"enum": [True, False]}, {"enum": [1, 0]}, ("/enum", "enum-narrowed")),
        ({"const": True}, {"const": 1}, ("/const", "const-changed")),
        (
            {"allOf": [{"const": True}]},
            {"allOf": [{"const": 1}]},
            ("/allOf/0/const", "const-changed"),
        ),
        # a draft-7 tuple: each position is compared
        (
            {"$schema": DRAFT7, "items": [S, S]},
            {"$schema": DRAFT7, "items": [S, {"type": "integer"}]},
            ("/items/1/type", "retyped"),
        ),
        (
            {"prefixItems": [S], "items": False},
            {"prefixItems": [S], "items": False, "minItems": 0, "maxItems": 0},
            ("/maxItems", "bound-tightened"),
        ),
        # a new property that a patternProperties entry used to admit
        (
            {"patternProperties": {"^a": S}, "additionalProperties": False},
            {
                "properties": {"ab": {"type": "integer"}},
                "patternProperties": {"^a": S},
                "additionalProperties": False,
            },
            ("/properties/ab/type", "retyped"),
        ),
        # a patternProperties entry removed from a closed object
        (
            {"patternProperties": {"^a": S}, "additionalProperties": False},
            {"additionalProperties": False},
            ("/patternProperties", "composition-changed"),
        ),
        # draft 7 asserts contentMediaType; 2020-12 does not
        (
            {"$schema": DRAFT7, "type": "string"},
            {"$schema": DRAFT7, "type": "string", "contentMediaType": "application/json"},
            ("/contentMediaType", "assertion-changed"),
        ),
        # a $ref beside its siblings: both apply (2020-12), never one over the other
        (
            {"$defs": {"s": S}, "properties": {"c": {"$ref": "#/$defs/s"}}},
            {"$defs": {"s": S}, "properties": {"c": {"$ref": "#/$defs/s", "maxLength": 3}}},
            ("/properties/c/maxLength", "bound-tightened"),
        ),
        (
            {
                "$schema": DRAFT7,
                "definitions": {"s": S},
                "items": {"$ref": "#/definitions/s", "maxLength": 1},
            },
            {"$schema": DRAFT7, "items": {"type": "string", "maxLength": 1}},
            ("/items/maxLength", "bound-tightened"),
        ),
        # minContains left out means 1
        (
            {"contains": S, "minContains": 0},
            {"contains": S},
            ("/minContains", "assertion-changed"),
        ),
        # a recursive schema: the loop is compared as written, with its $defs
        (
            {"$defs": {"n": {"properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
            {
                "$defs": {
                    "n": {"properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}
                },
                "$ref": "#/$defs/n",
            },
            ("/allOf/0/properties/next", "newly-required"),
        ),
    ],
)
def test_once_missed_breaking_changes_are_found(
    old: Any, new: Any, expected: tuple[str, str]
) -> None:
    assert expected in rules(old, new)


def test_safe_changes_stay_compatible() -> None:
    assert rules({"multipleOf": 6}, {"multipleOf": 3}) == set()
    assert rules({"multipleOf": 0.3}, {"multipleOf": 0.1}) == set()
    assert ("/multipleOf", "bound-tightened") in rules({"multipleOf": 0.1}, {"multipleOf": 0.3})
    assert rules({"enum": [1, "a"]}, {"enum": [1.0, "a", True]}) == set()
    assert rules({"allOf": [S, {"maxLength": 3}]}, {"allOf": [{"maxLength": 5}]}) == set()
    assert rules({"description": "x", "anyOf": [S]}, {"title": "y", "anyOf": [S]}) == set()
    assert rules({"$schema": DRAFT7, "items": [S]}, {"prefixItems": [S]}) == set()
    assert rules({"contentMediaType": "application/json"}, {"contentMediaType": "text/x"}) == set()


# --- a contract's x-callgate decides which calls reach its schema -----------------------------

GRAMMARS: list[Any] = [
    {"type": "text"},
    {"type": "grammar", "syntax": "regex", "definition": "[a-z]+"},
    {"type": "grammar", "syntax": "regex", "definition": "a+"},
]
PRINCIPALS = ["ann", "bob", "cy"]
KEY_ARGUMENTS = ["k", "key"]


@st.composite
def annotations(draw: st.DrawFn) -> dict[str, Any]:
    """An `x-callgate` annotation: its call kind, grammar, principals and idempotency."""
    kind = draw(st.sampled_from(["function_call", "custom_tool_call"]))
    out: dict[str, Any] = {}
    if kind != "function_call" or draw(st.booleans()):
        out["call_kind"] = kind
    if kind == "custom_tool_call" and draw(st.booleans()):
        out["format"] = draw(st.sampled_from(GRAMMARS))
    if draw(st.booleans()):
        out["allowed_principals"] = draw(st.lists(st.sampled_from(PRINCIPALS), unique=True))
    if draw(st.booleans()):
        out["side_effects"] = draw(st.booleans())
    if draw(st.booleans()):
        out["idempotency"] = draw(st.sampled_from(["required", "optional", "none"]))
    if draw(st.booleans()):
        out["idempotency_key_argument"] = draw(st.sampled_from(KEY_ARGUMENTS))
    return out


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, str, str | None, str | None, dict[str, str]]:
    """A call as the contract's annotation sees it: its kind, its text (a custom tool's input),
    its principal, its envelope's idempotency key and the key-like arguments it carries."""
    return (
        draw(st.sampled_from(["function_call", "custom_tool_call"])),
        draw(st.sampled_from(["", "a", "aa", "ab", "AB", "a b"])),
        draw(st.none() | st.sampled_from(PRINCIPALS)),
        draw(st.none() | st.sampled_from(["k1", "k2"])),
        draw(st.dictionaries(st.sampled_from(KEY_ARGUMENTS), st.sampled_from(["k1", "k2"]))),
    )


def passes(annotation: dict[str, Any], call: tuple[Any, ...]) -> bool:
    """Whether a call passes the annotation, as the README states each part (Contract kinds,
    Authorization, Idempotency), the annotation read as the registry reads it."""
    meta = contract_meta({"x-callgate": annotation}, "C")
    grammar = input_check(annotation.get("format"), "C")
    kind, text, principal, envelope_key, arguments = call
    argument_key = arguments.get(meta.idempotency_key_argument or "")
    if kind != meta.call_kind or (grammar is not None and grammar(text) is not None):
        return False
    if meta.allowed_principals is not None and principal not in meta.allowed_principals:
        return False
    if None not in (argument_key, envelope_key) and argument_key != envelope_key:
        return False  # idempotency_key_mismatch
    return not meta.needs_key or (argument_key or envelope_key) is not None


@settings(derandomize=True, deadline=None, max_examples=300, print_blob=True)
@given(annotations(), annotations(), st.lists(calls(), min_size=20, max_size=20))
def test_every_compatible_verdict_holds_for_generated_calls(
    old: dict[str, Any], new: dict[str, Any], sample: list[tuple[Any, ...]]
) -> None:
    """`compatible` (backward) means every call the old contract let through, the new one lets
    through: its x-callgate as much as its schema."""
    schema = {"type": "object"}
    changes = compare({**schema, "x-callgate": old}, {**schema, "x-callgate": new})
    event("compatible" if not changes else "breaking")
    if changes:
        return
    for call in sample:
        if passes(old, call):
            event("a call OLD lets through")
            assert passes(new, call), (old, new, call)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({}, {"call_kind": "custom_tool_call"}, ("/x-callgate/call_kind", "call-kind-changed")),
        (
            {"call_kind": "custom_tool_call"},
            {"call_kind": "custom_tool_call", "format": GRAMMARS[1]},
            ("/x-callgate/format", "grammar-changed"),
        ),
        (
            {},
            {"allowed_principals": ["ann"]},
            ("/x-callgate/allowed_principals", "principals-narrowed"),
        ),
        ({}, {"side_effects": True}, ("/x-callgate/idempotency", "key-required")),
    ],
)
def test_a_contract_change_that_refuses_calls_is_breaking(
    old: dict[str, Any], new: dict[str, Any], expected: tuple[str, str]
) -> None:
    """Each part of x-callgate that refuses calls is breaking where it is added, and only a
    changed call kind breaks the other way too."""
    assert expected in rules({"x-callgate": old}, {"x-callgate": new})
    widened = rules({"x-callgate": new}, {"x-callgate": old})
    assert (expected in widened) is (expected[1] == "call-kind-changed")


# --- every "compatible" verdict, checked on generated instances ------------------------------

NAMES = ["a", "ab", "b"]
VALUES: list[Any] = [None, True, False, 0, 1, 2, -1, 0.5, 1.5, "", "a", "ab", "b", "e30=", "{}"]
_SCALAR_KEYWORDS = st.sampled_from(
    [
        "type",
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "uniqueItems",
        "required",
        "contentMediaType",
        "contentEncoding",
    ]
)
_TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]


@st.composite
def keyword_value(draw: st.DrawFn, keyword: str) -> Any:
    match keyword:
        case "type":
            types = draw(st.lists(st.sampled_from(_TYPES), min_size=1, max_size=3, unique=True))
            return types[0] if len(types) == 1 else types
        case "enum":
            return draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=4, unique_by=repr))
        case "const":
            return draw(st.sampled_from(VALUES))
        case "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum":
            return draw(st.sampled_from([-1, 0, 0.5, 1, 2]))
        case "multipleOf":
            return draw(st.sampled_from([0.5, 1, 2, 3, 6]))
        case "minLength" | "maxLength" | "minItems" | "maxItems":
            return draw(st.integers(0, 2))
        case "pattern":
            return draw(st.sampled_from(["^a", "b$", "a"]))
        case "uniqueItems":
            return draw(st.booleans())
        case "required":
            return draw(st.lists(st.sampled_from(NAMES), max_size=2, unique=True))
        case "contentMediaType":
            return "application/json"
        case "contentEncoding":
            return "base64"
    raise AssertionError(keyword)


def schemas(draft7: bool, depth: int = 2) -> st.SearchStrategy[Any]:
    sub = schemas(draft7, depth - 1) if depth else st.sampled_from([True, False, {}])

    @st.composite
    def node(draw: st.DrawFn) -> Any:
        out: dict[str, Any] = {}
        for keyword in draw(st.lists(_SCALAR_KEYWORDS, max_size=3, unique=True)):
            if keyword.startswith("content") and not draft7:
                continue
            out[keyword] = draw(keyword_value(keyword))
        if depth and draw(st.booleans()):
            structure = draw(st.sampled_from(["object", "array", "allOf", "anyOf", "not"]))
            if structure == "object":
                out["properties"] = draw(st.dictionaries(st.sampled_from(NAMES), sub, max_size=2))
                if draw(st.booleans()):
                    out["patternProperties"] = {"^a": draw(sub)}
                out["additionalProperties"] = draw(st.sampled_from([True, False]) | sub)
            elif structure == "array":
                if draw(st.booleans()):
                    out["items" if draft7 else "prefixItems"] = draw(st.lists(sub, max_size=2))
                    out["additionalItems" if draft7 else "items"] = draw(sub)
                else:
                    out["items"] = draw(sub)
            elif structure == "not":
                out["not"] = draw(sub)
            else:
                out[structure] = draw(st.lists(sub, min_size=1, max_size=2))
        if draft7:
            out["$schema"] = DRAFT7
        return out

    return node()


@st.composite
def mutated(draw: st.DrawFn, schema: Any, draft7: bool) -> Any:
    """`schema` with one change somewhere: a keyword removed, added or given another value, or
    a subschema replaced."""
    if not isinstance(schema, dict) or draw(st.integers(0, 4)) == 0:
        return draw(schemas(draft7, 1))
    out = dict(schema)
    subschemas = [
        k
        for k in ("not", "additionalProperties", "additionalItems")
        if isinstance(out.get(k), dict)
    ]
    subschemas += [k for k in ("items",) if isinstance(out.get(k), dict)]
    action = draw(st.sampled_from(["remove", "add", "descend"]))
    if action == "descend" and subschemas:
        key = draw(st.sampled_from(subschemas))
        out[key] = draw(mutated(out[key], draft7))
    elif action == "descend" and isinstance(out.get("properties"), dict) and out["properties"]:
        name = draw(st.sampled_from(sorted(out["properties"])))
        out["properties"] = {
            **out["properties"],
            name: draw(mutated(out["properties"][name], draft7)),
        }
    elif action == "remove" and [k for k in out if k != "$schema"]:
        del out[draw(st.sampled_from(sorted(k for k in out if k != "$schema")))]
    else:
        keyword = draw(_SCALAR_KEYWORDS.filter(lambda k: draft7 or not k.startswith("content")))
        out[keyword] = draw(keyword_value(keyword))
    return out


@st.composite
def instances(draw: st.DrawFn, depth: int = 2) -> Any:
    if not depth or draw(st.integers(0, 2)) == 0:
        return draw(st.sampled_from(VALUES))
    inner = instances(depth - 1)
    if draw(st.booleans()):
        return draw(st.lists(inner, max_size=3))
    return draw(st.dictionaries(st.sampled_from([*NAMES, "c"]), inner, max_size=3))


@st.composite
def schema_pairs(draw: st.DrawFn) -> tuple[Any, Any]:
    draft7 = draw(st.booleans())
    old = draw(schemas(draft7))
    new = old
    for _ in range(draw(st.integers(1, 3))):
        new = draw(mutated(new, draft7))
    return old, new


@settings(derandomize=True, deadline=None, max_examples=300, print_blob=True)
@given(schema_pairs(), st.lists(instances(), min_size=10, max_size=10))
def test_every_compatible_verdict_holds_for_generated_instances(
    pair: tuple[Any, Any], sample: list[Any]
) -> None:
    old, new = pair
    try:
        changes = compare(old, new, Mode.BACKWARD)
        old_check, new_check = (
            compile_check(s, file=n, engine=JSONSCHEMA_RS, limits=LIMITS)
            for s, n in ((old, "OLD"), (new, "NEW"))
        )
    except SchemaLoadError:
        return  # a pair that does not load is not compared
    event("compatible" if not changes else "breaking")
    if changes:
        return
    for instance in sample:
        if not old_check(instance):
            event("an instance OLD accepts")
            assert new_check(instance) == (), (old, new, instance)


def union(*branches: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": list(branches)}


def variant(kind: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return obj({"kind": {"const": kind}, **properties}, ["kind", *required], closed=False)


def test_a_discriminated_union_is_compared_branch_by_branch() -> None:
    """A `oneOf` whose branches each require one same property with a const of their own is
    matched by that value: a change inside a branch is judged as that branch's change, the
    order of the branches does not matter, and a branch gone is a variant removed."""
    a = variant("a", {"x": S}, ["x"])
    b = variant("b", {"y": {"type": "integer"}}, ["y"])
    v1 = union(a, b)
    assert rules(v1, union(b, a), Mode.FULL) == set()
    grown = union(variant("a", {"x": S, "z": S}, ["x"]), b)
    assert rules(v1, grown, Mode.FORWARD) == set()
    retyped = union(a, variant("b", {"y": S}, ["y"]))
    assert rules(v1, retyped) == {("/oneOf/1/properties/y/type", "retyped")}
    assert rules(v1, union(b)) == {("/oneOf/0", "variant-removed")}
    assert rules(v1, union(a, b, variant("c", {}, [])), Mode.FORWARD) == {
        ("/oneOf/2", "variant-removed")
    }


@pytest.mark.parametrize(
    "branches",
    [
        # the same value twice, no property every branch has as a const, a non-object branch
        [{"properties": {"kind": {"const": "a"}}, "required": ["kind"]}] * 2,
        [
            {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
            {"properties": {"kind": {"type": "string"}}, "required": ["kind"]},
        ],
        [{"properties": {"kind": {"const": "a"}}, "required": []}, {"type": "string"}],
    ],
)
def test_a_union_that_is_not_discriminated_is_not_analysed(branches: list[Any]) -> None:
    changed = [*branches, {"type": "null"}]
    assert rules({"oneOf": branches}, {"oneOf": changed}, Mode.FORWARD) == {
        ("/oneOf", "composition-changed")
    }
