"""Outcome events as records: the size bound, keys and headers, the idempotency request, and the
owner's rejections, which must be the very events the gate would have written for them."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker._native import AssembledCall, encode_event, event_members
from worker.compose import contract_event_bytes, event_limits
from worker.core.canonical import scoped_key
from worker.core.events import (
    MAX_TOPIC_BYTES,
    EventLimits,
    derive_event,
    encode,
    encode_written,
    idempotency_rejection,
    idempotency_request,
    read_idempotency_request,
    record_headers,
    record_key,
    substitute_rejection,
)
from worker.core.feedback import build_feedback
from worker.model import (
    CallKind,
    Code,
    IncompleteReason,
    Outcome,
    Phase,
    RepairKind,
    SchemaRef,
    Verdict,
)
from worker.model import Violation as V
from worker.published.model import parse_event
from worker.schemas.contract import ViolationLimits
from worker.settings import MAX_LIMIT, LimitSettings

FIXED = settings(derandomize=True, deadline=None, print_blob=True)
MAX_FEEDBACK = 4096
MESSAGES = ViolationLimits(32, max_path_bytes=512, max_message_bytes=512)
UNBOUNDED = 1 << 40
REF = SchemaRef("payments.create_payment", "1")

ids = st.text(min_size=1, max_size=40)
maybe = st.none() | st.text(max_size=40)
callers = st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3).map(
    lambda caller: orjson.dumps(caller).decode()
)


@st.composite
def calls(draw: st.DrawFn) -> AssembledCall:
    """A call with every field the event may carry, set or not."""
    return AssembledCall(
        draw(ids),
        draw(ids),
        draw(maybe),
        b"",
        tool_version=draw(maybe),
        idempotency_key=draw(maybe),
        trace_id=draw(maybe),
        run_id=draw(maybe),
        step_id=draw(maybe),
        traceparent=draw(maybe),
        attempt=draw(st.none() | st.integers(1, 2**32 - 1)),
        topic=draw(st.text(max_size=20)),
        partition=draw(st.integers(0, 2**31 - 1)),
        first_offset=draw(st.integers(0, 2**62)),
        chunks=draw(st.integers(1, 5000)),
        duplicate_chunks=draw(st.integers(0, 50)),
        assembly_us=draw(st.integers(0, 10**6)),
        call_kind=draw(st.sampled_from(CallKind)),
        caller=draw(st.none() | callers),
    )


violations = st.lists(
    st.builds(V, st.text(max_size=300), st.text(max_size=30), st.text(max_size=600)),
    max_size=60,
)
phases = st.dictionaries(st.sampled_from([p.value for p in Phase]), st.integers(0, 10**6))
contracts = st.builds(SchemaRef, st.text(max_size=30), st.text(max_size=5))
schemas = st.none() | contracts


@st.composite
def verdicts(draw: st.DrawFn) -> Verdict:
    outcome = draw(st.sampled_from(list(Outcome)))
    schema = draw(schemas)
    key = draw(maybe)
    repairs = tuple(draw(st.lists(st.just(RepairKind.MARKDOWN_FENCE), max_size=1)))
    if outcome is Outcome.ACCEPTED:
        size = draw(st.integers(0, 90_000))
        return Verdict(
            outcome,
            schema=draw(contracts),  # an accepted call was judged by a contract
            arguments_json=orjson.dumps({"blob": "x" * size}),
            repairs=repairs,
            requires_approval=draw(st.booleans()),
            idempotency_key=key,
            phases_us=draw(phases),
        )
    if outcome is Outcome.INCOMPLETE:
        return Verdict(
            outcome,
            phase=Phase.ASSEMBLY,
            reason=draw(st.sampled_from(list(IncompleteReason))),
            retryable=draw(st.booleans()),
            idempotency_key=key,
            phases_us=draw(phases),
        )
    code = draw(st.sampled_from(list(Code)))
    found = tuple(draw(violations))
    retryable = draw(st.booleans())
    exhausted = draw(st.booleans())
    return Verdict(
        outcome,
        phase=draw(st.sampled_from(list(Phase))),
        code=code,
        schema=schema,
        violations=found,
        repairs=repairs,
        retryable=retryable,
        feedback=build_feedback(
            code,
            schema,
            found,
            retryable=retryable,
            budget_exhausted=exhausted,
            max_bytes=MAX_FEEDBACK,
        ),
        idempotency_key=key,
        phases_us=draw(phases),
    )


# --- the size policy --------------------------------------------------------------------------


@FIXED
@given(call=calls(), verdict=verdicts(), max_bytes=st.integers(8_000, 120_000))
def test_an_event_never_exceeds_its_bound_and_is_cut_only_when_it_must(
    call: AssembledCall, verdict: Verdict, max_bytes: int
) -> None:
    event, written = encode_written(call, verdict, EventLimits(max_bytes, MAX_FEEDBACK, MESSAGES))
    assert len(event) <= max_bytes
    assert encode(call, verdict, EventLimits(max_bytes, MAX_FEEDBACK, MESSAGES)) == event
    whole = encode_event(call, verdict, UNBOUNDED)
    assert whole is not None
    fields = orjson.loads(event)
    assert (fields["event_id"], fields["call_id"]) == (call.event_id, call.call_id)
    assert fields["idempotency_key"] == verdict.idempotency_key
    assert encode_event(call, written, UNBOUNDED) == event  # the verdict it says it wrote
    if len(whole) <= max_bytes:
        assert event == whole  # untouched
        assert written is verdict
        return
    schema = None if verdict.schema is None else vars_of(verdict.schema)
    assert fields["schema"] == schema
    # here a rejection without its violations always fits (ids and feedback are bounded
    # well below the smallest bound drawn), and an incomplete event is small
    assert verdict.outcome is not Outcome.INCOMPLETE
    if verdict.outcome is Outcome.ACCEPTED:
        assert (fields["outcome"], fields["phase"], fields["error_code"]) == (
            "rejected",
            "delivery",
            "event_too_large",
        )
        assert [v["keyword"] for v in fields["violations"]] == ["event_too_large"]
        assert str(max_bytes) in fields["violations"][0]["message"]
        assert fields["retryable"] is False
        assert "arguments" not in fields
        assert written.outcome is Outcome.REJECTED
        return
    # a rejection that lost its violations, and says how many
    assert fields["violations"] == []
    assert (fields["outcome"], fields["phase"], fields["error_code"]) == (
        "rejected",
        verdict.phase,
        verdict.code,
    )
    assert fields["retryable"] is verdict.retryable
    assert fields["repairs"] == [{"kind": r} for r in verdict.repairs]
    feedback = fields["retry_feedback"]
    assert feedback["violations"] == []
    assert feedback["violations_omitted"] == len(verdict.violations)
    assert verdict.retry_feedback is not None
    was_exhausted = verdict.retry_feedback.get("retry_budget_exhausted", False)
    assert feedback.get("retry_budget_exhausted", False) is was_exhausted


def vars_of(schema: SchemaRef) -> dict[str, str]:
    return {"id": schema.id, "version": schema.version}


def test_a_rejection_with_too_many_violations_drops_them_and_says_so() -> None:
    call = AssembledCall("s", "c", "t", b"")
    found = tuple(V(f"/p{i}", "type", "m" * 400) for i in range(200))
    verdict = Verdict(
        Outcome.REJECTED,
        phase=Phase.SCHEMA_VALIDATION,
        code=Code.SCHEMA_VIOLATION,
        schema=REF,
        violations=found,
        retryable=True,
        feedback=build_feedback(
            Code.SCHEMA_VIOLATION,
            REF,
            found,
            retryable=True,
            budget_exhausted=False,
            max_bytes=MAX_FEEDBACK,
        ),
    )
    event = orjson.loads(encode(call, verdict, EventLimits(65_536, MAX_FEEDBACK, MESSAGES)))
    assert (event["outcome"], event["error_code"], event["violations"]) == (
        "rejected",
        "schema_violation",
        [],
    )
    assert event["retry_feedback"]["violations_omitted"] == 200
    assert event["retryable"] is True


def test_an_accepted_event_that_cannot_fit_becomes_event_too_large() -> None:
    call = AssembledCall("s", "c", "create_payment", b"", idempotency_key="k-1")
    verdict = Verdict(
        Outcome.ACCEPTED,
        schema=REF,
        arguments_json=orjson.dumps({"blob": "x" * 70_000}),
        requires_approval=True,
        idempotency_key="k-1",
        idempotency_digest=b"\x01" * 16,
    )
    event, written = encode_written(call, verdict, EventLimits(65_536, MAX_FEEDBACK, MESSAGES))
    fields = orjson.loads(event)
    assert (fields["outcome"], fields["phase"], fields["error_code"]) == (
        "rejected",
        "delivery",
        "event_too_large",
    )
    assert "arguments" not in fields
    assert "requires_approval" not in fields
    assert fields["idempotency_key"] == "k-1"
    assert (written.outcome, written.code, written.idempotency_digest) == (
        Outcome.REJECTED,
        Code.EVENT_TOO_LARGE,
        None,
    )


def test_a_substitute_says_why_in_the_delivery_phase() -> None:
    verdict = Verdict(Outcome.ACCEPTED, schema=REF, arguments_json=b"{}", idempotency_key="k")
    substitute = substitute_rejection(
        verdict,
        Code.OUTPUT_REFUSED,
        "topic refused",
        EventLimits(UNBOUNDED, MAX_FEEDBACK, MESSAGES),
    )
    assert (substitute.outcome, substitute.phase, substitute.code) == (
        Outcome.REJECTED,
        Phase.DELIVERY,
        Code.OUTPUT_REFUSED,
    )
    assert substitute.violations == (V("", "output_refused", "topic refused"),)
    assert (substitute.schema, substitute.idempotency_key, substitute.retryable) == (
        REF,
        "k",
        False,
    )


def _messages_within(event: bytes, max_message_bytes: int) -> None:
    for violation in orjson.loads(event)["violations"]:
        for text in (violation["path"], violation["keyword"], violation["message"]):
            assert len(text.encode()) <= max_message_bytes, violation


@FIXED
@given(
    call=calls(),
    verdict=verdicts(),
    max_message_bytes=st.integers(64, 600),
    max_bytes=st.integers(8_000, 120_000) | st.integers(10**17, 2**63),
    topic=st.text(st.sampled_from(["a", "é", "天", "😀", "."]), min_size=249, max_size=249).map(
        lambda name: name.encode()[:MAX_TOPIC_BYTES].decode("utf-8", "ignore")
    ),
    code=st.sampled_from([Code.OUTPUT_REFUSED, Code.EVENT_TOO_LARGE, Code.INTERNAL_ERROR]),
)
def test_every_substitutes_message_is_within_the_message_bound(
    *,
    call: AssembledCall,
    verdict: Verdict,
    max_message_bytes: int,
    max_bytes: int,
    topic: str,
    code: Code,
) -> None:
    """A violation callgate writes in a substitute's place is bounded as every other (the
    issue: `output_refused` named a topic of up to 249 bytes, under a bound of 64), however
    long what it says: a refused topic's name, an event bound of many digits."""
    messages = ViolationLimits(
        32, max_path_bytes=max_message_bytes, max_message_bytes=max_message_bytes
    )
    limits = EventLimits(max_bytes, MAX_FEEDBACK, messages)
    event, _ = encode_written(call, verdict, limits)
    _messages_within(event, max_message_bytes)
    detail = f"{topic} refused the event (KafkaError)"
    substitute = substitute_rejection(verdict, code, detail, limits)
    event, _ = encode_written(call, substitute, limits)
    _messages_within(event, max_message_bytes)
    (violation,) = substitute.violations
    assert violation.message == detail or violation.message.endswith("\u2026")


