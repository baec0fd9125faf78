"""Approval: the fingerprint, the store that holds calls and rules on decisions, the expiry.

Fingerprints are held to their rule with generated arguments: one for every spelling of the same
arguments, another for any change. The store is driven with the records a worker reads (pending
events and decisions, with their offsets and times); every event and record it makes is held to
the published schemas; a store rebuilt from its changelog at any point rules on the rest as the
original does.
"""

from __future__ import annotations

import functools
import json
import random
from typing import Any

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.support import published
from worker._native import AssembledCall, ParseError, parse_json
from worker.compose import build_key_store, build_processor
from worker.core.approval import (
    CALLGATE,
    PENDING_OUTCOME,
    ApprovalStore,
    Decision,
    Refusal,
    Ruled,
    Ruling,
    decision_record,
    fingerprint,
)
from worker.core.idempotency import resolve
from worker.core.processor import Processor, Route
from worker.model import Code, Outcome, SchemaRef
from worker.published import Document
from worker.published.model import Accepted, PendingApproval, Rejected, parse_event
from worker.settings import Settings

FIXED = settings(derandomize=True, deadline=None, print_blob=True, max_examples=300)
REFUND = SchemaRef("payments.refund_payment", "1")
SETTINGS = Settings()
EXPIRY_MS = 60_000
RETENTION_MS = 600_000


# --- the fingerprint --------------------------------------------------------------------------

LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
ARGUMENTS = st.dictionaries(st.text(max_size=8), VALUES, max_size=6)


def spellings(value: Any, seed: int) -> list[bytes]:
    """Texts of the same JSON value: members in other orders, whitespace, escapes, numbers in
    another form."""
    rng = random.Random(seed)

    def shuffled(node: Any) -> Any:
        if isinstance(node, dict):
            items = list(node.items())
            rng.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        if isinstance(node, list):
            return [shuffled(v) for v in node]
        return node

    return [
        orjson.dumps(value),
        json.dumps(shuffled(value), ensure_ascii=True, indent=2).encode(),
        json.dumps(shuffled(value), ensure_ascii=False, separators=(" , ", " : ")).encode(),
        json.dumps(shuffled(value)).encode(),
    ]


@FIXED
@given(arguments=ARGUMENTS, seed=st.integers(0, 2**16))
def test_every_spelling_of_the_same_arguments_has_one_fingerprint(
    arguments: dict[str, Any], seed: int
) -> None:
    parsed = [parse_json(text, 254) for text in spellings(arguments, seed)]
    # a number the strict parser refuses (no exact double of its text) is no call's argument
    assume(not any(isinstance(value, ParseError) for value in parsed))
    found = {fingerprint(REFUND, value) for value in parsed}
    assert len(found) == 1
    assert len(found.pop()) == 32


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (b'{"a": 1.0}', b'{"a": 1}'),  # one double, two spellings
        (b'{"a": 1e2}', b'{"a": 100.0}'),
        (b'{"a": "\\u0041"}', b'{"a": "A"}'),
        (b'{"b": [1, 2], "a": null}', b'{"a":null,"b":[1,2]}'),
    ],
)
def test_spellings_a_model_writes_have_one_fingerprint(one: bytes, other: bytes) -> None:
    assert fingerprint(REFUND, parse_json(one, 254)) == fingerprint(REFUND, parse_json(other, 254))


