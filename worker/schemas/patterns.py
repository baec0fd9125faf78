"""Schema `pattern`s meet model-controlled strings: compile them safely, translate, refuse ReDoS.

Three jobs, all done once at load:

* `python_error(pattern)`: why Python's `re` cannot compile a pattern (None when it can). Every
  engine refuses such a pattern, so a contract means the same on both engines.
* `to_python(pattern)`: the pattern rewritten so Python's `re` (fastjsonschema's matcher) reads it
  as ECMA-262 does: `$` is the end of the string (`\\Z`; Python's `$` also matches before a final
  newline), `.` excludes the ECMA line terminators, `\\d \\w \\b` are ASCII (`(?a)`), a `[` inside a
  class is literal, and `[]` / `[^]` mean "nothing" / "anything". Without it `^[a-z]+$` would
  silently accept `"abc\\n"`.
* `backtracking_risk(pattern)`: the ReDoS guard. Python's `re` backtracks, so `^(a+)+$` on
  `"a"*40 + "!"` takes exponential time. The guard is a load-time check on the parsed pattern: a
  quantifier (max > 1) whose body holds another quantifier (max > 1) — star height above one — or
  an alternation whose branches may start with the same character inside an unbounded quantifier,
  is refused for the backtracking engine (fastjsonschema) with the pattern's JSON Pointer. The
  jsonschema-rs engine compiles patterns with the Rust `regex` crate (linear time, no
  backreferences or lookaround: those are refused at load there), so it accepts `^(a+)+$` and its
  verdict on a long non-matching string still comes back in microseconds. Polynomial backtracking
  (`.*a.*a.*b`) is not refused; the size limit on arguments bounds it.
"""

from __future__ import annotations

import importlib
import re
import warnings
from typing import Any

_parser: Any = importlib.import_module("re._parser")
_constants: Any = importlib.import_module("re._constants")

_REPEATS = frozenset(
    {_constants.MAX_REPEAT, _constants.MIN_REPEAT, getattr(_constants, "POSSESSIVE_REPEAT", None)}
    - {None}
)
_UNBOUNDED = _constants.MAXREPEAT


def python_error(pattern: str) -> str | None:
    """None when Python's `re` compiles the pattern, else the compiler's reason."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        return str(exc)
    return None


def to_python(pattern: str) -> str:
    """The ECMA-262 pattern as Python's `re` must be given it to mean the same (see module doc)."""
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


def backtracking_risk(pattern: str) -> str | None:
    """Why a backtracking matcher could take exponential time here (None: no risk seen)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = _parser.parse(pattern)
    except (re.error, OverflowError, RecursionError):
        return None  # python_error() reports it
    return _scan(list(parsed))


#: A character set as inclusive code point ranges; None means "cannot tell: maybe anything".
_Chars = list[tuple[int, int]] | None

_CATEGORIES: dict[Any, list[tuple[int, int]]] = {
    _constants.CATEGORY_DIGIT: [(48, 57)],
    _constants.CATEGORY_WORD: [(48, 57), (65, 90), (95, 95), (97, 122)],
    _constants.CATEGORY_SPACE: [(9, 13), (32, 32)],
}


def _scan(items: list[Any]) -> str | None:
    for op, av in items:
        if op in _REPEATS:
            high, body = av[1], list(av[2])
            if high == _UNBOUNDED or high > 1:
                if _nested_risk(body):
                    return "nested quantifiers that can split the same text many ways"
                if high == _UNBOUNDED and _branch_overlap(body):
                    return "a repeated alternation whose branches can match the same text"
            found = _scan(body)
        elif op is _constants.SUBPATTERN:
            found = _scan(list(av[3]))
        elif op is _constants.BRANCH:
            found = next((f for b in av[1] if (f := _scan(list(b)))), None)
        elif op in (_constants.ASSERT, _constants.ASSERT_NOT):
            found = _scan(list(av[1]))
        else:
            found = None  # atoms; an atomic group never backtracks into itself
        if found:
            return found
    return None


def _flatten(items: list[Any]) -> list[Any]:
    """A sequence with its plain groups opened, so `((a)b)` reads as `a b`."""
    flat: list[Any] = []
    for op, av in items:
        if op is _constants.SUBPATTERN:
            flat.extend(_flatten(list(av[3])))
        else:
            flat.append((op, av))
    return flat


def _inner_repeats(items: list[Any]) -> list[list[Any]]:
    """The bodies of every quantifier (max > 1) anywhere inside a sequence."""
    found: list[list[Any]] = []
    for op, av in items:
        if op in _REPEATS:
            if av[1] == _UNBOUNDED or av[1] > 1:
                found.append(list(av[2]))
            found.extend(_inner_repeats(list(av[2])))
        elif op is _constants.SUBPATTERN:
            found.extend(_inner_repeats(list(av[3])))
        elif op is _constants.BRANCH:
            for branch in av[1]:
                found.extend(_inner_repeats(list(branch)))
    return found


def _nested_risk(body: list[Any]) -> bool:
    """A repeated body holding a repeat is safe only when a mandatory character of the body can
    never be one the inner repeat consumes: it then marks where each iteration ends."""
    separators = [_atom_chars(op, av) for op, av in _flatten(body) if _is_atom(op)]
    for inner in _inner_repeats(body):
        consumed = _chars_of(inner)
        if not any(_disjoint(sep, consumed) for sep in separators):
            return True
    return False


def _branch_overlap(body: list[Any]) -> bool:
    for op, av in _flatten(body):
        if op is _constants.BRANCH:
            firsts = [_first_chars(list(b)) for b in av[1]]
            for i, left in enumerate(firsts):
                if any(not _disjoint(left, right) for right in firsts[i + 1 :]):
                    return True
    return False


def _is_atom(op: Any) -> bool:
    return op in (_constants.LITERAL, _constants.IN, _constants.NOT_LITERAL, _constants.ANY)


def _atom_chars(op: Any, av: Any) -> _Chars:
    if op is _constants.LITERAL:
        return [(av, av)]
    if op is _constants.IN:
        ranges: list[tuple[int, int]] = []
        for item_op, item_av in av:
            if item_op is _constants.LITERAL:
                ranges.append((item_av, item_av))
            elif item_op is _constants.RANGE:
                ranges.append(item_av)
            elif item_op is _constants.CATEGORY and item_av in _CATEGORIES:
                ranges.extend(_CATEGORIES[item_av])
            else:
                return None  # negated set or an unknown category
        return ranges
    return None


def _chars_of(items: list[Any]) -> _Chars:
    """Every character a sequence may consume (None: cannot tell)."""
    ranges: list[tuple[int, int]] = []
    for op, av in items:
        if _is_atom(op):
            chars = _atom_chars(op, av)
        elif op in _REPEATS:
            chars = _chars_of(list(av[2]))
        elif op is _constants.SUBPATTERN:
            chars = _chars_of(list(av[3]))
        elif op is _constants.BRANCH:
            chars = []
            for branch in av[1]:
                part = _chars_of(list(branch))
                if part is None:
                    return None
                chars.extend(part)
        elif op is _constants.AT:
            chars = []
        else:
            return None
        if chars is None:
            return None
        ranges.extend(chars)
    return ranges


def _first_chars(items: list[Any]) -> _Chars:
    flat = _flatten(items)
    if not flat:
        return None
    op, av = flat[0]
    return _atom_chars(op, av) if _is_atom(op) else None


def _disjoint(left: _Chars, right: _Chars) -> bool:
    if left is None or right is None:
        return False
    return all(a_hi < b_lo or b_hi < a_lo for a_lo, a_hi in left for b_lo, b_hi in right)
