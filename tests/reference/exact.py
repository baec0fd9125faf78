"""Exact JSON for the reference judge: a strict reader, a value equality and a schema check.

Written from the README's rules ("Strict JSON everywhere", "The chain"), not from the gate's
code, and slow on purpose: a recursive-descent reader over code points that reports the first
fault in document order, numbers kept as exact `Decimal`s (never a double), and the schema
check done by the `jsonschema` package on those exact values (integers and bounds compared as
decimals, `multipleOf` as an exact remainder).

Faults, as the README names them: `invalid_json` (not RFC 8259 JSON), `inexact_number` (a number
that is neither an integer within [-2^63, 2^64-1] nor the shortest decimal of a double),
`duplicate_key` (a key twice in one object, at any
depth), `non_finite_number` (NaN, Infinity), `invalid_utf8` (bytes that are not UTF-8, a lone
surrogate escape). Nesting deeper than the bound is `too_deep`.
"""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import jsonschema
from jsonschema import validators

#: every JSON text callgate reads nests at most this deep (README, "Everything is bounded")
MAX_NESTING = 254

#: enough digits that no comparison or remainder the tests make is ever rounded
EXACT = decimal.Context(prec=10_000, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)

_DOUBLE_MAX = Decimal("1.7976931348623157e308")
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_WHITESPACE = " \t\n\r"
#: RFC 8259's number grammar
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class Fault(Exception):
    """Why a text is not the JSON the README admits: `code` is the event's error code."""

    def __init__(self, code: str, where: int) -> None:
        super().__init__(f"{code} at {where}")
        self.code = code
        self.where = where


def read(
    data: str | bytes,
    *,
    max_depth: int = MAX_NESTING,
    bounded: bool = True,
) -> Any:
    """The exact value of one JSON text (objects as dicts, numbers as `Decimal`); raises
    `Fault` at the first thing the README refuses, in document order. `bounded=False` reads
    every number exactly, whatever its size (to judge what a gate let through)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Fault("invalid_utf8", exc.start) from None
    reader = _Reader(data, max_depth, bounded)
    reader.skip()
    value = reader.value(1)
    reader.skip()
    if reader.at < len(data):
        raise Fault("invalid_json", reader.at)
    return value


def depth(value: Any) -> int:
    """How many containers deep a value nests (a scalar: 0, `{}`: 1)."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def _outside_strings(text: str) -> Iterator[tuple[str, bool]]:
    """Each character of `text` (valid JSON or not), and whether it is outside every string."""
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            yield ch, False
        else:
            in_string = ch == '"'
            yield ch, not in_string


def respelt(text: str) -> bool:
    """Whether the gate writes arguments of this text again instead of passing it on as it came
    (README, "Strict JSON everywhere"): it holds an integer past 2^53 (which an ordinary reader
    reads as a double, another number, when it is spelt with a fraction or an exponent)."""
    blanked = "".join(ch if outside else " " for ch, outside in _outside_strings(text))
    for match in _NUMBER.finditer(blanked):
        value = EXACT.create_decimal(match.group())
        if EXACT.remainder(value, 1) == 0 and EXACT.abs(value) > 2**53:
            return True
    return False


def ordinary(data: str | bytes) -> Any:
    """A JSON text as an ordinary reader reads it (Python's `json`, as orjson and pydantic do):
    an integer's digits as that integer, any other number as the double nearest it; numbers
    as `Decimal`s (a double as its shortest form), to compare with `equal`."""
    return json.loads(data, parse_float=lambda text: Decimal(repr(float(text))))


def text_depth(text: str) -> int:
    """The deepest nesting of brackets outside strings in `text` (valid JSON or not)."""
    deepest = level = 0
    for ch, outside in _outside_strings(text):
        if outside and ch in "[{":
            level += 1
            deepest = max(deepest, level)
        elif outside and ch in "]}":
            level -= 1
    return deepest


def compact(text: str) -> str:
    """`text` (one JSON text) without its insignificant whitespace: every string (escapes and
    all) and number text as it is, only the whitespace between tokens gone (README: accepted
    arguments are embedded so, in `check` and on Kafka alike)."""
    return "".join(
        ch for ch, outside in _outside_strings(text) if not (outside and ch in _WHITESPACE)
    )