def changed(value: Any, rng: random.Random) -> Any:
    """`value` with one thing changed: a leaf, a member added or removed, an item more."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        name = rng.choice(sorted(value))
        copy = dict(value)
        if rng.random() < 0.2:
            del copy[name]
        else:
            copy[name] = changed(copy[name], rng)
        return copy
    if isinstance(value, list) and value and rng.random() < 0.7:
        index = rng.randrange(len(value))
        return [*value[:index], changed(value[index], rng), *value[index + 1 :]]
    if isinstance(value, dict):
        return {**value, "\u0000added": 1}
    if isinstance(value, list):
        return [*value, None]
    if isinstance(value, bool) or value is None:
        return "x" if value is None else not value
    if isinstance(value, int):
        return value + 1 if value < 2**63 - 1 else value - 1
    if isinstance(value, float):
        return value + 1.0 if abs(value) < 1e15 else -value if value else 1.0
    return value + "x"


@FIXED
@given(arguments=ARGUMENTS, seed=st.integers(0, 2**16))
def test_any_change_of_the_arguments_changes_the_fingerprint(
    arguments: dict[str, Any], seed: int
) -> None:
    other = changed(arguments, random.Random(seed))
    if other == arguments:  # -0.0 == 0.0 and the like: not a change JSON can tell
        return
    assert fingerprint(REFUND, arguments) != fingerprint(REFUND, other)


def test_another_tool_or_version_has_another_fingerprint() -> None:
    arguments = {"payment_id": "p", "amount_minor": 1}
    found = {
        fingerprint(REFUND, arguments),
        fingerprint(SchemaRef("payments.refund_payment", "2"), arguments),
        fingerprint(SchemaRef("payments.create_payment", "1"), arguments),
    }
    assert len(found) == 3


def test_an_integer_past_a_double_keeps_its_own_fingerprint() -> None:
    assert fingerprint(REFUND, {"a": 2**53 + 1}) != fingerprint(REFUND, {"a": 2**53})


# --- the pending event --------------------------------------------------------------------------


def refund(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "payment_id": "pay_7f3a",
        "amount_minor": 1250,
        "currency": "EUR",
        "reason": "duplicate charge",
        "idempotency_key": "refund-1",
    }
    body.update(overrides)
    return body


@functools.cache
def processor() -> Processor:
    return build_processor(SETTINGS)


def pending_of(call_id: str = "c1", **overrides: Any) -> tuple[str, bytes]:
    """The event id and pending event of a refund call, as the worker writes it."""
    call = AssembledCall("s", call_id, "refund_payment", orjson.dumps(refund(**overrides)))
    emission = processor().emit(call)
    assert emission.route is Route.IDEMPOTENCY  # keyed: its key's owner holds it
    resolution = resolve(build_key_store(SETTINGS), emission.value, 1, 4096)
    assert resolution.pending
    return call.event_id, resolution.event


def test_a_call_that_requires_approval_is_a_pending_event_bound_to_its_arguments() -> None:
    event_id, value = pending_of()
    event = parse_event(published.check_event(value))
    assert isinstance(event, PendingApproval)
    assert (event.event_id, event.phase, event.requires_approval) == (event_id, "approval", True)
    assert event.approval.fingerprint == fingerprint(REFUND, refund())


def test_an_unkeyed_call_that_requires_approval_goes_to_the_pending_topic(tmp_path: Any) -> None:
    (tmp_path / "ops").mkdir()
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "x-callgate": {"requires_approval": True},
        "type": "object",
        "properties": {"target": {"type": "string"}},
        "required": ["target"],
        "additionalProperties": False,
    }
    (tmp_path / "ops" / "restart.v1.schema.json").write_bytes(orjson.dumps(schema))
    processor = build_processor(Settings(schemas={"dir": tmp_path}))
    call = AssembledCall("s", "c", "restart", b'{"target": "db"}', principal="ops")
    emission = processor.emit(call)
    assert emission.route is Route.PENDING_APPROVAL
    assert emission.key == call.event_id.encode()
    assert ("outcome", PENDING_OUTCOME.encode()) in emission.headers
    event = parse_event(published.check_event(emission.value))
    assert isinstance(event, PendingApproval)
    assert event.principal == "ops"


# --- the store --------------------------------------------------------------------------------


def store() -> ApprovalStore:
    return ApprovalStore(expiry_ms=EXPIRY_MS, retention_ms=RETENTION_MS, max_feedback_bytes=4096)


def decision(
    event_id: str, found: str, what: Decision = Decision.APPROVE, by: str = "ana"
) -> bytes:
    value = decision_record(event_id, found, what, by, "checked the charge")
    published.check(Document.APPROVAL_DECISION, value)
    return value


def checked(ruled: Ruled) -> Ruled:
    """Every event and refusal the store makes holds to the published schemas."""
    if ruled.event is not None:
        published.check_event(ruled.event)
    if ruled.refusal_record is not None:
        published.check(Document.APPROVAL_DECISION, ruled.refusal_record)
    return ruled


def held(at_ms: int = 1_000) -> tuple[ApprovalStore, str, str]:
    event_id, value = pending_of()
    s = store()
    changes = s.hold(event_id, value, at_ms)
    assert [c[0] for c in changes] == [event_id]
    assert len(s) == 1
    return s, event_id, fingerprint(REFUND, refund())


def test_an_approval_naming_the_fingerprint_releases_the_call_once() -> None:
    s, event_id, found = held()
    ruled = checked(s.decide(decision(event_id, found), event_id.encode(), 5, 2_000))
    assert (ruled.ruling, ruled.outcome, ruled.refusal) == (Ruling.APPROVED, Outcome.ACCEPTED, None)
    event = parse_event(ruled.event or b"")
    assert isinstance(event, Accepted)
    assert event.arguments == refund()
    assert event.approval is not None
    assert (
        event.approval.fingerprint,
        event.approval.decided_by,
        event.approval.decided_at_ms,
    ) == (
        found,
        "ana",
        2_000,
    )
    assert len(s) == 0
    # a second approval (another record) is refused: the call reaches the topic once
    again = checked(s.decide(decision(event_id, found), event_id.encode(), 6, 2_100))
    assert (again.ruling, again.refusal, again.event) == (
        Ruling.REFUSED,
        Refusal.ALREADY_DECIDED,
        None,
    )


def test_a_tampered_fingerprint_is_refused_and_the_call_stays_pending() -> None:
    s, event_id, found = held()
    tampered = fingerprint(REFUND, refund(amount_minor=999_999))
    ruled = checked(s.decide(decision(event_id, tampered), event_id.encode(), 5, 2_000))
    assert (ruled.ruling, ruled.refusal, ruled.event) == (
        Ruling.REFUSED,
        Refusal.FINGERPRINT_MISMATCH,
        None,
    )
    refusal = orjson.loads(ruled.refusal_record or b"")
    assert refusal["fingerprint"] == tampered
    assert refusal["refused"]["code"] == "fingerprint_mismatch"
    assert len(s) == 1
    assert ruled.changes == []
    released = checked(s.decide(decision(event_id, found), event_id.encode(), 6, 2_100))
    assert released.ruling is Ruling.APPROVED


def test_a_denial_ends_the_call_in_a_final_rejection_without_its_arguments() -> None:
    s, event_id, found = held()
    ruled = checked(s.decide(decision(event_id, found, Decision.DENY), event_id.encode(), 5, 2_000))
    event = parse_event(ruled.event or b"")
    assert isinstance(event, Rejected)
    assert (event.phase, event.error_code, event.retryable) == (
        "approval",
        "approval_denied",
        False,
    )
    assert event.retry_feedback.instruction.startswith("A person denied this call")
    assert "arguments" not in orjson.loads(ruled.event or b"")
    assert b"checked the charge" not in (ruled.event or b"")  # the decider's words stay theirs


def test_expiry_counts_in_record_time() -> None:
    s, event_id, found = held(at_ms=1_000)
    early = checked(
        s.decide(
            decision(event_id, found, Decision.EXPIRE, CALLGATE), None, 5, 1_000 + EXPIRY_MS - 1
        )
    )
    assert (early.ruling, early.refusal) == (Ruling.REFUSED, Refusal.NOT_EXPIRED)
    assert s.due(1_000 + EXPIRY_MS - 1) == []
    assert s.due(1_000 + EXPIRY_MS) == [(event_id, found)]
    ruled = checked(
        s.decide(decision(event_id, found, Decision.EXPIRE, CALLGATE), None, 6, 1_000 + EXPIRY_MS)
    )
    assert (ruled.ruling, ruled.code) == (Ruling.EXPIRED, Code.APPROVAL_EXPIRED)
    assert s.due(10**12) == []


def test_an_approval_after_the_expiry_is_refused_and_the_call_expires() -> None:
    s, event_id, found = held(at_ms=1_000)
    late = checked(s.decide(decision(event_id, found), event_id.encode(), 5, 1_000 + EXPIRY_MS))
    assert (late.ruling, late.refusal, late.code) == (
        Ruling.EXPIRED,
        Refusal.EXPIRED,
        Code.APPROVAL_EXPIRED,
    )
    assert orjson.loads(late.refusal_record or b"")["refused"]["code"] == "expired"
    assert isinstance(parse_event(late.event or b""), Rejected)


def test_a_decision_stamped_before_a_later_record_is_taken_at_the_later_time() -> None:
    """The store's time never goes back: a back-dated approval after the expiry is late."""
    s, event_id, found = held(at_ms=1_000)
    other_id, other = pending_of("c2", idempotency_key="refund-2")
    s.hold(other_id, other, 1_000 + EXPIRY_MS + 5)
    late = checked(s.decide(decision(event_id, found), event_id.encode(), 7, 1_500))
    assert late.ruling is Ruling.EXPIRED


