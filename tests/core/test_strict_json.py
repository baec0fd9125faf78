"""Strict parsing against JSONTestSuite and the cases orjson alone lets through."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.datafiles import data_files, data_path
from worker.core.strict_json import ParseError, depth_over, parse, scan
from worker.model import Code

SUITE = data_path("json-test-suite")
CASES = data_files("json-test-suite/test_parsing", "*.json", at_least=300)

# Each implementation-defined case, decided: True = accepted, else the code it is rejected with.
I_DECISIONS: dict[str, bool | Code] = {
    "i_number_double_huge_neg_exp.json": True,  # underflows to 0.0, as IEEE 754 says
    "i_number_huge_exp.json": Code.NON_FINITE_NUMBER,
    "i_number_neg_int_huge_exp.json": Code.NON_FINITE_NUMBER,
    "i_number_pos_double_huge_exp.json": Code.NON_FINITE_NUMBER,
    "i_number_real_neg_overflow.json": Code.NON_FINITE_NUMBER,
    "i_number_real_pos_overflow.json": Code.NON_FINITE_NUMBER,
    "i_number_real_underflow.json": True,
    # integers beyond 64 bits would silently become floats: refused, never rounded
    "i_number_too_big_neg_int.json": Code.INVALID_JSON,
    "i_number_too_big_pos_int.json": Code.INVALID_JSON,
    "i_number_very_big_negative_int.json": Code.INVALID_JSON,
    "i_object_key_lone_2nd_surrogate.json": Code.INVALID_UTF8,
    "i_string_1st_surrogate_but_2nd_missing.json": Code.INVALID_UTF8,
    "i_string_1st_valid_surrogate_2nd_invalid.json": Code.INVALID_UTF8,
    "i_string_UTF-16LE_with_BOM.json": Code.INVALID_UTF8,
    "i_string_UTF-8_invalid_sequence.json": Code.INVALID_UTF8,
    "i_string_UTF8_surrogate_U+D800.json": Code.INVALID_UTF8,
    "i_string_incomplete_surrogate_and_escape_valid.json": Code.INVALID_UTF8,
    "i_string_incomplete_surrogate_pair.json": Code.INVALID_UTF8,
    "i_string_incomplete_surrogates_escape_valid.json": Code.INVALID_UTF8,
    "i_string_invalid_lonely_surrogate.json": Code.INVALID_UTF8,
    "i_string_invalid_surrogate.json": Code.INVALID_UTF8,
    "i_string_invalid_utf-8.json": Code.INVALID_UTF8,
    "i_string_inverted_surrogates_U+1D11E.json": Code.INVALID_UTF8,
    "i_string_iso_latin_1.json": Code.INVALID_UTF8,
    "i_string_lone_second_surrogate.json": Code.INVALID_UTF8,
    "i_string_lone_utf8_continuation_byte.json": Code.INVALID_UTF8,
    "i_string_not_in_unicode_range.json": Code.INVALID_UTF8,
    "i_string_overlong_sequence_2_bytes.json": Code.INVALID_UTF8,
    "i_string_overlong_sequence_6_bytes.json": Code.INVALID_UTF8,
    "i_string_overlong_sequence_6_bytes_null.json": Code.INVALID_UTF8,
    "i_string_truncated-utf-8.json": Code.INVALID_UTF8,
    "i_string_utf16BE_no_BOM.json": Code.INVALID_UTF8,
    "i_string_utf16LE_no_BOM.json": Code.INVALID_UTF8,
    "i_structure_500_nested_arrays.json": True,  # the parser takes it; the limits phase does not
    "i_structure_UTF-8_BOM_empty_object.json": Code.INVALID_JSON,
}


def test_suite_is_present() -> None:
    assert len(CASES) > 300


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.name.startswith("n_")], ids=lambda c: c.name
)
def test_every_n_case_is_rejected(case: Path) -> None:
    assert isinstance(parse(case.read_bytes()), ParseError)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.name.startswith("y_")], ids=lambda c: c.name
)
def test_every_y_case_is_accepted_except_duplicate_keys(case: Path) -> None:
    result = parse(case.read_bytes())
    if case.name.startswith("y_object_duplicated_key"):
        assert isinstance(result, ParseError)
        assert result.code is Code.DUPLICATE_KEY
    else:
        assert not isinstance(result, ParseError), result


def test_every_i_case_has_a_decision() -> None:
    assert {c.name for c in CASES if c.name.startswith("i_")} == set(I_DECISIONS)


@pytest.mark.parametrize("name", sorted(I_DECISIONS))
def test_i_case_decision(name: str) -> None:
    result = parse((SUITE / "test_parsing" / name).read_bytes())
    decision = I_DECISIONS[name]
    if decision is True:
        assert not isinstance(result, ParseError), result
    else:
        assert isinstance(result, ParseError)
        assert result.code is decision


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (b'{"amount": 10, "amount": 100}', "/amount"),
        (b'{"x": [0, {"b": 1, "b": 2}]}', "/x/1/b"),
        (b'{"a": 1, "\\u0061": 2}', "/a"),
        (b'{"a/b": {"c~": 1, "c~": 1}}', "/a~1b/c~0"),
    ],
)
def test_duplicate_keys_at_any_depth_name_their_path(text: bytes, path: str) -> None:
    result = parse(text)
    assert isinstance(result, ParseError)
    assert (result.code, result.path) == (Code.DUPLICATE_KEY, path)


def test_colons_inside_strings_are_not_members() -> None:
    assert parse(b'{"a": "x:y\\":z", "b": [{"c": ":"}]}') == {
        "a": 'x:y":z',
        "b": [{"c": ":"}],
    }


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (b'{"n": NaN}', Code.NON_FINITE_NUMBER),
        (b'{"n": -Infinity}', Code.NON_FINITE_NUMBER),
        (b'{"n": 1e400}', Code.NON_FINITE_NUMBER),
        (b'{"s": "\\ud800"}', Code.INVALID_UTF8),
        (b'{"s": "\xff"}', Code.INVALID_UTF8),
        (b'{"city": "\xe6\x9d\xad\xe5\xb7\x9e",}', Code.INVALID_JSON),
        (b"", Code.INVALID_JSON),
        (b'["ls","pwd"', Code.INVALID_JSON),
        (b'{"amount_minor": 123456789012345678901234}', Code.INVALID_JSON),
    ],
)
def test_rejections_are_classified(text: bytes, code: Code) -> None:
    result = parse(text)
    assert isinstance(result, ParseError)
    assert result.code is code


def test_the_largest_64_bit_integers_pass() -> None:
    assert parse(b"[18446744073709551615, -9223372036854775808]") == [
        18446744073709551615,
        -9223372036854775808,
    ]


def test_scan_measures_depth_outside_strings() -> None:
    assert scan(b'{"a": [[{"b": "[[[[["}]]]}').depth == 4
    assert scan(b"123").depth == 0


@pytest.mark.parametrize(
    ("text", "limit", "over"),
    [
        (b'{"a": 1}', 1, None),
        (b"[[[]]]", 3, None),  # exactly at the limit
        (b"[[[[]]]]", 3, 4),
        (b'{"a": {"b": [1, {"c": []}]}}', 3, 5),
        (b'{"s": "[[[[[[[[[[{{{{{{{{{{"}', 2, None),  # brackets in a string are text
        (b"[" * 40 + b"]" * 40, 32, 40),
        (b"[[],[],[],[],[]]", 2, None),  # many brackets, shallow: counted, then scanned
        (b"[[[[", 3, 4),  # truncated text still has a depth
    ],
)
def test_depth_over_answers_only_past_the_limit(text: bytes, limit: int, over: int | None) -> None:
    assert depth_over(text, limit) == over
