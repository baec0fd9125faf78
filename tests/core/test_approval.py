"""Approval: the fingerprint, the store that holds calls and rules on decisions, the expiry.

Fingerprints are held to their rule with generated arguments: one for every spelling of the same
arguments, another for any change. The store is driven with the records a worker reads (pending
events and decisions, with their offsets and times); every event and record it makes is held to
the published schemas; a store rebuilt from its changelog at any point rules on the rest as the
original does; and a model written from the README's words alone rules as the store does on
generated records in any order, multiplicity and time, read again and across restarts.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.support import published
from tests.support.numbers import admitted, number_texts
from worker._native import AssembledCall, ParseError, parse_json
from worker.compose import build_key_store, build_processor
from worker.core.approval import (
    APPROVAL_RESERVE,
    CALLGATE,
    CLOCK_KEY,
    PENDING_OUTCOME,
    ApprovalStore,
    Clock,
    Decision,
    Refusal,
    Ruled,
    Ruling,
    decision_record,
    fingerprint,
)
from worker.core.events import encode_written, read_idempotency_request
from worker.core.idempotency import resolve
from worker.core.pipeline import passed_on
from worker.core.processor import Processor, Route, promised_event_bytes
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
    assert ruled.changes == [(CLOCK_KEY, Clock(2_000))]  # the call's entry stays; the time moved
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
    assert s.hold(event_id, value, 3_000) == [(CLOCK_KEY, Clock(3_000))]  # only the time moved
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


# --- a model of the README's rules, against the store -----------------------------------------
#
# Written from the README's words ("Approval"), not from the store: a call is held from its
# pending record's time; a decision's time is its record's, and the store's time (the newest record
# time read) never goes back; `approve` naming the call's fingerprint before its expiry releases it
# once, `deny` ends it, `expire` once the expiry passed or any decision after it ends it expired
# (a late approve or deny also refused `expired`); another fingerprint, no call, a call decided
# already or an `expire` too early is refused and changes nothing; the very record that decided a
# call, read again after a crash, makes the same outcome again; a store rebuilt from its changelog
# at any point rules as the original would have.

#: three calls; the first two have the same arguments (so one fingerprint) under other call ids
MODEL_CALLS = [pending_of("m0"), pending_of("m1"), pending_of("m2", idempotency_key="refund-9")]
MODEL_PRINTS = [
    fingerprint(REFUND, refund()),
    fingerprint(REFUND, refund()),
    fingerprint(REFUND, refund(idempotency_key="refund-9")),
]
UNKNOWN_ID = "e" * 32
TAMPERED = "f" * 32
#: record times: on, just before and just after the expiry of calls held at them
TIMES = st.sampled_from(
    [0, 1, EXPIRY_MS - 1, EXPIRY_MS, EXPIRY_MS + 1, 2 * EXPIRY_MS - 1, 2 * EXPIRY_MS, 3 * EXPIRY_MS]
) | st.integers(0, 3 * EXPIRY_MS)

MODEL_STEPS = st.one_of(
    st.tuples(st.just("hold"), st.integers(0, 2), TIMES),
    st.tuples(
        st.just("decide"),
        st.integers(0, 3),  # the call named (3: none held)
        st.sampled_from(list(Decision)),
        st.sampled_from(["own", "other", "tampered"]),  # the fingerprint named
        st.sampled_from(["ana", CALLGATE]),
        TIMES,
    ),
    st.tuples(st.just("garbage"), TIMES),
    # a recent decision record read again (0: the last one)
    st.tuples(st.just("replay"), st.integers(0, 3)),
    # a crash: the store rebuilt from its changelog, the last records read again
    st.tuples(st.just("restart"), st.integers(0, 3)),
)


class ReadmeModel:
    """What the README says the owner of a pending-approval partition does."""

    def __init__(self) -> None:
        self.now = 0
        self.pending: dict[str, tuple[str, int]] = {}  # event id -> (fingerprint, held at)
        #: event id -> (offset of the record that decided it, what that record made)
        self.decided: dict[str, tuple[int, tuple[Any, ...]]] = {}

    def hold(self, event_id: str, found: str, at: int) -> None:
        self.now = max(self.now, at)
        if event_id not in self.pending and event_id not in self.decided:
            self.pending[event_id] = (found, self.now)

    def decide(
        self, event_id: str, found: str, what: Decision, by: str, *, offset: int, at: int
    ) -> tuple[Any, ...]:
        """(ruling, refusal, what the outcome event says)"""
        self.now = max(self.now, at)
        if event_id in self.decided:
            first_offset, made = self.decided[event_id]
            if offset == first_offset:
                return made
            return (Ruling.REFUSED, Refusal.ALREADY_DECIDED, None)
        if event_id not in self.pending:
            return (Ruling.REFUSED, Refusal.UNKNOWN_CALL, None)
        held_print, held_at = self.pending[event_id]
        past = self.now >= held_at + EXPIRY_MS  # "before its expiry" releases it
        made: tuple[Any, ...]
        if what is Decision.EXPIRE:
            if not past:
                return (Ruling.REFUSED, Refusal.NOT_EXPIRED, None)
            made = (Ruling.EXPIRED, None, ("rejected", "approval_expired"))
        elif found != held_print:
            return (Ruling.REFUSED, Refusal.FINGERPRINT_MISMATCH, None)
        elif past:
            made = (Ruling.EXPIRED, Refusal.EXPIRED, ("rejected", "approval_expired"))
        elif what is Decision.APPROVE:
            made = (Ruling.APPROVED, None, ("accepted", held_print, by, self.now))
        else:
            made = (Ruling.DENIED, None, ("rejected", "approval_denied"))
        del self.pending[event_id]
        self.decided[event_id] = (offset, made)
        return made


def said(ruled: Ruled, calls: dict[str, bytes]) -> tuple[Any, ...]:
    """What a ruling says, in the model's terms; every event checked against its call."""
    if ruled.event is None:
        return (ruled.ruling, ruled.refusal, None)
    fields = orjson.loads(ruled.event)
    pending = orjson.loads(calls[fields["event_id"]])
    assert fields["call_id"] == pending["call_id"]
    if fields["outcome"] == "accepted":
        approval = fields["approval"]
        # what is released is the arguments the approval named, and nothing else
        assert fields["arguments"] == pending["arguments"]
        assert approval["fingerprint"] == fingerprint(
            SchemaRef(fields["schema"]["id"], fields["schema"]["version"]), fields["arguments"]
        )
        body: tuple[Any, ...] = (
            "accepted",
            approval["fingerprint"],
            approval["decided_by"],
            approval["decided_at_ms"],
        )
    else:
        assert "arguments" not in fields
        body = (fields["outcome"], fields["error_code"])
    return (ruled.ruling, ruled.refusal, body)


