"""The record processor: records of a partition in, one emission per call out.

What the Kafka worker and `callgate check` both run, fed records as the Kafka client hands them
(`FileRecord` has every field a ConsumerRecord has that the processor reads). The heart of it is
the last section: one verdict per call across crashes, for generated traffic of envelopes and
vendor streams interleaved, checkpointed and restored anywhere.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from tests.adapters import streamgen
from tests.datafiles import SCHEMAS
from worker._native import AssembledCall, encode_event
from worker.check import FileRecord
from worker.compose import (
    build_key_store,
    build_processor,
    build_registry,
    contract_event_bytes,
    gate_limits,
    violation_limits,
)
from worker.core.approval import ended_event, pending_event
from worker.core.canonical import scoped_key
from worker.core.events import (
    WIDEST_ESCAPE,
    EventLimits,
    idempotency_rejection,
    read_idempotency_request,
)
from worker.core.idempotency import Decision, KeyStore, resolve
from worker.core.pipeline import Gate
from worker.core.processor import (
    Emission,
    Processor,
    Route,
    _derived_bound,
    _derived_lengths,
    _later_bound,
    _later_exceeds,
    _longest_later,
)
from worker.model import CallKind, Code, Outcome, RepairKind, SchemaRef, Verdict
from worker.model import Phase as Phase_
from worker.plugins import Plugins, load_plugins
from worker.schemas.registry import SchemaRegistry
from worker.settings import MAX_LIMIT, LimitSettings, Settings

FIXED = settings(derandomize=True, deadline=None, print_blob=True)
IDLE_MS = 1_000
LIFETIME_MS = 2_000
SETTINGS = Settings(
    schemas={"dir": SCHEMAS},
    assembly={"idle_timeout_s": IDLE_MS / 1000, "max_call_lifetime_s": LIFETIME_MS / 1000},
)
REGISTRY = build_registry(SETTINGS)
TOPIC = "model-output"
MAX_FEEDBACK = SETTINGS.limits.max_feedback_bytes
MESSAGES = violation_limits(SETTINGS.limits)


def new_processor(settings: Settings = SETTINGS) -> Processor:
    return build_processor(settings, REGISTRY)


def envelope(stream: str, call: str | None, seq: int | None, delta: str, **fields: Any) -> bytes:
    body: dict[str, Any] = {"stream_id": stream, "kind": "tool_call", "delta": delta}
    if call is not None:
        body["call_id"] = call
    if seq is not None:
        body["seq"] = seq
    body.update(fields)
    return orjson.dumps(body)


def end(stream: str, finish: str | None = None) -> bytes:
    return orjson.dumps({"stream_id": stream, "kind": "end", "finish_reason": finish})


@dataclass
class Partition:
    """Records of one partition, offsets from 0, record time as the test says."""

    topic: str = TOPIC
    partition: int = 0
    offset: int = 0
    clock: int = 1_000_000

    def __call__(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        after_ms: int = 1,
        fmt: str | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> FileRecord:
        self.clock += after_ms
        extra = ((("content-format", fmt.encode()),) if fmt else ()) + tuple(headers)
        record = FileRecord(self.topic, self.partition, self.offset, self.clock, key, value, extra)
        self.offset += 1
        return record


def events(emissions: Iterable[Emission]) -> list[dict[str, Any]]:
    return [orjson.loads(e.value) for e in emissions]


def summary(emissions: Iterable[Emission]) -> list[tuple[Any, ...]]:
    return [(e["call_id"], e["outcome"], e["error_code"] or e["reason"]) for e in events(emissions)]


WEATHER = '{"city":"Oslo","units":"celsius"}'


# --- one call, one event ----------------------------------------------------------------------


def test_a_call_in_chunks_becomes_one_event_when_its_last_chunk_arrives() -> None:
    p, rec = new_processor(), Partition()
    pieces = ['{"city":"Hang', 'zhou","units":', '"celsius"}']
    first = rec(envelope("r1", "c1", 0, pieces[0], tool="get_weather", tool_version="1"))
    middle = rec(envelope("r1", "c1", 1, pieces[1]))
    last = rec(envelope("r1", "c1", 2, pieces[2], final=True, trace_id="t-1", attempt=2))
    assert p.feed(TOPIC, 0, [first]) == []
    assert p.feed(TOPIC, 0, [middle]) == []
    (emission,) = p.feed(TOPIC, 0, [last])
    assert emission.route is Route.ACCEPTED
    assert emission.key == b"c1"
    assert emission.headers == [
        ("outcome", b"accepted"),
        ("tool", b"get_weather"),
        ("schema-version", b"1"),
    ]
    event = orjson.loads(emission.value)
    assert event["outcome"] == "accepted"
    assert event["arguments"] == {"city": "Hangzhou", "units": "celsius", "days": 1}
    assert event["schema"] == {"id": "weather.get_weather", "version": "1"}
    assert event["source"] == {"topic": TOPIC, "partition": 0, "first_offset": 0, "last_offset": 2}
    assert event["metrics"]["chunks"] == 3
    assert event["metrics"]["bytes"] == len("".join(pieces).encode())
    assert (event["trace_id"], event["attempt"]) == ("t-1", 2)
    assert event["event_id"] == emission.call.event_id
    assert emission.verdict.outcome is Outcome.ACCEPTED
    assert p.next_offset(TOPIC, 0) == 3


def test_batching_does_not_matter() -> None:
    rec = Partition()
    records = [
        rec(envelope("r1", "a", 0, '{"city":"Oslo",', tool="get_weather")),
        rec(envelope("r1", "b", 0, "{", tool="get_weather", final=True)),
        rec(envelope("r1", "a", 1, '"units":"celsius"}', final=True)),
    ]
    whole = summary(new_processor().feed(TOPIC, 0, records))
    one_by_one = new_processor()
    assert [s for r in records for s in summary(one_by_one.feed(TOPIC, 0, [r]))] == whole
    assert whole == [("b", "rejected", "invalid_json"), ("a", "accepted", None)]


# --- records that cannot be read -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fmt", "key"),
    [
        (b"not json", None, None),
        (b"[]", None, None),
        (b'{"kind": "tool_call"}', None, None),  # no stream
        (b'{"stream_id": "r1", "kind": "tool_call", "call_id": "c", "seq": -1}', None, None),
        (None, None, None),  # a tombstone
        (b"{}", "gemini.stream", b"g1"),  # a format nobody reads
        (b"{", "openai.chat", b"o1"),  # a vendor event that is not JSON
        (b'{"id": "x"}', "openai.chat", None),  # a vendor record without its stream key
    ],
)
def test_a_poison_record_is_its_own_rejection_and_the_partition_goes_on(
    value: bytes | None, fmt: str | None, key: bytes | None
) -> None:
    p, rec = new_processor(), Partition()
    good_start = rec(envelope("r9", "good", 0, '{"city":"Oslo",', tool="get_weather"))
    poison = rec(value, fmt=fmt, key=key)
    good_end = rec(envelope("r9", "good", 1, '"units":"celsius"}', final=True))
    out = p.feed(TOPIC, 0, [good_start, poison, good_end])
    # a record is named by the call it names when that can be read, else by its place
    named = value is not None and b'"call_id": "c"' in value
    # an envelope record that names no stream, without a key, could be a piece of any
    # envelope call: the open one ends (its last piece is then the tail of a judged call)
    nameless = fmt is None and not named
    assert summary(out) == [
        ("c" if named else f"record:{TOPIC}:0:1", "rejected", "malformed_record"),
        ("good", "incomplete", "stream_corrupt") if nameless else ("good", "accepted", None),
    ]
    bad = orjson.loads(out[0].value)
    assert (bad["phase"], bad["retryable"]) == ("assembly", False)
    assert bad["source"]["first_offset"] == bad["source"]["last_offset"] == 1
    assert bad["violations"][0]["message"]  # says what is wrong
    assert out[0].route is Route.REJECTED
    assert p.next_offset(TOPIC, 0) == 3


def test_a_bad_record_that_names_a_call_ends_it_stream_corrupt() -> None:
    p, rec = new_processor(), Partition()
    opened = rec(envelope("r1", "c1", 0, '{"city":', tool="get_weather"))
    broken = rec(envelope("r1", "c1", 1, '"Oslo"}', final="yes"))  # final must be a bool
    out = p.feed(TOPIC, 0, [opened, broken])
    # the rejection names the stream and call the record names, so their agent hears of it
    assert sorted(summary(out)) == sorted(
        [
            ("c1", "rejected", "malformed_record"),
            ("c1", "incomplete", "stream_corrupt"),
        ]
    )
    bad = next(orjson.loads(o.value) for o in out if b"malformed_record" in o.value)
    assert (bad["stream_id"], bad["source"]["first_offset"]) == ("r1", 1)


def test_a_reused_call_id_is_its_own_rejection_and_a_resent_call_is_nothing() -> None:
    p, rec = new_processor(), Partition()
    whole = envelope("r1", "c1", 0, WEATHER, tool="get_weather", final=True)
    first = p.feed(TOPIC, 0, [rec(whole), rec(whole)])  # a retransmission: no second verdict
    assert summary(first) == [("c1", "accepted", None)]
    reused = envelope("r1", "c1", 0, '{"city":"Rome","units":"celsius"}', tool="get_weather")
    out = p.feed(TOPIC, 0, [rec(reused), rec(envelope("r1", "c1", 1, "", final=True))])
    assert summary(out) == [("c1", "rejected", "call_id_reused")]
    event = orjson.loads(out[0].value)
    assert (event["phase"], event["retryable"]) == ("assembly", False)
    assert event["event_id"] != orjson.loads(first[0].value)["event_id"]  # a call of its own


def test_a_retransmitted_piece_that_differs_is_stream_corrupt() -> None:
    p, rec = new_processor(), Partition()
    out = p.feed(
        TOPIC,
        0,
        [
            rec(envelope("r1", "c1", 0, '{"city":"Oslo",', tool="get_weather")),
            rec(envelope("r1", "c1", 0, '{"city":"Rome",', tool="get_weather")),
        ],
    )
    assert summary(out) == [("c1", "incomplete", "stream_corrupt")]
    assert out[0].route is Route.INCOMPLETE
    assert orjson.loads(out[0].value)["retryable"] is True


# --- time is record time -----------------------------------------------------------------------


def test_an_idle_call_times_out_by_record_time_only() -> None:
    p, rec = new_processor(), Partition()
    assert p.feed(TOPIC, 0, [rec(envelope("r1", "slow", 0, "{", tool="get_weather"))]) == []
    # other traffic just inside the idle time: nothing closes
    assert p.feed(TOPIC, 0, [rec(end("r3"), after_ms=IDLE_MS - 1)]) == []
    # a record past the idle time closes it, before that record is read
    out = p.feed(
        TOPIC,
        0,
        [rec(envelope("r2", "fast", 0, WEATHER, tool="get_weather", final=True), after_ms=2)],
    )
    assert summary(out) == [("slow", "incomplete", "timeout"), ("fast", "accepted", None)]
    # its late piece is no second verdict
    late = p.feed(TOPIC, 0, [rec(envelope("r1", "slow", 1, "}", final=True))])
    assert late == []


def test_a_record_from_the_past_does_not_turn_the_clock_back() -> None:
    p, rec = new_processor(), Partition()
    p.feed(TOPIC, 0, [rec(end("r0"), after_ms=10 * IDLE_MS)])
    # opened by a record stamped long before the partition's time: it is as old as that time
    p.feed(TOPIC, 0, [rec(envelope("r1", "b", 0, "{", tool="get_weather"), after_ms=-5 * IDLE_MS)])
    out = p.feed(TOPIC, 0, [rec(end("r2"), after_ms=5 * IDLE_MS + 2)])
    assert summary(out) == []
    out = p.feed(TOPIC, 0, [rec(end("r2"), after_ms=IDLE_MS)])
    assert summary(out) == [("b", "incomplete", "timeout")]


def test_a_call_open_past_its_lifetime_ends_at_its_next_piece() -> None:
    p, rec = new_processor(), Partition()
    out = p.feed(TOPIC, 0, [rec(envelope("r1", "long", 0, '{"city":', tool="get_weather"))])
    seq = 1
    while rec.clock < 1_000_000 + LIFETIME_MS:  # always active, never idle
        out += p.feed(TOPIC, 0, [rec(envelope("r1", "long", seq, " "), after_ms=IDLE_MS // 2)])
        seq += 1
    out += p.feed(TOPIC, 0, [rec(envelope("r1", "long", seq, '"Oslo"}', final=True))])
    assert summary(out) == [("long", "incomplete", "max_lifetime")]


def test_input_without_timestamps_never_times_out() -> None:
    p = new_processor()
    records = [
        FileRecord(TOPIC, 0, 0, None, None, envelope("r1", "a", 0, "{", tool="get_weather"), ()),
        *(FileRecord(TOPIC, 0, i, None, None, end(f"x{i}"), ()) for i in range(1, 50)),
    ]
    assert p.feed(TOPIC, 0, records) == []
    assert summary(p.flush()) == [("a", "incomplete", "stream_ended")]


# --- stream end, flush ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finish", "reason"),
    [
        ("length", "max_tokens"),
        ("content_filter", "content_filter"),
        ("stop", "stream_ended"),
        (None, "stream_ended"),
    ],
)
def test_a_stream_that_ends_with_calls_open_makes_them_incomplete(
    finish: str | None, reason: str
) -> None:
    p, rec = new_processor(), Partition()
    p.feed(TOPIC, 0, [rec(envelope("r1", "cut", 0, '{"city":"Pa', tool="get_weather"))])
    p.feed(TOPIC, 0, [rec(envelope("r2", "other", 0, "{", tool="get_weather"))])
    out = p.feed(TOPIC, 0, [rec(end("r1", finish))])
    assert summary(out) == [("cut", "incomplete", reason)]
    assert summary(p.flush()) == [("other", "incomplete", "stream_ended")]
    assert p.flush() == []


def test_a_dropped_partition_forgets_its_open_calls() -> None:
    p, rec = new_processor(), Partition()
    p.feed(TOPIC, 0, [rec(envelope("r1", "a", 0, "{", tool="get_weather"))])
    p.drop(TOPIC, 0)
    assert p.assembler.open_calls == 0
    assert p.next_offset(TOPIC, 0) is None
    assert p.flush() == []


# --- keyed calls: the owner of the key decides ------------------------------------------------


def payment_args(**overrides: Any) -> dict[str, Any]:
    body = {
        "amount_minor": 1250,
        "currency": "EUR",
        "recipient": "acct_1",
        "description": None,
        "idempotency_key": "pay-1",
    }
    body.update(overrides)
    return body


def payment(rec: Partition, call: str, args: dict[str, Any], stream: str = "r1") -> FileRecord:
    text = orjson.dumps(args).decode()
    return rec(envelope(stream, call, 0, text, tool="create_payment", final=True))


def test_a_keyed_call_goes_to_its_keys_owner_who_accepts_the_first() -> None:
    p, rec, store = new_processor(), Partition(), build_key_store(SETTINGS)
    (emission,) = p.feed(TOPIC, 0, [payment(rec, "c1", payment_args())])
    assert emission.route is Route.IDEMPOTENCY
    assert emission.key == scoped_key(None, "pay-1").encode()  # the key, scoped by principal
    assert emission.headers == []
    request = read_idempotency_request(emission.value)
    assert (request.key, request.call_id, request.event_id) == (
        scoped_key(None, "pay-1"),
        "c1",
        emission.call.event_id,
    )
    assert request.digest == emission.verdict.idempotency_digest
    resolution = resolve(store, emission.value, rec.clock, MAX_FEEDBACK)
    assert (resolution.decision, resolution.outcome) == (Decision.FIRST, Outcome.ACCEPTED)
    event = orjson.loads(resolution.event)
    assert (event["outcome"], event["call_id"], event["idempotency_key"]) == (
        "accepted",
        "c1",
        "pay-1",
    )
    assert event["requires_approval"] is False
    assert event["arguments"] == payment_args()
    assert resolution.event == request.event


def test_the_same_request_again_is_a_duplicate_naming_the_first_event() -> None:
    p, rec, store = new_processor(), Partition(), build_key_store(SETTINGS)
    (first,) = p.feed(TOPIC, 0, [payment(rec, "c1", payment_args())])
    # another call, the same request written another way
    reordered = dict(reversed(list(payment_args().items())))
    (second,) = p.feed(TOPIC, 0, [payment(rec, "c2", reordered, stream="r2")])
    assert second.route is Route.IDEMPOTENCY
    resolve(store, first.value, rec.clock, MAX_FEEDBACK)
    resolution = resolve(store, second.value, rec.clock, MAX_FEEDBACK)
    assert (resolution.decision, resolution.outcome) == (Decision.DUPLICATE, Outcome.REJECTED)
    event = orjson.loads(resolution.event)
    assert (event["outcome"], event["phase"], event["error_code"]) == (
        "rejected",
        "idempotency",
        "duplicate",
    )
    assert event["call_id"] == "c2"
    assert event["event_id"] == second.call.event_id
    assert event["duplicate_of"] == first.call.event_id
    assert "arguments" not in event
    assert event["retryable"] is False


def test_a_different_request_under_the_same_key_is_a_conflict() -> None:
    p, rec, store = new_processor(), Partition(), build_key_store(SETTINGS)
    (first,) = p.feed(TOPIC, 0, [payment(rec, "c1", payment_args())])
    (other,) = p.feed(TOPIC, 0, [payment(rec, "c2", payment_args(amount_minor=999))])
    resolve(store, first.value, rec.clock, MAX_FEEDBACK)
    resolution = resolve(store, other.value, rec.clock, MAX_FEEDBACK)
    assert resolution.decision is Decision.CONFLICT
    event = orjson.loads(resolution.event)
    assert (event["error_code"], event["duplicate_of"]) == (
        "idempotency_conflict",
        first.call.event_id,
    )


def test_a_replayed_keyed_call_is_accepted_again_as_the_same_event() -> None:
    store = build_key_store(SETTINGS)
    records = [payment(Partition(), "c1", payment_args())]
    (first,) = new_processor().feed(TOPIC, 0, records)
    (again,) = new_processor().feed(TOPIC, 0, records)  # after a crash: the same input
    decided = [resolve(store, e.value, 0, MAX_FEEDBACK) for e in (first, again)]
    assert [d.decision for d in decided] == [Decision.FIRST, Decision.REPLAY]
    assert [d.outcome for d in decided] == [Outcome.ACCEPTED, Outcome.ACCEPTED]
    assert orjson.loads(decided[1].event)["event_id"] == orjson.loads(decided[0].event)["event_id"]


def test_a_rejected_keyed_call_goes_straight_to_its_topic() -> None:
    p, rec = new_processor(), Partition()
    (emission,) = p.feed(TOPIC, 0, [payment(rec, "c1", payment_args(currency="XXX"))])
    assert emission.route is Route.REJECTED
    assert orjson.loads(emission.value)["idempotency_key"] == "pay-1"


def test_an_accepted_call_whose_event_cannot_be_written_is_routed_as_its_rejection() -> None:
    """The event says rejected `event_too_large`: its topic, headers and key owner agree."""
    plugins = load_plugins(SCHEMAS)
    growing = Plugins()
    growing.adapter("weather.get_weather", "1")(lambda args: {**args, "pad": "x" * 2_000})
    for chosen, key in ((growing, None), (growing, "w-1"), (plugins, None)):
        built = new_processor()  # its assembler and decoder, this gate and event bound
        p = Processor(
            built.assembler,
            built.decoder,
            Gate(
                REGISTRY,
                chosen,
                gate_limits(SETTINGS),
            ),
            EventLimits(1_500, MAX_FEEDBACK, MESSAGES),
        )
        text = envelope(
            "r1",
            "c1",
            0,
            WEATHER,
            tool="get_weather",
            tool_version="1",
            final=True,
            idempotency_key=key,
        )
        (emission,) = p.feed(TOPIC, 0, [Partition()(text)])
        event = orjson.loads(emission.value)
        if chosen is plugins:
            assert emission.route is Route.ACCEPTED  # small enough
            continue
        assert (event["outcome"], event["error_code"]) == ("rejected", "event_too_large")
        assert emission.route is Route.REJECTED
        assert dict(emission.headers)["outcome"] == b"rejected"
        assert emission.verdict.outcome is Outcome.REJECTED
        assert event["idempotency_key"] == key


_IDENT = st.text(st.sampled_from(["a", "\x01", "é", '"', "😀"]), min_size=1, max_size=30)


@FIXED
@given(
    ident=_IDENT,
    key=st.text(st.sampled_from("ab-_09"), min_size=1, max_size=128),
    held=st.booleans(),
    slack=st.integers(-3, 3) | st.integers(-700, 700),
)
def test_an_event_written_later_in_a_calls_place_fits_the_bound_or_the_call_is_too_large(
    ident: str, key: str, held: bool, slack: int
) -> None:
    """Three keyed calls (a refund is held for approval too): the first, its duplicate and a
    conflicting one, under an event bound around the longest rejection their key's owner
    could write in place of their events (the owner writes it from the accepted event, without
    its arguments but with its feedback). Every event written, by the worker and by the key's
    owner, is within the bound, and a payment is `event_too_large` only when an event written
    for it, then or later, would not be (the issue: the owner's `duplicate` of a call accepted
    just under the bound was written past it)."""
    tool = "refund_payment" if held else "create_payment"
    first = {"amount_minor": 1250, "currency": "EUR", "idempotency_key": key}
    first |= (
        {"payment_id": "p", "reason": None} if held else {"recipient": "a", "description": None}
    )
    calls = [first, first, {**first, "amount_minor": 1251}]

    def records() -> list[FileRecord]:
        rec = Partition()
        return [
            rec(envelope(ident, f"{ident}{n}", 0, orjson.dumps(a).decode(), tool=tool, final=True))
            for n, a in enumerate(calls)
        ]

    def processor(bound: int) -> Processor:
        built = new_processor()
        limits = EventLimits(bound, MAX_FEEDBACK, MESSAGES)
        return Processor(built.assembler, built.decoder, built.gate, limits)

    probe = processor(1 << 30).feed(TOPIC, 0, records())
    accepted = [read_idempotency_request(e.value).event for e in probe]
    owners = [n for event in accepted for n in _owners_events(event)]
    # no lower than the smallest event these calls can have (the settings refuse such bounds)
    smallest = max(len(e.value) for e in processor(1).feed(TOPIC, 0, records()))
    bound = max(max(owners) + slack, smallest)
    store = build_key_store(SETTINGS)
    for emission, probed in zip(processor(bound).feed(TOPIC, 0, records()), accepted, strict=True):
        if emission.route is Route.IDEMPOTENCY:
            written = read_idempotency_request(emission.value).event
            assert len(written) <= bound
            assert len(resolve(store, emission.value, 0, MAX_FEEDBACK).event) <= bound
            assert all(n <= bound for n in _owners_events(written))  # whatever it decides
        else:
            assert len(emission.value) <= bound
            fields = orjson.loads(emission.value)
            assert (fields["outcome"], fields["error_code"]) == ("rejected", "event_too_large")
            if not held:  # (a held call's later events are its approval's too)
                # refused only when needed: the event as probed (its timings aside) did not fit
                assert max(len(probed), *_owners_events(probed)) > bound - _TIMINGS


@FIXED
@given(
    max_message_bytes=st.integers(64, 300),
    topic=st.text(st.sampled_from(["a", "é", "天", "😀", "-"]), min_size=249, max_size=249),
    stream=st.text(st.sampled_from(["s", "\x01", "😀"]), min_size=1, max_size=64),
)
def test_every_violation_written_in_a_calls_place_is_within_the_message_bound(
    max_message_bytes: int, topic: str, stream: str
) -> None:
    """The `event_too_large` a keyed call becomes when its key's owner's event could not fit,
    and the `output_refused` written when a topic of the longest name refuses its event, say
    no more than CALLGATE_LIMITS__MAX_MESSAGE_BYTES, as every violation (the issue: both were
    written whole: 90 bytes and up to 280, under a bound of 64)."""
    settings = Settings(schemas={"dir": SCHEMAS}, limits={"max_message_bytes": max_message_bytes})
    limits = settings.limits.event_limits()
    records = [payment(Partition(), "c1", payment_args(), stream)]
    probe = build_processor(settings, REGISTRY).feed(TOPIC, 0, records)
    accepted = read_idempotency_request(probe[0].value).event
    built = build_processor(settings, REGISTRY)
    tight = EventLimits(len(accepted) + 1, limits.max_feedback_bytes, limits.violations)
    p = Processor(built.assembler, built.decoder, built.gate, tight)
    (emission,) = p.feed(TOPIC, 0, records)
    assert emission.verdict.code is Code.EVENT_TOO_LARGE
    refused = f"{topic.encode()[:249].decode('utf-8', 'ignore')} refused the event (KafkaError)"
    substituted, written = built.substitute(
        emission.call, probe[0].verdict, Code.OUTPUT_REFUSED, refused
    )
    assert written.code is Code.OUTPUT_REFUSED
    for written_event in (emission.value, substituted):
        for violation in orjson.loads(written_event)["violations"]:
            assert len(violation["message"].encode()) <= max_message_bytes, violation


def test_the_fixed_messages_of_later_events_fit_the_least_message_bound() -> None:
    """What a key's owner and an approval write into a violation is fixed text, within the
    least CALLGATE_LIMITS__MAX_MESSAGE_BYTES the settings allow: it is never cut."""
    (least,) = [
        m.ge for m in LimitSettings.model_fields["max_message_bytes"].metadata if hasattr(m, "ge")
    ]
    accepted = Verdict(Outcome.ACCEPTED, schema=SchemaRef("s", "1"), arguments_json=b"{}")
    value = encode_event(AssembledCall("s", "c", "t"), accepted, 1 << 20)
    assert value is not None
    pending, _ = pending_event(value)
    events = [idempotency_rejection(value, code, "0" * 32, MAX_FEEDBACK)[0] for code in KEYED]
    events += [ended_event(pending, code, MAX_FEEDBACK) for code in ENDED]
    for later in events:
        (violation,) = orjson.loads(later)["violations"]
        assert len(violation["message"].encode()) <= least


KEYED = (Code.DUPLICATE, Code.IDEMPOTENCY_CONFLICT)
ENDED = (Code.APPROVAL_DENIED, Code.APPROVAL_EXPIRED)


_WIDE = st.sampled_from(["\x01", "\x1f", '"', "a", "é", "😀"])


@settings(FIXED, max_examples=50)
@given(data=st.data())
def test_under_the_least_bounds_allowed_every_call_the_promise_covers_is_accepted(
    data: st.DataObject,
) -> None:
    """Whatever the bounds and a contract's schema id and version, either the settings or the
    composition refuse them, or every accepted call with at most CALLGATE_LIMITS__MAX_BYTES
    of arguments and identifiers and an idempotency key of at most
    CALLGATE_LIMITS__MAX_ID_BYTES, keyed or not, held or not, is written accepted, and every
    event written later in its place fits too (the issue: the settings' bound left out the
    key and the schema, so under the least bound they allowed a keyed call with identifiers at
    their widest was `event_too_large` with 2-byte arguments)."""
    max_id_bytes = data.draw(st.integers(16, 4096), label="max_id_bytes")

    widest = data.draw(st.booleans(), label="every byte escaped in six")

    def ident() -> str:
        if widest:
            return "\x01" * max_id_bytes
        text = data.draw(st.text(_WIDE, min_size=max_id_bytes, max_size=max_id_bytes))
        return text.encode()[:max_id_bytes].decode("utf-8", "ignore")

    limits = {
        "max_id_bytes": max_id_bytes,
        "max_feedback_bytes": data.draw(st.integers(1_000, 8_192), label="max_feedback_bytes"),
        "max_bytes": data.draw(st.integers(2, 40) | st.integers(2, 300_000), label="max_bytes"),
        "max_event_bytes": MAX_LIMIT,
    }
    ref = SchemaRef(data.draw(st.text(_WIDE, max_size=300)), data.draw(st.text(_WIDE, max_size=8)))
    needed = contract_event_bytes(LimitSettings(**limits), ref)
    slack = data.draw(st.integers(-3, 3) | st.integers(-2_000, 2_000), label="slack")
    limits["max_event_bytes"] = max(65_536, needed + slack)
    try:
        chosen = LimitSettings(**limits)
    except ValueError:
        event("refused by the settings")
        return
    if contract_event_bytes(chosen, ref) > chosen.max_event_bytes:
        event("refused at composition")  # build_gate refuses the contract
        return
    event("covered")
    max_bytes = chosen.max_bytes
    arguments = b"{}" if max_bytes < 9 else b'{"a":"' + b"x" * (max_bytes - 8) + b'"}'
    keyed = data.draw(st.booleans(), label="keyed")
    key = ident() if keyed or data.draw(st.booleans()) else None
    call = AssembledCall(
        ident(),
        ident(),
        ident(),
        arguments,
        idempotency_key=key,
        principal=ident(),
        trace_id=ident(),
        run_id=ident(),
        step_id=ident(),
        traceparent=ident(),
        attempt=2**32 - 1,
        topic=data.draw(st.text(_WIDE, min_size=249, max_size=249))
        .encode()[:249]
        .decode("utf-8", "ignore"),
        first_offset=2**63 - 1,
        call_kind=data.draw(st.sampled_from(CallKind)),
    )
    verdict = Verdict(
        Outcome.ACCEPTED,
        schema=ref,
        arguments_json=arguments,
        repairs=tuple(data.draw(st.lists(st.sampled_from(RepairKind), max_size=2, unique=True))),
        requires_approval=data.draw(st.booleans(), label="held"),
        idempotency_key=key,
        idempotency_digest=bytes(16) if keyed else None,
        phases_us={phase.value: 2**63 - 1 for phase in Phase_},
    )
    built = new_processor()  # its own contracts aside: `ref` is the contract judged here
    chosen_processor = Processor(built.assembler, built.decoder, built.gate, chosen.event_limits())
    value, written = chosen_processor._written(call, verdict)
    assert written is verdict, orjson.loads(value)["violations"]
    assert _longest_later(value, written, chosen.max_feedback_bytes) <= chosen.max_event_bytes


#: how many bytes two writings of one event may differ by: their phases' microseconds
_TIMINGS = 64


def _owners_events(event: bytes) -> list[int]:
    """How long each rejection the key's owner may write for an accepted `event` would be."""
    return [
        len(idempotency_rejection(event, code, "0" * 32, MAX_FEEDBACK)[0])
        for code in (Code.DUPLICATE, Code.IDEMPOTENCY_CONFLICT)
    ]


