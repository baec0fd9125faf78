"""One-event changes of a vendor stream: deletion, duplication, adjacent swap, and mutation of a
value inside one event (its type or its value), as hypothesis strategies and exhaustive lists.

A mutation picks one event, one place in it (a member, an element, the event itself), and either
replaces the value there (by another JSON type, a nearby integer, an edited string, a value that
occurs elsewhere in the stream: an index, an id, a name), deletes it, or sets a member beside it
(a name the stream uses, with a value it has elsewhere: an `id` on a later delta, say).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any

from hypothesis import strategies as st

Event = dict[str, Any]
Path = tuple[str | int, ...]

_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=6)
_INT = st.integers(min_value=-(2**53), max_value=2**53)
_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-2, max_value=3),
    _INT,
    st.floats(allow_nan=False, allow_infinity=False),
    _TEXT,
)
JSON = st.recursive(
    _LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)


def paths(value: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every place in a JSON value, the value itself first."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


def leaves(events: Sequence[Event]) -> list[Any]:
    """The distinct scalar values of a stream (what a confused producer could put elsewhere)."""
    seen: dict[str, Any] = {}
    for event in events:
        for path in paths(event):
            value = get(event, path)
            if not isinstance(value, dict | list):
                seen.setdefault(repr(value), value)
    return list(seen.values())


def get(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value


def _replaced(event: Event, path: Path, new: Any) -> Event:
    out = copy.deepcopy(event)
    parent = get(out, path[:-1])
    parent[path[-1]] = new
    return out


def _deleted(event: Event, path: Path) -> Event:
    out = copy.deepcopy(event)
    parent = get(out, path[:-1])
    del parent[path[-1]]
    return out


@st.composite
def _new_value(draw: st.DrawFn, old: Any, stream_values: Sequence[Any]) -> Any:
    choices = [JSON, st.sampled_from(stream_values)] if stream_values else [JSON]
    if type(old) is int:
        choices.append(st.sampled_from([old - 1, old + 1, -old - 1, str(old), float(old)]))
    if isinstance(old, str):
        choices.append(
            st.one_of(
                st.just(old + old),
                st.just(old[:-1]),
                st.just(old.upper()),
                _TEXT.map(lambda t: old + t),
                _TEXT.map(lambda t: t + old),
                st.just([old]),
                st.just({"text": old}),
            )
        )
    return draw(st.one_of(choices))


@st.composite
def mutated(
    draw: st.DrawFn, events: Sequence[Event], end: int | None = None
) -> tuple[str, list[Event]]:
    """One event of `events` changed at one place, or (one time in ten) an event before `end`
    moved or copied to another place before `end`; (what was done, the new stream).

    `end` is the position of the stream's last event (its END): an event moved or copied past it
    arrives after the stream ended, when its calls are out (the adapter refuses it then)."""
    index = draw(st.integers(min_value=0, max_value=len(events) - 1))
    last = len(events) - 1 if end is None else end
    if last > 0 and draw(st.integers(min_value=0, max_value=9)) == 0:
        index = draw(st.integers(min_value=0, max_value=last - 1))
        if draw(st.booleans()):
            to = draw(st.integers(min_value=0, max_value=last - 1))
            rest = [*events[:index], *events[index + 1 :]]
            return f"move event {index} to {to}", [*rest[:to], events[index], *rest[to:]]
        to = draw(st.integers(min_value=0, max_value=last))
        copied = copy.deepcopy(events[index])
        return f"copy event {index} to {to}", [*events[:to], copied, *events[to:]]
    event = events[index]
    path = draw(st.sampled_from([p for p in paths(event) if p]))
    old = get(event, path)
    parent = get(event, path[:-1])
    operations = ["replace"]
    if isinstance(parent, dict):
        operations += ["delete", "add"]
    operation = draw(st.sampled_from(operations))
    if operation == "delete":
        new_event = _deleted(event, path)
        what = f"event {index}: delete {list(path)}"
    elif operation == "add":
        members = members_of(events)
        siblings = sorted(set(_siblings(events, path[:-1])) - set(parent)) or sorted(members)
        key = draw(st.sampled_from([*siblings, "extra"]))
        known = members.get(key, [])
        value = st.sampled_from(known) if known else _new_value(None, leaves(events))
        new_event = _replaced(event, (*path[:-1], key), draw(value))
        what = f"event {index}: set {[*path[:-1], key]}"
    else:
        new = draw(_new_value(old, leaves(events)))
        new_event = _replaced(event, path, new)
        what = f"event {index}: {list(path)} = {new!r} (was {old!r})"
    return what, [*events[:index], new_event, *events[index + 1 :]]


def _shape(path: Path) -> Path:
    return tuple(0 if isinstance(step, int) else step for step in path)


def _siblings(events: Sequence[Event], parent: Path) -> list[str]:
    """The member names that objects at the same place as `parent` have in any event."""
    shape = _shape(parent)
    names: dict[str, None] = {}
    for event in events:
        for path in paths(event):
            if path and isinstance(path[-1], str) and _shape(path[:-1]) == shape:
                names[path[-1]] = None
    return list(names)


def members_of(events: Sequence[Event]) -> dict[str, list[Any]]:
    """Every member name used in the stream, with the distinct values it has there."""
    members: dict[str, dict[str, Any]] = {}
    for event in events:
        for path in paths(event):
            if path and isinstance(path[-1], str):
                value = get(event, path)
                members.setdefault(path[-1], {}).setdefault(repr(value), value)
    return {key: list(values.values()) for key, values in members.items()}


def single_event_changes(events: Sequence[Event]) -> Iterator[tuple[str, list[Event]]]:
    """Every deletion, duplication and adjacent swap of one event."""
    for i in range(len(events)):
        yield f"delete event {i}", [*events[:i], *events[i + 1 :]]
        yield f"duplicate event {i}", [*events[: i + 1], copy.deepcopy(events[i]), *events[i + 1 :]]
        if i + 1 < len(events):
            yield (
                f"swap events {i}, {i + 1}",
                [*events[:i], events[i + 1], events[i], *events[i + 2 :]],
            )
