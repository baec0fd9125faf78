"""What is accepted is exactly what was validated, on every path (issue 24, sections 1-8).

Each class of hostile input is generated and goes through the processor (`Processor.feed`, what
`callgate check` and the Kafka worker both run, one event encoder), keyed and unkeyed:

- a number means one thing: numbers around the double and 64-bit boundaries, in every spelling,
  judged on both engines against the rule written with `decimal` (`tests.support.numbers`);
  the event passes on exactly the value judged, as an ordinary JSON reader reads it (orjson,
  pydantic: the executor's and the approval's readers), and the gate's idempotency digest, the
  executor's request digest and the approval fingerprint are one identity;
- a retransmission either equals the piece taken (its text and `final`) or the call is never
  accepted, however long the call; after an envelope stream's `end` nothing more on it is taken;
- a piece that cannot be read ends every call it could belong to, keyed or not, and its
  rejection names the stream and call it names; every known field of every envelope is checked;
- accepted arguments are embedded without insignificant whitespace, whatever layout the model
  streamed: every event is one line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from callgate_executor import contract
from tests.support.numbers import INEXACT, admitted, exact, number_texts
from worker.check import FileRecord
from worker.compose import build_processor, build_registry
from worker.core.approval import Decided, Decision, approved_event, pending_event
from worker.core.events import read_idempotency_request
from worker.core.processor import Emission, Processor, Route
from worker.published.model import Accepted, parse_event
from worker.settings import Settings

FIXED = settings(derandomize=True, deadline=None, print_blob=True, max_examples=200)
TOPIC = "model-output"
ENGINES = ["fastjsonschema", "jsonschema-rs"]
#: a contract whose numbers are each judged by one keyword
NUMBERS_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "amount_minor": {"type": "integer", "minimum": 1, "maximum": 100000000},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "step": {"type": "number", "multipleOf": 0.01},
    },
    "additionalProperties": False,
}
#: a keyed contract that requires approval: its calls go to their key's owner with the gate's
#: digest, then wait for a person bound to their fingerprint, then run on an executor
APPROVED_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "x-callgate": {"requires_approval": True, "idempotency_key_argument": "key"},
    "type": "object",
    "properties": {"n": {"type": "number"}, "key": {"type": "string"}},
    "required": ["n", "key"],
    "additionalProperties": False,
}
FIELD_RULES = {
    "amount_minor": lambda v: v.denominator == 1 and 1 <= v <= 100000000,
    "ratio": lambda v: 0 < v <= 1,
    "step": lambda v: (v / Fraction(1, 100)).denominator == 1,
}


def _processor(tmp: Path, engine: str) -> Processor:
    (tmp / "numbers").mkdir(exist_ok=True)
    (tmp / "numbers" / "check.v1.schema.json").write_text(json.dumps(NUMBERS_SCHEMA))
    (tmp / "numbers" / "approve.v1.schema.json").write_text(json.dumps(APPROVED_SCHEMA))
    (tmp / "weather").mkdir(exist_ok=True)
    (tmp / "weather" / "get_weather.v1.schema.json").write_text(
        json.dumps({"type": "object", "properties": {"city": {"type": "string"}}})
    )
    settings_ = Settings(schemas={"dir": tmp, "engine": engine})
    return build_processor(settings_, build_registry(settings_))


@pytest.fixture(scope="module", params=ENGINES)
def engine_processor(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    tmp = tmp_path_factory.mktemp(request.param)
    return lambda: _processor(tmp, request.param)


def records(values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> list[FileRecord]:
    return [
        FileRecord(TOPIC, 0, offset, 1_000 + offset, key, value, ())
        for offset, (value, key) in enumerate(zip(values, keys, strict=True))
    ]


def feed(p: Processor, values: Sequence[bytes | None], *, keyed: bool) -> list[dict[str, Any]]:
    """The events of `values` fed as one partition (keyed by their stream id, or not), read
    with every number as an exact decimal; each event's bytes under `_raw`."""
    keys = [_stream_of(v) if keyed else None for v in values]
    out: list[Emission] = p.feed(TOPIC, 0, records(values, keys))
    events = []
    for emission in out:
        assert b"\n" not in emission.value  # one line, whatever the input held
        event = json.loads(emission.value, parse_float=Decimal, parse_int=Decimal)
        event["_raw"] = emission.value
        events.append(event)
    return events


