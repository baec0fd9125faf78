"""The rule for numbers, written again from the README with Python's `decimal` and `fractions`,
and generators of numbers around the double and 64-bit boundaries, in every JSON spelling.

The rule (README, "A number means one thing"): a JSON number is its exact decimal value. An
integer value within [-2^63, 2^64-1] is an exact integer, however it is spelt; any other value
is admitted only when it is the shortest round-trip decimal of a finite double (then it is that
double); everything else is refused, `inexact_number`. `admitted` is that rule, on the text.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

from hypothesis import strategies as st

LOW, HIGH = -(2**63), 2**64 - 1
INEXACT = "inexact_number"


def admitted(text: str) -> int | float | None:
    """What the rule makes of a JSON number text: its int, its float, or None (refused)."""
    value = Decimal(text)  # exact, whatever the digits and the exponent
    if value.is_zero():
        return 0
    if value.adjusted() > 20:  # at least 10^21: no 64-bit integer, and no room for a fraction
        return None
    if value == value.to_integral_value():
        whole = int(value)
        return whole if LOW <= whole <= HIGH else None
    if value.adjusted() < -400:
        return None
    double = float(value)  # correctly rounded
    return double if math.isfinite(double) and Decimal(repr(double)) == value else None


def exact(number: int | float) -> Fraction:
    """The exact value an admitted number stands for."""
    return Fraction(number) if isinstance(number, int) else Fraction(Decimal(repr(number)))


def spellings(value: Decimal) -> list[str]:
    """JSON texts of exactly `value`: integer digits, fractions with trailing zeros, exponents
    with either letter, a sign or leading zeros, mantissas shifted left and right."""
    sign = "-" if value.is_signed() and not value.is_zero() else ""
    digits_tuple, exponent = value.as_tuple().digits, value.as_tuple().exponent
    assert isinstance(exponent, int)
    digits = "".join(map(str, digits_tuple)).lstrip("0")
    if not digits:
        return [sign + text for text in ("0", "0.0", "0e0", "0.000E+5", "0e-400")]
    out: list[str] = []
    # value = digits * 10**exponent
    if exponent >= 0 and len(digits) + exponent <= 400:
        plain = digits + "0" * exponent
        out += [plain, plain + ".0", plain + ".000"]
    elif exponent < 0 and -exponent <= 400:
        whole, fraction = digits[:exponent] or "0", digits[exponent:].rjust(-exponent, "0")
        out += [f"{whole}.{fraction}", f"{whole}.{fraction}00"]
    scientific = len(digits) - 1 + exponent
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    out += [
        f"{mantissa}e{scientific}",
        f"{mantissa}E+{scientific}" if scientific >= 0 else f"{mantissa}E{scientific}",
        f"{digits}e{exponent}",
        f"{digits}00e{exponent - 2}",
        f"0.{digits}e{scientific + 1}",
        f"{mantissa if '.' in mantissa else mantissa + '.'}0e{scientific:+03d}".replace("+", ""),
    ]
    if len(digits) > 1:
        out.append(f"{digits[:2]}.{digits[2:] or '0'}e{scientific - 1}")
    return [sign + text for text in out]


def _doubles_near(anchor: float) -> list[float]:
    below, above = anchor, anchor
    found = [anchor]
    for _ in range(3):
        below, above = math.nextafter(below, -math.inf), math.nextafter(above, math.inf)
        found += [below, above]
    return [d for d in found if math.isfinite(d)]


#: Doubles at the boundaries that matter: 2^53, 2^63, 2^64, the extremes of the range.
_ANCHORS = [
    0.1,
    0.3,
    1.0,
    2.0**53,
    2.0**63,
    2.0**64,
    1e16,
    1e17,
    1e21,
    1e28,
    1e300,
    1.7976931348623157e308,
    2.2250738585072014e-308,
    5e-324,
]
_INTEGERS = [0, 1, 2**53, 2**63, 2**64, 10**17, 10**19, 10**20, 3 * 10**28]


@st.composite
def number_values(draw: st.DrawFn) -> Decimal:
    """An exact decimal value near a boundary: an integer near 2^53, 2^63 or 2^64 (or a large
    power of ten), a double near an anchor or any double, that double's shortest form with a
    digit more, or the exact midpoint of two neighbouring doubles; either sign."""
    kind = draw(st.sampled_from(["integer", "double", "longer", "midpoint", "digits"]))
    if kind == "integer":
        value = Decimal(draw(st.sampled_from(_INTEGERS)) + draw(st.integers(-3, 3)))
    elif kind == "digits":
        significand = draw(st.integers(1, 10**20))
        value = Decimal(significand).scaleb(draw(st.integers(-30, 10)))
    else:
        anchor = draw(st.sampled_from(_ANCHORS) | st.floats(allow_nan=False, allow_infinity=False))
        double = draw(st.sampled_from(_doubles_near(abs(anchor))))
        value = Decimal(repr(double))
        if kind == "longer":  # one more significant digit than the double's shortest form
            sign, digits, exponent = value.as_tuple()
            assert isinstance(exponent, int)
            value = Decimal((sign, (*digits, draw(st.integers(1, 9))), exponent - 1))
        elif kind == "midpoint":
            upper = math.nextafter(double, math.inf)
            if math.isfinite(upper):
                with localcontext() as exact_context:
                    exact_context.prec = 1200  # a double's exact decimal has at most 767 digits
                    value = (Decimal(double) + Decimal(upper)) / 2
    return value.copy_negate() if draw(st.booleans()) else value


@st.composite
def number_texts(draw: st.DrawFn) -> str:
    """A JSON number text: a value of `number_values` in one of its `spellings`."""
    return draw(st.sampled_from(spellings(draw(number_values()))))