def test_a_decision_on_no_call_is_refused_and_garbage_decides_nothing() -> None:
    s = store()
    unknown = "0" * 32
    ruled = checked(s.decide(decision(unknown, "1" * 32), unknown.encode(), 1, 10))
    assert (ruled.ruling, ruled.refusal) == (Ruling.REFUSED, Refusal.UNKNOWN_CALL)
    for garbage in (b"{", b"[]", b'{"event_id": "x"}', None):
        bad = s.decide(garbage, b"k", 2, 10)
        assert (bad.ruling, bad.refusal, bad.refusal_record) == (
            Ruling.REFUSED,
            Refusal.MALFORMED,
            None,
        )
        assert bad.detail


def test_the_record_that_decided_read_again_decides_again_to_the_same_event() -> None:
    s, event_id, found = held()
    first = s.decide(decision(event_id, found), event_id.encode(), 5, 2_000)
    again = s.decide(decision(event_id, found), event_id.encode(), 5, 2_000)
    assert (again.ruling, again.event) == (Ruling.APPROVED, first.event)
    assert again.changes == []


def test_a_pending_event_written_again_is_ignored_once_decided() -> None:
    event_id, value = pending_of()
    s, _, found = held()
    s.decide(decision(event_id, found, Decision.DENY), event_id.encode(), 5, 2_000)
    assert s.hold(event_id, value, 3_000) == []
    assert len(s) == 0
    again = s.decide(decision(event_id, found), event_id.encode(), 6, 3_000)
    assert again.refusal is Refusal.ALREADY_DECIDED