def _stream_of(value: bytes | None) -> bytes | None:
    try:
        stream = orjson.loads(value or b"").get("stream_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return stream.encode() if isinstance(stream, str) else None


def envelope(call: str, delta: str, *, seq: int | None = None, **fields: Any) -> bytes:
    body: dict[str, Any] = {"stream_id": "s", "call_id": call, "kind": "tool_call", "delta": delta}
    if seq is not None:
        body["seq"] = seq
    body.update(fields)
    return orjson.dumps(body)


def weather_call(text: str, pieces: int, *, numbered: bool, call: str = "c") -> list[bytes]:
    """`text` as a get_weather call of `pieces` envelopes (numbered or not), the last final."""
    size = -(-len(text) // pieces)
    deltas = [text[n * size : (n + 1) * size] for n in range(pieces)]
    return [
        envelope(
            call,
            delta,
            seq=n if numbered else None,
            final=n == len(deltas) - 1,
            **({"tool": "get_weather", "tool_version": "1"} if n == 0 else {}),
        )
        for n, delta in enumerate(deltas)
    ]


# --- 1. a number means one thing --------------------------------------------------------------


@FIXED
@given(field=st.sampled_from(sorted(FIELD_RULES)), text=number_texts())
def test_a_number_is_judged_as_its_exact_value_and_passed_on_as_judged(
    engine_processor: Any, field: str, text: str
) -> None:
    arguments = f'{{"{field}": {text}}}'
    (event,) = feed(
        engine_processor(),
        [envelope("c", arguments, tool="numbers.check", tool_version="1", final=True)],
        keyed=False,
    )
    value = admitted(text)
    if value is None:
        assert (event["outcome"], event["error_code"]) == ("rejected", INEXACT), text
        return
    expected = "accepted" if FIELD_RULES[field](exact(value)) else "rejected"
    assert event["outcome"] == expected, (text, event["violations"])
    if expected == "accepted":
        # the text passed on is the value judged: as it was spelt, or (arguments holding an
        # integer past 2^53) written again, each integer as its digits
        assert event["arguments"] == {field: Decimal(text)}
        spelt = str(value) if _respelt(text, value) else text
        assert f'"arguments":{{"{field}":{spelt}}}'.encode() in event["_raw"]
        assert exact(value) == Fraction(Decimal(text))


def _respelt(text: str, value: int | float) -> bool:
    return type(value) is int and abs(value) > 2**53


@FIXED
@given(text=number_texts())
def test_every_reader_of_an_event_reads_the_number_judged_and_one_identity(
    engine_processor: Any, text: str
) -> None:
    """The value judged is the value passed on, to every reader: an ordinary JSON reader (orjson
    in the approval path, pydantic in the executor) reads the event's arguments as the number
    the gate judged, so the gate's idempotency digest, the executor's request digest and the
    approval fingerprint (each computed on what its reader read) are one identity. An integer
    beyond 2^53 spelt with a fraction or an exponent (9007199254740993.0) was judged as that
    integer but passed on as spelt, which a double reads as 9007199254740992: the pending event
    carried the other number, the executor digested it, and it collided with the call that
    sent 9007199254740992."""
    value = admitted(text)
    assume(value is not None)
    arguments = f'{{"n": {text}, "key": "k"}}'
    call = envelope("c", arguments, tool="numbers.approve", tool_version="1", final=True)
    (emission,) = engine_processor().feed(TOPIC, 0, records([call], [None]))
    assert emission.route is Route.IDEMPOTENCY, orjson.loads(emission.value)
    request = read_idempotency_request(emission.value)
    gate = request.digest.hex()
    for read in (orjson.loads(request.event)["arguments"], _accepted(request.event).arguments):
        assert read == {"n": value, "key": "k"}, (text, read)
    event = _accepted(request.event)
    assert contract.digest_of(event) == gate, text
    pending, found = pending_event(request.event)
    assert found == gate, text
    decided = Decided(Decision.APPROVE, offset=0, at_ms=1, by="ops")
    approved = _accepted(approved_event(pending, decided))
    assert approved.arguments == {"n": value, "key": "k"}, text
    assert contract.approval_refusal(approved, contract_requires=True) is None
    assert contract.digest_of(approved) == gate


def _accepted(value: bytes) -> Accepted:
    event = parse_event(value)
    assert isinstance(event, Accepted)
    return event


@FIXED
@given(field=st.sampled_from(sorted(FIELD_RULES)), text=number_texts(), keyed=st.booleans())
def test_a_streamed_number_is_refused_alike_in_every_spelling(
    engine_processor: Any, field: str, text: str, keyed: bool
) -> None:
    """Streamed, the number is read by the early verdict before the call ends: a number the
    strict parser refuses is `inexact_number` there too, never an early verdict on its rounding
    or on a key read after it (3e28 past a maximum was `schema_violation`, its digits
    `inexact_number`)."""
    values = [
        envelope("c", f'{{"{field}": {text},', seq=0, tool="numbers.check", tool_version="1"),
        envelope("c", '"undeclared": 1}', seq=1, final=True),
    ]
    (event,) = feed(engine_processor(), values, keyed=keyed)
    if admitted(text) is None:
        assert (event["outcome"], event["error_code"]) == ("rejected", INEXACT), (text, event)
    else:
        assert event["error_code"] != INEXACT, (text, event)


@pytest.mark.parametrize(
    "text",
    ["0.99999999999999999", "99999999.99999999999", "3e28", "1e28", "1e300", "3E+28", "1e-400"],
)
def test_the_issue_numbers_are_refused_on_both_engines(engine_processor: Any, text: str) -> None:
    (event,) = feed(
        engine_processor(),
        [envelope("c", f'{{"amount_minor": {text}}}', tool="numbers.check", final=True)],
        keyed=True,
    )
    assert (event["outcome"], event["error_code"]) == ("rejected", INEXACT)


# --- 2. a retransmission equals the piece taken, however long the call ------------------------


@FIXED
@given(
    pieces=st.integers(2, 150),
    copied=st.integers(0, 10**6),
    keyed=st.booleans(),
    numbered=st.booleans(),
)
def test_a_verbatim_copy_of_any_piece_is_dropped_however_long_the_call(
    engine_processor: Any, pieces: int, copied: int, keyed: bool, numbered: bool
) -> None:
    text = '{"city":"' + "".join(chr(ord("a") + n % 26) for n in range(pieces)) + '"}'
    values = weather_call(text, pieces, numbered=numbered)
    values.append(values[copied % len(values)])  # after the call closed
    out = feed(engine_processor(), values, keyed=keyed)
    assert [(e["call_id"], e["outcome"]) for e in out] == [("c", "accepted")]
    assert out[0]["arguments"] == json.loads(text)


@FIXED
@given(at=st.integers(0, 3), keyed=st.booleans(), numbered=st.booleans(), after=st.booleans())
def test_a_copy_that_differs_only_in_final_is_never_an_equal_duplicate(
    engine_processor: Any, at: int, keyed: bool, numbered: bool, after: bool
) -> None:
    values = weather_call('{"city":"Oslo"}', 4, numbered=numbered)  # {"ci, ty":, "Os, lo"}
    flipped = orjson.loads(values[at])
    flipped["final"] = not flipped["final"]
    copy = orjson.dumps(flipped)
    if after:
        values.append(copy)
    else:
        values.insert(at + 1, copy)
    out = feed(engine_processor(), values, keyed=keyed)
    if after or at == 3:
        # the call had its verdict; the copy is no retransmission of it: a call of its own,
        # never accepted
        assert out[0]["outcome"] == "accepted"
        assert all(e["outcome"] != "accepted" for e in out[1:])
    elif not numbered and at < 3:
        # unnumbered pieces are taken in order: a final copy ends the call with other text,
        # which is then judged as text (here `{"ci` is no JSON); it is never accepted whole
        assert all(e.get("arguments") != {"city": "Oslo"} for e in out)
    else:
        assert all(e["outcome"] != "accepted" for e in out), out


@FIXED
@given(
    before=st.integers(0, 2),
    numbered=st.booleans(),
    keyed=st.booleans(),
    finish=st.sampled_from([None, "stop", "length"]),
)
def test_after_an_envelope_streams_end_nothing_more_on_it_is_taken(
    engine_processor: Any, before: int, numbered: bool, keyed: bool, finish: str | None
) -> None:
    values = [
        value
        for n in range(before)
        for value in weather_call('{"city":"Oslo"}', 2, numbered=numbered, call=f"b{n}")
    ]
    values.append(orjson.dumps({"stream_id": "s", "kind": "end", "finish_reason": finish}))
    values += weather_call('{"city":"Oslo"}', 2, numbered=numbered)
    out = feed(engine_processor(), values, keyed=keyed)
    assert [e["call_id"] for e in out if e["outcome"] == "accepted"] == [
        f"b{n}" for n in range(before)
    ]
    (late,) = (e for e in out if e["call_id"] == "c")
    assert (late["stream_id"], late["error_code"]) == ("s", "malformed_record")


def _bounded_processor(tmp: Path, max_bytes: int, max_chunks: int) -> Processor:
    (tmp / "weather").mkdir(exist_ok=True)
    (tmp / "weather" / "get_weather.v1.schema.json").write_text(
        json.dumps({"type": "object", "properties": {"city": {"type": "string"}}})
    )
    settings_ = Settings(
        schemas={"dir": tmp}, limits={"max_bytes": max_bytes, "max_chunks": max_chunks}
    )
    return build_processor(settings_, build_registry(settings_))


@FIXED
@given(
    pieces=st.integers(2, 40),
    closed_by=st.sampled_from(["too_large", "too_many_chunks", "early"]),
    copied=st.integers(0, 10**6),
    at=st.integers(0, 10**6),
    differs=st.booleans(),
    finished=st.booleans(),
    keyed=st.booleans(),
    numbered=st.booleans(),
)
def test_a_copy_of_any_piece_of_a_call_closed_by_a_bound_or_early_equals_it_or_corrupts(
    tmp_path_factory: pytest.TempPathFactory,
    *,
    pieces: int,
    closed_by: str,
    copied: int,
    at: int,
    differs: bool,
    finished: bool,
    keyed: bool,
    numbered: bool,
) -> None:
    """A call past its bound on bytes or pieces, or rejected early, and a copy of any of its
    pieces (verbatim or not) anywhere after it: a verbatim copy is dropped (the call has its one
    event, as without the copy); a numbered copy that differs while the call is open ends it
    `stream_corrupt`; nothing is ever accepted and no two events share an `event_id`."""
    value = "1" * pieces * 3 if closed_by == "early" else '"' + "o" * pieces * 3 + '"'
    text = '{"city":' + value + "}"
    values = weather_call(text, pieces, numbered=numbered)
    if not finished:  # the stream ends before the call's last piece
        values[-1] = orjson.dumps({"stream_id": "s", "kind": "end"})
    bounds = {
        "too_large": (len(text) // 3, 4096),
        "too_many_chunks": (4096, max(1, pieces // 3)),
        "early": (4096, 4096),
    }[closed_by]
    tmp = tmp_path_factory.mktemp("bounds")
    processor = _bounded_processor(tmp, *bounds)
    expected = [
        (e["outcome"], e["error_code"], e["reason"]) for e in feed(processor, values, keyed=keyed)
    ]
    source = copied % (pieces - (0 if finished else 1))
    copy = orjson.loads(values[source])
    if differs:
        copy["delta"] = copy["delta"] + "x"
    place = source + 1 + at % (len(values) - source)
    values.insert(place, orjson.dumps(copy))
    out = feed(_bounded_processor(tmp, *bounds), values, keyed=keyed)
    assert all(e["outcome"] != "accepted" for e in out), out
    assert len({e["event_id"] for e in out}) == len(out)
    got = [(e["outcome"], e["error_code"], e["reason"]) for e in out]
    after = place == len(values) - 1
    if not differs and (numbered or after):
        # (an unnumbered copy inside an open call is one more piece of it, no retransmission)
        assert got == expected
    elif differs and numbered and not after and closed_by != "early":
        # the call was still open: a numbered piece unlike the one taken corrupts it
        assert got[0] == ("incomplete", None, "stream_corrupt")


# --- 3. a piece that cannot be read ends every call it could belong to ------------------------

#: ways one piece of a call cannot be read, each keeping its stream and call id readable
BROKEN = [
    lambda d: d.replace(b'"delta":', b'"delta":"x","delta":', 1),  # a field twice
    lambda d: d.replace(b'"kind":"tool_call"', b'"kind":"tool_call","final":"yes"', 1),
    lambda d: d.replace(b'"kind":"tool_call"', b'"kind":"tool_call","seq":1e400', 1),
    lambda d: d.replace(b'"kind":"tool_call"', b'"kind":"tool_call","tool":false', 1),
    lambda d: d.replace(b'"kind":"tool_call"', b'"kind":"tool_call","finish_reason":7', 1),
    lambda d: d.replace(
        b'"kind":"tool_call"', b'"kind":"tool_call","tool_version":"' + b"v" * 300 + b'"', 1
    ),
    lambda d: d.replace(b'"kind":"tool_call"', b'"kind":"tool_call","x":{"a":1,"a":2}', 1),
    lambda d: d.replace(b'"kind":"tool_call"', b'"kind":"tool_call","x":0.10000000000000001', 1),
    lambda d: d.replace(b'"kind":"tool_call"', b'"kind":"tool"', 1),
    lambda d: d[:-1],  # cut short, after its ids
]


@FIXED
@given(
    pieces=st.integers(2, 8),
    broken_at=st.integers(0, 10**6),
    how=st.integers(0, len(BROKEN) - 1),
    numbered=st.booleans(),
)
def test_an_unreadable_piece_ends_its_call_keyed_or_not_and_is_named(
    engine_processor: Any, pieces: int, broken_at: int, how: int, numbered: bool
) -> None:
    text = '{"city":"' + "o" * pieces * 3 + '"}'
    values = weather_call(text, pieces, numbered=numbered)
    at = broken_at % len(values)
    values[at] = BROKEN[how](values[at])
    runs = [feed(engine_processor(), values, keyed=keyed) for keyed in (False, True)]
    # keyed and unkeyed input decide alike (check feeds envelopes unkeyed, producers may key)
    assert [_decided(e) for e in runs[0]] == [_decided(e) for e in runs[1]]
    for out in runs:
        assert all(e["outcome"] != "accepted" for e in out), out
        rejected = [e for e in out if e["error_code"] == "malformed_record"]
        assert len(rejected) == 1
        assert (rejected[0]["stream_id"], rejected[0]["call_id"]) == ("s", "c")
        assert len({e["event_id"] for e in out}) == len(out)


#: records that name no stream an envelope could be read to name (not UTF-8, not JSON, not an
#: object, no `stream_id` or one that is not a string, a tombstone): keyed by the stream id of
#: nothing, as `check` and a producer that sets no key send them
NAMELESS: list[bytes | None] = [
    b"garbage",
    b"\xff\xfe",
    b"[]",
    b'{"kind":"tool_call","call_id":"c","delta":"x"}',
    b'{"stream_id":7,"call_id":"c","kind":"tool_call","delta":"x"}',
    None,
]


@FIXED
@given(
    streams=st.integers(1, 3),
    pieces=st.integers(2, 5),
    numbered=st.booleans(),
    at=st.integers(0, 10**6),
    how=st.integers(0, len(NAMELESS) - 1),
    replaces=st.booleans(),
    keyed=st.booleans(),
)
def test_a_record_that_names_no_stream_ends_every_envelope_call_it_could_belong_to(
    engine_processor: Any,
    *,
    streams: int,
    pieces: int,
    numbered: bool,
    at: int,
    how: int,
    replaces: bool,
    keyed: bool,
) -> None:
    """Interleaved calls of up to three envelope streams, one record among them (in place of
    a piece, or besides) that names no stream: unkeyed (`check`, a producer that sets no key) it
    could belong to any of them, so every envelope call open then ends `stream_corrupt`; keyed
    by a stream id, that stream's. Calls closed before it, and calls opened after it, are
    judged as without it; it is one `malformed_record` of its own; no event id twice."""
    text = '{"city":"' + "o" * pieces * 2 + '"}'
    calls = []
    for n in range(streams):
        values = weather_call(text, pieces, numbered=numbered, call=f"c{n}")
        calls.append(
            [v.replace(b'"stream_id":"s"', f'"stream_id":"s{n}"'.encode()) for v in values]
        )
    # round robin: each stream's calls interleaved, piece by piece
    order = [call[k] for k in range(pieces) for call in calls]
    place = at % len(order)
    bad = NAMELESS[how]
    owner = orjson.loads(order[place])["stream_id"]  # the stream of the piece it replaces
    values = list(order)
    if replaces:
        values[place] = bad
    else:
        values.insert(place, bad)
    keys = [_stream_of(v) for v in values]
    keys[place] = owner.encode() if keyed else None
    out = [
        event
        for emission in engine_processor().feed(TOPIC, 0, records(values, keys))
        for event in [json.loads(emission.value)]
    ]
    assert len({e["event_id"] for e in out}) == len(out)
    (malformed,) = (e for e in out if e["error_code"] == "malformed_record")
    assert malformed["stream_id"] == (owner if keyed else "")
    by_stream = {e["stream_id"]: e for e in out if e is not malformed}
    for n in range(streams):
        stream = f"s{n}"
        # a call is open at `place` when a piece of it came before and its last one after
        opened = any(_stream_of(v) == stream.encode() for v in order[:place])
        ends_after = any(_stream_of(v) == stream.encode() for v in order[place + 1 :]) or (
            not replaces and any(_stream_of(v) == stream.encode() for v in order[place:])
        )
        ended = opened and ends_after and (not keyed or stream == owner)
        event = by_stream.get(stream)
        if ended:
            assert event is not None
            assert (event["outcome"], event["reason"]) == ("incomplete", "stream_corrupt")
        elif event is not None and stream != owner:
            # (the owner's call may have lost its piece: what is left of it is judged as it
            # comes, and never accepted as other arguments, below)
            assert event["outcome"] == "accepted"
    assert all(e.get("arguments") in (None, json.loads(text)) for e in out)


def _decided(event: dict[str, Any]) -> tuple[Any, ...]:
    return (
        event["event_id"],
        event["call_id"],
        event["outcome"],
        event["error_code"],
        event["reason"],
    )


@pytest.mark.parametrize(
    "field", ['"seq":1e400', '"final":"yes"', '"delta":7', '"call_id":["x"]', '"tool":false']
)
def test_an_end_with_a_field_of_the_wrong_type_is_malformed_and_ends_its_stream(
    engine_processor: Any, field: str
) -> None:
    opened = envelope("c", '{"city":"Oslo"', tool="get_weather", tool_version="1")
    bad_end = b'{"stream_id":"s","kind":"end","finish_reason":"stop",' + field.encode() + b"}"
    out = feed(engine_processor(), [opened, bad_end], keyed=False)
    (bad,) = (e for e in out if e["error_code"] == "malformed_record")
    assert bad["stream_id"] == "s"
    (call,) = (e for e in out if e["call_id"] == "c")
    assert (call["outcome"], call["reason"]) == ("incomplete", "stream_corrupt")


# --- 8. output framing ------------------------------------------------------------------------

CITY = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
LAYOUT = st.sampled_from(["", " ", "\n", "\n  ", "\t", "\r\n", " \n\t "])


@FIXED
@given(
    city=CITY,
    layouts=st.lists(LAYOUT, min_size=6, max_size=6),
    pieces=st.integers(1, 5),
    keyed=st.booleans(),
)
def test_accepted_arguments_are_one_line_however_the_model_laid_them_out(
    engine_processor: Any, city: str, layouts: list[str], pieces: int, keyed: bool
) -> None:
    a, b, c, d, e, f = layouts
    city_text = json.dumps(city)  # escapes as this writer writes them
    text = f'{a}{{{b}"city"{c}:{d}{city_text}{e}}}{f}'
    values = weather_call(text, pieces, numbered=False)
    (event,) = feed(engine_processor(), values, keyed=keyed)
    assert event["outcome"] == "accepted"
    assert event["arguments"] == {"city": city}
    # no whitespace around the structure, the string's own text (its escapes) as it came
    assert b'"arguments":{"city":' + city_text.encode() + b"}," in event["_raw"]
