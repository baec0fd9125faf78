"""Schema `pattern`s meet model-controlled strings: every one is matched in linear time.

A `pattern` (and a `patternProperties` name) is an ECMA-262 regular expression. Neither engine
is given it as written: `translate(pattern)` parses it as ECMA-262 does and renders it for the
two linear-time matchers callgate uses, each told exactly what ECMA-262 means:

* RE2 (google-re2), which judges patterns on the fastjsonschema path (`Re2Search`) and matches
  `patternProperties` names wherever callgate itself needs to;
* the Rust `regex` crate, which jsonschema-rs runs with `RegexOptions()` (written so that
  jsonschema-rs's draft-7 meta-schema check, which reads a pattern as ECMA-262, accepts it).

Neither backtracks, so `^(a+)+$`, `^([a-z][a-z]?)+$` or `\\S+@\\S+\\.\\S+` answer in time linear
in the input. What the rendering makes explicit, because the engines' defaults differ from ECMA:
`$` is the end of the input only (RE2 and Rust read it so without the `m` flag); `.` is any
character but `\\n \\r \\u2028 \\u2029`; `\\d \\w` and the `\\b \\B` boundaries are ASCII; `\\s`
is ECMA's white space and line terminators (Rust's and RE2's `\\s` are other sets); a `[` inside
a class is literal; `[]` matches nothing and `[^]` any character. Every class is written out as
code point ranges, so no engine-specific class syntax (`[[:alpha:]]`, `&&`, `--`) is ever read.

What a linear-time engine cannot do, or what has no single meaning, is refused (`PatternRefused`):
backreferences, lookahead and lookbehind, Unicode property escapes (`\\p{..}`: their meaning
depends on ECMA's `u` flag), escapes ECMA gives no meaning in Unicode mode (`\\a`, `\\z`, ...),
inline flags, and repetition counts above what RE2 compiles (1000); in a draft-7 schema also a
word boundary, which jsonschema-rs's draft-7 meta-schema check accepts in no ASCII-only form.
`problem(pattern, draft)` says why a pattern is refused, after also compiling both renderings,
so a contract means the same on both engines or does not load at all.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

from worker.schemas.drafts import Draft, schema_uri

#: Code point ranges, inclusive, sorted and disjoint; surrogates are never in one (no valid
#: UTF-8 text holds one, and the Rust `regex` crate refuses them as class bounds).
Ranges = tuple[tuple[int, int], ...]

_MAX_CODE_POINT = 0x10FFFF
_ALL: Ranges = ((0, 0xD7FF), (0xE000, _MAX_CODE_POINT))
_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
#: ECMA-262 WhiteSpace (TAB, VT, FF, ZWNBSP, every Zs) and LineTerminator (LF, CR, LS, PS).
_SPACE: Ranges = (
    (0x09, 0x0D),
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
    (0xFEFF, 0xFEFF),
)
_LINE_TERMINATORS: Ranges = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))

_MAX_GROUP_DEPTH = 100
_MAX_REPEAT_DIGITS = 6
_SYNTAX = frozenset("^$\\.*+?()[]{}|/")
_CONTROL_ESCAPES = {"f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B}
_QUANTIFIER = re.compile(r"\{([0-9]+)(,([0-9]*))?\}")  # applied to schema text only, anchored
_GROUP_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
#: Printed as themselves by the renderer; every other character is escaped or written as \x{..}.
_PLAIN = frozenset(string.ascii_letters + string.digits + "_ !\"#%&',-/:;<=>@`~")
_HEX = frozenset(string.hexdigits)
_META = frozenset(".+*?()|[]{}^$\\")


class PatternRefused(Exception):
    """The pattern cannot be matched in linear time with its ECMA-262 meaning; says why."""


@dataclass(frozen=True, slots=True)
class Translation:
    """One ECMA-262 pattern, rendered for each linear-time engine with the same meaning."""

    re2: str
    rust: str
    word_boundary: bool  # holds \b or \B


# --- the parsed form -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Chars:
    """One character out of a set (a literal is a set of one)."""

    ranges: Ranges


@dataclass(frozen=True, slots=True)
class _Assert:
    kind: str  # "^", "$", "b", "B"


@dataclass(frozen=True, slots=True)
class _Group:
    body: _Alt


@dataclass(frozen=True, slots=True)
class _Repeat:
    atom: _Chars | _Group
    low: int
    high: int | None  # None: unbounded
    lazy: bool


_Term = _Chars | _Assert | _Group | _Repeat


@dataclass(frozen=True, slots=True)
class _Alt:
    branches: tuple[tuple[_Term, ...], ...]


def _normalize(ranges: list[tuple[int, int]]) -> Ranges:
    """Sorted, merged, and with the surrogate block cut out."""
    cut: list[tuple[int, int]] = []
    for low, high in ranges:
        if low <= 0xDFFF and high >= 0xD800:
            if low < 0xD800:
                cut.append((low, 0xD7FF))
            if high > 0xDFFF:
                cut.append((0xE000, high))
        else:
            cut.append((low, high))
    merged: list[tuple[int, int]] = []
    for low, high in sorted(cut):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


def _complement(ranges: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    start = 0
    for low, high in _normalize(list(ranges)):
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= _MAX_CODE_POINT:
        out.append((start, _MAX_CODE_POINT))
    return _normalize(out)


_CLASS_ESCAPES: dict[str, Ranges] = {
    "d": _DIGIT,
    "D": _complement(_DIGIT),
    "w": _WORD,
    "W": _complement(_WORD),
    "s": _SPACE,
    "S": _complement(_SPACE),
}
_DOT = _complement(_LINE_TERMINATORS)


class _Parser:
    """ECMA-262 `Pattern` (Unicode mode, with Annex B's literal `]`, `{` and `}`)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.depth = 0

    def fail(self, why: str) -> PatternRefused:
        return PatternRefused(f"{why} (at offset {self.at})")

    def peek(self, ahead: int = 0) -> str:
        index = self.at + ahead
        return self.text[index] if index < len(self.text) else ""

    def parse(self) -> _Alt:
        alt = self.alternation()
        if self.at < len(self.text):
            raise self.fail("unbalanced ')'")
        return alt

    def alternation(self) -> _Alt:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.sequence())
        return _Alt(tuple(branches))

    def sequence(self) -> tuple[_Term, ...]:
        terms: list[_Term] = []
        while self.at < len(self.text) and self.peek() not in "|)":
            term = self.term()
            repeat = self.quantifier()
            if repeat is not None:
                if not isinstance(term, _Chars | _Group):
                    raise self.fail("a quantifier needs something to repeat")
                low, high, lazy = repeat
                term = _Repeat(term, low, high, lazy)
                if self.quantifier_here():
                    raise self.fail("a quantifier cannot repeat a quantifier")
            terms.append(term)
        return tuple(terms)

    def quantifier_here(self) -> bool:
        char = self.peek()
        return char in ("*", "+", "?") or (
            char == "{" and _QUANTIFIER.match(self.text, self.at) is not None
        )

    def quantifier(self) -> tuple[int, int | None, bool] | None:
        char = self.peek()
        low: int
        high: int | None
        if char == "*":
            low, high, self.at = 0, None, self.at + 1
        elif char == "+":
            low, high, self.at = 1, None, self.at + 1
        elif char == "?":
            low, high, self.at = 0, 1, self.at + 1
        elif char == "{" and (match := _QUANTIFIER.match(self.text, self.at)):
            counts = [match[1], match[3]]
            if any(c is not None and len(c) > _MAX_REPEAT_DIGITS for c in counts):
                raise self.fail("a repetition count is too large")
            low = int(match[1])
            high = low if match[2] is None else (int(match[3]) if match[3] else None)
            if high is not None and high < low:
                raise self.fail("a repetition range is out of order")
            self.at = match.end()
        else:
            return None
        lazy = self.peek() == "?"
        if lazy:
            self.at += 1
        return low, high, lazy

    def term(self) -> _Term:
        char = self.peek()
        if char in ("^", "$"):
            self.at += 1
            return _Assert(char)
        if char == "(":
            return self.group()
        if char == "[":
            return _Chars(self.char_class())
        if char == ".":
            self.at += 1
            return _Chars(_DOT)
        if char == "\\":
            following = self.peek(1)
            if following in ("b", "B"):
                self.at += 2
                return _Assert(following)
            if following in _CLASS_ESCAPES:
                self.at += 2
                return _Chars(_CLASS_ESCAPES[following])
            return _Chars(_single(self.escape()))
        if char in ("*", "+", "?") or self.quantifier_here():
            raise self.fail("a quantifier needs something to repeat")
        self.at += 1
        return _Chars(_single(ord(char)))

    def group(self) -> _Group:
        self.at += 1  # (
        if self.peek() == "?":
            if self.text.startswith(("?=", "?!", "?<=", "?<!"), self.at):
                raise self.fail("lookahead and lookbehind need a backtracking matcher")
            if self.text.startswith("?:", self.at):
                self.at += 2
            elif self.text.startswith("?<", self.at):
                name = _GROUP_NAME.match(self.text, self.at + 2)
                if name is None or not self.text.startswith(">", name.end()):
                    raise self.fail("a group name must be an identifier closed by '>'")
                self.at = name.end() + 1
            else:
                raise self.fail("inline flags and other '(?' groups are not ECMA-262")
        self.depth += 1
        if self.depth > _MAX_GROUP_DEPTH:
            raise self.fail(f"groups nest more than {_MAX_GROUP_DEPTH} deep")
        body = self.alternation()
        self.depth -= 1
        if self.peek() != ")":
            raise self.fail("a group is not closed")
        self.at += 1
        return _Group(body)

    def char_class(self) -> Ranges:
        self.at += 1  # [
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            if self.at >= len(self.text):
                raise self.fail("a character class is not closed")
            left = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.at += 1
                right = self.class_atom()
                if not isinstance(left, int) or not isinstance(right, int):
                    raise self.fail("a class range cannot start or end with a class escape")
                if right < left:
                    raise self.fail("a class range is out of order")
                ranges.append((left, right))
            elif isinstance(left, int):
                ranges.append((left, left))
            else:
                ranges.extend(left)
        self.at += 1  # ]
        chars = _normalize(ranges)
        return _complement(chars) if negated else chars

    def class_atom(self) -> int | Ranges:
        char = self.peek()
        if char != "\\":
            self.at += 1
            return ord(char)
        following = self.peek(1)
        if following in _CLASS_ESCAPES:
            self.at += 2
            return _CLASS_ESCAPES[following]
        if following == "b":
            self.at += 2
            return 0x08
        if following == "-":
            self.at += 2
            return ord("-")
        if following == "B":
            raise self.fail("\\B has no meaning inside a class")
        return self.escape()

    def escape(self) -> int:
        """A character escape after `\\`, as its code point."""
        following = self.peek(1)
        if not following:
            raise self.fail("the pattern ends with a lone backslash")
        self.at += 2
        if following in _CONTROL_ESCAPES:
            return _CONTROL_ESCAPES[following]
        if following == "0":
            if self.peek().isdigit():
                raise self.fail("octal escapes and backreferences need a backtracking matcher")
            return 0
        if following in "123456789" or following == "k":
            raise self.fail("backreferences need a backtracking matcher")
        if following == "c":
            letter = self.peek()
            if not (letter.isascii() and letter.isalpha()):
                raise self.fail("\\c needs an ASCII letter")
            self.at += 1
            return ord(letter) % 32
        if following == "x":
            return self.hex_digits(2)
        if following == "u":
            return self.unicode_escape()
        if following in ("p", "P"):
            raise self.fail("Unicode property escapes are not supported")
        if following.isascii() and following.isalnum():
            raise self.fail(f"\\{following} has no meaning in ECMA-262 (Unicode mode)")
        return ord(following)  # a syntax character or another identity escape

    def hex_digits(self, count: int) -> int:
        digits = self.text[self.at : self.at + count]
        if len(digits) != count or not set(digits) <= _HEX:
            raise self.fail(f"an escape needs {count} hex digits")
        self.at += count
        return int(digits, 16)

    def unicode_escape(self) -> int:
        if self.peek() == "{":
            end = self.text.find("}", self.at)
            digits = self.text[self.at + 1 : end] if end > 0 else ""
            if not digits or len(digits) > 6 or not set(digits) <= _HEX:
                raise self.fail("\\u{...} needs 1 to 6 hex digits")
            value = int(digits, 16)
            self.at = end + 1
        else:
            value = self.hex_digits(4)
            if 0xD800 <= value <= 0xDBFF and self.text.startswith("\\u", self.at):
                low_at = self.at
                self.at += 2
                low = self.hex_digits(4)
                if 0xDC00 <= low <= 0xDFFF:
                    return 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00)
                self.at = low_at
        if value > _MAX_CODE_POINT or 0xD800 <= value <= 0xDFFF:
            raise self.fail("an escape names no Unicode scalar value (a lone surrogate?)")
        return value