@settings(derandomize=True, deadline=None, print_blob=True, max_examples=1000)
@given(steps=st.lists(MODEL_STEPS, min_size=2, max_size=30))
def test_the_store_rules_as_the_readme_says_through_replays_and_restarts(
    steps: list[tuple[Any, ...]],
) -> None:
    """Approval, denial, expiry and garbage records in any order, any times (on the expiry
    boundary too, and stamped before records already read), records read again, the store
    rebuilt from its changelog anywhere: every ruling is the README's, every call released at
    most once and with the arguments its fingerprint names, ended by one outcome."""
    model, s = ReadmeModel(), store()
    log: list[tuple[str, bytes | None]] = []
    records: list[tuple[bytes | None, bytes, int, int, tuple[Any, ...]]] = []
    calls = dict(MODEL_CALLS)
    outcomes: dict[str, set[bytes]] = {}
    work = list(steps)
    while work:
        step = work.pop(0)
        offset = len(records)
        decisions = [r for r in records if r[0] is not None]
        if step[0] == "restart":
            s = store()
            s.restore(log)
            work[:0] = [("replay", back) for back in reversed(range(min(step[1], len(decisions))))]
            continue
        if step[0] == "hold":
            _, which, at = step
            event_id, value = MODEL_CALLS[which]
            model.hold(event_id, MODEL_PRINTS[which], at)
            changes = s.hold(event_id, value, at)
            log += [(k, v.encode() if v is not None else None) for k, v in changes]
            records.append((None, b"", offset, at, ("hold", which)))
            continue
        if step[0] == "replay":
            if not decisions:
                continue
            value, key, offset, at, named = decisions[-1 - step[1] % len(decisions)]
        elif step[0] == "garbage":
            value, key, at, named = b'{"decision": "approve"}', b"k", step[1], ("garbage",)
        else:
            _, which, what, whose, by, at = step
            event_id = MODEL_CALLS[which][0] if which < 3 else UNKNOWN_ID
            found = {
                "own": MODEL_PRINTS[which % 3],
                "other": MODEL_PRINTS[(which + 2) % 3],  # the third's, or one of the twins'
                "tampered": TAMPERED,
            }[whose]
            value, key = decision(event_id, found, what, by), event_id.encode()
            named = (event_id, found, what, by)
        if step[0] != "replay":
            records.append((value, key, offset, at, named))
        ruled = checked(s.decide(value, key, offset, at))
        log += [(k, v.encode() if v is not None else None) for k, v in ruled.changes]
        if named[0] == "garbage":
            model.now = max(model.now, at)
            assert (ruled.ruling, ruled.refusal, ruled.event) == (
                Ruling.REFUSED,
                Refusal.MALFORMED,
                None,
            )
            continue
        expected = model.decide(*named, offset=offset, at=at)
        assert said(ruled, calls) == expected, (named, offset, at)
        if ruled.event is not None:
            outcomes.setdefault(named[0], set()).add(ruled.event)
    # read again or not, a call has one outcome event (the same bytes each time)
    assert all(len(events) == 1 for events in outcomes.values())
    assert len(s) == len(model.pending)


