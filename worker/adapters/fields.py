"""Typed access to the fields of a vendor event, shared by the vendor adapters.

Every getter names the event and the field in its `InputFormatError`, so a malformed record is
rejected with a message that says exactly what was wrong with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from worker.errors import InputFormatError

_SHORT_CODE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def obj(event: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    value = event.get(name)
    if not isinstance(value, dict):
        raise InputFormatError(f"{where}: field {name!r} must be an object")
    return value


def opt_obj(event: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any] | None:
    value = event.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputFormatError(f"{where}: field {name!r} must be an object or null")
    return value


def string(event: Mapping[str, Any], name: str, where: str) -> str:
    value = event.get(name)
    if not isinstance(value, str) or not value:
        raise InputFormatError(f"{where}: field {name!r} must be a non-empty string")
    return value


def text(event: Mapping[str, Any], name: str, where: str) -> str:
    """A string that may be empty (a piece of text, never a name)."""
    value = event.get(name)
    if not isinstance(value, str):
        raise InputFormatError(f"{where}: field {name!r} must be a string")
    return value


def opt_str(event: Mapping[str, Any], name: str, where: str) -> str | None:
    value = event.get(name)
    if value is None or isinstance(value, str):
        return value
    raise InputFormatError(f"{where}: field {name!r} must be a string or null")


def integer(event: Mapping[str, Any], name: str, where: str) -> int:
    value = event.get(name)
    if type(value) is not int or value < 0:
        raise InputFormatError(f"{where}: field {name!r} must be an integer >= 0")
    return value


def opt_int(event: Mapping[str, Any], name: str, where: str) -> int | None:
    if event.get(name) is None:
        return None
    return integer(event, name, where)


def array(event: Mapping[str, Any], name: str, where: str) -> list[Any]:
    value = event.get(name)
    if not isinstance(value, list):
        raise InputFormatError(f"{where}: field {name!r} must be an array")
    return value


def short_code(value: object, default: str) -> str:
    """A vendor's error code or type if it is a short identifier, else `default`.

    Vendor error messages can echo user or model text; only identifiers leave the adapter.
    """
    if isinstance(value, str) and _SHORT_CODE.match(value):
        return value
    return default
