"""Strict RFC 8259 parsing on top of orjson, with what orjson lets through closed off.

orjson already rejects NaN/Infinity literals, numbers that overflow a double, invalid UTF-8, lone
surrogate escapes and a byte-order mark. Two gaps remain, and this module closes them:

- duplicate keys: orjson keeps the last one. We count the object members in the text (every `:`
  outside a string separates a member) and compare with the keys in the parsed tree; only when the
  two differ (the rare, rejected case) do we re-parse slowly to find the duplicate's path.
- integer literals beyond 64 bits: orjson turns them into floats, silently losing digits (an
  `amount_minor` of 12345678901234567890123 would be rewritten). They are refused.

`scan(text)` measures the nesting depth outside strings, before any parse; `depth_over(text, limit)`
is the limits phase's check built on it, which scans only a text that could be too deep.

Speed (the hot path is valid text): both checks first run as a few C-speed byte operations and
fall back to the exact, slower walk only when the fast test cannot decide. Duplicates: every
literal `:` in the text is a member separator or sits inside a string, and orjson's re-encoding of
the tree has exactly one `:` per kept key plus the literal ones of the kept strings; without `\\u`
escapes, equal counts prove there is no duplicate. Long integers: a run of 19 digits anywhere
(strings included) sends the text to the exact search, which ignores strings.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from worker.model import Code

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_LONG_INTEGER = re.compile(rb"(?<![\d.eE+\-])-?\d{19,}(?![\d.eE])")
_NON_FINITE = re.compile(rb"\b(?:NaN|Infinity)\b")
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


@dataclass(frozen=True, slots=True)
class Scan:
    """What one pass over the raw bytes learned, before parsing."""

    depth: int


@dataclass(frozen=True, slots=True)
class ParseError:
    code: Code
    message: str
    path: str = ""


#: everything but the bytes that delimit strings and containers, deleted by `bytes.translate`
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))
#: digits to "0", all else to "x": a run of 19 zeros is a run of 19 digits
_DIGITS_AS_ZERO = bytes(ord("0") if chr(b).isdigit() else ord("x") for b in range(256))
_NINETEEN_DIGITS = b"0" * 19
_FAST_DEPTH_PASSES = 64
_SQUARE = bytes.maketrans(b"{}", b"[]")


def _containers(text: bytes) -> bytes:
    """The brackets of `text` outside strings, every `}` and `{` written as `]` and `[`."""
    if b"\\" in text:  # escapes out of the way: `\\` pairs first, then escaped quotes
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = text.translate(_SQUARE, _NOT_STRUCTURE)
    if b'"' not in structure:
        return structure
    parts = structure.split(b'"')
    outside = parts[::2]
    if not len(parts) % 2:  # a string left open (truncated text): its brackets count
        outside.append(parts[-1])
    return b"".join(outside)


def scan(text: bytes) -> Scan:
    brackets = _containers(text)
    if not brackets:
        return Scan(0)
    # Each pass deletes the innermost pairs (the leaves): a balanced text empties after exactly
    # `depth` passes. Unbalanced or very deep text takes the linear walk instead.
    passes, rest = 0, brackets
    while rest and passes < _FAST_DEPTH_PASSES:
        shorter = rest.replace(b"[]", b"")
        if len(shorter) == len(rest):
            break
        rest, passes = shorter, passes + 1
    if not rest:
        return Scan(passes)
    depth = deepest = 0
    for byte in brackets:
        if byte == 91:  # "["
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return Scan(deepest)


def depth_over(text: bytes, limit: int) -> int | None:
    """The nesting depth of `text` when it is deeper than `limit`, else None.

    The limits phase's check. A text with no more than `limit` opening brackets (strings
    included) cannot nest deeper, and byte counts prove it; only a text with more is scanned.
    Braces are counted first: a text with many of them goes to the scan after one count.
    """
    braces = text.count(b"{")
    if braces <= limit and braces + text.count(b"[") <= limit:
        return None
    depth = scan(text).depth
    return depth if depth > limit else None


def parse(text: bytes) -> Any | ParseError:
    """Any JSON value, or the first reason the text is not strict JSON. Never raises."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return _classify(text, str(exc))
    if type(value) is dict or type(value) is list:
        if not _no_duplicates_fast(text, value):
            stripped = _STRING.sub(b"", text)
            if stripped.count(b":") != _count_keys(value):
                return _find_duplicate(text)
        if _NINETEEN_DIGITS in text.translate(_DIGITS_AS_ZERO) and _long_integer(text):
            return ParseError(
                Code.INVALID_JSON,
                "an integer is outside the 64-bit range and would lose precision",
            )
    elif len(text) >= 19 and _long_integer(text):
        return ParseError(
            Code.INVALID_JSON, "an integer is outside the 64-bit range and would lose precision"
        )
    return value


