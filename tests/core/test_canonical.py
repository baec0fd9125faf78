"""RFC 8785 canonical form: the RFC's own examples, and properties over generated values."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.canonical import canonical, request_digest
from worker.model import SchemaRef

# RFC 8785, appendix B: IEEE 754 bit patterns and their canonical text
RFC_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


@pytest.mark.parametrize(("bits", "text"), RFC_NUMBERS)
def test_the_rfcs_numbers(bits: str, text: str) -> None:
    (value,) = struct.unpack(">d", bytes.fromhex(bits))
    assert canonical(value) == text


def test_the_rfcs_sorting_example() -> None:
    # RFC 8785 section 3.2.3: names sorted by their UTF-16 code units
    names = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    text = canonical(names)
    order = [name for name, _ in json.loads(text, object_pairs_hook=list)]
    assert order == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


def test_strings_use_the_minimal_escapes() -> None:
    assert canonical('\u0000\u001f"\\/\u007f\u20ac') == '"\\u0000\\u001f\\"\\\\/\u007f\u20ac"'


def test_integers_are_exact_where_doubles_would_merge_them() -> None:
    assert canonical(9007199254740993) == "9007199254740993"
    assert canonical(2**64 - 1) == "18446744073709551615"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return float(a) == float(b) and not (
            math.copysign(1, float(a)) != math.copysign(1, float(b)) and a != 0
        )
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b and type(a) is type(b))


@settings(max_examples=300, derandomize=True)
@given(value=json_values)
def test_the_canonical_text_reads_back_as_the_same_value(value: Any) -> None:
    assert _same(json.loads(canonical(value)), value)


@settings(max_examples=300, derandomize=True)
@given(value=st.floats(allow_nan=False, allow_infinity=False))
def test_every_double_reads_back_exactly(value: float) -> None:
    assert float(canonical(value)) == value


@settings(max_examples=200, derandomize=True)
@given(value=st.dictionaries(st.text(max_size=5), st.integers(), max_size=6))
def test_member_order_and_whitespace_do_not_change_the_digest(value: dict[str, int]) -> None:
    schema = SchemaRef("payments.create_payment", "1")
    shuffled = dict(reversed(list(value.items())))
    assert request_digest(schema, value) == request_digest(schema, shuffled)
    assert request_digest(schema, value) != request_digest(
        SchemaRef("payments.create_payment", "2"), value
    )
