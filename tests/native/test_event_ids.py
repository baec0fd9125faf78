"""Event ids (README "`event_id` names the call"): an event id names exactly one event.

Consumers and executors drop an event whose `event_id` they have seen, so two different events
under one id would lose one of them. Every event the gate writes carries the event id of its
call (`AssembledCall.event_id`, derived once, in the native core). The class test reads
sequences of records, in every vendor format and through the native face, whose records may
each carry several calls rejected at the record (a Gemini response whose candidates each end
`MALFORMED_FUNCTION_CALL` or `UNEXPECTED_TOOL_CALL`, `malformed` chunks naming a call or none,
identifiers past the bound) mixed with good calls, and finds every event's id its own, and the
same ids again when the same records are read again (a replay after a crash).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.adapters.oracles import GEMINI, Record, assembler, decoder, encode
from tests.adapters.test_naming import FORMATS, Format, shapes
from worker._native import AssembledCall, Chunk
from worker.settings import LimitSettings

TOPIC = "in"
MAX_ID = LimitSettings().max_id_bytes
#: what the Gemini adapter rejects at the record, and what releases a candidate's calls
_GEMINI_FINISHES = ("MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "STOP")


def _event(call: AssembledCall) -> tuple[Any, ...]:
    """What one event says of its call: its names, place and verdict."""
    return (
        call.stream_id,
        call.call_id,
        call.first_offset,
        call.assembly_error,
        call.assembly_detail,
        call.incomplete,
        call.arguments,
    )


def _assert_one_id_per_event(
    first: Sequence[AssembledCall], again: Sequence[AssembledCall]
) -> None:
    ids = [call.event_id for call in first]
    clashes = [
        (_event(a), _event(b))
        for i, a in enumerate(first)
        for b in first[i + 1 :]
        if a.event_id == b.event_id
    ]
    assert not clashes, f"two events share an event id: {clashes}"
    assert len(set(ids)) == len(ids)
    # read again (a replay): the same events, each under the same id
    assert [(c.event_id, _event(c)) for c in again] == [(c.event_id, _event(c)) for c in first]


# -- every vendor format ------------------------------------------------------------------------


@st.composite
def _stream(draw: st.DrawFn, name: str) -> tuple[str, list[bytes]]:
    """One vendor stream named `name`: its format, and its records' values."""
    form: Format = draw(st.sampled_from(FORMATS))
    shape = draw(shapes(form))
    outputs, error, count = shape.outputs, shape.error, len(shape.outputs)
    # each vendor id its own; some past the identifier bound (their record is rejected)
    ids: list[list[str | None]] = [
        [
            (
                (f"{'a' * MAX_ID}{k}{t}" if draw(st.booleans()) else f"call_{k}_{t}")
                if named
                else None
            )
            for t, named in enumerate(flags)
        ]
        for k, (flags, _) in enumerate(outputs)
    ]
    events = form.build(name, shape, ids, random.Random(draw(st.integers(0, 2**16))))
    if form.fmt == GEMINI and not error:
        # the candidates' finishes in one response: each may be rejected at the record
        finishes = events[-count:]
        candidates = [
            {**finish["candidates"][0], "finishReason": draw(st.sampled_from(_GEMINI_FINISHES))}
            for finish in finishes
        ]
        events = [*events[:-count], {"candidates": candidates, "responseId": "r1"}]
    return form.fmt, encode(events)


@st.composite
def _vendor_records(draw: st.DrawFn) -> list[Record]:
    """Records of 1 to 3 vendor streams of one partition, interleaved as drawn."""
    streams = [draw(_stream(f"s{n}")) for n in range(draw(st.integers(1, 3)))]
    queues = [
        [(fmt, f"s{n}", value) for value in values] for n, (fmt, values) in enumerate(streams)
    ]
    out: list[Record] = []
    while any(queues):
        live = [queue for queue in queues if queue]
        fmt, name, value = draw(st.sampled_from(live)).pop(0)
        offset = len(out)
        head = (("content-format", fmt.encode()),)
        out.append(Record(TOPIC, 0, offset, offset * 10, name.encode(), value, head))
    return out


def _read_vendor(records: Sequence[Record]) -> list[AssembledCall]:
    dec, asm = decoder(), assembler()
    return [*asm.feed_records(TOPIC, 0, list(records), dec.decode), *asm.flush()]


@settings(max_examples=150, deadline=None)
@given(_vendor_records())
def test_every_event_of_vendor_records_has_an_id_of_its_own(records: list[Record]) -> None:
    _assert_one_id_per_event(_read_vendor(records), _read_vendor(records))


def test_a_gemini_response_whose_candidates_each_end_malformed_is_two_events_two_ids() -> None:
    response = {
        "candidates": [
            {"index": k, "content": {"role": "model", "parts": []}, "finishReason": finish}
            for k, finish in enumerate(("MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL"))
        ]
    }
    head = (("content-format", GEMINI.encode()),)
    records = [Record(TOPIC, 0, 0, 0, b"s", value, head) for value in encode([response])]
    calls = _read_vendor(records)
    assert [call.assembly_error for call in calls] == [
        "malformed_tool_call",
        "unexpected_tool_call",
    ]
    _assert_one_id_per_event(calls, _read_vendor(records))


# -- the native face: what any adapter's chunks can say of one record -------------------------

#: one chunk of a record: a good call (whole), a malformed chunk naming a call or none, a call
#: whose tool name is past the identifier bound
_PIECE = st.sampled_from(("call", "named", "unnamed", "long"))


def _chunks(pieces: Sequence[str], offset: int) -> list[Chunk]:
    out: list[Chunk] = []
    for n, piece in enumerate(pieces):
        call_id = f"c{offset}_{n}"  # every call its own id: no id reused
        if piece == "call":
            out.append(Chunk("s", "tool_call", call_id, tool="t", delta="{}", final=True))
        elif piece == "named":
            out.append(Chunk("s", "malformed", call_id, delta=f"bad {n}"))
        elif piece == "unnamed":
            out.append(Chunk("s", "malformed", delta=f"bad {n}", error="malformed_tool_call"))
        else:
            out.append(Chunk("s", "tool_call", call_id, tool="t" * (MAX_ID + 1), delta="{}"))
    return out


def _read_chunks(records: Sequence[Sequence[str]]) -> list[AssembledCall]:
    asm = assembler()
    out: list[AssembledCall] = []
    for offset, pieces in enumerate(records):
        out += asm.feed_chunks(TOPIC, 0, offset, offset * 10, _chunks(pieces, offset))
    out += asm.feed_chunks(TOPIC, 0, len(records), len(records) * 10, [Chunk("s", "end")])
    return [*out, *asm.flush()]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_PIECE, max_size=5), min_size=1, max_size=4))
def test_every_event_of_a_records_chunks_has_an_id_of_its_own(records: list[list[str]]) -> None:
    _assert_one_id_per_event(_read_chunks(records), _read_chunks(records))
