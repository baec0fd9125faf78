"""Exceptions of every kind, for tests that hold a tool's fault to be its call's failure."""

from __future__ import annotations

import asyncio
import builtins

from callgate_executor import ToolError
from worker.published.model import ResultError


class _Own(BaseException):
    """A `BaseException` of the application's own, no `Exception`."""


def _raisable() -> list[BaseException]:
    """An instance of every exception class of the builtins that takes no arguments, and of
    those that need some, groups, a cancellation, and `ToolError`s good and odd."""
    made: list[BaseException] = [
        asyncio.CancelledError(),
        ExceptionGroup("g", [ValueError()]),
        BaseExceptionGroup("g", [KeyboardInterrupt()]),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"),
        UnicodeEncodeError("ascii", "\xff", 0, 1, "bad"),
        UnicodeTranslateError("x", 0, 1, "bad"),
        _Own(),
        ToolError("no such sku", type="unknown_sku"),
        ToolError("typed oddly", type=5),  # type: ignore[arg-type]
        ToolError(b"not text"),  # type: ignore[arg-type]
    ]
    for name in dir(builtins):
        kind = getattr(builtins, name)
        if isinstance(kind, type) and issubclass(kind, BaseException):
            try:
                made.append(kind())
            except TypeError:
                continue  # needs arguments: those that do are made above
    return made


RAISABLE = _raisable()


def expected_failure(exc: BaseException, where: str) -> ResultError:
    """The failure a run raising `exc` at `where` is recorded as."""
    if where == "output":
        name = "PydanticSerializationError"  # pydantic wraps what a serializer raises
    elif isinstance(exc, StopIteration):
        name = "RuntimeError"  # a coroutine cannot raise StopIteration (PEP 479)
    elif isinstance(exc, ToolError) and isinstance(exc.type, str) and isinstance(exc.message, str):
        return ResultError(type=exc.type, message=exc.message)
    else:
        name = type(exc).__name__
    return ResultError(type=name, message="the tool failed")
