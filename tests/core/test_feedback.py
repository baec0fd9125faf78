"""Retry feedback names no raw input: only declared property names and array indices in paths.

Property names are generated (any text, including ones that look like indices, pointers or the
placeholder itself); whatever the schema does not declare never reaches the feedback, while the
violations themselves (for the event, for operators) keep the real path.
"""

from __future__ import annotations

from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import orjson
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from worker._native import AssembledCall
from worker.compose import build_gate, build_registry
from worker.core.feedback import NO_ARGUMENTS, UNDECLARED, build_feedback, feedback_path
from worker.errors import ConfigError
from worker.model import Code, Outcome, SchemaRef, Violation
from worker.schemas.contract import CUT, ViolationLimits
from worker.schemas.drafts import Draft, declared_names, escape
from worker.schemas.engines import compile_check
from worker.settings import MAX_LIMIT, Settings

FIXED = settings(derandomize=True, deadline=None, print_blob=True)
LIMITS = ViolationLimits(max_violations=32, max_path_bytes=512, max_message_bytes=512)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "user": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "object", "additionalProperties": False}},
        "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
    "patternProperties": {"^x-": {"type": "string"}},
    "required": ["user"],
    "additionalProperties": False,
}
DECLARED = declared_names(SCHEMA, Draft.DRAFT2020_12)
REF = SchemaRef("d.t", "1")
CHECKS = {
    engine: compile_check(SCHEMA, file="t", engine=engine, limits=LIMITS)
    for engine in ("fastjsonschema", "jsonschema-rs")
}


def feedback(violations: tuple[Violation, ...], arguments: Any) -> dict[str, Any]:
    return build_feedback(
        Code.SCHEMA_VIOLATION,
        REF,
        violations,
        retryable=True,
        budget_exhausted=False,
        max_bytes=1 << 20,
        declared=DECLARED,
        arguments=arguments,
    ).fields


def tokens(path: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def test_the_schema_declares_what_it_names() -> None:
    assert {"user", "name", "tags", "extra"} == DECLARED  # not the pattern "^x-"
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "dependencies": {"a": ["b"], "c": {"required": ["d"]}},
        "propertyNames": {"enum": ["e", 1]},
        "definitions": {"x": {"properties": {"f": {}}}},
    }
    assert declared_names(draft7, Draft.DRAFT7) == {"a", "b", "c", "d", "e", "f"}
    modern = {"dependentRequired": {"g": ["h"]}, "dependentSchemas": {"i": {}}}
    assert declared_names(modern, Draft.DRAFT2020_12) == {"g", "h", "i"}


def test_an_undeclared_property_is_not_echoed() -> None:
    arguments = {"user": {"name": "a"}, "password=hunter2": "x"}
    violations = CHECKS["jsonschema-rs"](arguments)
    assert [v.path for v in violations] == ["/password=hunter2"]  # the event keeps it
    shown = feedback(violations, arguments)
    assert shown["violations"][0]["path"] == "/" + UNDECLARED
    assert "hunter2" not in orjson.dumps(shown).decode()


def test_indices_stay_where_the_arguments_show_an_array() -> None:
    arguments = {"tags": [{}, {"7": 1}], "7": {"0": [1]}}
    assert feedback_path("/tags/1/7", DECLARED, arguments) == f"/tags/1/{UNDECLARED}"
    assert feedback_path("/7/0/0", DECLARED, arguments) == f"/{UNDECLARED}/{UNDECLARED}/0"
    assert feedback_path("/tags/1/7", DECLARED) == f"/tags/{UNDECLARED}/{UNDECLARED}"
    assert feedback_path("/tags/01", DECLARED, arguments) == f"/tags/{UNDECLARED}"
    assert feedback_path("/user/name", DECLARED, {}) == "/user/name"  # a missing one, required
    assert feedback_path("", DECLARED, arguments) == ""
    assert feedback_path("/secret" + CUT, DECLARED, {}) == f"/{UNDECLARED}{CUT}"
    assert feedback_path(CUT, DECLARED, {}) == CUT
    assert feedback_path("not-a-pointer", DECLARED, {}) == UNDECLARED
    assert feedback_path("/a~1b", frozenset({"a/b"}), {}) == "/a~1b"


_NAMES = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["0", "1", "01", "-1", "user", UNDECLARED, "~", "/", "a/b", "…", "tags"]),
    st.integers(0, 50).map(str),
)
_VALUES = st.recursive(
    st.none() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_NAMES, inner, max_size=3),
    max_leaves=6,
)


@settings(FIXED, max_examples=400)
@given(
    extra=st.dictionaries(_NAMES, _VALUES, max_size=6),
    nested=st.dictionaries(_NAMES, _VALUES, max_size=4),
    tags=st.lists(st.dictionaries(_NAMES, _VALUES, max_size=3), max_size=4),
    engine=st.sampled_from(["fastjsonschema", "jsonschema-rs"]),
)
def test_generated_undeclared_names_never_reach_the_feedback(
    extra: dict[str, Any], nested: dict[str, Any], tags: list[Any], engine: str
) -> None:
    arguments: dict[str, Any] = {**extra, "user": {**nested, "name": "n"}, "tags": tags}
    violations = CHECKS[engine](arguments)
    assume(violations)
    shown = feedback(violations, arguments)
    for violation, entry in zip(violations, shown["violations"], strict=True):
        real, safe = tokens(violation.path), tokens(entry["path"])
        assert len(real) == len(safe)
        if violation.path.endswith(CUT):  # a fixed marker: the same whether cut or named "…"
            real, safe = real[:-1], safe[:-1]
        node: Any = arguments
        for token, shown_token in zip(real, safe, strict=True):
            if isinstance(node, list):
                assert shown_token == token  # an index stays
                node = node[int(token)]
                continue
            if token in DECLARED:
                assert shown_token == token
            else:
                assert shown_token == UNDECLARED, (violation.path, entry["path"])
            node = node.get(token) if isinstance(node, dict) else None
    names = {n for n in [*extra, *nested] if n not in DECLARED and n not in (UNDECLARED, "…")}
    for entry in shown["violations"]:
        for token in tokens(entry["path"]):
            assert token not in names or token.isdigit()  # only an index may look like a name


