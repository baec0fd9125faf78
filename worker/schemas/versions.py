"""Schema versions: one parser for every version text, from a file name or from a call.

The contract layout names version N of a tool `<tool>.v<N>.schema.json`, so a version is what
that name can hold: ASCII digits, at most `MAX_VERSION_DIGITS` of them, read as a decimal number.
A call may say `"2"`, `"v2"`, `"v02"` or the integer 2; all mean version `"2"`, the canonical
form the registry keys its contracts by. Anything else (`"²"`, `"٢"`, `"+2"`, `" 2"`, `"-1"`,
5,000 digits, a float, a bool) is no version at all: `parse_version` returns None and never raises.
"""

from __future__ import annotations

#: Digits a version may have (leading zeros included): nine, so every one fits an int quickly.
MAX_VERSION_DIGITS = 9
_DIGITS = frozenset("0123456789")


def parse_version(raw: object) -> str | None:
    """The canonical decimal form of a version (`"v01"` -> `"1"`), or None for anything else."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return str(raw) if 0 <= raw < 10**MAX_VERSION_DIGITS else None
    if not isinstance(raw, str):
        return None
    digits = raw.removeprefix("v")
    if not 0 < len(digits) <= MAX_VERSION_DIGITS or not _DIGITS.issuperset(digits):
        return None
    return str(int(digits))
