"""The published schemas as the tests hold every record to them, and the hook that does it.

`check(document, value)` validates one record against a *strict* copy of its published schema:
the published documents leave objects open (readers ignore members they do not know), but what
callgate itself writes must hold only members the schema declares, so the copy closes every
object that lists its properties. A record that fails raises AssertionError with the record and
every error.

`install()` wraps, once per session, every function the product makes a published record with
(`PRODUCERS`), wherever a module holds it (so `from x import f` and `x.f` are both covered):
each record made in a test's process is checked as it is made. Records made by child processes
(`callgate run`, the executor, the demo) are checked where the tests read them
(`tests.support.outcomes.as_seen`). `calls` counts the checks per producer, so a test can see
that the hook is in place.
"""

from __future__ import annotations

import copy
import functools
import importlib
import pkgutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
import orjson

from worker.published import Document, load

#: checks made, per producer name (and per document for `check`)
calls: Counter[str] = Counter()


def strict(schema: Any) -> Any:
    """A copy of `schema` in which every object schema that lists `properties` and says nothing
    of other members refuses them."""
    out = copy.deepcopy(schema)
    for node in _nodes(out):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
    return out


def _nodes(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _nodes(item)
    elif isinstance(value, list):
        for item in value:
            yield from _nodes(item)


@functools.cache
def _validator(document: Document) -> Any:
    return jsonschema_rs.validator_for(strict(load(document)))


def check(document: Document, value: bytes | str | dict[str, Any]) -> dict[str, Any]:
    """The record, parsed, once it holds to the strict schema; AssertionError otherwise."""
    record = value if isinstance(value, dict) else orjson.loads(value)
    errors = [f"{e.instance_path}: {e.message}" for e in _validator(document).iter_errors(record)]
    calls[document.value] += 1
    if errors:
        raise AssertionError(
            f"a record breaks the published schema {document.value}:\n  "
            + "\n  ".join(errors[:20])
            + f"\nrecord: {orjson.dumps(record)[:4000]!r}"
        )
    return record


def check_event(value: bytes | str | dict[str, Any]) -> dict[str, Any]:
    return check(Document.OUTCOME_EVENT, value)


# -- the producers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Producer:
    """A function that makes published records, and how to find them in what it returns."""

    module: str
    name: str
    records: Callable[[Any], list[tuple[Document, bytes | dict[str, Any]]]]


def _event_or_none(result: Any) -> list[tuple[Document, bytes | dict[str, Any]]]:
    return [] if result is None else [(Document.OUTCOME_EVENT, bytes(result))]


def _first_is_event(result: Any) -> list[tuple[Document, bytes | dict[str, Any]]]:
    return [(Document.OUTCOME_EVENT, result[0])]


def _tool_result(result: Any) -> list[tuple[Document, bytes | dict[str, Any]]]:
    return [(Document.TOOL_RESULT, bytes(result))]


PRODUCERS: tuple[Producer, ...] = (
    # every event the chain writes (accepted, rejected, incomplete, substitutes)
    Producer("worker._native", "encode_event", _event_or_none),
    # the key owner's rejections (duplicate, idempotency_conflict)
    Producer("worker.core.events", "idempotency_rejection", _first_is_event),
    # every tool result an executor writes
    Producer("callgate_executor.contract", "encode_result", _tool_result),
    # a call held for approval (the approval owner's own events are checked by its tests)
    Producer("worker.core.approval", "pending_event", _first_is_event),
)

_installed = False


def install() -> None:
    """Wrap every producer wherever a loaded module of the project holds it (once)."""
    global _installed
    if _installed:
        return
    _import_all("worker")
    _import_all("callgate_executor")
    for producer in PRODUCERS:
        original = getattr(importlib.import_module(producer.module), producer.name)
        wrapped = _checking(producer, original)
        for module in list(sys.modules.values()):
            name = getattr(module, "__name__", "")
            if not name.startswith(("worker", "callgate_", "tests")) or name == producer.module:
                continue
            for attribute, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attribute, wrapped)
    _installed = True


def _checking(producer: Producer, original: Callable[..., Any]) -> Callable[..., Any]:
    label = f"{producer.module}.{producer.name}"

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        for document, record in producer.records(result):
            check(document, record)
        calls[label] += 1
        return result

    return wrapper


def _import_all(package: str) -> None:
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