def test_a_decided_call_is_forgotten_after_its_retention() -> None:
    s, event_id, found = held()
    s.decide(decision(event_id, found), event_id.encode(), 5, 2_000)
    other_id, other = pending_of("c2", idempotency_key="refund-2")
    changes = s.hold(other_id, other, 2_000 + RETENTION_MS)
    assert (event_id, None) in changes
    late = s.decide(decision(event_id, found), event_id.encode(), 9, 2_000 + RETENTION_MS)
    assert late.refusal is Refusal.UNKNOWN_CALL


CALLS = [pending_of(f"c{i}", idempotency_key=f"refund-{i}") for i in range(3)]


@settings(derandomize=True, deadline=None, print_blob=True, max_examples=150)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["hold", "approve", "tamper", "deny", "expire", "garbage"]),
            st.integers(0, 2),
            st.integers(0, 40_000),
        ),
        max_size=25,
    ),
    cut=st.integers(0, 25),
)
def test_a_store_rebuilt_from_its_changelog_rules_as_the_original(
    steps: list[tuple[str, int, int]], cut: int
) -> None:
    calls = CALLS
    prints = [fingerprint(REFUND, refund(idempotency_key=f"refund-{i}")) for i in range(3)]
    original = store()
    log: list[tuple[str, Any]] = []
    rebuilt: ApprovalStore | None = None
    at = 0
    for index, (kind, which, gap) in enumerate(steps):
        if index == cut:
            rebuilt = store()
            rebuilt.restore((k, v.encode() if v is not None else None) for k, v in log)
        at += gap
        event_id, value = calls[which]
        fp = prints[which] if kind != "tamper" else "f" * 32
        what = {"deny": Decision.DENY, "expire": Decision.EXPIRE}.get(kind, Decision.APPROVE)
        record = b"{" if kind == "garbage" else decision(event_id, fp, what)
        outcomes: list[tuple[Any, ...]] = []
        for target in (original, rebuilt):
            if target is None:
                continue
            if kind == "hold":
                outcomes.append(("held", target.hold(event_id, value, at)))
            else:
                ruled = checked(target.decide(record, event_id.encode(), index, at))
                outcomes.append((ruled.ruling, ruled.refusal, ruled.event, ruled.changes))
        log += outcomes[0][-1]
        if len(outcomes) == 2:
            assert outcomes[0] == outcomes[1]