_TEXT = st.text(st.sampled_from(["a", "\x01", "\x1f", "\n", "é", '"', "\\", "😀"]), max_size=40)
_SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | _TEXT
_JSON = st.recursive(
    _SCALARS | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
#: a caller as an adapter writes one (orjson's text of what the vendor sent, its numbers exact)
_CALLERS = st.dictionaries(
    _TEXT,
    st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3), max_leaves=6),
    max_size=3,
).map(lambda caller: orjson.dumps(caller).decode())


@st.composite
def _accepted(draw: st.DrawFn) -> tuple[bytes, Verdict]:
    """An accepted call's event as the processor writes it: any identifiers, kind, caller (an
    adapter's, written by orjson), key or none, held or not, any schema, arguments spelt with
    or without whitespace."""
    opt = st.none() | _TEXT
    call = AssembledCall(
        draw(_TEXT),
        draw(_TEXT),
        draw(opt),
        b"",
        trace_id=draw(opt),
        run_id=draw(opt),
        step_id=draw(opt),
        traceparent=draw(opt),
        principal=draw(opt),
        attempt=draw(st.none() | st.integers(1, 2**32 - 1)),
        topic=draw(_TEXT),
        partition=draw(st.integers(0, 2**31 - 1)),
        first_offset=draw(st.integers(0, 2**63 - 1)),
        chunks=draw(st.integers(1, 2**32 - 1)),
        call_kind=draw(st.sampled_from(CallKind)),
        caller=draw(st.none() | _CALLERS),
    )
    arguments = draw(st.dictionaries(_TEXT, _JSON, max_size=4))
    spelt = orjson.dumps(arguments, option=orjson.OPT_INDENT_2 if draw(st.booleans()) else 0)
    keyed = draw(st.booleans())
    verdict = Verdict(
        Outcome.ACCEPTED,
        schema=SchemaRef(draw(_TEXT), draw(_TEXT)),
        arguments_json=spelt,
        repairs=tuple(draw(st.lists(st.sampled_from(RepairKind), max_size=2))),
        requires_approval=draw(st.booleans()),
        idempotency_key=draw(_TEXT) if keyed else draw(opt),
        idempotency_digest=b"\x00" * 16 if keyed else None,
        phases_us=draw(st.dictionaries(st.sampled_from(list(Phase_)), st.integers(0, 2**62))),
    )
    value = encode_event(call, verdict, 1 << 40)
    assert value is not None
    return value, verdict


