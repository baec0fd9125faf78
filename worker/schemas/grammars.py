"""A custom tool's declared input format, read from its contract and checked on each call.

OpenAI Responses declares a custom tool's free-form input as `format: {"type": "text"}` (any
text) or `format: {"type": "grammar", "syntax": "lark" | "regex", "definition": "..."}`. A
custom tool's contract (`x-callgate.call_kind: custom_tool_call`) may copy that declaration as
`x-callgate.format`; the call's text is then checked against it, after the contract's JSON
Schema has judged `{"input": <the text>}` (where `pattern`, `maxLength` and the rest apply).

- `regex`: the whole text must match the definition (the vendor's regex syntax is the Rust
  `regex` crate's, which RE2 reads alike). RE2 matches in time linear in the text, so a model's
  text never makes it backtrack; a definition RE2 cannot compile is refused at load.
- `lark`: refused at load, naming what to declare instead: a Lark grammar's meaning depends on
  its parser (Earley, LALR) and no parser callgate runs answers in linear time for every
  grammar, so the gate would either judge it differently from the vendor or slowly.
"""

from __future__ import annotations

from typing import Any

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

from worker.errors import SchemaLoadError
from worker.model import Violation
from worker.schemas.contract import InputCheck

#: the grammar syntaxes callgate checks
SYNTAXES = ("regex",)
_KEYS = {"text": {"type"}, "grammar": {"type", "syntax", "definition"}}


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False
    options.never_capture = True
    return options


class RegexGrammar:
    """A custom tool's `regex` grammar: the whole text matches it, decided in linear time."""

    __slots__ = ("_regexp",)

    def __init__(self, definition: str, file: str) -> None:
        try:
            self._regexp = re2.compile(definition.encode(), _options())
        except re2.error as exc:
            reason = str(exc.args[0] if exc.args else exc).splitlines()[0]
            raise SchemaLoadError(
                f"x-callgate.format: RE2 cannot compile the regex grammar: {reason}", file=file
            ) from None

    def __call__(self, text: str) -> Violation | None:
        try:
            encoded = text.encode()
        except UnicodeEncodeError:  # a lone surrogate is no text the vendor's grammar allows
            encoded = None
        if encoded is not None and self._regexp.fullmatch(encoded) is not None:
            return None
        return Violation("/input", "grammar", "the input does not match the tool's grammar")


def input_check(declared: Any, file: str) -> InputCheck | None:
    """The check of a custom tool's `x-callgate.format` (None: any text), or `SchemaLoadError`
    saying what is wrong with the declaration."""
    if declared is None:
        return None
    if not isinstance(declared, dict) or declared.get("type") not in _KEYS:
        raise SchemaLoadError(
            'x-callgate.format must be {"type": "text"} or '
            '{"type": "grammar", "syntax": "regex", "definition": "..."}',
            file=file,
        )
    unknown = set(declared) - _KEYS[declared["type"]]
    if unknown:
        raise SchemaLoadError(f"x-callgate.format has unknown keys {sorted(unknown)}", file=file)
    if declared["type"] == "text":
        return None
    syntax, definition = declared.get("syntax"), declared.get("definition")
    if syntax == "lark":
        raise SchemaLoadError(
            "x-callgate.format: a Lark grammar is not checked by callgate (no parser it runs "
            "decides every Lark grammar as the vendor does, in linear time); declare the "
            'input as a regex grammar ("syntax": "regex") or a JSON Schema pattern on /input',
            file=file,
        )
    if syntax not in SYNTAXES:
        raise SchemaLoadError(
            f"x-callgate.format: unknown grammar syntax {syntax!r}; callgate checks "
            f"{', '.join(SYNTAXES)}",
            file=file,
        )
    if not isinstance(definition, str) or not definition:
        raise SchemaLoadError("x-callgate.format.definition must be a non-empty string", file=file)
    return RegexGrammar(definition, file)
