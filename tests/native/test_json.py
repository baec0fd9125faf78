"""The strict JSON parser through its Python face: `parse_json`, `depth_over`, `ParseError`.

JSONTestSuite decides the grammar: every `n_` case is rejected, every `y_` case is accepted with
the value and the types `json.loads` gives (but for the ones that repeat a key), and each `i_`
case has a decision with its reason. Generated texts check the rest: values `orjson` writes come
back type for type, arbitrary bytes never raise, and a reference written here on top of
`json.loads` (duplicates, the rule for numbers as `tests.support.numbers.admitted` writes it with
`decimal`, NaN/Infinity, lone surrogates, depth, trailing text) gives the same outcome and the
same JSON Pointer as the parser on texts that mix all of those. Hypothesis runs derandomized, so
every run draws the same examples.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.datafiles import data_files
from tests.support.numbers import INEXACT, admitted, number_texts
from worker._native import ParseError, depth_over, parse_json

CASES = data_files("json-test-suite/test_parsing", "*.json", at_least=300)
CODES = {
    "invalid_json",
    "duplicate_key",
    "non_finite_number",
    "inexact_number",
    "invalid_utf8",
    "too_deep",
}
DEPTH_CAP = 1024  # the deepest the parser ever goes, whatever max_depth says
FIXED = settings(derandomize=True, deadline=None, print_blob=True)

# Each implementation-defined case, decided: True = accepted, else the code it is rejected with.
I_DECISIONS: dict[str, bool | str] = {
    # A number means its exact value: below the smallest double, past the largest, or an integer
    # past 64 bits, no double names it exactly (it would be judged as another value)
    "i_number_double_huge_neg_exp.json": INEXACT,
    "i_number_real_underflow.json": INEXACT,
    "i_number_huge_exp.json": INEXACT,
    "i_number_neg_int_huge_exp.json": INEXACT,
    "i_number_pos_double_huge_exp.json": INEXACT,
    "i_number_real_neg_overflow.json": INEXACT,
    "i_number_real_pos_overflow.json": INEXACT,
    "i_number_too_big_neg_int.json": INEXACT,
    "i_number_too_big_pos_int.json": INEXACT,
    "i_number_very_big_negative_int.json": INEXACT,
    # a lone surrogate escape is no character: no valid UTF-8 holds it
    "i_object_key_lone_2nd_surrogate.json": "invalid_utf8",
    "i_string_1st_surrogate_but_2nd_missing.json": "invalid_utf8",
    "i_string_1st_valid_surrogate_2nd_invalid.json": "invalid_utf8",
    "i_string_incomplete_surrogate_and_escape_valid.json": "invalid_utf8",
    "i_string_incomplete_surrogate_pair.json": "invalid_utf8",
    "i_string_incomplete_surrogates_escape_valid.json": "invalid_utf8",
    "i_string_invalid_lonely_surrogate.json": "invalid_utf8",
    "i_string_invalid_surrogate.json": "invalid_utf8",
    "i_string_inverted_surrogates_U+1D11E.json": "invalid_utf8",
    "i_string_lone_second_surrogate.json": "invalid_utf8",
    # the text must be UTF-8 (RFC 8259 section 8.1): any other bytes are refused
    "i_string_UTF-16LE_with_BOM.json": "invalid_utf8",
    "i_string_UTF-8_invalid_sequence.json": "invalid_utf8",
    "i_string_UTF8_surrogate_U+D800.json": "invalid_utf8",
    "i_string_invalid_utf-8.json": "invalid_utf8",
    "i_string_iso_latin_1.json": "invalid_utf8",
    "i_string_lone_utf8_continuation_byte.json": "invalid_utf8",
    "i_string_not_in_unicode_range.json": "invalid_utf8",
    "i_string_overlong_sequence_2_bytes.json": "invalid_utf8",
    "i_string_overlong_sequence_6_bytes.json": "invalid_utf8",
    "i_string_overlong_sequence_6_bytes_null.json": "invalid_utf8",
    "i_string_truncated-utf-8.json": "invalid_utf8",
    "i_string_utf16BE_no_BOM.json": "invalid_utf8",
    "i_string_utf16LE_no_BOM.json": "invalid_utf8",
    # the parser takes 500 levels when asked to; the caller's max_depth is the limit
    "i_structure_500_nested_arrays.json": True,
    # RFC 8259 section 8.1: a parser may ignore a byte-order mark; a strict one refuses it
    "i_structure_UTF-8_BOM_empty_object.json": "invalid_json",
}


def typed(value: Any) -> Any:
    """A value with its types spelled out, for equality type for type: `1 != 1.0 != True`, a
    float by its exact bits (so `-0.0 != 0.0`), an object's members in order."""
    if isinstance(value, dict):
        return ("object", [(key, typed(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("array", [typed(item) for item in value])
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, value)


def outcome(result: Any) -> tuple[str, Any]:
    """`("ok", typed value)` or `(code, path)`."""
    if isinstance(result, ParseError):
        return (result.code, result.path)
    return ("ok", typed(result))


def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def case_id(case: Path) -> str:
    return case.name


# --- JSONTestSuite ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", [c for c in CASES if c.name.startswith("n_")], ids=case_id)
def test_every_n_case_is_rejected(case: Path) -> None:
    result = parse_json(case.read_bytes(), DEPTH_CAP)
    assert isinstance(result, ParseError), result
    assert result.code in CODES


@pytest.mark.parametrize("case", [c for c in CASES if c.name.startswith("y_")], ids=case_id)
def test_every_y_case_is_what_json_loads_reads_type_for_type(case: Path) -> None:
    text = case.read_bytes()
    result = parse_json(text, DEPTH_CAP)
    if case.name.startswith("y_object_duplicated_key"):
        # valid JSON, but a repeated key is refused: which value would a reader see?
        assert isinstance(result, ParseError)
        assert (result.code, result.path) == ("duplicate_key", "/a")
    else:
        assert outcome(result) == reference(text, DEPTH_CAP)


def test_every_i_case_has_a_decision() -> None:
    assert {c.name for c in CASES if c.name.startswith("i_")} == set(I_DECISIONS)


@pytest.mark.parametrize("case", [c for c in CASES if c.name.startswith("i_")], ids=case_id)
def test_each_i_case_is_decided_as_stated(case: Path) -> None:
    result = parse_json(case.read_bytes(), DEPTH_CAP)
    decision = I_DECISIONS[case.name]
    if decision is True:
        assert not isinstance(result, ParseError), result
    else:
        assert isinstance(result, ParseError), result
        assert result.code == decision


# --- examples, one rule each -----------------------------------------------------------------


def test_integers_span_both_64_bit_ranges_and_stay_ints() -> None:
    text = b"[18446744073709551615, -9223372036854775808, 9223372036854775808, -0, 1.0, 1e2, -0.0]"
    assert outcome(parse_json(text, 8)) == (
        "ok",
        typed([2**64 - 1, -(2**63), 2**63, 0, 1, 100, 0]),
    )


@settings(FIXED, max_examples=1500)
@given(number_texts())
def test_a_number_is_its_exact_value_in_every_spelling(text: str) -> None:
    """Numbers around the double and 64-bit boundaries, in every spelling, against the rule
    written with `decimal`: the same int, the same float bit for bit, or `inexact_number`."""
    expected = admitted(text)
    result = parse_json(f'{{"n": {text}}}'.encode(), 8)
    if expected is None:
        assert isinstance(result, ParseError), (text, result)
        assert (result.code, result.path) == (INEXACT, "/n")
    else:
        assert outcome(result) == ("ok", typed({"n": expected})), text


@pytest.mark.parametrize(
    ("text", "code", "path"),
    [
        (b'{"amount_minor": 18446744073709551616}', INEXACT, "/amount_minor"),
        (b'{"amount_minor": 0.99999999999999999}', INEXACT, "/amount_minor"),
        (b'{"amount_minor": 3e28}', INEXACT, "/amount_minor"),
        (b"[-9223372036854775809]", INEXACT, "/0"),
        (b'{"x": [1e400]}', INEXACT, "/x/0"),
        (b'{"n": NaN}', "non_finite_number", "/n"),
        (b"[-Infinity]", "non_finite_number", "/0"),
        (b'{"s": ["\\ud800"]}', "invalid_utf8", "/s/0"),
        (b'{"\\udc00": 1}', "invalid_utf8", ""),
        (b'{"s": "\xff"}', "invalid_utf8", "/s"),
        (b'{"a": 1, "a": 1}', "duplicate_key", "/a"),
        (b"\xef\xbb\xbf{}", "invalid_json", ""),
        (b'{"a": [1,]}', "invalid_json", "/a"),
        (b"{} {}", "invalid_json", ""),
        (b"", "invalid_json", ""),
    ],
)
def test_rejections_carry_a_code_and_the_pointer_of_the_offending_value(
    text: bytes, code: str, path: str
) -> None:
    result = parse_json(text, 8)
    assert isinstance(result, ParseError)
    assert (result.code, result.path) == (code, path)


def test_messages_say_where_and_never_echo_the_text() -> None:
    for text in (
        b'{"secret-key": 1, "secret-key": 2}',
        b'{"secret-key": NaN}',
        b'{"secret-key": "\\ud800"}',
        b'{"secret-key": secret}',
        b'["secret-\xff"]',
    ):
        result = parse_json(text, 8)
        assert isinstance(result, ParseError)
        assert "secret" not in result.message
        assert re.search(r"\(line \d+, column \d+\)$", result.message), result.message


def test_max_depth_counts_containers_and_is_capped() -> None:
    assert parse_json(b"[[[]]]", 3) == [[[]]]
    assert parse_json(b"7", 0) == 7
    too_deep = parse_json(b'{"a": [{"b": {}}]}', 3)
    assert isinstance(too_deep, ParseError)
    assert (too_deep.code, too_deep.path) == ("too_deep", "/a/0/b")
    at_cap = b"[" * DEPTH_CAP + b"]" * DEPTH_CAP
    past_cap = b"[" * (DEPTH_CAP + 1) + b"]" * (DEPTH_CAP + 1)
    assert not isinstance(parse_json(at_cap, 10**9), ParseError)
    capped = parse_json(past_cap, 10**9)
    assert isinstance(capped, ParseError)
    assert capped.code == "too_deep"
    unclosed = parse_json(b"[" * 1_000_000, 10**9)  # costs no native stack
    assert isinstance(unclosed, ParseError)
    assert unclosed.code == "too_deep"


def test_a_parse_error_is_a_frozen_value() -> None:
    error = ParseError("duplicate_key", "an object has the same key twice", "/a")
    assert error == ParseError("duplicate_key", "an object has the same key twice", "/a")
    assert hash(error) == hash(ParseError(error.code, error.message, error.path))
    assert ParseError("too_deep", "m").path == ""
    assert repr(error) == (
        "ParseError(code='duplicate_key', message='an object has the same key twice', path='/a')"
    )
    with pytest.raises(AttributeError):
        error.code = "invalid_json"  # type: ignore[misc]
    with pytest.raises(ValueError, match="code must be one of"):
        ParseError("bad_code", "m")


# --- generated values: what orjson writes comes back ----------------------------------------

# every character a UTF-8 text can hold: controls, quotes, backslashes, brackets, astral planes
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(TEXT, children, max_size=5),
    max_leaves=40,
)


def _as_the_rule_reads(value: Any) -> Any:
    """What the rule for numbers makes of a value orjson wrote: a float is the value of the text
    orjson writes for it, its shortest form (so `5.374815076274517e+16` is the integer
    53748150762745170, and a non-integral float is itself); `_Refused` when the rule refuses it."""
    if isinstance(value, dict):
        return {key: _as_the_rule_reads(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_the_rule_reads(item) for item in value]
    if isinstance(value, float):
        read = admitted(orjson.dumps(value).decode())
        return _Refused(INEXACT) if read is None else read
    return value


def _refused(value: Any) -> bool:
    if isinstance(value, dict):
        return any(map(_refused, value.values()))
    if isinstance(value, list):
        return any(map(_refused, value))
    return isinstance(value, _Refused)


@settings(FIXED, max_examples=500)
@given(VALUES)
def test_what_orjson_writes_parses_back_equal_type_for_type(value: Any) -> None:
    text = orjson.dumps(value)
    expected = _as_the_rule_reads(value)
    result = parse_json(text, DEPTH_CAP)
    if _refused(expected):
        assert isinstance(result, ParseError)
        assert result.code == INEXACT
    else:
        assert outcome(result) == ("ok", typed(expected))


@settings(FIXED, max_examples=300)
@given(VALUES)
def test_depth_over_measures_the_nesting_of_the_parsed_value(value: Any) -> None:
    text = orjson.dumps(value)
    nesting = depth(value)
    assert depth_over(text, nesting) is None
    if not _refused(_as_the_rule_reads(value)):
        assert not isinstance(parse_json(text, nesting), ParseError)
    if nesting > 0:
        assert depth_over(text, nesting - 1) == nesting
        cut = parse_json(text, nesting - 1)
        assert isinstance(cut, ParseError)
        # a number the rule refuses may come first
        assert cut.code in {"too_deep", INEXACT}


# --- arbitrary bytes --------------------------------------------------------------------------


def _mutated(text: bytes, at: int, junk: bytes) -> bytes:
    at %= len(text) + 1
    return text[:at] + junk + text[at:]


BYTES = st.binary(max_size=300) | st.builds(
    _mutated, VALUES.map(orjson.dumps), st.integers(0, 10**6), st.binary(min_size=1, max_size=4)
)


@settings(FIXED, max_examples=1000)
@given(BYTES, st.integers(0, 40))
def test_any_bytes_give_a_value_or_a_parse_error_and_never_raise(text: bytes, limit: int) -> None:
    result = parse_json(text, limit)
    if isinstance(result, ParseError):
        assert result.code in CODES
        assert result.message.isascii()
        assert "(line " in result.message
    else:
        assert depth(result) <= limit
        # anything strict JSON accepts, JSON accepts: the same value (each number exactly)
        orjson.loads(text)
        assert reference(text, limit) == outcome(result)
    depth_over(text, limit)


# --- the reference: json.loads, made strict around the parse ---------------------------------


class _Pairs(list[tuple[str, Any]]):
    """An object as its members in order, duplicates kept."""


class _Refused:
    """A number json.loads takes and strict JSON refuses, with the code it is refused with."""

    def __init__(self, code: str) -> None:
        self.code = code


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_WHITESPACE = " \t\n\r"


def _number(text: str) -> int | float | _Refused:
    if len(text.lstrip("-")) > 4000:  # spares int()'s limit: refused whatever the digits
        return _Refused(INEXACT)
    value = admitted(text)
    return _Refused(INEXACT) if value is None else value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_Pairs,
    parse_int=_number,
    parse_float=_number,
    parse_constant=lambda _: _Refused("non_finite_number"),
)


def _first_defect(node: Any, path: str, level: int, max_depth: int) -> tuple[str, str] | None:
    """What the strict parser stops at first, in the order it reads the text: a container is
    checked for depth as it opens, a key as it is read, a member's value before the member is
    added (and found to repeat a key)."""
    if isinstance(node, _Pairs | list):
        if level >= max_depth:
            return ("too_deep", path)
        if isinstance(node, list) and not isinstance(node, _Pairs):
            for index, item in enumerate(node):
                found = _first_defect(item, f"{path}/{index}", level + 1, max_depth)
                if found:
                    return found
            return None
        seen: set[str] = set()
        for key, item in node:
            if _LONE_SURROGATE.search(key):
                return ("invalid_utf8", path)
            member = f"{path}/{escape(key)}"
            found = _first_defect(item, member, level + 1, max_depth)
            if found:
                return found
            if key in seen:
                return ("duplicate_key", member)
            seen.add(key)
        return None
    if isinstance(node, _Refused):
        return (node.code, path)
    if isinstance(node, str) and _LONE_SURROGATE.search(node):
        return ("invalid_utf8", path)
    return None


def _plain(node: Any) -> Any:
    if isinstance(node, _Pairs):
        return {key: _plain(item) for key, item in node}
    if isinstance(node, list):
        return [_plain(item) for item in node]
    return node


def reference(text: bytes, max_depth: int) -> tuple[str, Any]:
    """The outcome strict parsing must have, as `outcome` spells it; a path of None where the
    reference cannot place the failure (text that is not UTF-8, or broken where it starts)."""
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        return ("invalid_utf8", None)
    start = len(decoded) - len(decoded.lstrip(_JSON_WHITESPACE))
    try:
        tree, end = _DECODER.raw_decode(decoded, start)
    except json.JSONDecodeError:
        return ("invalid_json", None)
    defect = _first_defect(tree, "", 0, min(max_depth, DEPTH_CAP))
    if defect:
        return defect
    if decoded[end:].strip(_JSON_WHITESPACE):
        return ("invalid_json", "")
    return ("ok", typed(_plain(tree)))


def agrees(result: Any, expected: tuple[str, Any]) -> bool:
    code, detail = outcome(result)
    return code == expected[0] and (expected[1] is None or detail == expected[1])


# Generated texts: the grammar's every corner, with the values strict JSON refuses mixed in.
WHITESPACE = st.sampled_from(["", " ", "\n", "\t", "\r\n", " \t\n\r "])
STRING_PIECES = st.one_of(
    st.text(st.characters(codec="utf-8", min_codepoint=0x20, exclude_characters='"\\')),
    st.sampled_from(
        ["\\n", '\\"', "\\\\", "\\/", "\\u0000", "\\u001f", "\\u00e9", "\\u0061", "[{"]
    ),
    st.just("\\ud83d\\ude00"),  # a surrogate pair: one astral character
)
LONE_SURROGATES = st.sampled_from(["\\ud800", "\\udc00", "\\ud800\\u0041", "\\ude00\\ud83d"])
STRINGS = st.lists(
    st.one_of(STRING_PIECES, STRING_PIECES, STRING_PIECES, LONE_SURROGATES), max_size=4
).map(lambda pieces: '"' + "".join(pieces) + '"')
# a few keys, so objects often repeat one ("a" and "\\u0061" are the same key)
KEYS = st.sampled_from(['"a"', '"b"', '"\\u0061"', '"a/b"', '"c~"', '"~1"', '""', '"\\udfff"'])
IN_RANGE = st.one_of(
    st.integers(-(2**63), 2**64 - 1).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(
        ["-0", "-0.0", "1E+2", "0.5e-1", "9223372036854775808", "18446744073709551615", "1e4"]
    ),
    number_texts(),
)
REFUSED_NUMBERS = st.sampled_from(
    [
        "18446744073709551616",
        "-9223372036854775809",
        "123456789012345678901234567890",
        "1e400",
        "-1e400",
        "1e-400",
        "0.99999999999999999",
        "3e28",
        "NaN",
        "Infinity",
        "-Infinity",
    ]
)
NUMBERS = st.one_of(IN_RANGE, IN_RANGE, IN_RANGE, REFUSED_NUMBERS)
LEAVES = NUMBERS | STRINGS | st.sampled_from(["true", "false", "null"])


def _repeating(parts: tuple[str, str, str, str]) -> str:
    """An object with "a" first and again last (spelled as given), other members between."""
    spelling, first, between, last = parts
    members = [f'"a":{first}', between[1:-1], f"{spelling}:{last}"]
    return "{" + ",".join(member for member in members if member) + "}"


def _containers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    arrays = st.lists(st.tuples(WHITESPACE, children, WHITESPACE), max_size=4).map(
        lambda items: "[" + ",".join(a + item + b for a, item, b in items) + "]"
    )
    keys = st.one_of(KEYS, KEYS, STRINGS)
    members = st.tuples(WHITESPACE, keys, WHITESPACE, WHITESPACE, children, WHITESPACE)
    objects = st.lists(members, max_size=4).map(
        lambda ms: "{" + ",".join(f"{a}{k}{b}:{c}{v}{d}" for a, k, b, c, v, d in ms) + "}"
    )
    repeating = st.tuples(st.sampled_from(['"a"', '"\\u0061"']), children, objects, children).map(
        _repeating
    )
    deep_arrays = st.tuples(st.integers(1, 30), children).map(
        lambda nest: "[" * nest[0] + nest[1] + "]" * nest[0]
    )
    deep_objects = st.tuples(st.integers(1, 30), KEYS, children).map(
        lambda nest: ("{" + nest[1] + ":") * nest[0] + nest[2] + "}" * nest[0]
    )
    return st.one_of(arrays, objects, arrays, objects, repeating, deep_arrays, deep_objects)


TRAILING = st.sampled_from(["", "", "", "x", ",", "]", "}", "{}", " 1", "nul", "\f", "\u00a0", "/"])
TEXTS = st.tuples(
    WHITESPACE, st.recursive(LEAVES, _containers, max_leaves=16), WHITESPACE, TRAILING
).map(lambda parts: "".join(parts).encode("utf-8", "surrogatepass"))
NOT_UTF8 = st.sampled_from([b"\xff", b"\x80", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])


@settings(FIXED, max_examples=1500)
@given(TEXTS, st.integers(3, 24) | st.just(DEPTH_CAP))
def test_parse_json_decides_as_the_reference_does(text: bytes, max_depth: int) -> None:
    expected = reference(text, max_depth)
    assert agrees(parse_json(text, max_depth), expected), expected


@settings(FIXED, max_examples=300)
@given(TEXTS, st.integers(0, 10**6), NOT_UTF8)
def test_bytes_that_are_not_utf8_are_invalid_utf8_wherever_they_are(
    text: bytes, at: int, junk: bytes
) -> None:
    decoded = text.decode("utf-8")
    at %= len(decoded) + 1  # at a character boundary, so the junk cannot complete a character
    broken = decoded[:at].encode() + junk + decoded[at:].encode()
    result = parse_json(broken, 48)
    assert isinstance(result, ParseError)
    assert result.code == "invalid_utf8"


# --- the pointer of a duplicate ---------------------------------------------------------------

POINTER_KEYS = st.text(st.sampled_from("ab~/01"), max_size=4) | TEXT


def _objects(node: Any, tokens: list[str]) -> list[list[str]]:
    """The path of every object in the value."""
    if isinstance(node, list):
        return [path for i, item in enumerate(node) for path in _objects(item, [*tokens, str(i)])]
    if isinstance(node, dict):
        inner = [path for key, item in node.items() for path in _objects(item, [*tokens, key])]
        return [tokens, *inner]
    return []


def _dump(value: Any) -> str:
    return orjson.dumps(value).decode()


def _dump_with_duplicate(node: Any, tokens: list[str], target: list[str], extra: str) -> str:
    """The value's text with `extra` members added last to the object at `target`."""
    if isinstance(node, list):
        items = (
            _dump_with_duplicate(v, [*tokens, str(i)], target, extra) for i, v in enumerate(node)
        )
        return "[" + ",".join(items) + "]"
    if isinstance(node, dict):
        members = [
            f"{_dump(key)}:{_dump_with_duplicate(v, [*tokens, key], target, extra)}"
            for key, v in node.items()
        ]
        if tokens == target:
            members.append(extra)
        return "{" + ",".join(members) + "}"
    return _dump(node)


#: values whose every number the rule takes (a refused number would be found before a duplicate)
TAKEN_SCALARS = SCALARS.filter(lambda v: not _refused(_as_the_rule_reads(v)))
TAKEN_VALUES = VALUES.filter(lambda v: not _refused(_as_the_rule_reads(v)))
WITH_AN_OBJECT = st.dictionaries(POINTER_KEYS, TAKEN_VALUES, max_size=4) | st.lists(
    st.dictionaries(POINTER_KEYS, TAKEN_VALUES, min_size=1, max_size=3), min_size=1, max_size=3
)


@settings(FIXED, max_examples=400)
@given(WITH_AN_OBJECT, st.data())
def test_the_path_of_a_duplicate_names_the_repeated_member(value: Any, data: st.DataObject) -> None:
    target = data.draw(st.sampled_from(_objects(value, [])), label="object")
    owner: Any = value
    for token in target:
        owner = owner[int(token)] if isinstance(owner, list) else owner[token]
    keys = sorted(owner)
    key = data.draw(st.sampled_from(keys) if keys else POINTER_KEYS, label="key")
    member = f"{_dump(key)}:{_dump(data.draw(TAKEN_SCALARS, label='its value'))}"
    extra = member if key in owner else member + "," + member
    text = _dump_with_duplicate(value, [], target, extra).encode()
    result = parse_json(text, DEPTH_CAP)
    assert isinstance(result, ParseError)
    assert result.code == "duplicate_key"
    assert result.path == "".join("/" + escape(token) for token in [*target, key])
    # and the pointer reads back (RFC 6901: "~1" is "/", then "~0" is "~")
    assert [unescape(token) for token in result.path.split("/")[1:]] == [*target, key]
