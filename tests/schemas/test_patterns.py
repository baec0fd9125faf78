"""Patterns: ECMA-262 meaning on both linear-time engines, refusals, and no super-linear input.

The meaning is checked three ways on generated patterns and strings: RE2 (the fastjsonschema
path), the Rust `regex` crate through jsonschema-rs, and the oracle (Python's `re` with the old
ECMA rewrite, `tests.schemas.ecma_oracle`) must agree. Hypothesis runs derandomized: the examples
are the same on every run, and a failure prints its reproduction blob.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.schemas.ecma_oracle import ecma_search
from tests.support.contracts import load_registry
from worker.errors import SchemaLoadError
from worker.schemas.contract import Contract
from worker.schemas.drafts import Draft
from worker.schemas.patterns import PatternRefused, Re2Search, problem, translate

ENGINES = ["fastjsonschema", "jsonschema-rs"]
FIXED = settings(derandomize=True, deadline=None, print_blob=True)
#: The argument size limit (LimitSettings.max_bytes): the longest string a call can hold.
MAX_ARGUMENT = 256 * 1024


@functools.lru_cache(maxsize=4096)
def rust_matcher(pattern: str) -> Any:
    schema = {"pattern": translate(pattern).rust}
    return jsonschema_rs.Draft202012Validator(schema, pattern_options=jsonschema_rs.RegexOptions())


def rust_search(pattern: str, text: str) -> bool:
    return bool(rust_matcher(pattern).is_valid(text))


def re2_search(pattern: str, text: str) -> bool:
    return Re2Search(pattern).search(text)


def load(tmp_path: Path, schema: Any, engine: str) -> Contract:
    (tmp_path / "d").mkdir(parents=True, exist_ok=True)
    (tmp_path / "d" / "t.v1.schema.json").write_text(json.dumps(schema))
    found = load_registry(tmp_path, engine=engine).resolve("t", None)
    assert isinstance(found, Contract)
    return found


# --- generated patterns mean what ECMA-262 says ------------------------------------------------

_LITERALS = st.sampled_from(
    [
        "a",
        "b",
        "z",
        "A",
        "0",
        "7",
        "_",
        "-",
        " ",
        "é",
        "😀",
        "]",
        "}",
        ",",
        "@",
        "\\.",
        "\\$",
        "\\^",
        "\\[",
        "\\]",
        "\\(",
        "\\)",
        "\\*",
        "\\+",
        "\\?",
        "\\|",
        "\\/",
        "\\n",
        "\\r",
        "\\t",
        "\\v",
        "\\f",
        "\\0",
        "\\x41",
        "\\u00e9",
        "\\u2028",
        "\\-",
    ]
)
_CLASS_ITEMS = st.sampled_from(
    [
        "a",
        "b",
        "z",
        "0",
        "9",
        "_",
        "é",
        "😀",
        " ",
        ".",
        "$",
        "[",
        "\\]",
        "\\-",
        "\\\\",
        "\\n",
        "a-f",
        "0-9",
        "A-Z",
        "à-ÿ",
        "a-😀",
        "\\d",
        "\\w",
        "\\D",
        "\\W",
        "\\b",
        "\\u2028",
    ]
)
_CLASSES = st.builds(
    lambda negated, items, dash: (
        "[" + ("^" if negated else "") + "".join(items) + ("-" if dash else "") + "]"
    ),
    st.booleans(),
    st.lists(_CLASS_ITEMS, max_size=4),
    st.booleans(),
)
_QUANTIFIERS = st.sampled_from(["", "", "*", "+", "?", "{2}", "{1,3}", "{2,}", "{0,1}"]).flatmap(
    lambda q: st.sampled_from([q, q + "?"]) if q else st.just(q)
)
_ASSERTIONS = st.sampled_from(["^", "$", "\\b", "\\B"])


def _patterns() -> st.SearchStrategy[str]:
    atoms = st.one_of(
        _LITERALS, st.just("."), st.sampled_from(["\\d", "\\w", "\\D", "\\W"]), _CLASSES
    )

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        kinds = st.sampled_from(["(", "(?:"])
        group = st.builds(lambda kind, body: kind + body + ")", kinds, inner)
        term = st.one_of(
            st.builds(lambda atom, q: atom + q, st.one_of(atoms, group), _QUANTIFIERS),
            _ASSERTIONS,
        )
        sequence = st.lists(term, max_size=4).map("".join)
        return st.lists(sequence, min_size=1, max_size=3).map("|".join)

    return st.recursive(atoms, extend, max_leaves=8)


_TEXTS = st.text(
    alphabet=st.sampled_from(
        [
            "a",
            "b",
            "z",
            "A",
            "0",
            "7",
            "_",
            "-",
            " ",
            "é",
            "😀",
            "\n",
            "\r",
            "\u2028",
            "\t",
            ".",
            "$",
            "[",
            "]",
            "^",
            "@",
            ",",
            "\x0b",
            "\x0c",
            "\x00",
            "\u00e0",
            "}",
        ]
    ),
    max_size=12,
)


@settings(FIXED, max_examples=500)
@given(pattern=_patterns(), texts=st.lists(_TEXTS, min_size=1, max_size=6))
def test_both_renderings_mean_what_ecma_says(pattern: str, texts: list[str]) -> None:
    assume(problem(pattern, Draft.DRAFT2020_12) is None)  # refused patterns have no meaning
    for text in texts:
        expected = ecma_search(pattern, text)
        assert re2_search(pattern, text) == expected, (pattern, text, translate(pattern).re2)
        assert rust_search(pattern, text) == expected, (pattern, text, translate(pattern).rust)


@settings(FIXED, max_examples=300)
@given(pattern=_patterns())
def test_generated_patterns_are_almost_never_refused(pattern: str) -> None:
    reason = problem(pattern, Draft.DRAFT2020_12)
    # the generator makes a range out of a class escape now and then; nothing else is refused
    assert reason is None or "class escape" in reason, (pattern, reason)


# --- the points where engines' defaults differ from ECMA-262 -------------------------------------

#: ECMA-262 \s: WhiteSpace (TAB, VT, FF, ZWNBSP, every Zs) and LineTerminator (LF, CR, LS, PS).
ECMA_SPACE = set("\t\n\x0b\x0c\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") | {
    chr(c) for c in range(0x2000, 0x200B)
}
NOT_SPACE = ["\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\u180e", "\u200b", "a", "_", "é"]


@pytest.mark.parametrize("search", [re2_search, rust_search])
def test_the_ecma_meaning_where_engines_differ(search: Any) -> None:
    assert not search("^a$", "a\n")  # $ is the end of the input
    assert search("^a$", "a")
    assert search("^[$]$", "$")
    assert not search("^\\d$", "\u0664")  # Arabic-Indic four: not an ECMA digit
    assert not search("^\\w$", "é")
    for terminator in ("\n", "\r", "\u2028", "\u2029"):
        assert not search("^.$", terminator)
    assert search("^.$", "\x85")
    assert search("^.$", "😀")  # one code point
    assert search("^[^]$", "\n")
    assert not search("a[]", "a")
    assert search("^[[]$", "[")  # a [ in a class is literal
    assert not search("^[[:alpha:]]$", "b")  # not a POSIX class: `[` `:` `a` ... then `]`
    assert search("^[[:alpha:]]$", ":]")
    assert not search("\\bé", "é")  # \b is an ASCII word boundary
    assert search("a\\b", "aé")
    assert search("^\\u{1F600}$", "😀")
    assert search("^\\uD83D\\uDE00$", "😀")  # a surrogate pair is one code point
    assert search("^\\cJ$", "\n")
    for char in ECMA_SPACE:
        assert search("^\\s$", char), hex(ord(char))
        assert not search("^\\S$", char), hex(ord(char))
        assert search("^[\\s]$", char), hex(ord(char))
    for char in NOT_SPACE:
        assert not search("^\\s$", char), hex(ord(char))
        assert search("^[^\\s]$", char), hex(ord(char))


@settings(FIXED, max_examples=200)
@given(pattern=_patterns(), texts=st.lists(_TEXTS, min_size=1, max_size=4))
def test_the_direct_match_agrees_with_the_wrappers_search(pattern: str, texts: list[str]) -> None:
    assume(problem(pattern, Draft.DRAFT2020_12) is None)
    matcher = Re2Search(pattern)
    assert matcher._match is not None  # the direct path is the one in use
    for text in texts:
        assert matcher.search(text) == (matcher._search(text.encode()) is not None)


def test_a_lone_surrogate_in_the_text_is_matched_as_a_replacement_character() -> None:
    assert Re2Search("^.$").search("\ud800")
    assert not Re2Search("^a$").search("\ud800")


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(a)\\1", "backreference"),
        ("(?<n>a)\\k<n>", "backreference"),
        ("a(?=b)", "lookahead and lookbehind"),
        ("a(?!b)", "lookahead and lookbehind"),
        ("(?<=a)b", "lookahead and lookbehind"),
        ("(?<!a)b", "lookahead and lookbehind"),
        ("\\p{L}", "Unicode property escapes"),
        ("\\P{Lu}", "Unicode property escapes"),
        ("(?i)a", "inline flags"),
        ("a**", "cannot repeat a quantifier"),
        ("a{2}{3}", "cannot repeat a quantifier"),
        ("*a", "needs something to repeat"),
        ("^*", "needs something to repeat"),
        ("\\b+", "needs something to repeat"),
        ("a{3,2}", "out of order"),
        ("[z-a]", "out of order"),
        ("[\\d-z]", "class escape"),
        ("(a", "not closed"),
        ("a)", "unbalanced"),
        ("[a", "not closed"),
        ("\\", "lone backslash"),
        ("\\a", "no meaning"),
        ("\\z", "no meaning"),
        ("\\uD800", "lone surrogate"),
        ("\\u{110000}", "no Unicode scalar value"),
        ("\\x4", "hex digits"),
        ("\\c1", "ASCII letter"),
        ("\\07", "backreference"),
        ("a{1001}", "RE2 cannot compile"),
        ("(?:a{1000}){1000}", "RE2 cannot compile"),
        ("a{99999999}", "too large"),
        ("(" * 101 + ")" * 101, "nest more than"),
    ],
)
def test_what_no_linear_engine_can_mean_is_refused(pattern: str, why: str) -> None:
    reason = problem(pattern, Draft.DRAFT2020_12)
    assert reason is not None
    assert why in reason
    with pytest.raises(PatternRefused):
        Re2Search(pattern)


def test_a_word_boundary_needs_a_2020_12_schema() -> None:
    assert problem("\\bword\\b", Draft.DRAFT2020_12) is None
    reason = problem("\\bword\\b", Draft.DRAFT7)
    assert reason is not None
    assert "draft 2020-12" in reason


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        ({"properties": {"a": {"pattern": "(x)\\1"}}}, "/properties/a/pattern"),
        ({"patternProperties": {"^(?=x)": {}}}, "/patternProperties/^(?=x)"),
        ({"$defs": {"d~/": {"pattern": "\\p{L}"}}}, "/$defs/d~0~1/pattern"),
        ({"propertyNames": {"pattern": "a{2000}"}}, "/propertyNames/pattern"),
    ],
)
def test_a_refused_pattern_names_file_pointer_and_pattern(
    tmp_path: Path, engine: str, schema: dict[str, Any], pointer: str
) -> None:
    with pytest.raises(SchemaLoadError) as caught:
        load(tmp_path, schema, engine)
    message = str(caught.value)
    assert caught.value.file is not None
    assert caught.value.file.endswith("t.v1.schema.json")
    assert f" at {pointer} is refused" in message
    assert "pattern '" in message


# --- pathological patterns answer in time linear in the input ----------------------------------

#: (pattern, the text that makes a backtracking engine try every split of it)
PATHOLOGICAL = [
    ("^(a+)+$", "a" * MAX_ARGUMENT + "!"),
    ("^(a*)*$", "a" * MAX_ARGUMENT + "!"),
    ("^(a|a)*$", "a" * MAX_ARGUMENT + "!"),
    ("^(a|aa)+$", "a" * MAX_ARGUMENT + "!"),
    ("^([a-z][a-z]?)+$", "a" * MAX_ARGUMENT + "!"),
    ("^(\\w+\\s?)+$", "a" * MAX_ARGUMENT + "!"),
    ("(.*,)*x", "," * MAX_ARGUMENT),
    ("^(a|ab|abc)*d$", "abc" * (MAX_ARGUMENT // 3)),
    ("^(ab|a)(bc|c)*$", "a" + "bc" * (MAX_ARGUMENT // 2) + "!"),
    ("\\S+@\\S+\\.\\S+", "@" * MAX_ARGUMENT),
    ("^\\S+@\\S+\\.\\S+$", "a@" * (MAX_ARGUMENT // 2)),
    ("^(([a-z])+.)+[A-Z]([a-z])+$", "a" * MAX_ARGUMENT),
    ("(x+x+)+y", "x" * MAX_ARGUMENT),
    ("^(\\d+)*$", "1" * MAX_ARGUMENT + "x"),
    ("^(.*?,){11}P", "1," * (MAX_ARGUMENT // 2)),
    (".*a.*a.*a.*b", "a" * MAX_ARGUMENT),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("engine", ENGINES)
def test_pathological_patterns_answer_promptly_on_both_engines(tmp_path: Path, engine: str) -> None:
    """Each judgement of a 256 KiB string takes milliseconds; a backtracking matcher would take
    longer than the universe has left on most of these. The timeout bounds the whole family."""
    schema = {
        "type": "object",
        "properties": {
            f"p{i}": {"type": "string", "pattern": pattern}
            for i, (pattern, _) in enumerate(PATHOLOGICAL)
        },
    }
    check = load(tmp_path, schema, engine).check
    for i, (_, text) in enumerate(PATHOLOGICAL):
        violations = check({f"p{i}": text})
        assert [(v.path, v.keyword) for v in violations] == [(f"/p{i}", "pattern")], i


@pytest.mark.timeout(30)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_pattern_beside_a_failed_max_length_is_prompt_too(tmp_path: Path, engine: str) -> None:
    email = {"type": "string", "maxLength": 254, "pattern": "^\\S+@\\S+\\.\\S+$"}
    check = load(tmp_path, {"properties": {"e": email}}, engine).check
    for text in ("@" * MAX_ARGUMENT, "a@b" * (MAX_ARGUMENT // 3), " " * MAX_ARGUMENT):
        assert {v.keyword for v in check({"e": text})} == {"maxLength", "pattern"}
    assert check({"e": "a@b.c"}) == ()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("engine", ENGINES)
def test_pattern_properties_are_matched_by_the_linear_engines_too(
    tmp_path: Path, engine: str
) -> None:
    schema = {"patternProperties": {"^(a+)+$": {"type": "integer"}}, "additionalProperties": False}
    check = load(tmp_path, schema, engine).check
    assert check({"a" * 1000: 1}) == ()
    violations = check({"a" * MAX_ARGUMENT + "!": 1})
    assert [v.keyword for v in violations] == ["additionalProperties"]


_NESTED = st.recursive(
    st.sampled_from(["a", "[ab]", "\\w", ".", "a?"]),
    lambda inner: st.builds(
        lambda parts, q, sep: "(" + sep.join(parts) + ")" + q,
        st.lists(inner, min_size=1, max_size=3),
        st.sampled_from(["*", "+", "{1,5}", "{2,}"]),
        st.sampled_from(["", "|"]),
    ),
    max_leaves=6,
)


@pytest.mark.timeout(120)
@settings(FIXED, max_examples=60)
@given(body=_NESTED, tail=st.sampled_from(["!", "", "b!"]))
def test_generated_nested_quantifiers_answer_promptly(body: str, tail: str) -> None:
    pattern = "^" + body + "$"
    assume(problem(pattern, Draft.DRAFT2020_12) is None)
    text = "a" * (MAX_ARGUMENT // 4) + tail
    # no assertion on the time: the timeout above bounds 60 patterns x 2 engines x 64 KiB
    re2_search(pattern, text)
    rust_search(pattern, text)


# --- fastjsonschema's generated code ------------------------------------------------------------


def test_required_names_beside_pattern_properties_load_on_fastjsonschema(tmp_path: Path) -> None:
    """fastjsonschema's generator checks, with Python's re, that a required name can match a
    patternProperties pattern when additionalProperties is false; callgate moves `required` where
    that check does not run, keeping the meaning."""
    schema = {
        "required": ["x1"],
        "patternProperties": {"^x[0-9]$": {"type": "integer"}},
        "additionalProperties": False,
    }
    for engine in ENGINES:
        check = load(tmp_path / engine, schema, engine).check
        assert check({"x1": 1}) == ()
        assert [v.keyword for v in check({})] == ["required"]
        assert [v.keyword for v in check({"x1": 1, "y": 2})] == ["additionalProperties"]
        assert [v.keyword for v in check({"x1": "one"})] == ["type"]