@FIXED
@given(
    accepted=_accepted(),
    max_feedback_bytes=st.integers(256, 8192),
    slack=st.integers(-3, 3) | st.integers(-2_000, 2_000),
)
def test_the_later_events_bound_is_never_below_them_and_decides_as_building_them_does(
    accepted: tuple[bytes, Verdict], max_feedback_bytes: int, slack: int
) -> None:
    """The cheap bound of the events written later in an accepted call's place (its key's
    owner's, its approval's) is never below the longest of them built, whatever the call's
    identifiers, caller, key, schema and arguments and the feedback bound; and under an event
    bound drawn around that longest, `_later_exceeds` says what building them says (the
    processor built them for every keyed or held call before)."""
    value, verdict = accepted
    derived = _derived_lengths(
        value,
        keyed=verdict.idempotency_digest is not None,
        held=verdict.requires_approval,
        max_feedback_bytes=max_feedback_bytes,
    )
    assert all(n <= _derived_bound(value, verdict.schema) for n in derived)
    longest = _longest_later(value, verdict, max_feedback_bytes)
    assert _later_bound(value, verdict) >= longest
    for bound in (longest + slack, _later_bound(value, verdict) + slack):
        limits = EventLimits(bound, max_feedback_bytes, MESSAGES)
        assert _later_exceeds(value, verdict, limits) is (longest > bound)


