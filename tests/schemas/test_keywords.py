"""Both engines judge every number as its exact decimal value, and the keywords callgate judges
itself (`multipleOf`, draft 7 `contentEncoding` / `contentMediaType`) alike.

Generated numbers around the double and 64-bit boundaries, in every spelling, read by the rule
(`tests.support.numbers.admitted`, written from the README with `decimal`), are judged by both
engines against schemas whose numbers are drawn the same way; the verdict must be the one
`fractions` gives on the exact values, whichever engine judges.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.contracts import LIMITS
from tests.support.numbers import admitted, exact, number_texts
from worker.model import Violation
from worker.schemas.engines import compile_check
from worker.schemas.keywords import is_multiple
from worker.schemas.vetting import ENGINES

FIXED = settings(derandomize=True, deadline=None, print_blob=True, max_examples=300)
DRAFT7 = "http://json-schema.org/draft-07/schema#"

Number = int | float
#: admitted numbers (the rule's int or float), drawn around the boundaries in every spelling
numbers = number_texts().map(admitted).filter(lambda value: value is not None)
positive = numbers.filter(lambda value: value is not None and value > 0)


def verdicts(schema: Any, instance: Any) -> list[tuple[Violation, ...]]:
    return [
        compile_check(schema, file="case", engine=engine, limits=LIMITS)(instance)
        for engine in ENGINES
    ]


def reference(keyword: str, param: Any, instance: Any) -> bool:
    """The keyword's verdict on exact values (booleans are not numbers)."""
    if isinstance(instance, bool):
        if keyword == "const":
            return param is instance
        if keyword == "enum":
            return any(option is instance for option in param)
        return keyword != "type"
    value = exact(instance)
    match keyword:
        case "type":
            return param == "number" or value.denominator == 1
        case "minimum":
            return value >= exact(param)
        case "maximum":
            return value <= exact(param)
        case "exclusiveMinimum":
            return value > exact(param)
        case "exclusiveMaximum":
            return value < exact(param)
        case "multipleOf":
            return (value / exact(param)).denominator == 1
        case "const":
            return not isinstance(param, bool) and value == exact(param)
        case "enum":
            return any(not isinstance(o, bool) and value == exact(o) for o in param)
    raise AssertionError(keyword)


_BOUNDS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]


@st.composite
def number_keywords(draw: st.DrawFn) -> tuple[str, Any]:
    keyword = draw(st.sampled_from([*_BOUNDS, "multipleOf", "const", "enum", "type"]))
    if keyword == "type":
        return keyword, draw(st.sampled_from(["integer", "number"]))
    if keyword == "multipleOf":
        return keyword, draw(positive)
    if keyword == "enum":
        return keyword, draw(st.lists(numbers | st.booleans(), min_size=1, max_size=3))
    if keyword == "const":
        return keyword, draw(numbers | st.booleans())
    return keyword, draw(numbers)


@FIXED
@given(number_keywords(), numbers | st.booleans(), st.sampled_from([DRAFT7, None]))
def test_both_engines_judge_numbers_as_their_exact_decimal_value(
    keyword_param: tuple[str, Any], instance: Any, draft: str | None
) -> None:
    keyword, param = keyword_param
    if keyword == "enum" and len({orjson.dumps(o) for o in param}) < len(param):
        param = list({orjson.dumps(o): o for o in param}.values())  # enum items are unique
    schema: dict[str, Any] = {"properties": {"n": {keyword: param}}}
    if draft:
        schema["$schema"] = draft
    expected = reference(keyword, param, instance)
    found = verdicts(schema, {"n": instance})
    assert [not v for v in found] == [expected, expected], (schema, instance, found)
    for violations in found:
        if violations:
            assert [(v.path, v.keyword) for v in violations] == [("/n", keyword)]


@FIXED
@given(numbers | st.booleans() | st.text(max_size=3), positive)
def test_is_multiple_is_exact(value: Any, step: Number) -> None:
    expected = (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or (exact(value) / exact(step)).denominator == 1
    )
    assert is_multiple(value, step) is expected


@pytest.mark.parametrize(
    ("schema", "instance", "valid"),
    [
        # the cases: a float division or a 28-digit Decimal said "multiple"
        ({"type": "integer", "minimum": 3, "multipleOf": 3}, 10**28, False),
        ({"type": "integer", "minimum": 3, "multipleOf": 3}, 3 * 10**28, True),
        ({"multipleOf": 3e-30}, 1, False),
        ({"multipleOf": 5e-324}, 1, True),  # the quotient overflows a double
        ({"multipleOf": 0.1}, 0.3, True),  # 0.3 / 0.1 is 2.9999999999999996 in doubles
        ({"multipleOf": 0.01}, 19.01, True),
        ({"multipleOf": 3}, 2**63 - 1, False),  # past 2^53, a float quotient looks whole
        ({"multipleOf": 0.123456789}, 1e308, False),
        ({"multipleOf": 1e-8}, 12391239123, True),
    ],
)
def test_multiple_of_cases(schema: Any, instance: Any, valid: bool) -> None:
    assert [not v for v in verdicts(schema, instance)] == [valid, valid]


