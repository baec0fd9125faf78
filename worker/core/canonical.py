"""RFC 8785 (JSON Canonicalization Scheme) form of a request, and its digest.

Two requests are the same when their canonical forms are equal: object members sorted by the
UTF-16 code units of their names, no insignificant whitespace, strings with the minimal escapes,
numbers in the shortest form that reads back as the same double (ECMAScript's
`Number.prototype.toString`).

One deliberate departure: an integer is written exactly, digit for digit. RFC 8785 reads every
number as a double, so 9007199254740993 and 9007199254740992 would be one request; for an
`amount_minor` that would turn a conflict into a duplicate. callgate's parser only lets integers
of 64 bits through, so every integer has one exact form.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from worker.model import SchemaRef

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def canonical(value: Any) -> str:
    """The RFC 8785 text of a JSON value (dict, list, str, int, float, bool, None)."""
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def scoped_key(principal: str | None, key: str) -> str:
    """What an idempotency key is remembered, routed and executed under: the key within its
    principal's scope (calls naming no principal share one scope of their own). Two calls share a
    key only when they name the same principal and the same key; so no principal can block,
    take over or learn of another's call by its key. The canonical form of `[principal, key]`:
    one text per pair, no two pairs alike."""
    return canonical([principal, key])


def request_digest(schema: SchemaRef, arguments: Any) -> bytes:
    """What an idempotency key is compared by: the tool, its schema version and the arguments."""
    text = canonical([schema.id, schema.version, arguments])
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def _write(value: Any, parts: list[str]) -> None:
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif type(value) is int:
        parts.append(str(value))
    elif type(value) is float:
        parts.append(_number(value))
    elif type(value) is str:
        parts.append(_string(value))
    elif type(value) is list:
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _write(item, parts)
        parts.append("]")
    elif type(value) is dict:
        parts.append("{")
        for index, name in enumerate(sorted(value, key=_utf16_units)):
            if index:
                parts.append(",")
            parts.append(_string(name))
            parts.append(":")
            _write(value[name], parts)
        parts.append("}")
    else:
        raise TypeError(f"not a JSON value: {type(value).__name__}")


def _utf16_units(name: str) -> bytes:
    return name.encode("utf-16-be", "surrogatepass")


def _string(text: str) -> str:
    out = ['"']
    for char in text:
        escaped = _ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
        elif char < " ":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _number(value: float) -> str:
    """ECMAScript's Number::toString for a finite double."""
    if not math.isfinite(value):
        raise ValueError("NaN and Infinity are not JSON numbers")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    digits, exponent = _shortest(abs(value))
    # the value is 0.d1d2...dk * 10**exponent, as ECMAScript's n = exponent, k = len(digits)
    k, n = len(digits), exponent
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{sign}{mantissa}e{'+' if e > 0 else '-'}{abs(e)}"


def _shortest(value: float) -> tuple[str, int]:
    """The shortest digits that read back as `value`, and n with value = 0.digits * 10**n."""
    mantissa, _, exponent = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    fraction = fraction.rstrip("0")
    digits = (whole + fraction).lstrip("0")
    point = len(whole) + (int(exponent) if exponent else 0)
    leading_zeros = len(whole + fraction) - len((whole + fraction).lstrip("0"))
    return digits.rstrip("0") or "0", point - leading_zeros