@pytest.mark.parametrize("schema", [SchemaRef("", ""), SchemaRef("\x01" * 7, "\x1f" * 3)])
def test_the_later_events_bound_is_met_by_the_call_it_is_measured_on(schema: SchemaRef) -> None:
    """No smaller bound is sound: a keyed and held call with the shortest arguments, whose
    schema's every character is escaped in six bytes, has a derived event of exactly the
    bound's length."""
    call = AssembledCall("s", "c", "t", b"", idempotency_key="k")
    verdict = Verdict(
        Outcome.ACCEPTED,
        schema=schema,
        arguments_json=b"{}",
        requires_approval=True,
        idempotency_key="k",
        idempotency_digest=b"\x00" * 16,
    )
    value = encode_event(call, verdict, 1 << 40)
    assert value is not None
    derived = _derived_lengths(value, keyed=True, held=True, max_feedback_bytes=1 << 20)
    assert max(derived) == _derived_bound(value, schema)


# --- one verdict per call across crashes ------------------------------------------------------

STREAM_FORMATS = ["openai.chat", "anthropic.messages", "openai.responses"]
ARGUMENTS = [
    WEATHER,
    '{"city":"Zürich","units":"fahrenheit","days":3}',
    '{"city":1}',
    '{"city":"Oslo",}',
    '{"city":"Oslo","units":"kelvin","days":3}',
    '```json\n{"city":"Oslo","units":"celsius"}\n```',
    '{"deep":' + "[" * 40 + "]" * 40 + "}",
]