def _no_duplicates_fast(text: bytes, value: Any) -> bool:
    """True proves no object of `value` lost a duplicate key; False means: look closer."""
    if b"\\u" in text:
        return False
    try:
        encoded = orjson.dumps(value)
    except orjson.JSONEncodeError:  # deeper than orjson encodes: the walk decides
        return False
    return text.count(b":") == encoded.count(b":")


def _long_integer(text: bytes) -> bool:
    stripped = _STRING.sub(b"", text)
    for match in _LONG_INTEGER.finditer(stripped):
        if not _INT64_MIN <= int(match.group()) <= _UINT64_MAX:
            return True
    return False


def _count_keys(value: Any) -> int:
    """Keys in every object of the tree; iterative, so depth costs no recursion."""
    if type(value) is not dict and type(value) is not list:
        return 0
    keys = 0
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            keys += len(node)
            children: Any = node.values()
        else:
            children = node
        stack.extend(child for child in children if type(child) in _CONTAINERS)
    return keys


_CONTAINERS = (dict, list)


def _classify(text: bytes, message: str) -> ParseError:
    where = message[message.find(": line ") + 2 :] if ": line " in message else ""
    if "not valid UTF-8" in message:
        return ParseError(Code.INVALID_UTF8, f"the text is not valid UTF-8 ({where})")
    if "surrogate" in message:
        return ParseError(Code.INVALID_UTF8, f"a string holds a lone UTF-16 surrogate ({where})")
    if "infinity" in message or _NON_FINITE.search(_STRING.sub(b"", text)):
        return ParseError(Code.NON_FINITE_NUMBER, "NaN and Infinity are not JSON numbers")
    if not text.strip():
        return ParseError(Code.INVALID_JSON, "the text is empty")
    if "EOF" in message or "end of" in message:
        return ParseError(Code.INVALID_JSON, f"the text ends before the JSON value does ({where})")
    return ParseError(
        Code.INVALID_JSON, message.split(":", 1)[0] + (f" ({where})" if where else "")
    )


class _Flagged(dict[str, Any]):
    """An object that held a duplicate key (only built on the slow, already-rejected path)."""

    duplicate: str | None = None


def _find_duplicate(text: bytes) -> ParseError:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = _Flagged()
        for key, value in items:
            if key in obj and obj.duplicate is None:
                obj.duplicate = key
            obj[key] = value
        return obj

    def locate(value: Any, path: str) -> str | None:
        if isinstance(value, _Flagged):
            if value.duplicate is not None:
                return f"{path}/{_escape(value.duplicate)}"
            children: Any = ((f"{path}/{_escape(k)}", v) for k, v in value.items())
        elif isinstance(value, list):
            children = ((f"{path}/{i}", v) for i, v in enumerate(value))
        else:
            return None
        for child_path, child in children:
            found = locate(child, child_path)
            if found is not None:
                return found
        return None

    try:
        path = locate(json.loads(text, object_pairs_hook=pairs), "")
    except (ValueError, RecursionError):
        path = None
    return ParseError(Code.DUPLICATE_KEY, "an object has the same key twice", path=path or "")


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")
