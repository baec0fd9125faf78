"""A vendor stream ends once, and an event that cannot be placed ends its stream, for every format.

Generated on every recorded and generated stream (and random ones), through the whole path the
worker runs (decoder, native reassembler, gate, with contracts that accept any object):

- events after the stream's end (the same stream's events again, mutated or not, a second
  message, the trailers a format sends after its end) never add, change or accept a call: what
  is accepted is what the stream up to its end gives, the first event after the end that carries
  anything is the one `malformed_record`, and a trailer that carries nothing makes no event;
- an identifier of the stream (a call id, a tool name) made longer than `max_id_bytes` breaks the
  stream at the first event that carries it: nothing from there on is accepted, and that record
  is one `malformed_record` (never one per chunk: no two events share an `event_id`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from tests.adapters.mutations import mutated
from tests.adapters.oracles import (
    ANTHROPIC,
    CHAT,
    Gate,
    decoder,
    encode,
    permissive_contracts,
    records,
    sdk_calls,
)
from tests.adapters.test_integrity import STREAMS, _random_stream, _tools, end_of
from worker.adapters.decoder import ADAPTERS, WHOLE_RECORDS
from worker.adapters.openai_responses import BUILT_IN_TOOLS
from worker.core.processor import Emission
from worker.model import Code, Outcome
from worker.settings import LimitSettings

Event = dict[str, Any]
MAX_ID = LimitSettings().max_id_bytes
GENERATED = settings(
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    return Gate(permissive_contracts(tmp_path_factory.mktemp("contracts"), _tools()))


def accepted(emissions: Sequence[Emission]) -> dict[str, tuple[Any, ...]]:
    return {
        e.call.call_id: (e.call.tool, e.call.arguments, e.call.first_offset)
        for e in emissions
        if e.verdict.outcome is Outcome.ACCEPTED
    }


def malformed(emissions: Sequence[Emission]) -> list[Emission]:
    return [e for e in emissions if e.verdict.code is Code.MALFORMED_RECORD]


def event_ids_are_unique(emissions: Sequence[Emission]) -> None:
    ids = [orjson.loads(e.value)["event_id"] for e in emissions]
    assert len(ids) == len(set(ids)), ids


@st.composite
def _after_end(draw: st.DrawFn, fmt: str, events: Sequence[Event]) -> tuple[str, list[Event]]:
    """Events that follow a stream's end: its own events again (as sent, or changed), the
    whole stream again (a second message under the same stream), or the format's trailers."""
    what = draw(st.sampled_from(["again", "changed", "second", "trailer"]))
    if what == "again":
        picks = draw(st.lists(st.sampled_from(list(events)), min_size=1, max_size=4))
        return what, [copy.deepcopy(e) for e in picks]
    if what == "changed":
        _, changed = draw(mutated(events))
        return what, changed[draw(st.integers(0, len(changed) - 1)) :]
    if what == "second":
        return what, copy.deepcopy(list(events))
    return what, [trailer(fmt, draw(st.integers(0, 3)))]