def envelope_stream(
    n: int, rng: random.Random, draw: st.DrawFn
) -> list[tuple[bytes | None, bytes | None, str | None]]:
    stream = f"s{n}"
    out: list[tuple[bytes | None, bytes | None, str | None]] = []
    for c in range(draw(st.integers(1, 3))):
        call = f"c{n}.{c}"
        kind = draw(st.sampled_from(["weather", "weather", "payment", "keyed", "text"]))
        if kind == "payment":
            args = payment_args(
                idempotency_key=draw(st.sampled_from(["pay-1", "pay-2"])),
                amount_minor=draw(st.sampled_from([1, 2, 5_000_000])),
                currency=draw(st.sampled_from(["EUR", "JPY"])),
            )
            text, tool, extra = orjson.dumps(args).decode(), "create_payment", {}
        else:
            text, tool = draw(st.sampled_from(ARGUMENTS)), "get_weather"
            extra = (
                {"idempotency_key": draw(st.sampled_from(["w-1", "w-2"]))}
                if kind == "keyed"
                else {}
            )
            if kind == "text":
                extra = {}
        pieces = streamgen.split_text(text, rng, max_piece=12)
        shape = draw(st.sampled_from(["whole", "whole", "cut", "gap", "resend", "corrupt"]))
        for seq, piece in enumerate(pieces):
            last = seq == len(pieces) - 1
            if shape == "gap" and seq == 1:
                continue
            fields: dict[str, Any] = {"final": last and shape != "cut", **extra}
            if seq == 0:
                fields["tool"] = tool
            if kind == "text":
                fields["kind"] = "text"
            value = envelope(stream, call, seq, piece, **fields)
            out.append((value, None, None))
            if shape == "resend":
                out.append((value, None, None))
            if shape == "corrupt" and seq == 0:
                out.append((envelope(stream, call, 0, piece + "x", **fields), None, None))
    if draw(st.booleans()):
        out.append((end(stream, draw(st.sampled_from([None, "length", "stop"]))), None, None))
    return out


