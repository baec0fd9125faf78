"""Keywords callgate judges itself: one implementation, handed to both engines.

Where fastjsonschema and jsonschema-rs would judge a keyword differently from each other, or
from its meaning, the keyword is implemented once here and both engines call it:
fastjsonschema through its code generator (`Draft7Generator`, whose generated code calls the
functions in `GENERATED_CODE_NAMES`), jsonschema-rs as a custom keyword (`rs_keywords`). So the
engines agree on these by construction, and a violation reads the same from either.

* `multipleOf`, exactly (`is_multiple`). Every number callgate judges is an exact decimal: an
  `int`, or a `float` that stands for the decimal of its shortest round-trip form (`exact`),
  which is what the strict parser admits (see the README's rule for numbers). fastjsonschema
  divides through a float or a 28-digit `Decimal` and jsonschema-rs through a double: each
  misjudges some (`1e28` against 3, `1` against `3e-30`, `1` against `5e-324`).
* draft 7 `contentEncoding` and `contentMediaType`, which draft 7 lets an engine assert and both
  engines do, differently: fastjsonschema decodes base64 leniently (`"!!!"` passes) and reads
  JSON with Python's lenient `json`. Here `base64` (any case) means RFC 4648 base64 with its
  padding and nothing else, and `application/json` (any case, without parameters) means strict
  JSON by callgate's own parser, of the decoded bytes when the encoding is base64. Any other
  encoding or media type is not asserted, by either engine. In 2020-12 both are annotations.
"""

from __future__ import annotations

import binascii
from base64 import b64decode
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from fastjsonschema import draft07

from worker._native import ParseError, parse_json
from worker.schemas.contract import MAX_DOCUMENT_DEPTH
from worker.schemas.drafts import Draft
from worker.schemas.messages import describe

if TYPE_CHECKING:
    from jsonschema_rs import KeywordValidator

_JSON = "application/json"
_BASE64 = "base64"


def exact(number: int | float) -> Fraction:
    """The exact decimal a JSON number stands for: an int as it is, a float as the decimal of its
    shortest round-trip form (`repr`), which the parser guarantees was the number's text."""
    return Fraction(number) if type(number) is int else Fraction(repr(number))


def is_multiple(value: Any, step: int | float) -> bool:
    """Whether `value` is an integer multiple of `step`, exactly; True for anything not a number
    (`multipleOf` constrains numbers only)."""
    kind = type(value)
    if kind is int:
        if type(step) is int:
            return bool(value % step == 0)
    elif kind is not float:
        return True
    return (exact(value) / exact(step)).denominator == 1


def _media_is_json(media_type: Any) -> bool:
    return isinstance(media_type, str) and media_type.split(";")[0].strip().lower() == _JSON


def _encoding_is_base64(encoding: Any) -> bool:
    return isinstance(encoding, str) and encoding.lower() == _BASE64


def _base64(text: str) -> bytes | None:
    try:
        return b64decode(text, validate=True)
    except (binascii.Error, ValueError):  # ValueError: a non-ASCII character
        return None


def content_encoding_ok(value: Any, encoding: Any) -> bool:
    """Draft 7 `contentEncoding`: a string is valid base64 when the encoding is base64."""
    return not (isinstance(value, str) and _encoding_is_base64(encoding)) or (
        _base64(value) is not None
    )


def content_media_type_ok(value: Any, media_type: Any, encoding: Any) -> bool:
    """Draft 7 `contentMediaType`: a string is strict JSON when the media type is JSON (its
    base64-decoded bytes when the encoding is base64; content that does not decode is
    `contentEncoding`'s failure, not this keyword's)."""
    if not (isinstance(value, str) and _media_is_json(media_type)):
        return True
    if _encoding_is_base64(encoding):
        content = _base64(value)
        if content is None:
            return True
    else:
        try:
            content = value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: not text, so not JSON text
            return False
    return not isinstance(parse_json(content, MAX_DOCUMENT_DEPTH), ParseError)


# --- fastjsonschema: its code generator, calling the functions above -------------------------

#: The names the generated code calls, put into its globals before it runs.
GENERATED_CODE_NAMES: dict[str, Any] = {
    "callgate_multiple_of": is_multiple,
    "callgate_content_encoding": content_encoding_ok,
    "callgate_content_media_type": content_media_type_ok,
}


#: fastjsonschema's own draft-7 code generator (untyped)
_FASTJSONSCHEMA_DRAFT7: Any = draft07.CodeGeneratorDraft07


class Draft7Generator(_FASTJSONSCHEMA_DRAFT7):  # type: ignore[misc]
    """fastjsonschema's draft-7 code generator with this module's keywords."""

    def generate_multiple_of(self) -> None:
        step = self._definition["multipleOf"]
        with self.l("if not callgate_multiple_of({variable}, {}):", repr(step)):
            self.exc("{name} must be multiple of {multipleOf}", rule="multipleOf")

    def generate_content_encoding(self) -> None:
        encoding = self._definition["contentEncoding"]
        with self.l("if not callgate_content_encoding({variable}, {}):", repr(encoding)):
            self.exc("{name} must be encoded by base64", rule="contentEncoding")

    def generate_content_media_type(self) -> None:
        media_type = self._definition["contentMediaType"]
        encoding = self._definition.get("contentEncoding")
        with self.l(
            "if not callgate_content_media_type({variable}, {}, {}):",
            repr(media_type),
            repr(encoding),
        ):
            self.exc("{name} must be valid JSON", rule="contentMediaType")


# --- jsonschema-rs: custom keywords ------------------------------------------------------------


class _RsKeyword:
    """A jsonschema-rs custom keyword: raises a value-free message (the keyword's own, from
    `worker.schemas.messages`) when the instance fails it."""

    keyword = ""

    def __init__(self, parent_schema: dict[str, Any], value: Any, schema_path: Any) -> None:
        self.parent = parent_schema
        self.value = value
        self.message = describe(self.keyword, value)

    def holds(self, instance: Any) -> bool:
        raise NotImplementedError

    def validate(self, instance: Any) -> None:
        if not self.holds(instance):
            raise ValueError(self.message)


class _MultipleOf(_RsKeyword):
    keyword = "multipleOf"

    def holds(self, instance: Any) -> bool:
        return is_multiple(instance, self.value)


class _ContentEncoding(_RsKeyword):
    keyword = "contentEncoding"

    def holds(self, instance: Any) -> bool:
        return content_encoding_ok(instance, self.value)


class _ContentMediaType(_RsKeyword):
    keyword = "contentMediaType"

    def holds(self, instance: Any) -> bool:
        return content_media_type_ok(instance, self.value, self.parent.get("contentEncoding"))


_RS_KEYWORDS: dict[Draft, dict[str, type[KeywordValidator]]] = {
    Draft.DRAFT7: {
        "multipleOf": _MultipleOf,
        "contentEncoding": _ContentEncoding,
        "contentMediaType": _ContentMediaType,
    },
    Draft.DRAFT2020_12: {"multipleOf": _MultipleOf},
}


def rs_keywords(draft: Draft) -> dict[str, type[KeywordValidator]]:
    """The custom keywords every jsonschema-rs validator of `draft` is built with."""
    return _RS_KEYWORDS[draft]


def is_custom_error(details: dict[str, Any]) -> bool:
    """Whether a jsonschema-rs error's details (`kind.as_dict()`) come from a keyword here:
    its message is then the keyword's own."""
    return "message" in details and details.get("keyword") in _RS_KEYWORDS[Draft.DRAFT7]