@pytest.mark.parametrize("arguments", [NO_ARGUMENTS, {"a": [1]}])
def test_without_a_schema_every_key_is_undeclared(arguments: Any) -> None:
    violation = Violation("/a/0", "duplicate_key", "a key appears twice")
    shown = build_feedback(
        Code.DUPLICATE_KEY,
        None,
        (violation,),
        retryable=True,
        budget_exhausted=False,
        max_bytes=4096,
        arguments=arguments,
    ).fields
    expected = "/0" if arguments is not NO_ARGUMENTS else f"/{UNDECLARED}"
    assert shown["violations"][0]["path"] == f"/{UNDECLARED}" + expected


def test_the_placeholder_is_a_single_pointer_token() -> None:
    assert escape(UNDECLARED) == UNDECLARED


texts = st.text(st.characters(codec="utf-8"), max_size=40)


@settings(FIXED, max_examples=300)
@given(
    found=st.lists(st.builds(Violation, texts, texts, texts), max_size=12),
    max_bytes=st.integers(256, 2048),
    omitted=st.integers(0, 5),
    exhausted=st.booleans(),
)
def test_the_feedback_is_encoded_once_within_its_bound(
    found: list[Violation], max_bytes: int, omitted: int, exhausted: bool
) -> None:
    """The JSON text the event embeds is the fields' encoding, within the bound whenever a
    violation is shown, and every violation left out is counted."""
    feedback = build_feedback(
        Code.SCHEMA_VIOLATION,
        REF,
        tuple(found),
        retryable=True,
        budget_exhausted=exhausted,
        max_bytes=max_bytes,
        omitted=omitted,
    )
    assert feedback.json == orjson.dumps(feedback.fields)
    shown = feedback.fields["violations"]
    assert len(feedback.json) <= max_bytes or not shown
    left_out = omitted + len(found) - len(shown)
    assert feedback.fields.get("violations_omitted", 0) == left_out
    if left_out:  # said last, after everything it qualifies
        assert list(feedback.fields)[-1] == "violations_omitted"


_REQUIRED = [f"p{n}" for n in range(12)]
_CONTRACT = {
    "type": "object",
    "properties": {name: {"type": "integer"} for name in _REQUIRED},
    "required": _REQUIRED,
    "additionalProperties": False,
}
#: arguments each phase before the contract's own rejects: every kind of violation a call of
#: one tool can get, from one violation to as many as `max_violations` keeps
_REJECTED_ARGUMENTS = ["{", "[1]", "{}", '{"p0": 1.5}', '{"p0": 1e400}', "[" * 300 + "]" * 300]


@settings(FIXED, max_examples=60)
@given(
    domain=st.text(st.sampled_from("abz_-"), min_size=1, max_size=60),
    tool=st.text(st.sampled_from("AZaz09_-"), min_size=1, max_size=160),
    max_feedback_bytes=st.integers(256, 262) | st.integers(256, 700),
    max_violations=st.sampled_from([1, 9, 10, 32, 10**6, MAX_LIMIT]),
)
def test_a_gate_that_is_built_keeps_every_feedback_within_its_bound(
    domain: str, tool: str, max_feedback_bytes: int, max_violations: int
) -> None:
    """Whatever a contract's id and version, and whatever the bounds, either the settings or
    the gate refuse them (naming the setting, and the contract's file), or every rejection of
    that contract, its retry budget spent or not, has feedback within max_feedback_bytes
    (the issue: a contract's id made a feedback with no violation left longer than its bound,
    even the shipped ones under the least bound the settings took)."""
    with TemporaryDirectory() as directory:
        (Path(directory) / domain).mkdir()
        file = Path(directory) / domain / f"{tool}.v7.schema.json"
        file.write_bytes(orjson.dumps(_CONTRACT))
        limits = {"max_feedback_bytes": max_feedback_bytes, "max_violations": max_violations}
        refusal = ""
        try:
            chosen = Settings(schemas={"dir": directory}, limits=limits)
            gate = build_gate(chosen, build_registry(chosen))
        except ValidationError as refused:
            refusal = "max_feedback_bytes must hold"
            assert refusal in str(refused)  # noqa: PT017 (refused by one of two steps)
        except ConfigError as refused:
            refusal = f"{file}: the retry feedback of {domain}.{tool} version 7"
            assert refusal in str(refused)  # noqa: PT017
            assert "CALLGATE_LIMITS__MAX_FEEDBACK_BYTES" in str(refused)  # noqa: PT017
    event("built" if not refusal else "refused by the gate" if "retry" in refusal else refusal)
    if refusal:
        return
    for text in _REJECTED_ARGUMENTS:
        for attempt in (None, chosen.retry.budget):
            judged = gate.judge(AssembledCall("s", "c", tool, text.encode(), attempt=attempt))
            assert judged.outcome is Outcome.REJECTED, (text, judged)
            assert judged.retry_feedback is not None
            written = orjson.dumps(judged.retry_feedback)
            assert len(written) <= max_feedback_bytes, written