def vendor_stream(
    n: int, rng: random.Random, draw: st.DrawFn
) -> list[tuple[bytes | None, bytes | None, str | None]]:
    fmt = draw(st.sampled_from(STREAM_FORMATS))
    calls = [
        (f"v{n}call{i}", "get_weather", draw(st.sampled_from(ARGUMENTS)))
        for i in range(draw(st.integers(1, 2)))
    ]
    if fmt == "openai.chat":
        events_ = streamgen.chat_stream(f"chat{n}", [calls], rng)
    elif fmt == "anthropic.messages":
        cut = draw(st.sampled_from([None, 2]))
        stop = "max_tokens" if cut else "tool_use"
        events_ = streamgen.anthropic_stream(
            f"msg{n}", calls, rng, stop_reason=stop, cut_last_after=cut
        )
    else:
        cut = draw(st.sampled_from([None, 3]))
        events_ = streamgen.responses_stream(f"resp{n}", calls, rng, cut_after=cut)
    if draw(st.integers(0, 9)) == 0 and len(events_) > 2:  # a corrupt event mid-stream
        events_.insert(len(events_) // 2, {"type": None})
    key = f"vendor-{n}".encode()
    return [(orjson.dumps(e), key, fmt) for e in events_]


#: time between records: mostly a stream's pace, now and then a stall past the idle time or
#: the lifetime, or a producer's clock behind the partition's
STEPS = st.one_of(
    st.sampled_from([0, 1, 2, 7, 50, 120, 300]),
    st.integers(0, 40).map(
        lambda n: {0: IDLE_MS + 1, 1: 2 * LIFETIME_MS, 2: -50, 3: -5 * IDLE_MS}.get(n, 10)
    ),
)


@st.composite
def traffic(
    draw: st.DrawFn, envelope_streams: int = 3, vendor_streams: int = 2
) -> list[FileRecord]:
    """Envelope streams, vendor streams and poison records of one partition, interleaved, with
    record times that stall, jump past the idle time and the lifetime, and go back."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    streams = [envelope_stream(n, rng, draw) for n in range(draw(st.integers(0, envelope_streams)))]
    streams += [vendor_stream(n, rng, draw) for n in range(draw(st.integers(0, vendor_streams)))]
    streams += [
        [(draw(st.sampled_from([b"{", b"[]", None])), None, None)]
        for _ in range(draw(st.integers(0, 2)))
    ]
    merged = [item for _, item in streamgen.interleave(streams, rng)]
    clock = 1_700_000_000_000
    records = []
    for offset, (value, key, fmt) in enumerate(merged):
        clock += draw(STEPS)
        headers = (("content-format", fmt.encode()),) if fmt else ()
        records.append(FileRecord(TOPIC, 0, offset, clock, key, value, headers))
    return records


def normalized(emission: Emission) -> tuple[Any, ...]:
    """What an emission says, without the phase timings (measurement, not decision)."""
    value = emission.value
    request: Any = None
    if emission.route is Route.IDEMPOTENCY:
        found = read_idempotency_request(value)
        request = (found.key, found.digest, found.event_id, found.call_id, found.tool, found.schema)
        value = found.event
    event = orjson.loads(value)
    del event["metrics"]["phases_us"]
    return (emission.route, emission.key, emission.headers, request, event)


def uninterrupted(records: Sequence[FileRecord], settings: Settings) -> list[tuple[Any, ...]]:
    p = new_processor(settings)
    return [normalized(e) for e in [*p.feed(TOPIC, 0, records), *p.flush()]]


def cut_points(draw: st.DrawFn, n: int) -> list[int]:
    return sorted(set(draw(st.lists(st.integers(0, n), max_size=8))))


@dataclass(frozen=True)
class Bounds:
    """The settings a partition runs under, and how many streams the traffic interleaves."""

    settings: Settings
    envelope_streams: int
    vendor_streams: int


#: every bound far away, and every bound hit: open calls and vendor streams evicted, closed
#: calls forgotten (what a checkpoint must carry exactly, order included)
TIGHT = Settings(
    schemas={"dir": SCHEMAS},
    assembly={"idle_timeout_s": IDLE_MS / 1000, "max_call_lifetime_s": LIFETIME_MS / 1000},
    limits={"max_open_calls_per_partition": 2, "recently_closed_per_partition": 2},
)
ROOMY = Bounds(SETTINGS, 3, 2)
TIGHTLY = Bounds(TIGHT, 4, 5)
CRASH = settings(FIXED, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
#: past the bounds, a failure takes hundreds of examples to show and long to shrink: it is
#: printed as found
CRASH_AT_THE_BOUNDS = settings(
    FIXED,
    max_examples=1000,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
#: their thousand examples take 70-110 s on an idle machine, twice that beside other work: the
#: bound is for a hang, never for a slow run
AT_THE_BOUNDS_TIMEOUT_S = 480


def restore_anywhere(bounds: Bounds, data: st.DataObject) -> None:
    """Checkpoint (full, or full and deltas) anywhere, restore into a fresh processor, go on:
    exactly the emissions of one uninterrupted run."""
    records = data.draw(traffic(bounds.envelope_streams, bounds.vendor_streams))
    expected = uninterrupted(records, bounds.settings)
    live = new_processor(bounds.settings)
    frames: list[bytes] = []
    out: list[tuple[Any, ...]] = []
    position = 0
    for stop in [*cut_points(data.draw, len(records)), len(records)]:
        out += [normalized(e) for e in live.feed(TOPIC, 0, records[position:stop])]
        position = stop
        full = not frames or data.draw(st.booleans(), label="full checkpoint")
        checkpoint = live.checkpoint(TOPIC, 0, full=full)
        frames = [checkpoint] if full else [*frames, checkpoint]
        restored = new_processor(bounds.settings)
        restored.restore(TOPIC, 0, frames)
        assert restored.next_offset(TOPIC, 0) == live.next_offset(TOPIC, 0)
        assert restored.assembler.open_calls == live.assembler.open_calls
        assert restored.assembler.buffered_bytes == live.assembler.buffered_bytes
        live = restored
    out += [normalized(e) for e in live.flush()]
    assert out == expected


def crash_anywhere(bounds: Bounds, data: st.DataObject) -> None:
    """The worker feeds past its last checkpoint, emits, and dies; its successor restores the
    checkpoint and is fetched the records after it again: what it emits again is what was
    emitted before, byte for byte but the timings, and the run as a whole is the one it would
    have been."""
    records = data.draw(traffic(bounds.envelope_streams, bounds.vendor_streams))
    expected = uninterrupted(records, bounds.settings)
    live = new_processor(bounds.settings)
    frames: list[bytes] = []
    out: list[tuple[Any, ...]] = []
    position = 0
    for cut in [*cut_points(data.draw, len(records)), len(records)]:
        stop = max(cut, position)
        out += [normalized(e) for e in live.feed(TOPIC, 0, records[position:stop])]
        full = not frames or data.draw(st.booleans(), label="full checkpoint")
        checkpoint = live.checkpoint(TOPIC, 0, full=full)
        frames = [checkpoint] if full else [*frames, checkpoint]
        # on past the checkpoint, in batches of any size, then the crash
        beyond = data.draw(st.integers(0, len(records) - stop), label="fed before the crash")
        lost: list[tuple[Any, ...]] = []
        for batch in batches(records[stop : stop + beyond], data):
            lost += [normalized(e) for e in live.feed(TOPIC, 0, batch)]
        successor = new_processor(bounds.settings)
        successor.restore(TOPIC, 0, frames)
        again = [normalized(e) for e in successor.feed(TOPIC, 0, records[stop : stop + beyond])]
        assert again == lost
        # the successor may also be handed records it has seen (a fetch from an older offset)
        assert successor.feed(TOPIC, 0, records[max(0, stop - 3) : stop + beyond]) == []
        out += again
        position = stop + beyond
        live = successor
    out += [normalized(e) for e in live.flush()]
    assert out == expected


@CRASH
@given(data=st.data())
def test_a_restored_partition_emits_exactly_what_one_uninterrupted_run_emits(
    data: st.DataObject,
) -> None:
    restore_anywhere(ROOMY, data)


@CRASH
@given(data=st.data())
def test_a_crash_after_a_checkpoint_replays_the_same_events_and_no_others(
    data: st.DataObject,
) -> None:
    crash_anywhere(ROOMY, data)


@pytest.mark.timeout(AT_THE_BOUNDS_TIMEOUT_S)
@CRASH_AT_THE_BOUNDS
@given(data=st.data())
def test_a_restored_partition_at_every_bound_emits_what_one_run_emits(
    data: st.DataObject,
) -> None:
    restore_anywhere(TIGHTLY, data)


@pytest.mark.timeout(AT_THE_BOUNDS_TIMEOUT_S)
@CRASH_AT_THE_BOUNDS
@given(data=st.data())
def test_a_crash_at_every_bound_replays_the_same_events_and_no_others(
    data: st.DataObject,
) -> None:
    crash_anywhere(TIGHTLY, data)


def batches(records: Sequence[FileRecord], data: st.DataObject) -> list[Sequence[FileRecord]]:
    at = sorted(set(data.draw(st.lists(st.integers(0, len(records)), max_size=4))))
    bounds = [0, *at, len(records)]
    return [records[a:b] for a, b in itertools.pairwise(bounds)]


@settings(FIXED, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(records=traffic())
def test_every_call_has_one_event_id_and_a_replay_gives_the_same_ones(
    records: list[FileRecord],
) -> None:
    first = [*new_processor().feed(TOPIC, 0, records)]
    p = new_processor()
    second = [*p.feed(TOPIC, 0, records)]
    ids = [e.call.event_id for e in first]
    assert len(ids) == len(set(ids)), "two emissions name one call"
    assert [e.call.event_id for e in second] == ids
    for emission in first:  # the record names the call it came from
        if emission.route is Route.IDEMPOTENCY:
            named = read_idempotency_request(emission.value).event_id
        else:
            named = orjson.loads(emission.value)["event_id"]
        assert named == emission.call.event_id
    # what is still open is closed at the end, with ids of its own
    rest = [e.call.event_id for e in p.flush()]
    assert not set(rest) & set(ids)
    assert len(rest) == len(set(rest))


@settings(FIXED, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(records=traffic())
def test_the_key_owner_decides_keyed_calls_the_same_after_a_replay(
    records: list[FileRecord],
) -> None:
    """Keyed emissions of a run and of its replay, decided by one store: the replay is all
    `replay` (or the duplicate/conflict it was), never a new verdict."""
    store: KeyStore = build_key_store(SETTINGS)
    first = [e for e in new_processor().feed(TOPIC, 0, records) if e.route is Route.IDEMPOTENCY]
    decided = [resolve(store, e.value, 0, MAX_FEEDBACK) for e in first]
    replay = [e for e in new_processor().feed(TOPIC, 0, records) if e.route is Route.IDEMPOTENCY]
    again = [resolve(store, e.value, 0, MAX_FEEDBACK) for e in replay]
    for before, after in zip(decided, again, strict=True):
        if before.decision is Decision.FIRST:
            assert after.decision is Decision.REPLAY
        else:
            assert after.decision is before.decision
        assert after.outcome is before.outcome
        assert orjson.loads(after.event)["event_id"] == orjson.loads(before.event)["event_id"]


# --- every format, restored at every record --------------------------------------------------

#: an MCP result the weather tools file's output schema accepts
MCP_RESULT: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": "r",
    "result": {
        "content": [
            {"type": "text", "text": '{"temperature": 2.5, "conditions": "c", "humidity": 6}'}
        ],
        "structuredContent": {"temperature": 2.5, "conditions": "c", "humidity": 6},
        "isError": False,
    },
}
#: arguments a Gemini call can carry (its `args` is a JSON object, never text)
OBJECTS = [text for text in ARGUMENTS if text.startswith("{") and not text.endswith(",}")]

Item = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]
VENDOR_FORMATS = [
    "openai.chat",
    "anthropic.messages",
    "openai.responses",
    "google.gemini",
    "bedrock.converse",
    "mcp.result",
]


def any_vendor_stream(n: int, rng: random.Random) -> list[Item]:
    """One stream of any vendor format, finished in any way its vendor finishes one, now and
    then with an event repeated, broken, or sent after its end; keyed by its stream id (now and
    then an envelope stream's; a record or, rarely, the whole stream without a key), for a
    principal or none; Chat Completions with several choices, or in the `ollama` dialect."""
    fmt = rng.choice(VENDOR_FORMATS)
    calls = [(f"v{n}c{i}", "get_weather", rng.choice(ARGUMENTS)) for i in range(rng.randint(1, 3))]
    header = fmt
    if fmt == "openai.chat":
        k = rng.choice([1, 1, 2])
        choices = [[(f"{c[0]}x{j}", c[1], c[2]) for c in calls] for j in range(k)]
        finish = [rng.choice(["tool_calls", "stop", "length", "content_filter"]) for _ in choices]
        events = streamgen.chat_stream(
            f"chat{n}", choices, rng, finish=finish, usage=rng.random() < 0.5
        )
        header = "openai.chat; dialect=ollama" if k == 1 and rng.random() < 0.3 else fmt
    elif fmt == "anthropic.messages":
        events = streamgen.anthropic_stream(
            f"msg{n}",
            calls,
            rng,
            stop_reason=rng.choice(["tool_use", "max_tokens", "end_turn"]),
            cut_last_after=rng.choice([None, 2]),
            server_tool=rng.random() < 0.3,
        )
    elif fmt == "openai.responses":
        events = streamgen.responses_stream(
            f"resp{n}",
            calls,
            rng,
            cut_after=rng.choice([None, 3]),
            numbered=rng.random() < 0.5,
            parallel=rng.random() < 0.5,
        )
    elif fmt == "google.gemini":
        events = streamgen.gemini_stream(
            f"gem{n}",
            [(c[0], c[1], rng.choice(OBJECTS)) for c in calls],
            rng,
            partial=rng.random() < 0.5,
            with_ids=rng.random() < 0.5,
            finish=rng.choice(["STOP", "STOP", "MAX_TOKENS", "MALFORMED_FUNCTION_CALL", "SAFETY"]),
            cut_after=rng.choice([None, None, 4]),
        )
    elif fmt == "bedrock.converse":
        events = streamgen.bedrock_stream(
            calls,
            rng,
            stop_reason=rng.choice(["tool_use", "tool_use", "max_tokens", "malformed_tool_use"]),
            cut_last_after=rng.choice([None, None, 2]),
            server_tool=rng.random() < 0.5,
            metadata=rng.random() < 0.5,
        )
    else:
        events = []
        for i in range(rng.randint(1, 3)):
            result = orjson.loads(orjson.dumps(MCP_RESULT))
            result["id"] = f"m{n}.{i}"
            if rng.random() < 0.3:
                result["result"]["structuredContent"]["humidity"] = 200
            events.append(result)
    if rng.random() < 0.15 and len(events) > 2:  # an event the stream cannot place
        events.insert(rng.randrange(1, len(events)), {"type": None})
    if rng.random() < 0.2:  # an event repeated
        at = rng.randrange(len(events))
        events.insert(at + 1, events[at])
    if rng.random() < 0.2:  # an event after the end
        events.append(rng.choice(events))
    # now and then under the key of envelope stream n: a stream is one source, envelopes or not
    stream = f"s{n}" if rng.random() < 0.15 else f"vendor-{n}"
    key = stream.encode() if rng.random() < 0.95 else None
    headers: tuple[tuple[str, bytes], ...] = (("content-format", header.encode()),)
    if fmt == "mcp.result":
        headers += (("tool", b"weather.get_weather_data"),)
    if rng.random() < 0.3:
        headers += (("principal", b"alice"),)
    return [
        (orjson.dumps(event), key if rng.random() < 0.97 else None, headers) for event in events
    ]


def any_envelope_stream(n: int, rng: random.Random, keyed: bool) -> list[Item]:
    """One envelope stream: calls interleaved, numbered or not, whole, cut, with a gap, a piece
    repeated or changed, a copy or a new call under a closed call's id after it, an `end` or
    none, and a record after the `end`."""
    stream = f"s{n}"
    calls: list[tuple[str, list[bytes], str]] = []
    for c in range(rng.randint(1, 3)):
        call = f"c{n}.{c}"
        kind = rng.choice(["weather", "weather", "payment", "keyed", "text"])
        extra: dict[str, Any] = {}
        if kind == "payment":
            args = payment_args(idempotency_key=rng.choice(["pay-1", "pay-2"]))
            text, tool = orjson.dumps(args).decode(), "create_payment"
        else:
            text, tool = rng.choice(ARGUMENTS), "get_weather"
            if kind == "keyed":
                extra["idempotency_key"] = rng.choice(["w-1", "w-2"])
        if rng.random() < 0.2:
            extra["principal"] = "bob"
        numbered = rng.random() < 0.8
        shape = rng.choice(["whole", "whole", "cut", "gap", "resend", "corrupt", "late", "reuse"])
        values: list[bytes] = []
        pieces = streamgen.split_text(text, rng, max_piece=12)
        for seq, piece in enumerate(pieces):
            if shape == "gap" and seq == 1:
                continue
            fields: dict[str, Any] = {"final": seq == len(pieces) - 1 and shape != "cut", **extra}
            if seq == 0:
                fields["tool"] = tool
            if kind == "text":
                fields["kind"] = "text"
            number = seq if numbered else None
            values.append(envelope(stream, call, number, piece, **fields))
            if shape == "resend":
                values.append(values[-1])
            if shape == "corrupt" and seq == 0:
                values.append(envelope(stream, call, number, piece + "x", **fields))
        calls.append((call, values, shape))
    merged = [value for _, value in streamgen.interleave([v for _, v, _ in calls], rng)]
    for call, values, shape in calls:
        if shape == "late":
            merged.append(rng.choice(values))
        if shape == "reuse":
            merged.append(envelope(stream, call, 0, '{"city":"X"}', final=True, tool="get_weather"))
    if rng.random() < 0.6:
        merged.append(end(stream, rng.choice([None, "length", "stop", "tool_calls"])))
        if rng.random() < 0.4:
            merged.append(rng.choice(merged))
    key = stream.encode() if keyed else None
    return [(value, key, ()) for value in merged]


@st.composite
def every_format(draw: st.DrawFn) -> list[FileRecord]:
    """Envelope streams (keyed or not), streams of every vendor format and poison records of
    one partition, interleaved, in record times that stall, jump and go back."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    keyed = rng.random() < 0.5
    streams = [any_envelope_stream(n, rng, keyed) for n in range(rng.randint(0, 3))]
    streams += [any_vendor_stream(n, rng) for n in range(rng.randint(0, 3))]
    streams += [
        [(rng.choice([b"{", b"[]", None]), rng.choice([None, b"s0", b"vendor-0"]), ())]
        for _ in range(rng.randint(0, 2))
    ]
    clock = 1_700_000_000_000
    records = []
    for offset, (_, (value, key, headers)) in enumerate(streamgen.interleave(streams, rng)):
        clock += draw(STEPS)
        records.append(FileRecord(TOPIC, 0, offset, clock, key, value, headers))
    return records


@settings(FIXED, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(records=every_format(), tight=st.booleans(), data=st.data())
def test_every_format_restored_at_every_record_emits_what_one_run_emits(
    records: list[FileRecord], tight: bool, data: st.DataObject
) -> None:
    """A checkpoint (full, or a delta on the chain) after every record, each restored into a
    fresh processor that goes on: the emissions of one uninterrupted run, byte for byte but the
    timings, for every input format, keyed and unkeyed, with faults, under roomy and tight
    bounds (streams and calls evicted, closed ones forgotten)."""
    chosen = TIGHT if tight else SETTINGS
    expected = uninterrupted(records, chosen)
    live = new_processor(chosen)
    frames: list[bytes] = []
    out: list[tuple[Any, ...]] = []
    for record in records:
        out += [normalized(e) for e in live.feed(TOPIC, 0, [record])]
        full = not frames or data.draw(st.integers(0, 3), label="full") == 0
        checkpoint = live.checkpoint(TOPIC, 0, full=full)
        frames = [checkpoint] if full else [*frames, checkpoint]
        live = new_processor(chosen)
        live.restore(TOPIC, 0, frames)
    out += [normalized(e) for e in live.flush()]
    assert out == expected


# --- an idempotency key is an identifier, wherever it comes from ---------------------------------


def _keyed_contract(argument: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"side_effects": True}
    if argument is not None:
        meta["idempotency_key_argument"] = argument
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "x-callgate": meta,
        "type": "object",
        "properties": {"key": {"type": "string"}},
    }


@pytest.fixture(scope="module")
def keyed_contracts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, SchemaRegistry]:
    """A tool keyed by its envelope (`by_envelope`) and one keyed by its argument `key`."""
    directory = tmp_path_factory.mktemp("keyed") / "keys"
    directory.mkdir()
    for tool, argument in (("by_envelope", None), ("by_argument", "key")):
        schema = orjson.dumps(_keyed_contract(argument))
        (directory / f"{tool}.v1.schema.json").write_bytes(schema)
    conf = Settings(schemas={"dir": directory.parent})
    return conf, build_registry(conf)


def _of_bytes(data: st.DataObject, length: int) -> str:
    """A text of exactly `length` UTF-8 bytes, every byte escaped in six or mixed."""
    text = data.draw(st.text(_WIDE, min_size=length, max_size=length))
    cut = text.encode()[:length].decode("utf-8", "ignore")
    return cut + "a" * (length - len(cut.encode()))


@settings(FIXED, max_examples=40)
@given(data=st.data())
def test_a_key_decides_alike_from_the_envelope_and_from_an_argument(
    keyed_contracts: tuple[Settings, SchemaRegistry], data: st.DataObject
) -> None:
    """A key of at most CALLGATE_LIMITS__MAX_ID_BYTES is taken from the envelope and from the
    argument the contract names alike, and its call's events fit the event bound; a longer one
    is refused alike, `malformed_record`, on either path (the issue: a key argument was bounded
    by MAX_BYTES only, so a call keyed past the identifier bound was accepted, or
    `event_too_large`, where its envelope's key made the record malformed)."""
    max_id_bytes = data.draw(st.integers(16, 600), label="max_id_bytes")
    # room for a key argument of four times the bound, every byte escaped in six
    max_bytes = 32 + WIDEST_ESCAPE * 4 * max_id_bytes
    limits = LimitSettings(
        max_id_bytes=max_id_bytes, max_bytes=max_bytes, max_event_bytes=MAX_LIMIT
    )
    base, registry = keyed_contracts
    needed = max(contract_event_bytes(limits, c.ref) for c in registry.contracts())
    chosen = LimitSettings(
        max_id_bytes=max_id_bytes, max_bytes=max_bytes, max_event_bytes=max(65_536, needed)
    )
    conf = base.model_copy(update={"limits": chosen})
    p, rec = build_processor(conf, registry), Partition()
    length = data.draw(
        st.integers(max_id_bytes - 3, max_id_bytes + 3) | st.integers(1, 4 * max_id_bytes),
        label="key bytes",
    )
    key = _of_bytes(data, length)
    principal = _of_bytes(data, max_id_bytes)
    by_envelope = envelope(
        "s", "c1", 0, "{}", tool="by_envelope", final=True, idempotency_key=key, principal=principal
    )
    argument = orjson.dumps({"key": key}).decode()
    by_argument = envelope(
        "s", "c2", 0, argument, tool="by_argument", final=True, principal=principal
    )
    decided = []
    for value in (by_envelope, by_argument):
        (emission,) = p.feed(TOPIC, 0, [rec(value)])
        verdict = emission.verdict
        decided.append((emission.route, verdict.outcome, verdict.code, verdict.retryable))
        assert len(emission.value) <= chosen.max_event_bytes
        if verdict.outcome is Outcome.ACCEPTED:
            assert verdict.idempotency_key == key
            event = read_idempotency_request(emission.value).event
            assert (
                _longest_later(event, verdict, chosen.max_feedback_bytes) <= chosen.max_event_bytes
            )
    assert decided[0] == decided[1]
    if length > max_id_bytes:
        assert decided[0][1:3] == (Outcome.REJECTED, Code.MALFORMED_RECORD)
    else:
        assert decided[0][1] is Outcome.ACCEPTED