# --- draft 7 content keywords --------------------------------------------------------------


def _base64_reference(text: str) -> bool:
    """RFC 4648 section 4 with padding, as a grammar: groups of four, the last may pad."""
    alphabet = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
    if len(text) % 4:
        return False
    body, padding = text.rstrip("="), len(text) - len(text.rstrip("="))
    return padding <= 2 and all(char in alphabet for char in body)


@st.composite
def base64_texts(draw: st.DrawFn) -> tuple[str, bytes | None]:
    """A text and the bytes it encodes when it was left valid (None when mutated)."""
    content = draw(
        st.sampled_from([b"{}", b'{"a": 1}', b"[NaN]", b'{"a":1,"a":2}', b"[1e400]", b"nul"])
        | st.binary(max_size=12)
    )
    text = base64.b64encode(content).decode()
    mutation = draw(st.sampled_from(["none", "drop", "insert", "space", "unpad", "non-ascii"]))
    if mutation == "none" or not text:
        return text, content
    at = draw(st.integers(0, len(text) - 1))
    if mutation == "drop":
        text = text[:at] + text[at + 1 :]
    elif mutation == "insert":
        text = text[:at] + draw(st.sampled_from("!-_.=*")) + text[at:]
    elif mutation == "space":
        text = text[:at] + draw(st.sampled_from(" \n\t")) + text[at:]
    elif mutation == "unpad":
        text = text.rstrip("=")
    else:
        text = text[:at] + "\u00e9" + text[at:]
    return text, None


def _strict_json(content: bytes) -> bool:
    """The payloads above: JSON, and strict (no NaN, no number past a double, no key twice)."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({key for key, _ in pairs}) < len(pairs):
            raise ValueError("duplicate")
        return dict(pairs)

    def refuse(token: str) -> Any:
        raise ValueError(token)

    try:
        json.loads(
            content.decode("utf-8"),
            object_pairs_hook=no_duplicates,
            parse_constant=refuse,
            parse_float=lambda text: admitted(text) if admitted(text) is not None else refuse(text),
            parse_int=lambda text: admitted(text) if admitted(text) is not None else refuse(text),
        )
    except ValueError:
        return False
    return True


@FIXED
@given(base64_texts(), st.sampled_from(["base64", "BASE64"]), st.booleans())
def test_draft7_content_keywords_mean_one_thing_on_both_engines(
    drawn: tuple[str, bytes | None], encoding: str, with_media_type: bool
) -> None:
    text, _ = drawn
    schema: dict[str, Any] = {"$schema": DRAFT7, "contentEncoding": encoding}
    if with_media_type:
        schema["contentMediaType"] = "application/json"
    is_base64 = _base64_reference(text)
    expected: set[str] = set() if is_base64 else {"contentEncoding"}
    if is_base64 and with_media_type and not _strict_json(base64.b64decode(text)):
        expected.add("contentMediaType")
    for violations in verdicts(schema, text):
        assert {v.keyword for v in violations} == expected, (schema, text, violations)


@pytest.mark.parametrize(
    ("schema", "instance", "valid"),
    [
        ({"$schema": DRAFT7, "contentEncoding": "base64"}, "!!!", False),
        ({"$schema": DRAFT7, "contentEncoding": "base64"}, "e30=", True),
        ({"$schema": DRAFT7, "contentEncoding": "base64"}, "e30", False),
        ({"$schema": DRAFT7, "contentEncoding": "base64"}, 17, True),
        ({"$schema": DRAFT7, "contentEncoding": "quoted-printable"}, "!!!", True),
        ({"$schema": DRAFT7, "contentMediaType": "application/json"}, "[1]", True),
        ({"$schema": DRAFT7, "contentMediaType": "application/json"}, "[NaN]", False),
        ({"$schema": DRAFT7, "contentMediaType": "Application/JSON; charset=utf-8"}, "{", False),
        ({"$schema": DRAFT7, "contentMediaType": "text/html"}, "{", True),
        # 2020-12: annotations, on both engines
        ({"contentEncoding": "base64", "contentMediaType": "application/json"}, "!!!", True),
    ],
)
def test_content_cases(schema: Any, instance: Any, valid: bool) -> None:
    assert [not v for v in verdicts(schema, instance)] == [valid, valid]


def test_a_custom_keyword_reads_like_the_engines_own() -> None:
    schema = {"$schema": DRAFT7, "properties": {"a": {"multipleOf": 0.5}}}
    for violations in verdicts(schema, {"a": 0.3}):
        assert violations == (Violation("/a", "multipleOf", "must be a multiple of 0.5"),)
    schema = {"$schema": DRAFT7, "properties": {"b": {"contentEncoding": "base64"}}}
    for violations in verdicts(schema, {"b": "secret!"}):
        assert violations == (Violation("/b", "contentEncoding", 'must be encoded as "base64"'),)