# --- key and headers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "tool", "schema", "expected"),
    [
        (
            Outcome.ACCEPTED,
            "create_payment",
            REF,
            [("outcome", b"accepted"), ("tool", b"create_payment"), ("schema-version", b"1")],
        ),
        (
            Outcome.REJECTED,
            None,
            None,
            [("outcome", b"rejected"), ("tool", b""), ("schema-version", b"")],
        ),
        (
            Outcome.INCOMPLETE,
            "天気",
            SchemaRef("w.天気", "12"),
            [("outcome", b"incomplete"), ("tool", "天気".encode()), ("schema-version", b"12")],
        ),
    ],
)
def test_headers_let_executors_filter_without_parsing(
    outcome: Outcome, tool: str | None, schema: SchemaRef | None, expected: list[Any]
) -> None:
    version = schema.version if schema is not None else None
    assert record_headers(outcome, tool, version) == expected


def test_the_record_key_is_the_call_id() -> None:
    assert record_key(AssembledCall("s", "call_ü", None, b"")) == "call_ü".encode()


# --- the idempotency request ------------------------------------------------------------------


@FIXED
@given(
    call=calls(),
    key=st.text(max_size=40),
    digest=st.binary(min_size=16, max_size=16),
    schema=schemas,
    event=st.binary(max_size=200),
)
def test_an_idempotency_request_reads_back_as_written(
    call: AssembledCall, key: str, digest: bytes, schema: SchemaRef | None, event: bytes
) -> None:
    verdict = Verdict(
        Outcome.ACCEPTED,
        schema=schema,
        arguments_json=b"{}",
        idempotency_key=key,
        idempotency_digest=digest,
    )
    found = read_idempotency_request(idempotency_request(call, verdict, event))
    assert (found.key, found.digest, found.event_id, found.call_id, found.tool) == (
        scoped_key(call.principal, key),
        digest,
        call.event_id,
        call.call_id,
        call.tool,
    )
    assert found.schema == schema
    assert found.event == event  # byte for byte, newlines and all


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"{}",
        b"CGI1",
        b"CGI1{}",
        b"CGI1not json\n{}",
        b"CGI1[]\n{}",
        b"CGI1null\n{}",
        b"CGI1{}\n{}",
        b'CGI1{"key": 1, "digest": "00", "event_id": "e", "call_id": "c"}\n{}',
        b'CGI1{"key": "k", "digest": "zz", "event_id": "e", "call_id": "c"}\n{}',
        b'CGI1{"key": "k", "digest": "00", "event_id": "e", "call_id": "c", "tool": 3}\n{}',
        b'CGI1{"key": "k", "digest": "00", "event_id": "e", "call_id": "c", "schema": [1]}\n{}',
        b'CGI1{"key": "k", "digest": "00", "event_id": "e", "call_id": "c", "schema": "s"}\n{}',
        b'CGI1{"key": "k", "digest": "00", "event_id": null, "call_id": "c"}\n{}',
    ],
)
def test_anything_else_on_the_idempotency_topic_is_a_value_error(value: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (any ValueError: the owner logs and skips it)
        read_idempotency_request(value)


@FIXED
@given(
    header=st.recursive(
        st.none() | st.integers(-(2**63), 2**63 - 1) | st.text(), st.lists, max_leaves=5
    )
)
def test_a_request_header_of_any_other_shape_is_a_value_error(header: Any) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        read_idempotency_request(b"CGI1" + orjson.dumps(header) + b"\n{}")


# --- the owner's rejections are the gate's own events -----------------------------------------


@FIXED
@given(
    call=calls(),
    schema=st.builds(SchemaRef, st.text(max_size=30), st.text(max_size=5)),
    key=st.text(max_size=40),
    repairs=st.lists(st.just(RepairKind.MARKDOWN_FENCE), max_size=1),
    approval=st.booleans(),
    phases_us=phases,
    code=st.sampled_from([Code.DUPLICATE, Code.IDEMPOTENCY_CONFLICT]),
    first=st.text(min_size=32, max_size=32, alphabet="0123456789abcdef"),
)
def test_the_owners_rejection_is_what_the_gate_would_write_for_it(
    *,
    call: AssembledCall,
    schema: SchemaRef,
    key: str,
    repairs: list[RepairKind],
    approval: bool,
    phases_us: dict[str, int],
    code: Code,
    first: str,
) -> None:
    accepted = Verdict(
        Outcome.ACCEPTED,
        schema=schema,
        arguments_json=b'{"amount_minor": 1, "note": "a\\nb"}',
        repairs=tuple(repairs),
        requires_approval=approval,
        idempotency_key=key,
        idempotency_digest=b"\x00" * 16,
        phases_us=phases_us,
    )
    event = encode(call, accepted, EventLimits(UNBOUNDED, MAX_FEEDBACK, MESSAGES))
    derived, fields = idempotency_rejection(event, code, first, MAX_FEEDBACK)
    (violation,) = fields["violations"]
    assert (violation["path"], violation["keyword"]) == ("", "idempotency_key")
    found = (V("", "idempotency_key", violation["message"]),)
    direct = Verdict(
        Outcome.REJECTED,
        phase=Phase.IDEMPOTENCY,
        code=code,
        schema=schema,
        violations=found,
        repairs=tuple(repairs),
        retryable=False,
        feedback=build_feedback(
            code, schema, found, retryable=False, budget_exhausted=False, max_bytes=MAX_FEEDBACK
        ),
        idempotency_key=key,
        duplicate_of=first,
        phases_us=phases_us,
    )
    expected = encode_event(call, direct, UNBOUNDED)
    assert expected is not None
    # same keys, in the same order, with the same values: the format is defined once
    assert list(orjson.loads(derived).items()) == list(orjson.loads(expected).items())
    assert derived == expected
    assert fields == orjson.loads(derived)


def test_duplicate_and_conflict_say_different_things() -> None:
    call = AssembledCall("s", "c", "create_payment", b"")
    accepted = Verdict(Outcome.ACCEPTED, schema=REF, arguments_json=b"{}", idempotency_key="k")
    event = encode(call, accepted, EventLimits(UNBOUNDED, MAX_FEEDBACK, MESSAGES))
    _, duplicate = idempotency_rejection(event, Code.DUPLICATE, "e" * 32, MAX_FEEDBACK)
    _, conflict = idempotency_rejection(event, Code.IDEMPOTENCY_CONFLICT, "e" * 32, MAX_FEEDBACK)
    assert duplicate["violations"] != conflict["violations"]
    assert duplicate["retry_feedback"]["instruction"] != conflict["retry_feedback"]["instruction"]
    for fields in (duplicate, conflict):
        assert fields["duplicate_of"] == "e" * 32
        assert fields["retryable"] is False
        assert fields["retry_feedback"]["retryable"] is False


# --- the settings bound the worst case ---------------------------------------------------------


@st.composite
def _bounded_call(draw: st.DrawFn, max_id_bytes: int) -> AssembledCall:
    """A call whose identifiers are as long as the bound allows, of characters JSON may write
    as six bytes each (what an envelope or an adapter can hand the reassembler)."""
    char = st.sampled_from(["\x01", "\x1f", '"', "a", "é", "\u2028", "😀"])

    def ident() -> str:
        text = draw(st.text(char, min_size=1, max_size=max_id_bytes))
        return text.encode()[:max_id_bytes].decode("utf-8", "ignore") or "x"

    def maybe_ident() -> str | None:
        return ident() if draw(st.booleans()) else None

    return AssembledCall(
        ident(),
        ident(),
        maybe_ident(),
        b"",
        idempotency_key=maybe_ident(),
        trace_id=maybe_ident(),
        run_id=maybe_ident(),
        step_id=maybe_ident(),
        traceparent=maybe_ident(),
        attempt=draw(st.none() | st.integers(1, 2**32 - 1)),
        topic=draw(st.text(char, max_size=249)).encode()[:249].decode("utf-8", "ignore"),
        first_offset=draw(st.integers(0, 2**63 - 1)),
    )


@FIXED
@given(data=st.data())
def test_under_any_settings_accepted_every_event_fits_its_bound_and_none_raises(
    data: st.DataObject,
) -> None:
    """The settings refuse bounds under which an event could exceed max_event_bytes (the issue:
    4096-byte ids of U+0001 made an AssertionError escape instead of an event)."""
    max_id_bytes = data.draw(st.integers(16, 4096), label="max_id_bytes")
    max_feedback_bytes = data.draw(st.integers(256, 8192), label="max_feedback_bytes")
    max_bytes = data.draw(st.integers(1, 200_000), label="max_bytes")
    max_event_bytes = data.draw(st.integers(65_536, 400_000), label="max_event_bytes")
    limits = {
        "max_id_bytes": max_id_bytes,
        "max_feedback_bytes": max_feedback_bytes,
        "max_bytes": max_bytes,
        "max_event_bytes": max_event_bytes,
    }
    try:
        bounds = event_limits(LimitSettings(**limits))
    except ValueError:
        roomy = LimitSettings(**{**limits, "max_event_bytes": MAX_LIMIT})
        assert max_event_bytes < contract_event_bytes(roomy, SchemaRef("", ""))
        return
    call = data.draw(_bounded_call(max_id_bytes), label="call")
    verdict = data.draw(verdicts(), label="verdict")
    event, written = encode_written(call, verdict, bounds)
    assert len(event) <= max_event_bytes
    assert orjson.loads(event)["event_id"] == call.event_id
    assert encode_event(call, written, UNBOUNDED) == event


def test_the_issues_settings_are_refused_and_an_unbounded_call_still_gets_an_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(ValueError, match="max_event_bytes must hold max_bytes"):
        LimitSettings(max_id_bytes=4096, max_bytes=1024, max_event_bytes=66560)
    ids = "\x01" * 4096
    call = AssembledCall(ids, ids, ids, b"{}", trace_id=ids, run_id=ids, step_id=ids)
    accepted = Verdict(Outcome.ACCEPTED, arguments_json=b"{}")
    event, written = encode_written(
        call, accepted, EventLimits(66560, MAX_FEEDBACK, MESSAGES)
    )  # never raises
    assert (written.outcome, written.code) == (Outcome.REJECTED, Code.EVENT_TOO_LARGE)
    assert orjson.loads(event)["call_id"] == ids
    assert "over the bound of 66560" in caplog.text


def test_a_calls_kind_and_caller_are_read_back_by_the_published_model() -> None:
    caller = '{"type":"program","caller_id":"call_p"}'
    custom = AssembledCall("s", "c", "write_sql", call_kind="custom_tool_call", caller=caller)
    verdict = Verdict(Outcome.ACCEPTED, schema=REF, arguments_json=b'{"input":"SELECT 1"}')
    event = parse_event(encode(custom, verdict, EventLimits(UNBOUNDED, MAX_FEEDBACK, MESSAGES)))
    assert (event.call_kind, event.caller) == (
        "custom_tool_call",
        {"type": "program", "caller_id": "call_p"},
    )
    plain = parse_event(
        encode(
            AssembledCall("s", "c", "t"), verdict, EventLimits(UNBOUNDED, MAX_FEEDBACK, MESSAGES)
        )
    )
    assert (plain.call_kind, plain.caller) == ("function_call", None)


# --- events derived from events: the members' spans -------------------------------------------

#: numbers as a model may spell them, which orjson never writes: kept as they are written
_SPELT_NUMBERS = ("1e15", "-0", "1E+2", str(2**70), "-0.0", "1.5e-7", str(-(2**70)) + ".25E+3")
_SPACES = st.sampled_from(["", " ", "\n\t ", "\r\n"])
_JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def _value_texts(draw: st.DrawFn) -> bytes:
    """A value's JSON text: orjson's, or a spelt number alone or inside a container."""
    kind = draw(st.sampled_from(["orjson", "number", "nested"]))
    if kind == "orjson":
        return orjson.dumps(draw(_JSON))
    number = draw(st.sampled_from(_SPELT_NUMBERS)).encode()
    if kind == "number":
        return number
    inside = orjson.dumps(draw(_JSON))
    return (
        b'{"n":['
        + number
        + b","
        + inside
        + b"],"
        + orjson.dumps(draw(st.text().filter(lambda name: name != "n")))
        + b":"
        + inside
        + b"}"
    )


@st.composite
def _objects(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """An object's text, space around its brackets and separators, and its members' texts."""
    names = draw(st.lists(st.text(max_size=6), unique=True, max_size=6))
    members = [
        orjson.dumps(name)
        + draw(_SPACES).encode()
        + b":"
        + draw(_SPACES).encode()
        + draw(_value_texts())
        for name in names
    ]
    text = draw(_SPACES).encode() + b"{" + draw(_SPACES).encode()
    for index, member in enumerate(members):
        if index:
            text += draw(_SPACES).encode() + b"," + draw(_SPACES).encode()
        text += member
    return text + draw(_SPACES).encode() + b"}" + draw(_SPACES).encode(), members


@FIXED
@given(drawn=_objects(), data=st.data())
def test_an_events_members_are_cut_exactly_and_a_derived_event_keeps_the_others_text(
    drawn: tuple[bytes, list[bytes]], data: st.DataObject
) -> None:
    """The spans cut an object into exactly its members, each member's value text reads as the
    whole object's member does, and a derived event holds what it should: every member it does
    not change or drop as its text was, byte for byte."""
    text, members = drawn
    whole: dict[str, Any] = orjson.loads(text)
    spans = event_members(text)
    assert [name for name, _, _ in spans] == list(whole)
    assert [text[start:end] for _, start, end in spans] == members
    between = [0, *(edge for _, start, end in spans for edge in (start, end)), len(text)]
    gaps = [b"".join(text[between[i] : between[i + 1]].split()) for i in range(0, len(between), 2)]
    assert gaps == ([b"{}"] if not spans else [b"{", *[b","] * (len(spans) - 1), b"}"])
    for name, start, end in spans:
        value = text[start:end][len(orjson.dumps(name)) :].lstrip().removeprefix(b":")
        assert orjson.loads(value) == whole[name]

    names = list(whole)
    changes: dict[str, Any] = data.draw(
        st.dictionaries(st.sampled_from(names) | st.text(max_size=6), _JSON, max_size=4)
        if names
        else st.dictionaries(st.text(max_size=6), _JSON, max_size=4)
    )
    dropped = data.draw(st.sets(st.sampled_from(names), max_size=3) if names else st.just(set()))
    derived = derive_event(text, changes, dropped)
    expected = {
        name: changes.get(name, value) for name, value in whole.items() if name not in dropped
    }
    expected |= {
        name: value for name, value in changes.items() if name not in whole and name not in dropped
    }
    assert orjson.loads(derived) == expected
    assert list(orjson.loads(derived)) == list(expected)
    kept = {name: text[start:end] for name, start, end in spans}
    for name, start, end in event_members(derived):
        if name not in changes:
            assert derived[start:end] == kept[name]


@pytest.mark.parametrize(
    "text",
    [b"", b"[]", b"1", b'"a"', b"{", b'{"a":1,}', b'{"a":1} x', b'{"a":1}{}', b'{"a":1,"a":2}'],
)
def test_an_event_that_is_not_one_object_or_names_a_member_twice_has_no_members(
    text: bytes,
) -> None:
    with pytest.raises(ValueError, match="an event"):
        event_members(text)
    with pytest.raises(ValueError, match="an event"):
        derive_event(text, {"outcome": "approved"})
