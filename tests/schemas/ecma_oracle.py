"""The test oracle for pattern meaning: ECMA-262 as Python's `re` reads it after a rewrite.

`to_python` is the translation callgate used before patterns went to linear-time engines: `$` is
the end of the string, `.` excludes the ECMA line terminators, `\\d \\w \\b` are ASCII, a `[`
inside a class is literal, `[]` / `[^]` mean "nothing" / "anything". Python's `re` backtracks, so
it is only an oracle for patterns and strings too small to blow up, and it differs from ECMA on
`\\s` (ASCII only here) and on `{` that does not start a quantifier: the generators avoid both.
Python's `\\B` never matches in the empty string, where ECMA's always does (no word character on
either side): `ecma_search` reads it so for the empty text.
"""

from __future__ import annotations

import re
import warnings


def to_python(pattern: str) -> str:
    """The ECMA-262 pattern as Python's `re` must be given it to mean the same."""
    out: list[str] = ["(?a)"]
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        char = pattern[i]
        if char == "\\" and i + 1 < n:
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if char == "]":
                in_class = False
                out.append(char)
            elif char in "[$":
                out.append("\\" + char)
            else:
                out.append(char)
        elif char == "[":
            if pattern.startswith("[]", i):
                out.append("(?!)")
                i += 2
                continue
            if pattern.startswith("[^]", i):
                out.append("[\\s\\S]")
                i += 3
                continue
            in_class = True
            out.append(char)
            if pattern.startswith("[^", i):
                out.append("^")
                i += 1
        elif char == "$":
            out.append("\\Z")
        elif char == ".":
            out.append("[^\\n\\r\\u2028\\u2029]")
        else:
            out.append(char)
        i += 1
    return "".join(out)


def ecma_search(pattern: str, text: str) -> bool:
    """Whether ECMA-262 finds `pattern` in `text` (for small, well-behaved patterns)."""
    if text == "":
        pattern = pattern.replace("\\B", "(?:)")  # the generators never put a backslash before it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "possible set difference" and the like
        return re.search(to_python(pattern), text) is not None