class _Reader:
    def __init__(self, text: str, max_depth: int, bounded: bool) -> None:
        self.bounded = bounded
        self.text = text
        self.at = 0
        self.max_depth = max_depth

    def fail(self, code: str = "invalid_json") -> Fault:
        return Fault(code, self.at)

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in _WHITESPACE:
            self.at += 1

    def literal(self, word: str, value: Any) -> Any:
        if self.text.startswith(word, self.at):
            self.at += len(word)
            return value
        raise self.fail()

    def value(self, level: int) -> Any:
        ch = self.peek()
        if ch == "{":
            return self.object(level)
        if ch == "[":
            return self.array(level)
        if ch == '"':
            return self.string()
        if ch == "t":
            return self.literal("true", True)
        if ch == "f":
            return self.literal("false", False)
        if ch == "n":
            return self.literal("null", None)
        for word in ("NaN", "Infinity", "-Infinity"):
            if self.text.startswith(word, self.at):
                raise self.fail("non_finite_number")
        if ch == "-" or ch.isdigit():
            return self.number()
        raise self.fail()

    def items(self, level: int, close: str, item: Callable[[], None]) -> None:
        """A container's items, each read by `item`, separated by commas, up to `close`."""
        if level > self.max_depth:
            raise self.fail("too_deep")
        self.at += 1
        self.skip()
        if self.peek() == close:
            self.at += 1
            return
        while True:
            item()
            self.skip()
            ch = self.peek()
            if ch == close:
                self.at += 1
                return
            if ch != ",":
                raise self.fail()
            self.at += 1
            self.skip()

    def object(self, level: int) -> dict[str, Any]:
        members: dict[str, Any] = {}

        def member() -> None:
            if self.peek() != '"':
                raise self.fail()
            start = self.at
            key = self.string()
            self.skip()
            if self.peek() != ":":
                raise self.fail()
            self.at += 1
            self.skip()
            value = self.value(level + 1)
            if key in members:  # a member twice: a fault once the second member is whole
                raise Fault("duplicate_key", start)
            members[key] = value

        self.items(level, "}", member)
        return members

    def array(self, level: int) -> list[Any]:
        values: list[Any] = []
        self.items(level, "]", lambda: values.append(self.value(level + 1)))
        return values

    def string(self) -> str:
        self.at += 1  # the opening quote
        out: list[str] = []
        text = self.text
        while True:
            if self.at >= len(text):
                raise self.fail()
            ch = text[self.at]
            if ch == '"':
                self.at += 1
                return "".join(out)
            if ord(ch) < 0x20:
                raise self.fail()
            if 0xD800 <= ord(ch) <= 0xDFFF:  # a str made from bytes never holds one
                raise self.fail("invalid_utf8")
            if ch != "\\":
                out.append(ch)
                self.at += 1
                continue
            escape = text[self.at + 1 : self.at + 2]
            if escape in _ESCAPES:
                out.append(_ESCAPES[escape])
                self.at += 2
                continue
            if escape != "u":
                raise self.fail()
            unit = self.unit(self.at + 2)
            self.at += 6
            if 0xD800 <= unit <= 0xDBFF:  # a high surrogate: its low half must follow
                if text[self.at : self.at + 2] != "\\u":
                    raise self.fail("invalid_utf8")
                low = self.unit(self.at + 2)
                if not 0xDC00 <= low <= 0xDFFF:
                    raise self.fail("invalid_utf8")
                self.at += 6
                out.append(chr(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)))
            elif 0xDC00 <= unit <= 0xDFFF:
                raise self.fail("invalid_utf8")
            else:
                out.append(chr(unit))

    def unit(self, at: int) -> int:
        digits = self.text[at : at + 4]
        if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
            self.at = at
            raise self.fail()
        return int(digits, 16)

    def number(self) -> Decimal:
        start = self.at
        match = _NUMBER.match(self.text, start)
        if match is None:
            raise self.fail()
        spelled = match.group()
        self.at = match.end()
        # silent: a number is judged once its token is whole, as a key twice is once its member
        # is: a fraction or an exponent begun and not finished (`1e-`, `2.`) is invalid_json
        follows = self.peek()
        exponent = "e" in spelled or "E" in spelled
        if (follows == "." and "." not in spelled and not exponent) or (
            follows in ("e", "E") and not exponent
        ):
            raise self.fail()
        value = EXACT.create_decimal(spelled)
        if not self.bounded:
            return value
        # README, "Strict JSON everywhere": an integer value within 64 bits however spelt, else
        # only the shortest decimal that reads back as a double (Python's repr), or inexact_number
        if value.is_zero():
            return value
        if EXACT.abs(value) > _DOUBLE_MAX or value.adjusted() < -400:
            raise Fault("inexact_number", start)
        if EXACT.remainder(value, 1) == 0:
            if not _INT_MIN <= int(value) <= _INT_MAX:
                raise Fault("inexact_number", start)
            return value
        if Decimal(repr(float(value))) != value:
            raise Fault("inexact_number", start)
        return value


# -- equality -----------------------------------------------------------------------------------


def equal(a: Any, b: Any) -> bool:
    """JSON value equality: numbers by exact value (1 == 1.0 == 1e0), booleans never numbers,
    objects by members whatever their order."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (Decimal, int)) and isinstance(b, (Decimal, int)):
        return EXACT.compare(Decimal(a), Decimal(b)) == 0
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# -- schemas ------------------------------------------------------------------------------------


def _is_number(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, (Decimal, int)) and not isinstance(instance, bool)


def _is_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema: an integer is a number with a zero fractional part, however it is spelled
    return _is_number(checker, instance) and EXACT.remainder(Decimal(instance), 1) == 0


def _multiple_of(_validator: Any, divisor: Any, instance: Any, _schema: Any) -> Any:
    if not _is_number(None, instance):
        return
    if EXACT.remainder(Decimal(instance), Decimal(divisor)) != 0:
        yield jsonschema.ValidationError(f"{instance} is not a multiple of {divisor}")


def validator(schema: dict[str, Any]) -> Any:
    """A validator of `schema` (read with `read`, so its numbers are exact) that judges exact
    values: its draft's keywords, with number types and `multipleOf` on decimals. `format` is
    an annotation, as the README says."""
    base = validators.validator_for(schema)
    checker = base.TYPE_CHECKER.redefine_many({"number": _is_number, "integer": _is_integer})
    exact = validators.extend(base, {"multipleOf": _multiple_of}, type_checker=checker)
    return exact(schema)


def errors(schema_validator: Any, instance: Any) -> list[str]:
    """The paths (JSON Pointers) `instance` violates `schema_validator` at; empty: valid."""
    with decimal.localcontext(EXACT):
        return sorted(
            "".join(f"/{p}" for p in error.absolute_path)
            for error in schema_validator.iter_errors(instance)
        )