def _single(code_point: int) -> Ranges:
    return ((code_point, code_point),)


# --- rendering -----------------------------------------------------------------------------------


def _char(code_point: int, in_class: bool, rust: bool) -> str:
    char = chr(code_point)
    if not in_class and char in _PLAIN:
        return char
    if not in_class and char in _META:
        return "\\" + char
    # RE2 reads \x{..}; jsonschema-rs checks a draft-7 pattern as ECMA-262, which reads \u{..}
    return f"\\u{{{code_point:X}}}" if rust else f"\\x{{{code_point:X}}}"


def _chars(ranges: Ranges, rust: bool) -> str:
    if not ranges:
        everything = f"{_char(0, True, rust)}-{_char(_MAX_CODE_POINT, True, rust)}"
        return f"[^{everything}]"  # matches nothing
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return _char(ranges[0][0], False, rust)
    parts = [
        _char(low, True, rust)
        if low == high
        else f"{_char(low, True, rust)}-{_char(high, True, rust)}"
        for low, high in ranges
    ]
    return "[" + "".join(parts) + "]"


def _render(alt: _Alt, rust: bool) -> str:
    return "|".join("".join(_render_term(t, rust) for t in branch) for branch in alt.branches)


def _render_term(term: _Term, rust: bool) -> str:
    if isinstance(term, _Chars):
        return _chars(term.ranges, rust)
    if isinstance(term, _Assert):
        if term.kind in ("^", "$"):
            return term.kind  # both engines: start / end of the text (no multi-line flag)
        boundary = "\\" + term.kind  # RE2: ASCII word boundary
        return f"(?-u:{boundary})" if rust else boundary  # Rust's own \b is Unicode
    if isinstance(term, _Group):
        return f"(?:{_render(term.body, rust)})"
    atom = _render_term(term.atom, rust)
    if (term.low, term.high) == (0, None):
        count = "*"
    elif (term.low, term.high) == (1, None):
        count = "+"
    elif (term.low, term.high) == (0, 1):
        count = "?"
    elif term.high is None:
        count = f"{{{term.low},}}"
    elif term.high == term.low:
        count = f"{{{term.low}}}"
    else:
        count = f"{{{term.low},{term.high}}}"
    return atom + count + ("?" if term.lazy else "")