@settings(derandomize=True, deadline=None, print_blob=True, max_examples=100)
@given(
    arguments=ARGUMENTS,
    schema=st.sampled_from([REFUND, SchemaRef("payments.refund_payment", "2")]),
    seed=st.integers(0, 2**16),
)
def test_a_pending_event_whose_fingerprint_is_not_its_arguments_is_never_held(
    arguments: dict[str, Any], schema: SchemaRef, seed: int
) -> None:
    """What an approval names is the fingerprint of the call's tool, version and arguments, as
    the gate computes it again (as `callgate approve` and the executor do): a pending event
    stating another (its arguments, tool or version changed after it was made) is no call to
    hold, and an approval naming what it states releases nothing."""
    event_id, value = pending_of()
    fields = orjson.loads(value)
    stated = fields["approval"]["fingerprint"]
    fields["arguments"] = changed(fields["arguments"], random.Random(seed)) | arguments
    fields["schema"] = {"id": schema.id, "version": schema.version}
    if fingerprint(schema, fields["arguments"]) == stated:
        return  # the same call after all
    s = store()
    with pytest.raises(ValueError, match="fingerprint is not that of its arguments"):
        s.hold(event_id, orjson.dumps(fields), 1_000)
    ruled = checked(s.decide(decision(event_id, stated), event_id.encode(), 5, 2_000))
    assert (ruled.ruling, ruled.refusal, ruled.event) == (
        Ruling.REFUSED,
        Refusal.UNKNOWN_CALL,
        None,
    )


# --- every event of a held call carries the text judged ----------------------------------------

#: a keyed contract and an unkeyed one that require approval, taking any arguments
HELD_CONTRACTS = {
    "keyed": {"requires_approval": True, "idempotency_key_argument": "key"},
    "unkeyed": {"requires_approval": True},
}


@functools.cache
def held_processor(directory: str) -> Processor:
    root = Path(directory) / "held"
    root.mkdir(parents=True, exist_ok=True)
    for name, meta in HELD_CONTRACTS.items():
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "x-callgate": meta,
            "type": "object",
        }
        (root / f"{name}.v1.schema.json").write_bytes(orjson.dumps(schema))
    return build_processor(Settings(schemas={"dir": Path(directory)}))