def trailer(fmt: str, kind: int) -> Event:
    """What a format may send after its end that carries nothing (Chat Completions' usage
    chunk, a chunk of empty deltas); other formats have none: a ping after `message_stop`."""
    if fmt != CHAT:
        return {"type": "ping"}
    base: Event = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    if kind == 0:
        return {**base, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    delta = [{}, {"content": ""}, {"tool_calls": []}][kind - 1]
    return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def assert_ends_once(gate: Gate, fmt: str, events: list[Event], after: list[Event]) -> None:
    end = end_of(fmt, events)
    head = events[: end + 1]
    before = gate.run([records(fmt, encode(head))])
    emissions = gate.run([records(fmt, encode([*head, *after]))])
    event_ids_are_unique(emissions)
    assert accepted(emissions) == accepted(before)
    late = [e for e in emissions if e.call.last_offset > end]
    carrying = [e for e in after if not ADAPTERS[fmt].after_end(e)]
    # the first event after the end that is no trailer is the stream's one malformed record;
    # every call of it was decided before (nothing left to corrupt), the rest are dropped
    assert [e.verdict.code for e in late] == ([Code.MALFORMED_RECORD] if carrying else [])
    if carrying:
        first = next(i for i, e in enumerate(after) if not ADAPTERS[fmt].after_end(e))
        assert late[0].call.first_offset == end + 1 + first


@pytest.mark.parametrize(("name", "fmt", "events"), STREAMS, ids=[name for name, _, _ in STREAMS])
def test_nothing_after_a_recorded_streams_end_is_accepted(
    gate: Gate, name: str, fmt: str, events: list[Event]
) -> None:
    @GENERATED
    @given(st.data())
    def check(data: st.DataObject) -> None:
        what, after = data.draw(_after_end(fmt, events))
        note(what)
        assert_ends_once(gate, fmt, events, after)

    check()


@settings(max_examples=150, derandomize=True, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_nothing_after_a_random_streams_end_is_accepted(
    gate: Gate, seed: int, data: st.DataObject
) -> None:
    fmt, events = _random_stream(seed)
    _, after = data.draw(_after_end(fmt, events))
    assert_ends_once(gate, fmt, events, after)


def test_a_chat_call_after_the_finish_and_a_second_anthropic_message_are_refused(
    gate: Gate,
) -> None:
    """The issue's two examples, as they were sent."""
    (_, _, chat), *_ = [s for s in STREAMS if s[1] == CHAT and accepted_any(gate, s)]
    end = end_of(CHAT, chat)
    extra = copy.deepcopy(next(e for e in chat if e["choices"] and has_call(e)))
    extra["choices"][0]["delta"]["tool_calls"][0]["id"] = "call_after_the_finish"
    assert_ends_once(gate, CHAT, chat, [extra, *chat[end + 1 :]])
    (_, _, anthropic), *_ = [s for s in STREAMS if s[1] == ANTHROPIC and accepted_any(gate, s)]
    assert_ends_once(gate, ANTHROPIC, anthropic, copy.deepcopy(anthropic))


def accepted_any(gate: Gate, stream: tuple[str, str, list[Event]]) -> bool:
    _, fmt, events = stream
    return bool(accepted(gate.run([records(fmt, encode(events))])))


def has_call(event: Event) -> bool:
    return any(c.get("delta", {}).get("tool_calls") for c in event["choices"])


# -- identifiers past their bound ----------------------------------------------------------


def stream_identifiers(fmt: str, events: Sequence[Event]) -> dict[str, int]:
    """The strings of the stream that become a chunk's call id or tool (as they are sent, or
    with the `#k` tag of output k), each with the first event whose chunks carry it. A
    built-in tool's name is the adapter's, not the stream's."""
    dec = decoder()
    sent = {leaf for event in events for leaf in _strings(event) if leaf} - BUILT_IN_TOOLS
    first: dict[str, int] = {}
    for index, record in enumerate(records(fmt, encode(events))):
        for chunk in dec.decode(record, fmt):
            for made in (chunk.call_id, chunk.tool):
                for candidate in {made, (made or "").rsplit("#", 1)[0]} & sent:
                    first.setdefault(candidate, index)
    return first


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _replaced(value: Any, old: str, new: str) -> Any:
    if value == old:
        return new
    if isinstance(value, dict):
        return {k: _replaced(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replaced(v, old, new) for v in value]
    return value


@pytest.mark.parametrize(("name", "fmt", "events"), STREAMS, ids=[name for name, _, _ in STREAMS])
def test_an_identifier_past_its_bound_breaks_the_stream_at_its_first_event(
    gate: Gate, name: str, fmt: str, events: list[Event]
) -> None:
    identifiers = stream_identifiers(fmt, events)
    if not identifiers:
        return

    @GENERATED
    @given(
        identifier=st.sampled_from(sorted(identifiers)),
        extra=st.sampled_from(["x", "é", "\x01"]),
        over=st.integers(1, 40),
    )
    def check(identifier: str, extra: str, over: int) -> None:
        long = identifier + extra * (MAX_ID + over)
        changed = [_replaced(event, identifier, long) for event in events]
        first = identifiers[identifier]
        emissions = gate.run([records(fmt, encode(changed))])
        event_ids_are_unique(emissions)
        assert not [
            e
            for e in emissions
            if e.verdict.outcome is Outcome.ACCEPTED and e.call.last_offset >= first
        ]
        (bad,) = malformed(emissions)
        assert bad.call.first_offset == first
        # what was accepted before the long identifier is what the SDK holds there
        sdk = sdk_calls(fmt, changed[:first])
        for call_id, (tool, arguments, _) in accepted(emissions).items():
            assert sdk.calls[call_id] == (tool, arguments.decode())

    check()


_BROKEN = [b"{", b"\xff", b"[1, 2", b'{"type": "x",}', b"null"]


@pytest.mark.parametrize(("name", "fmt", "events"), STREAMS, ids=[name for name, _, _ in STREAMS])
def test_a_stream_broken_at_its_first_record_ends_each_call_it_can_still_see(
    gate: Gate, name: str, fmt: str, events: list[Event]
) -> None:
    """Its first record unreadable, a stream is refused: that record is its one rejection
    (`malformed_record`), nothing is accepted, and each call a later record opens under an id of
    its own ends `stream_corrupt`, once: every call the SDK holds whose id a later record names
    (a cut call the SDK drops too), and no other. A stream with no such call has the rejection
    alone."""
    if fmt in WHOLE_RECORDS:
        return
    sdk = sdk_calls(fmt, events)
    later = {leaf for event in events[1:] for leaf in _strings(event)}  # what it can still see
    visible = {call_id for call_id in sdk.calls if call_id.rsplit("#", 1)[0] in later}

    @GENERATED
    @given(broken=st.sampled_from(_BROKEN))
    def check(broken: bytes) -> None:
        values = encode(events)
        values[0] = broken
        emissions = gate.run([records(fmt, values)])
        event_ids_are_unique(emissions)
        assert not [e for e in emissions if e.verdict.outcome is Outcome.ACCEPTED]
        (bad,) = malformed(emissions)
        assert bad.call.first_offset == 0
        ended = [e.call.call_id for e in emissions if e is not bad]
        assert visible <= set(ended)  # every call the SDK holds that it can still see
        assert all(call_id.rsplit("#", 1)[0] in later for call_id in ended)  # none made up
        assert all(e.verdict.reason == "stream_corrupt" for e in emissions if e is not bad)

    check()