def translate(pattern: str) -> Translation:
    """The pattern for RE2 and for Rust's `regex`, each meaning what ECMA-262 says."""
    parsed = _Parser(pattern).parse()
    rust = _render(parsed, rust=True)
    return Translation(_render(parsed, rust=False), rust, "(?-u:\\" in rust)


# --- the engines ---------------------------------------------------------------------------------


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is reported by `problem`, not on stderr
    options.never_capture = True  # only "is there a match" is ever asked
    return options


class Re2Search:
    """A compiled pattern whose `search(text)` answers in time linear in `text`.

    It has the shape fastjsonschema's generated code expects of a compiled regex
    (`REGEX_PATTERNS[key].search(value)`); the answer is a bool. The search goes straight to
    RE2's `Match` (about half the cost of the wrapper's `search`, which builds a match object
    callgate never reads); should a google-re2 release not offer it, the wrapper's `search`.
    """

    __slots__ = ("_match", "_search", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        try:
            compiled = re2.compile(translate(pattern).re2.encode(), _re2_options())
        except re2.error as exc:
            raise PatternRefused(f"RE2 cannot compile it: {_reason(exc)}") from None
        self._search = compiled.search
        match = getattr(getattr(compiled, "_regexp", None), "Match", None)
        self._match = match if _UNANCHORED is not None else None

    def search(self, text: str) -> bool:
        try:
            encoded = text.encode()
        except UnicodeEncodeError:  # a lone surrogate: match it as U+FFFD, as `.` would
            encoded = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()
        if self._match is not None:
            return bool(self._match(_UNANCHORED, encoded, 0, len(encoded))[0][0] >= 0)
        return self._search(encoded) is not None


_UNANCHORED = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)