def _escaped(text: str, rng: random.Random) -> str:
    """`text` as a JSON string, each character as it is or (at random) as its `\\u` escape
    (a pair of them beyond the BMP), and `/` or a quote in their short escapes."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char == "/" and rng.random() < 0.5:
            out.append("\\/")
        elif ord(char) < 0x20 or rng.random() < 0.3:
            encoded = char.encode("utf-16-be")
            out += [f"\\u{int.from_bytes(encoded[i : i + 2], 'big'):04X}" for i in (0, 2)][
                : len(encoded) // 2
            ]
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


@st.composite
def judged_texts(draw: st.DrawFn) -> str:
    """The text of an object of arguments without insignificant whitespace: numbers in every
    JSON spelling the gate admits (exponents, `-0`, `1E+2`, integers near and past 2^53 and
    2^64, long fractions), strings with escapes and unicode, nested."""
    rng = random.Random(draw(st.integers(0, 2**16)))
    number = number_texts().filter(lambda t: admitted(t) is not None)
    string = st.text(max_size=10).map(lambda t: _escaped(t, rng))
    leaf = number | string | st.sampled_from(["-0", "1E+2", "1e15", "-0.0", "true", "null"])
    value = st.recursive(
        leaf,
        lambda inner: (
            st.lists(inner, max_size=3).map(lambda items: "[" + ",".join(items) + "]")
            | st.lists(st.tuples(st.text(max_size=4), inner), max_size=3).map(
                lambda pairs: (
                    "{" + ",".join(f"{_escaped(k, rng)}:{v}" for k, v in dict(pairs).items()) + "}"
                )
            )
        ),
        max_leaves=8,
    )
    names = st.text(max_size=6).filter(lambda n: n not in {"key", "arguments"})
    members = draw(st.dictionaries(names, value, min_size=1, max_size=5))
    return ",".join(f"{orjson.dumps(name).decode()}:{text}" for name, text in members.items())


def _top_members(event: bytes) -> list[str]:
    return list(orjson.loads(event))


@settings(derandomize=True, deadline=None, print_blob=True, max_examples=200)
@given(
    members=judged_texts(),
    keyed=st.booleans(),
    by=st.sampled_from(["ana", "\x01" * 256]),
    caller=st.sampled_from([None, '{"type":"program","at":1E+2,"id":"\\u0041"}']),
)
def test_every_event_of_a_held_call_carries_the_arguments_judged_byte_for_byte(
    tmp_path_factory: pytest.TempPathFactory,
    members: str,
    keyed: bool,
    by: str,
    caller: str | None,
) -> None:
    """Held, then approved, denied or expired: the pending and approved events carry the
    accepted event's argument text byte for byte (`1e15` was written again as
    `1000000000000000.0`, `-0` as `0`), the denied and expired ones none; the approved event is
    at most the accepted one and APPROVAL_RESERVE (a decider's name at its longest, escaped),
    and every event within the bound promised for the call's arguments. A caller (embedded as
    given) keeps its text in every event too."""
    directory = str(tmp_path_factory.getbasetemp())
    processor = held_processor(directory)
    tool = "keyed" if keyed else "unkeyed"
    text = ('{"key":"k",' if keyed else "{") + members + "}"
    parsed = parse_json(text.encode(), 64)
    assume(not isinstance(parsed, ParseError))
    call = AssembledCall("s", "c", f"held.{tool}", text.encode(), principal="p", caller=caller)
    emission = processor.emit(call)
    if keyed:
        assert emission.route is Route.IDEMPOTENCY, orjson.loads(emission.value)
        accepted = read_idempotency_request(emission.value).event
        resolution = resolve(build_key_store(SETTINGS), emission.value, 1, 4096)
        assert resolution.pending
        pending = resolution.event
    else:
        assert emission.route is Route.PENDING_APPROVAL, orjson.loads(emission.value)
        (accepted, _), pending = (
            encode_written(call, emission.verdict, processor.limits),
            (emission.value),
        )
    judged = passed_on(text.encode(), parsed)
    # the accepted text, once, as the event's member (the generated names are never "arguments")
    assert accepted.count(b'"arguments":' + judged) == 1
    limits = SETTINGS.limits
    schema = SchemaRef(f"held.{tool}", "1")
    bound = len(judged) + promised_event_bytes(limits.max_id_bytes, limits.event_limits(), schema)
    found = fingerprint(schema, orjson.loads(judged))
    decisions = [(Decision.APPROVE, 1_000), (Decision.DENY, 1_000), (Decision.EXPIRE, 10**9)]
    events = {"pending": pending}
    for what, at_ms in decisions:
        s = store()
        s.hold(call.event_id, pending, 1)
        ruled = s.decide(decision_record(call.event_id, found, what, by), None, 5, at_ms)
        assert ruled.event is not None, ruled
        events[what.value] = checked(ruled).event  # type: ignore[assignment]
    for name in ("pending", "approve"):
        assert events[name].count(b'"arguments":' + judged) == 1, (name, events[name], judged)
    for name in ("deny", "expire"):
        assert "arguments" not in _top_members(events[name])
    if caller is not None:
        for name, event in events.items():
            assert event.count(b'"caller":' + caller.encode()) == 1, name
    assert len(events["approve"]) <= len(accepted) + APPROVAL_RESERVE
    for name, event in events.items():
        assert len(event) <= bound, name
