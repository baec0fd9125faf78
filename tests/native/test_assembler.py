"""The native reassembler through its Python face: `Assembler.feed_records` on envelope records.

Examples name each rule once; the properties generate streams (interleaved, with
retransmissions, gaps, reuse, bad records, batch cuts and restarts) and check what must hold
whatever the input: batching never changes a decision, a restored partition decides as the
original would have, no call is judged twice, and nothing is accepted that the input did not
carry, piece by piece.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker._native import CALL_KINDS, AssembledCall, Assembler, Chunk
from worker.model import CallKind


class Record(NamedTuple):
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


LIMITS: dict[str, int] = {
    "max_call_bytes": 200,
    "max_call_chunks": 12,
    "max_open_calls_per_partition": 6,
    "max_id_bytes": 40,
    "max_detail_bytes": 120,
    "idle_timeout_ms": 5_000,
    "max_call_lifetime_ms": 60_000,
    "recently_closed_per_partition": 50,
}


def assembler(**overrides: int) -> Assembler:
    return Assembler(**{**LIMITS, **overrides})


def envelope(stream: str, call: str, seq: int | None, delta: str, **fields: Any) -> bytes:
    body: dict[str, Any] = {"stream_id": stream, "call_id": call, "kind": "tool_call"}
    if seq is not None:
        body["seq"] = seq
    body["delta"] = delta
    body.update(fields)
    return orjson.dumps(body)


def end(stream: str, reason: str | None = None) -> bytes:
    body: dict[str, Any] = {"stream_id": stream, "kind": "end"}
    if reason is not None:
        body["finish_reason"] = reason
    return orjson.dumps(body)


def records(values: Sequence[bytes | None], *, step_ms: int = 10, start: int = 0) -> list[Record]:
    return [Record(start + i, (start + i) * step_ms, b"k", value) for i, value in enumerate(values)]


def no_vendor(record: Any, fmt: str) -> list[Chunk]:
    raise AssertionError(f"no vendor record expected, got {fmt}")


def feed(a: Assembler, recs: Sequence[Record], vendor: Callable[..., Any] = no_vendor) -> list[Any]:
    return list(a.feed_records("t", 0, recs, vendor))


def outcome(call: AssembledCall) -> str:
    return call.incomplete or call.assembly_error or "complete"


def summary(calls: Sequence[AssembledCall]) -> list[tuple[Any, ...]]:
    """Everything a call carries but the time it took to assemble."""
    return [
        (
            c.event_id,
            c.stream_id,
            c.call_id,
            outcome(c),
            c.arguments,
            c.tool,
            c.first_offset,
            c.last_offset,
            c.chunks,
            c.duplicate_chunks,
            c.nbytes,
        )
        for c in calls
    ]


# -- the rules, one example each ------------------------------------------------------------------


def test_a_call_in_pieces_closes_on_final_with_its_text() -> None:
    a = assembler()
    out = feed(
        a,
        records(
            [
                envelope("s", "c", 0, '{"city":', tool="get_weather", tool_version="1"),
                envelope("s", "c", 1, '"Paris"}', final=True),
            ]
        ),
    )
    (call,) = out
    assert (call.arguments, call.tool, call.tool_version, outcome(call)) == (
        b'{"city":"Paris"}',
        "get_weather",
        "1",
        "complete",
    )
    assert (call.first_offset, call.last_offset, call.chunks) == (0, 1, 2)
    assert a.open_calls == 0
    assert a.buffered_bytes == 0


def test_a_retransmitted_piece_is_dropped_and_counted_but_a_different_one_corrupts() -> None:
    a = assembler()
    (call,) = feed(
        a,
        records(
            [
                envelope("s", "c", 0, "{"),
                envelope("s", "c", 0, "{"),
                envelope("s", "c", 1, "}", final=True),
            ]
        ),
    )
    assert (outcome(call), call.arguments, call.duplicate_chunks) == ("complete", b"{}", 1)
    (corrupt,) = feed(
        a,
        records([envelope("s", "d", 0, "{"), envelope("s", "d", 0, "[")], start=10),
    )
    assert outcome(corrupt) == "stream_corrupt"


def test_a_gap_ends_the_call_and_its_later_pieces_are_not_a_second_verdict() -> None:
    a = assembler()
    out = feed(
        a,
        records(
            [
                envelope("s", "c", 0, "{"),
                envelope("s", "c", 2, "x"),
                envelope("s", "c", 3, "}", final=True),
            ]
        ),
    )
    assert [outcome(c) for c in out] == ["sequence_gap"]
    assert a.late_chunks == 1


def test_an_end_makes_open_calls_incomplete_by_finish_reason() -> None:
    for reason, expected in [
        ("length", "max_tokens"),
        ("content_filter", "content_filter"),
        ("stop", "stream_ended"),
        (None, "stream_ended"),
    ]:
        a = assembler()
        out = feed(
            a, records([envelope("s", "c", 0, "{"), envelope("s", "d", 0, "{"), end("s", reason)])
        )
        assert [(c.call_id, outcome(c)) for c in out] == [("c", expected), ("d", expected)]


def test_bounds_drop_the_text_and_reject_the_call_when_it_ends() -> None:
    a = assembler()
    (large,) = feed(
        a, records([envelope("s", "c", 0, "x" * 150), envelope("s", "c", 1, "y" * 60, final=True)])
    )
    assert (outcome(large), large.arguments, large.nbytes) == ("too_large", b"", 210)
    pieces = [envelope("s", "d", i, "x") for i in range(13)] + [
        envelope("s", "d", 13, "", final=True)
    ]
    (many,) = feed(a, records(pieces, start=10))
    assert outcome(many) == "too_many_chunks"
    assert a.buffered_bytes == 0


def test_the_oldest_call_of_the_least_recently_active_stream_is_evicted() -> None:
    a = assembler(max_open_calls_per_partition=3)
    out = feed(
        a,
        records(
            [
                envelope("s", "a", 0, "{"),
                envelope("t", "b", 0, "{"),
                envelope("t", "c", 0, "{"),
                envelope("s", "a", 1, '"'),  # s is active again: t is the least recently active
                envelope("u", "d", 0, "{"),  # evicts b, t's oldest call
                envelope("t", "b", 1, "}", final=True),  # b's tail: no second verdict
            ]
        ),
    )
    assert [(c.call_id, outcome(c)) for c in out] == [("b", "evicted")]
    assert a.late_chunks == 1


def test_idle_time_is_the_partitions_own_record_time_per_stream() -> None:
    a = assembler()
    # no records for a minute of wall time change nothing: only record timestamps age a stream
    first = feed(a, [Record(0, 1_000, b"k", envelope("s", "c", 0, "{"))])
    later = feed(a, [Record(1, 5_999, b"k", envelope("t", "d", 0, "{"))])
    assert first == later == []
    (expired,) = feed(a, [Record(2, 6_000, b"k", envelope("u", "e", 0, "{"))])
    assert (expired.call_id, outcome(expired)) == ("c", "timeout")
    # a timestamp that goes back does not turn the clock back
    assert feed(a, [Record(3, 10, b"k", envelope("u", "e", 1, "}", final=True))])[0].call_id == "e"
    assert a.clock("t", 0) == 6_000


def test_a_stream_that_keeps_sending_keeps_its_quiet_calls_open() -> None:
    """A call that gets no piece while its stream sends others (a vendor holds it till the
    stream's end) is not idle: idleness is the stream's."""
    a = assembler()
    out = feed(a, [Record(0, 0, b"k", envelope("s", "held", 0, "{}", tool="t"))])
    for i in range(1, 10):
        other = envelope("s", f"other{i}", 0, "{}", tool="t", final=True)
        out += feed(a, [Record(i, i * 4_000, b"k", other)])
    assert [c.call_id for c in out if c.call_id == "held"] == []
    (done,) = feed(a, [Record(10, 40_000, b"k", envelope("s", "held", 1, "", final=True))])
    assert (done.call_id, outcome(done), done.arguments) == ("held", "complete", b"{}")


def test_a_continuation_of_a_forgotten_call_opens_nothing() -> None:
    """An adapter's piece that continues a call (no tool) never opens one: when the call was
    judged and forgotten, the piece is late, not a second call."""
    a = assembler(recently_closed_per_partition=1)
    first = list(a.feed_chunks("t", 0, 0, 0, [Chunk("v", "tool_call", "x", tool="t", delta="{")]))
    first += list(a.feed_chunks("t", 0, 1, 0, [Chunk("v", "abort", "x")]))
    first += list(a.feed_chunks("t", 0, 2, 0, [Chunk("v", "tool_call", "y", tool="t", delta="{")]))
    first += list(a.feed_chunks("t", 0, 3, 0, [Chunk("v", "abort", "y")]))  # x forgotten
    late = list(a.feed_chunks("t", 0, 4, 0, [Chunk("v", "tool_call", "x", delta="}", final=True)]))
    assert [(c.call_id, outcome(c)) for c in first] == [
        ("x", "stream_corrupt"),
        ("y", "stream_corrupt"),
    ]
    assert late == []
    assert a.late_chunks == 1


def test_a_call_older_than_its_lifetime_ends_at_its_next_piece() -> None:
    a = assembler(max_call_lifetime_ms=1_000, idle_timeout_ms=900)
    out = feed(
        a,
        [
            Record(0, 0, b"k", envelope("s", "c", 0, "{")),
            *[Record(i, i * 100, b"k", envelope("s", "c", i, "x")) for i in range(1, 10)],
            Record(10, 1_000, b"k", envelope("s", "c", 10, "}", final=True)),
        ],
    )
    assert [outcome(c) for c in out] == ["max_lifetime"]


def test_a_reused_call_id_is_its_own_rejected_call_with_its_own_event_id() -> None:
    a = assembler()
    first, reused = feed(
        a,
        records(
            [
                envelope("s", "c", 0, "{", tool="t"),
                envelope("s", "c", 1, "}", final=True),
                envelope("s", "c", 0, "{}", tool="t"),
                envelope("s", "c", 1, "", final=True),
            ]
        ),
    )
    assert (outcome(first), outcome(reused)) == ("complete", "call_id_reused")
    assert first.event_id != reused.event_id
    assert reused.first_offset == 2


def test_a_whole_call_sent_twice_is_one_call() -> None:
    a = assembler()
    pieces = [envelope("s", "c", 0, "{", tool="t"), envelope("s", "c", 1, "}", final=True)]
    out = feed(a, records(pieces + pieces))
    assert [outcome(c) for c in out] == ["complete"]
    assert a.duplicate_chunks == 2


def test_a_bad_record_is_its_own_call_and_ends_the_calls_it_could_belong_to() -> None:
    a = assembler()
    out = feed(
        a,
        records(
            [
                envelope("s", "c", None, '{"amount_minor": 1'),
                orjson.dumps({"stream_id": "s", "call_id": "c", "kind": "tool_call", "delta": {}}),
                envelope("s", "c", None, '00000, "x": 1}', final=True),
            ]
        ),
    )
    # the rejection names the stream and call the envelope names
    assert [(c.stream_id, c.call_id, outcome(c)) for c in out] == [
        ("s", "c", "malformed_record"),
        ("s", "c", "stream_corrupt"),
    ]
    assert "delta" in (out[0].assembly_detail or "")


def test_an_unreadable_record_ends_the_calls_of_the_stream_its_key_names() -> None:
    a = assembler()
    out = feed(
        a,
        [
            Record(0, 0, b"s", envelope("s", "c", None, "{")),
            Record(1, 0, b"s", b"{not json"),
            Record(2, 0, b"s", None),
        ],
    )
    assert [(c.call_id, outcome(c)) for c in out] == [
        ("record:t:0:1", "malformed_record"),
        ("c", "stream_corrupt"),
        ("record:t:0:2", "malformed_record"),
    ]


@pytest.mark.parametrize(
    "value",
    [
        b'{"stream_id":"s","call_id":"c","kind":"tool_call","delta":"a","delta":"b"}',
        b'{"stream_id":"s","call_id":"c","kind":"tool_call","tool":"a","tool":"b"}',
        b'{"stream_id":"s","call_id":"c","kind":"tool_call","x":{"k":1,"k":2}}',
        b'{"stream_id":"s","call_id":"c","kind":"tool_call","seq":-1}',
        b'{"stream_id":"s","call_id":"c","kind":"tool_call","seq":1.0}',
        b'{"stream_id":"s","call_id":"c","kind":"mcp_result"}',
        b'{"stream_id":"s","call_id":"c","kind":"tool_call","final":1}',
        b'{"stream_id":"s","call_id":"c","kind":"tool_call","attempt":0}',
        b'{"stream_id":"s","kind":"end","finish_reason":"done"}',
        b'{"stream_id":"","call_id":"c","kind":"tool_call"}',
        b"[]",
        b'{"stream_id":"s","call_id":"c","kind":"tool_call"} {}',
        b"\xef\xbb\xbf{}",
    ],
)
def test_envelopes_are_strict(value: bytes) -> None:
    (call,) = feed(assembler(), [Record(0, 0, b"s", value)])
    assert outcome(call) == "malformed_record"


@given(
    field=st.sampled_from(
        [
            "stream_id",
            "call_id",
            "tool",
            "idempotency_key",
            "principal",
            "trace_id",
            "run_id",
            "step_id",
            "tool_version",
        ]
    ),
    extra=st.integers(1, 100),
)
def test_every_identifier_is_bounded(field: str, extra: int) -> None:
    body: dict[str, Any] = {"stream_id": "s", "call_id": "c", "kind": "tool_call", "delta": "{}"}
    body[field] = "x" * (LIMITS["max_id_bytes"] + extra)
    (call,) = feed(assembler(), [Record(0, 0, b"s", orjson.dumps(body))])
    assert outcome(call) == "malformed_record"
    assert call.assembly_detail is not None
    assert len(call.assembly_detail.encode()) <= LIMITS["max_detail_bytes"]
    assert len(call.stream_id.encode()) <= LIMITS["max_id_bytes"]


def test_vendor_records_go_to_the_callback_in_order() -> None:
    a = assembler()
    seen: list[int] = []

    def vendor(record: Record, fmt: str) -> list[Chunk]:
        seen.append(record.offset)
        assert fmt == "openai.chat"
        if record.offset == 1:
            return [Chunk("v", "tool_call", "x", tool="t", delta="{")]
        return [Chunk("v", "tool_call", "x", delta="}", final=True)]

    header = (("content-format", b"openai.chat"),)
    out = feed(
        a,
        [
            Record(0, 0, b"s", envelope("s", "c", 0, "{")),
            Record(1, 0, b"v", b"ignored", header),
            Record(2, 0, b"s", envelope("s", "c", 1, "}", final=True)),
            Record(3, 0, b"v", b"ignored", header),
        ],
        vendor,
    )
    assert seen == [1, 3]
    assert [(c.call_id, c.arguments) for c in out] == [("c", b"{}"), ("x", b"{}")]


def test_an_adapter_abort_and_a_final_text_that_differs_are_stream_corrupt() -> None:
    a = assembler()
    out = list(
        a.feed_chunks("t", 0, 0, 0, [Chunk("v", "tool_call", "x", tool="t", delta="{")])
    ) + list(a.feed_chunks("t", 0, 1, 0, [Chunk("v", "abort", "x")]))
    out += list(
        a.feed_chunks(
            "t",
            0,
            2,
            0,
            [Chunk("v", "tool_call", "y", tool="t", delta="{}", final=True, expected="{ }")],
        )
    )
    assert [(c.call_id, outcome(c)) for c in out] == [
        ("x", "stream_corrupt"),
        ("y", "stream_corrupt"),
    ]


def test_a_calls_origin_reaches_its_assembled_call_and_survives_a_restore() -> None:
    caller = '{"type":"program","caller_id":"call_p"}'
    first = Chunk(
        "v",
        "tool_call",
        "x",
        tool="t",
        delta="SELECT",
        call_kind="custom_tool_call",
        caller=caller,
        double_encoded=True,
    )
    live = assembler()
    assert list(live.feed_chunks("t", 0, 0, 0, [first])) == []
    restored = assembler()
    restored.restore("t", 0, [live.snapshot("t", 0)])
    (call,) = restored.feed_chunks("t", 0, 1, 0, [Chunk("v", "tool_call", "x", final=True)])
    assert (call.arguments, call.call_kind, call.caller, call.double_encoded) == (
        b"SELECT",
        CallKind.CUSTOM_TOOL_CALL,
        caller,
        True,
    )
    plain = Chunk("v", "tool_call", "y", tool="t", delta="{}", final=True)
    (call,) = restored.feed_chunks("t", 0, 2, 0, [plain])
    assert (call.call_kind, call.caller, call.double_encoded) == ("function_call", None, False)


def test_a_later_piece_that_states_another_origin_corrupts_the_call() -> None:
    a = assembler()
    pieces = [
        Chunk("v", "tool_call", "x", tool="t", delta="{", call_kind="shell_call"),
        Chunk("v", "tool_call", "x", delta="}", final=True, call_kind="local_shell_call"),
    ]
    (call,) = a.feed_chunks("t", 0, 0, 0, pieces)
    assert (call.call_kind, outcome(call)) == ("shell_call", "stream_corrupt")


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"call_kind": "computer_call"}, "unknown call kind 'computer_call'"),
        ({"caller": "[1]"}, "a caller must be a JSON object"),
        ({"caller": '{"a":1,"a":2}'}, "a caller must be a JSON object"),
    ],
)
def test_a_chunk_or_call_states_only_a_known_kind_and_an_object_caller(
    fields: dict[str, str], error: str
) -> None:
    with pytest.raises(ValueError, match=error.replace("'", '"')):
        Chunk("v", "tool_call", "x", **fields)
    with pytest.raises(ValueError, match=error.replace("'", '"')):
        AssembledCall("v", "x", **fields)
    with pytest.raises(ValueError, match="a text chunk states no call kind"):
        Chunk("v", "text", "x", **fields)


def test_the_call_kinds_are_the_cores() -> None:
    assert tuple(CallKind) == CALL_KINDS


def test_a_caller_is_bounded_like_an_identifier() -> None:
    caller = orjson.dumps({"caller_id": "c" * 40}).decode()
    chunk = Chunk("v", "tool_call", "x", tool="t", delta="{}", final=True, caller=caller)
    (call,) = assembler().feed_chunks("t", 0, 0, 0, [chunk])
    assert call.assembly_error == "malformed_record"
    assert call.assembly_detail == "caller is longer than 40 bytes"


def test_a_malformed_chunk_from_an_adapter_is_its_own_call() -> None:
    (call,) = assembler().feed_chunks(
        "t", 0, 7, 0, [Chunk("v", "malformed", delta="openai.chat: bad", error="internal_error")]
    )
    assert (call.call_id, call.assembly_error, call.assembly_detail) == (
        "record:t:0:7",
        "internal_error",
        "openai.chat: bad",
    )


# -- properties over generated streams -----------------------------------------------------------

STREAMS = ["s1", "s2", "s3"]
CALLS = ["c1", "c2", "c3", "c4"]


@st.composite
def traffic(draw: st.DrawFn) -> list[Record]:
    """Interleaved calls with retransmissions, gaps, reuse, ends, bad records and time jumps."""
    values: list[bytes | None] = []
    stamps: list[int] = []
    clock = 0
    progress: dict[tuple[str, str], int] = {}
    for _ in range(draw(st.integers(1, 60))):
        stream = draw(st.sampled_from(STREAMS))
        call = draw(st.sampled_from(CALLS))
        action = draw(
            st.sampled_from(
                ["piece", "piece", "piece", "final", "repeat", "skip", "end", "bad", "noseq"]
            )
        )
        seq = progress.get((stream, call), 0)
        delta = draw(st.text(alphabet='{}[]"ab:,1 ', max_size=8))
        if action == "piece":
            values.append(envelope(stream, call, seq, delta, tool="t" if seq == 0 else None))
            progress[(stream, call)] = seq + 1
        elif action == "final":
            values.append(envelope(stream, call, seq, delta, final=True))
            progress[(stream, call)] = 0
        elif action == "repeat" and seq > 0:
            values.append(envelope(stream, call, seq - 1, delta))
        elif action == "skip":
            values.append(envelope(stream, call, seq + 1, delta))
        elif action == "end":
            values.append(end(stream, draw(st.sampled_from([None, "length", "stop"]))))
        elif action == "bad":
            values.append(draw(st.sampled_from([b"{", None, b'{"stream_id":"s1","kind":1}'])))
        else:
            values.append(envelope(stream, call, None, delta))
        clock += draw(st.sampled_from([0, 1, 10, 3_000, 6_000]))
        stamps.append(clock)
    return [Record(i, stamps[i], b"s1", v) for i, v in enumerate(values)]


def cuts(draw: st.DrawFn, n: int) -> list[int]:
    return sorted(set(draw(st.lists(st.integers(0, n), max_size=6))))


def batches(recs: list[Record], at: list[int]) -> list[list[Record]]:
    bounds = [0, *at, len(recs)]
    return [recs[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=150, derandomize=True, deadline=None)
@given(data=st.data())
def test_batching_never_changes_a_decision(data: st.DataObject) -> None:
    recs = data.draw(traffic())
    whole = assembler()
    expected = summary(feed(whole, recs) + list(whole.flush()))
    batched = assembler()
    out: list[Any] = []
    for batch in batches(recs, cuts(data.draw, len(recs))):
        out.extend(feed(batched, batch))
    out.extend(batched.flush())
    assert summary(out) == expected


@settings(max_examples=150, derandomize=True, deadline=None)
@given(data=st.data())
def test_a_restored_partition_decides_as_the_original(data: st.DataObject) -> None:
    recs = data.draw(traffic())
    original = assembler()
    expected = summary(feed(original, recs) + list(original.flush()))
    at = cuts(data.draw, len(recs))
    live = assembler()
    frames = [live.snapshot("t", 0)]
    out: list[Any] = []
    position = 0
    for stop in [*at, len(recs)]:
        out.extend(feed(live, recs[position:stop]))
        position = stop
        if data.draw(st.booleans()):
            frames.append(live.delta("t", 0))
        else:
            frames = [live.snapshot("t", 0)]
        restored = assembler()
        restored.restore("t", 0, frames)
        assert restored.open_calls == live.open_calls
        assert restored.buffered_bytes == live.buffered_bytes
        assert restored.clock("t", 0) == live.clock("t", 0)
        assert restored.next_offset("t", 0) == live.next_offset("t", 0)
        live = restored
    out.extend(live.flush())
    assert summary(out) == expected


@settings(max_examples=200, derandomize=True, deadline=None)
@given(recs=traffic())
def test_no_call_is_judged_twice_and_nothing_is_accepted_that_was_not_sent(
    recs: list[Record],
) -> None:
    a = assembler()
    out = feed(a, recs) + list(a.flush())
    ids = [c.event_id for c in out]
    assert len(ids) == len(set(ids))
    sent: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in recs:
        if record.value is None:
            continue
        try:
            body = orjson.loads(record.value)
        except orjson.JSONDecodeError:
            continue
        if isinstance(body, dict) and body.get("kind") == "tool_call":
            sent.setdefault((body["stream_id"], body["call_id"]), []).append(
                body | {"offset": record.offset}
            )
    for call in out:
        if outcome(call) != "complete":
            assert call.arguments == b""
            continue
        pieces = [
            p
            for p in sent[(call.stream_id, call.call_id)]
            if call.first_offset <= p["offset"] <= call.last_offset
        ]
        # the text is the pieces of this call's span in seq order, each seq once
        taken: dict[int, str] = {}
        order: list[str] = []
        for piece in pieces:
            if piece.get("seq") is None:
                order.append(piece["delta"])
            elif piece["seq"] not in taken:
                taken[piece["seq"]] = piece["delta"]
                order.append(piece["delta"])
            else:
                assert taken[piece["seq"]] == piece["delta"], "a differing repeat was accepted"
        assert call.arguments == "".join(order).encode()
        assert call.chunks == len(order)


def test_a_record_fed_before_is_skipped() -> None:
    a = assembler()
    pieces = records([envelope("s", "c", None, "{"), envelope("s", "c", None, "}", final=True)])
    first = feed(a, pieces[:1])
    again = feed(a, pieces)  # fetched again from an earlier offset: offset 0 is not fed twice
    assert first == []
    assert [(c.arguments, c.chunks) for c in again] == [(b"{}", 2)]
    assert a.stale_records == 1


# --- the principal: an envelope field or a record header, one per call --------------------------


def test_a_calls_principal_comes_from_its_envelope_or_its_header() -> None:
    header = (("principal", b"team-a"),)
    out = feed(
        assembler(),
        [
            Record(0, 0, b"s", envelope("s", "a", None, "{}", final=True, principal="team-a")),
            Record(1, 0, b"s", envelope("s", "b", None, "{}", final=True), header),
            Record(
                2, 0, b"s", envelope("s", "c", None, "{}", final=True, principal="team-a"), header
            ),
            Record(3, 0, b"s", envelope("s", "d", None, "{}", final=True)),
        ],
    )
    assert [(c.call_id, c.principal, outcome(c)) for c in out] == [
        ("a", "team-a", "complete"),
        ("b", "team-a", "complete"),
        ("c", "team-a", "complete"),
        ("d", None, "complete"),
    ]


@pytest.mark.parametrize(
    ("headers", "fields", "detail"),
    [
        ((("principal", b"team-b"),), {"principal": "team-a"}, "differs from the record's"),
        ((("principal", b"\xff"),), {}, "header 'principal' is not UTF-8"),
        ((("principal", b"p" * 41),), {}, "header 'principal' is longer than 40 bytes"),
    ],
)
def test_a_record_naming_two_principals_or_a_bad_one_is_malformed(
    headers: tuple[tuple[str, bytes], ...], fields: dict[str, Any], detail: str
) -> None:
    value = envelope("s", "c", None, "{}", final=True, **fields)
    (call,) = feed(assembler(), [Record(0, 0, b"s", value, headers)])
    assert outcome(call) == "malformed_record"
    assert detail in (call.assembly_detail or "")


def test_a_later_piece_naming_another_principal_corrupts_the_call() -> None:
    out = feed(
        assembler(),
        records(
            [
                envelope("s", "c", 0, "{", principal="alice"),
                envelope("s", "c", 1, "}", final=True, principal="mallory"),
            ]
        ),
    )
    assert [(c.principal, outcome(c)) for c in out] == [("alice", "stream_corrupt")]


def test_a_calls_principal_is_taken_from_the_first_piece_naming_it_and_survives_a_restore() -> None:
    live = assembler()
    assert feed(live, records([envelope("s", "c", 0, "{")])) == []
    assert feed(live, records([envelope("s", "c", 1, '"a":1', principal="alice")], start=1)) == []
    restored = assembler()
    restored.restore("t", 0, [live.snapshot("t", 0)])
    (call,) = feed(restored, records([envelope("s", "c", 2, "}", final=True)], start=2))
    assert (call.principal, call.arguments) == ("alice", b'{"a":1}')


def test_a_vendor_chunk_carries_its_principal_bounded_like_any_identifier() -> None:
    a = assembler()
    named = Chunk("v", "tool_call", "x", tool="t", delta="{}", final=True, principal="bob")
    (call,) = a.feed_chunks("t", 0, 0, 0, [named])
    assert call.principal == "bob"
    long = Chunk("v", "tool_call", "y", tool="t", delta="{}", final=True, principal="p" * 41)
    (call,) = a.feed_chunks("t", 0, 1, 0, [long])
    assert outcome(call) == "malformed_record"
    assert "principal is longer than 40 bytes" in (call.assembly_detail or "")


# --- MCP results: their own slot, whatever calls share their key and id ------------------------

MCP = (("content-format", b"mcp.result"),)


def mcp_result(stream: str, call: str, text: str) -> bytes:
    """An MCP result record's value, as this test's stand-in for the MCP adapter reads it."""
    return orjson.dumps({"stream": stream, "call": call, "text": text})


def mcp_adapter(rename: Callable[[str], str] = str) -> Callable[[Record, str], list[Chunk]]:
    """The MCP adapter's chunk for a record of `mcp_result`, its call id renamed by `rename`."""

    def adapter(record: Record, fmt: str) -> list[Chunk]:
        assert fmt == "mcp.result"
        body = orjson.loads(record.value or b"")
        call = rename(body["call"])
        return [Chunk(body["stream"], "mcp_result", call, tool="r", delta=body["text"], final=True)]

    return adapter


@st.composite
def calls_and_results(draw: st.DrawFn) -> list[Record]:
    """Envelope traffic with MCP results (copies and different ones too) under its keys and its
    calls' ids, at any place in it."""
    recs = draw(traffic())
    for _ in range(draw(st.integers(1, 12))):
        at = draw(st.integers(0, len(recs)))
        stream = draw(st.sampled_from(STREAMS))
        value = mcp_result(stream, draw(st.sampled_from(CALLS)), draw(st.sampled_from(["a", "b"])))
        timestamp = recs[at - 1].timestamp if at > 0 else 0
        recs.insert(at, Record(0, timestamp, stream.encode(), value, MCP))
    return [record._replace(offset=i) for i, record in enumerate(recs)]


def apart(call_id: str) -> str:
    """A result's id made unlike any call's of the traffic."""
    return f"result-{call_id}"


def decided(calls: Sequence[AssembledCall], rename: Callable[[str], str] = str) -> list[Any]:
    """What was decided of each call, results' ids renamed back (the event id names the id)."""
    return [(c.channel, c.stream_id, rename(c.call_id), *summary([c])[0][3:]) for c in calls]


@settings(max_examples=200, derandomize=True, deadline=None)
@given(data=st.data())
def test_a_result_and_a_call_under_one_key_and_id_end_as_they_would_apart(
    data: st.DataObject,
) -> None:
    recs = data.draw(calls_and_results())
    shared = assembler()
    out = feed(shared, recs, mcp_adapter()) + list(shared.flush())
    separate = assembler()
    expected = feed(separate, recs, mcp_adapter(apart)) + list(separate.flush())
    assert decided(out) == decided(expected, lambda c: c.removeprefix("result-"))
    ids = [c.event_id for c in out]
    assert len(ids) == len(set(ids))
    # nothing lost: every result record is a result, or a copy of one already judged
    results = {(c.stream_id, c.call_id) for c in out if c.channel == "mcp_result"}
    sent = {(r.key.decode(), orjson.loads(r.value or b"")["call"]) for r in recs if r.headers}
    assert results == sent


@settings(max_examples=100, derandomize=True, deadline=None)
@given(data=st.data())
def test_a_restored_partition_keeps_results_apart_from_calls(data: st.DataObject) -> None:
    recs = data.draw(calls_and_results())
    whole = assembler()
    expected = summary(feed(whole, recs, mcp_adapter()) + list(whole.flush()))
    live = assembler()
    out: list[Any] = []
    position = 0
    for stop in [*cuts(data.draw, len(recs)), len(recs)]:
        out.extend(feed(live, recs[position:stop], mcp_adapter()))
        position = stop
        restored = assembler()
        restored.restore("t", 0, [live.snapshot("t", 0)])
        live = restored
    out.extend(live.flush())
    assert summary(out) == expected


def test_a_result_under_an_open_calls_id_is_judged_alone_and_the_call_goes_on() -> None:
    a = assembler()
    out = feed(
        a,
        [
            Record(0, 0, b"s", envelope("s", "7", 0, "{", tool="t")),
            Record(1, 0, b"s", mcp_result("s", "7", '{"result":{}}'), MCP),
            Record(2, 0, b"s", envelope("s", "7", 1, "}", final=True)),
            Record(3, 0, b"s", mcp_result("s", "7", '{"result":{}}'), MCP),
        ],
        mcp_adapter(),
    )
    assert [(c.channel, c.call_id, outcome(c), c.arguments) for c in out] == [
        ("mcp_result", "7", "complete", b'{"result":{}}'),
        ("tool_call", "7", "complete", b"{}"),
    ]
    assert a.duplicate_chunks == 1  # the result's copy
