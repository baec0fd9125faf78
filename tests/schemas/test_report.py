"""Violations are bounded: in number (`max_violations`, never more computed), in bytes, in time.

The oracle for which violations are right is jsonschema-rs asked for every error of an instance
small enough to ask (`iter_errors` builds all of them before it returns): callgate's bounded
violations must be among them, and as many as the limit allows.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS
from worker.compose import build_registry, violation_limits
from worker.errors import SchemaLoadError
from worker.model import Violation
from worker.schemas.contract import CUT, CompiledCheck, Contract, ViolationLimits
from worker.schemas.drafts import Draft, pointer
from worker.schemas.engines import compile_check, rust_patterns
from worker.schemas.report import bounded, rs_findings, rs_validator
from worker.settings import LimitSettings, SchemaSettings, Settings

ENGINES = ["fastjsonschema", "jsonschema-rs"]
FIXED = settings(derandomize=True, deadline=None, print_blob=True)
LIMITS = ViolationLimits(max_violations=32, max_path_bytes=512, max_message_bytes=512)

MAP_OF_OBJECTS = {
    "type": "object",
    "additionalProperties": {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["a", "b", "c"],
        "additionalProperties": False,
    },
}


def compiled(schema: Any, engine: str, limits: ViolationLimits = LIMITS) -> CompiledCheck:
    return compile_check(schema, file="t.v1.schema.json", engine=engine, limits=limits)


def assert_bounded(violations: tuple[Violation, ...], limits: ViolationLimits) -> None:
    assert len(violations) <= limits.max_violations
    for violation in violations:
        assert len(violation.path.encode()) <= limits.max_path_bytes, violation
        assert len(violation.message.encode()) <= limits.max_message_bytes, violation


def every_violation(schema: Any) -> Callable[[Any], set[tuple[str, str]]]:
    """The oracle: (path, keyword) of every error jsonschema-rs reports, computed eagerly."""
    originals: dict[str, str] = {}
    validator = rs_validator(
        rust_patterns(schema, Draft.DRAFT2020_12, originals), Draft.DRAFT2020_12
    )

    def every(instance: Any) -> set[tuple[str, str]]:
        found = set()
        for error in validator.iter_errors(instance):
            for path, keyword, _ in rs_findings(error, [], originals, 1_000_000):
                found.add((pointer(path), keyword))
        return found

    return every


# --- the measured cases ------------------------------------------------------------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_200_kb_map_of_objects_stays_bounded(engine: str) -> None:
    check = compiled(MAP_OF_OBJECTS, engine)
    instance = {f"k{i}": {"a": 1, "b": "x", "d": 0} for i in range(6700)}  # ~200 KB, 26,800 wrong
    assert len(json.dumps(instance)) > 200_000
    for _ in range(20):  # each call in milliseconds: 20 fit the timeout many times over
        violations = check(instance)
        assert len(violations) == LIMITS.max_violations
        assert_bounded(violations, LIMITS)
    assert set(violations[:4]) == {
        Violation("/k0/a", "type", "must be of type string"),
        Violation("/k0/b", "type", "must be of type integer"),
        Violation("/k0/c", "required", "is a required property 'c'"),
        Violation("/k0/d", "additionalProperties", "is not an allowed property"),
    }


@pytest.mark.timeout(20)
@pytest.mark.parametrize("engine", ENGINES)
def test_120_000_violations_are_cut_before_they_are_computed(engine: str) -> None:
    check = compiled({"type": "object", "additionalProperties": {"type": "string"}}, engine)
    instance = {f"k{i}": i for i in range(120_000)}
    for _ in range(10):
        violations = check(instance)
        assert [v.path for v in violations] == [f"/k{i}" for i in range(32)]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("engine", ENGINES)
def test_many_extra_properties_and_unevaluated_names_are_cut(engine: str) -> None:
    names = {f"extra{i}": i for i in range(100_000)}
    check = compiled({"properties": {"a": {}}, "additionalProperties": False}, engine)
    assert len(check(names)) == 32
    if engine == "jsonschema-rs":
        check = compiled({"properties": {"a": {}}, "unevaluatedProperties": False}, engine)
        violations = check(names)
        assert len(violations) == 32
        assert {v.keyword for v in violations} == {"unevaluatedProperties"}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_failing_any_of_over_many_errors_is_one_violation(engine: str) -> None:
    """jsonschema-rs's first error of a failed anyOf carries every error of every branch; the
    reporter asks each branch `is_valid` instead."""
    schema = {
        "anyOf": [
            {"additionalProperties": {"type": "string"}},
            {"additionalProperties": {"type": "boolean"}},
        ]
    }
    check = compiled(schema, engine)
    for _ in range(10):
        assert check({f"k{i}": i for i in range(60_000)}) == (
            Violation("", "anyOf", "must match at least one of the schemas in 'anyOf'"),
        )


# --- bytes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_long_key_is_cut_with_a_marker(engine: str) -> None:
    limits = ViolationLimits(max_violations=4, max_path_bytes=64, max_message_bytes=16)
    schema = {
        "additionalProperties": {
            "properties": {"a": {"type": "string"}},
            "additionalProperties": False,
        }
    }
    check = compiled(schema, engine, limits)
    long_key = "é" * 10_000
    violations = check({"ok": {"a": "s"}, long_key: {"a": 1}})
    assert violations == (Violation(CUT, "type", "must be of ty\u2026"),)
    (violation,) = check({"k": {"a": "s", "x" * 100: 1}})
    assert violation == Violation("/k" + CUT, "additionalProperties", "is not an all\u2026")
    assert_bounded((violation,), limits)


def test_bounded_keeps_whole_tokens_and_escapes() -> None:
    limits = ViolationLimits(max_violations=1, max_path_bytes=16, max_message_bytes=16)
    assert bounded(["a/b", "c~d"], "k", "m", limits).path == "/a~1b/c~0d"
    assert bounded(["abc", 1, "defghijklm"], "k", "m", limits).path == "/abc/1" + CUT
    assert bounded(["x" * 40], "k", "m", limits).path == CUT
    assert bounded([], "k", "m", limits, cut=True).path == CUT
    message = bounded([], "k", "ü" * 20, limits).message
    assert message == "ü" * 6 + "\u2026"
    assert len(message.encode()) <= 16


# --- generated instances with many violations -------------------------------------------------

#: (schema, exact): exact when callgate's count must equal the oracle's (cut to the limit)
SHAPES: list[tuple[dict[str, Any], bool]] = [
    (MAP_OF_OBJECTS, True),
    (
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 0}},
                "required": ["n"],
            },
        },
        True,
    ),
    ({"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}, True),
    (
        {
            "patternProperties": {"^x": {"type": "integer"}, "^y": {"maxLength": 2}},
            "additionalProperties": {"type": "boolean"},
        },
        True,
    ),
    (
        {
            "type": "object",
            "allOf": [
                {"additionalProperties": {"type": ["integer", "object"]}},
                {"if": {"required": ["t"]}, "then": {"additionalProperties": {"minimum": 0}}},
            ],
        },
        True,
    ),
    (
        {
            "$defs": {"node": {"type": "object", "additionalProperties": {"$ref": "#/$defs/node"}}},
            "$ref": "#/$defs/node",
        },
        True,
    ),
    ({"dependentSchemas": {"t": {"additionalProperties": {"type": "integer"}}}}, True),
    ({"propertyNames": {"maxLength": 2}, "additionalProperties": {"type": "integer"}}, False),
    ({"properties": {"t": {}}, "unevaluatedProperties": {"type": "integer"}}, False),
    ({"not": {"type": "object"}}, True),
    ({"oneOf": [{"minProperties": 2}, {"maxProperties": 3}]}, True),
]
_LEAVES = st.one_of(
    st.integers(-3, 3), st.sampled_from(["", "s", "long"]), st.booleans(), st.none()
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(st.sampled_from(["a", "b", "c", "n", "t", "x1", "yy", "zzz"]), inner)
    ),
    max_leaves=6,
)
_PREFIXES = st.sampled_from(["x", "y", "k", "t", "ü", "a/b~"])


def _replicated(
    template: list[tuple[str, Any]], size: int, as_object: bool
) -> dict[str, Any] | list[Any]:
    """A few generated entries repeated to `size`: many violations, cheaply generated."""
    entries = [template[i % len(template)] for i in range(size)] if template else []
    if as_object:
        return {f"{prefix}{i}": value for i, (prefix, value) in enumerate(entries)}
    return [value for _, value in entries]


_INSTANCES = st.builds(
    _replicated,
    st.lists(st.tuples(_PREFIXES, _VALUES), min_size=1, max_size=6),
    st.one_of(st.integers(0, 10), st.integers(50, 400)),
    st.booleans(),
)


@pytest.mark.timeout(300)
@settings(FIXED, max_examples=300)
@given(
    shape=st.sampled_from(range(len(SHAPES))),
    instance=_INSTANCES,
    limit=st.integers(1, 40),
    path_bytes=st.sampled_from([16, 24, 64, 4096]),
)
def test_generated_instances_give_bounded_true_violations(
    shape: int, instance: Any, limit: int, path_bytes: int
) -> None:
    schema, exact = SHAPES[shape]
    limits = ViolationLimits(limit, max_path_bytes=path_bytes, max_message_bytes=path_bytes)
    every = every_violation(schema)(instance)
    for engine in ENGINES:
        try:
            check = compiled(schema, engine, limits)
        except SchemaLoadError:
            assert engine == "fastjsonschema"  # unevaluatedProperties: not a draft-7 keyword
            continue
        violations = check(instance)
        assert_bounded(violations, limits)
        assert bool(violations) == bool(every), (engine, violations, every)
        for violation in violations:
            if violation.path.endswith(CUT):
                stem = violation.path.removesuffix(CUT)
                assert any(p.startswith(stem) for p, _ in every), (engine, violation)
            else:
                assert (violation.path, violation.keyword) in every, (engine, violation, every)
        if exact and path_bytes == 4096:
            assert len(violations) == min(limit, len(every)), (engine, violations, every)


# --- who decides the limits --------------------------------------------------------------------


def test_the_compiled_check_has_no_limits_of_its_own() -> None:
    parameter = inspect.signature(compile_check).parameters["limits"]
    assert parameter.default is inspect.Parameter.empty
    with pytest.raises(TypeError):
        compile_check({}, file="f", engine="jsonschema-rs")  # type: ignore[call-arg]


def test_the_limits_come_from_the_settings() -> None:
    limits = violation_limits(LimitSettings(max_violations=3, max_message_bytes=300))
    assert (limits.max_violations, limits.max_path_bytes, limits.max_message_bytes) == (3, 300, 300)
    settings_ = Settings(
        schemas=SchemaSettings(dir=SCHEMAS), limits=LimitSettings(max_violations=2)
    )
    payment = build_registry(settings_).resolve("create_payment", None)
    assert isinstance(payment, Contract)
    assert len(payment.check({"amount_minor": "x", "currency": 1, "recipient_id": 2})) == 2
    with pytest.raises(ValueError, match="too small"):
        ViolationLimits(0, max_path_bytes=64, max_message_bytes=64)