def _reason(exc: BaseException) -> str:
    text = exc.args[0] if exc.args else exc
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return str(text).splitlines()[0] if str(text) else type(exc).__name__


def rust_error(rendered: str, draft: Draft) -> str | None:
    """Why jsonschema-rs (Rust `regex`, linear time) refuses a rendered pattern in a schema of
    `draft` (a draft-7 schema's patterns must also pass its meta-schema's `format: regex`)."""
    try:
        if draft is Draft.DRAFT7:
            jsonschema_rs.Draft7Validator(
                {"$schema": schema_uri(draft), "pattern": rendered},
                pattern_options=jsonschema_rs.RegexOptions(),
            )
        else:
            jsonschema_rs.Draft202012Validator(
                {"pattern": rendered}, pattern_options=jsonschema_rs.RegexOptions()
            )
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        return _reason(exc)
    return None


def problem(pattern: str, draft: Draft) -> str | None:
    """None when both engines match the pattern in linear time with its ECMA-262 meaning."""
    try:
        translation = translate(pattern)
        Re2Search(pattern)
    except PatternRefused as exc:
        return str(exc)
    except RecursionError:
        return "it nests too deeply"
    if translation.word_boundary and draft is Draft.DRAFT7:
        return (
            "jsonschema-rs's draft-7 meta-schema check accepts no word boundary (\\b, \\B) "
            "with ECMA-262's ASCII meaning; use a draft 2020-12 schema for it"
        )
    reason = rust_error(translation.rust, draft)
    return None if reason is None else f"the Rust regex engine cannot compile it: {reason}"
