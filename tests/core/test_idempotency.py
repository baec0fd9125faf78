"""The execute-once rule at the owner of a key: `KeyStore` and `resolve`.

A store is fed requests (key, digest, event id, record time) and answers first, replay, duplicate
or conflict; every change it makes is returned, and a store rebuilt from those changes (after a
restart, from the compacted changelog) must decide every later request as the original would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker._native import AssembledCall
from worker.core.canonical import request_digest, scoped_key
from worker.core.events import EventLimits, encode, idempotency_request
from worker.core.idempotency import Change, Decision, KeyRecord, KeyStore, resolve
from worker.model import Code, Outcome, SchemaRef, Verdict
from worker.schemas.contract import ViolationLimits

FIXED = settings(derandomize=True, deadline=None, print_blob=True)
RETENTION = 1_000
MAX_FEEDBACK = 4096
MESSAGES = ViolationLimits(32, max_path_bytes=512, max_message_bytes=512)
REF = SchemaRef("payments.create_payment", "1")
A, B = b"\xaa" * 16, b"\xbb" * 16


def store(max_keys: int = 100, retention_ms: int = RETENTION) -> KeyStore:
    return KeyStore(max_keys=max_keys, retention_ms=retention_ms)


# --- the four decisions ------------------------------------------------------------------------


def test_first_replay_duplicate_conflict() -> None:
    keys = store()
    decision, first, changes = keys.decide("k", A, "event-1", 10)
    assert decision is Decision.FIRST
    assert first == KeyRecord(A, "event-1", 10)
    assert changes == [("k", first)]
    # the very call again (after a crash): the record that decided it, nothing written
    assert keys.decide("k", A, "event-1", 11) == (Decision.REPLAY, first, [])
    # another call, the same request: a duplicate of the first event
    assert keys.decide("k", A, "event-2", 12) == (Decision.DUPLICATE, first, [])
    # another request: a conflict, still naming the first
    assert keys.decide("k", B, "event-3", 13) == (Decision.CONFLICT, first, [])
    # the very first call with a different digest is still that call (its event decides)
    assert keys.decide("k", B, "event-1", 14)[0] is Decision.REPLAY
    assert len(keys) == 1


def test_keys_are_independent() -> None:
    keys = store()
    assert keys.decide("k1", A, "e1", 0)[0] is Decision.FIRST
    assert keys.decide("k2", A, "e2", 0)[0] is Decision.FIRST  # the same request, another key
    assert keys.decide("K1", A, "e3", 0)[0] is Decision.FIRST  # keys are exact strings
    assert len(keys) == 3


# --- retention, by record time ----------------------------------------------------------------


def test_a_key_is_remembered_for_its_retention_of_record_time() -> None:
    keys = store()
    keys.decide("k", A, "e1", 1_000)
    assert keys.decide("k", A, "e2", 1_000 + RETENTION - 1)[0] is Decision.DUPLICATE
    decision, record, changes = keys.decide("k", A, "e3", 1_000 + RETENTION)
    assert decision is Decision.FIRST  # forgotten: the key is new again
    assert record == KeyRecord(A, "e3", 1_000 + RETENTION)
    assert changes == [("k", None), ("k", record)]  # the forgetting is written too


def test_any_request_ages_every_key_and_the_forgetting_is_written() -> None:
    keys = store()
    keys.decide("old", A, "e1", 0)
    keys.decide("newer", A, "e2", 500)
    _, _, changes = keys.decide("other", A, "e3", RETENTION + 1)
    assert changes[0] == ("old", None)
    assert [k for k, v in changes if v is not None] == ["other"]
    assert len(keys) == 2
    # a duplicate that ages keys writes only the forgetting
    keys.decide("x", A, "e4", RETENTION + 2)
    decision, _, changes = keys.decide("x", A, "e5", 500 + RETENTION)
    assert (decision, changes) == (Decision.DUPLICATE, [("newer", None)])


def test_time_is_the_partitions_own_and_never_goes_back() -> None:
    keys = store()
    keys.decide("k", A, "e1", 5_000)
    # a request stamped in the past: the clock stays; the key is recorded at the clock
    decision, record, _ = keys.decide("late", A, "e2", 100)
    assert decision is Decision.FIRST
    assert record.at_ms == 5_000
    # no time at all (the offline check): the clock stays too
    assert keys.decide("untimed", A, "e3", None)[1].at_ms == 5_000
    assert keys.decide("k", A, "e4", None)[0] is Decision.DUPLICATE


def test_without_time_nothing_is_ever_forgotten_by_age() -> None:
    keys = store()
    keys.decide("k", A, "e1", None)
    for n in range(50):
        keys.decide(f"other-{n}", A, f"x{n}", None)
    assert keys.decide("k", A, "e2", None)[0] is Decision.DUPLICATE


# --- max_keys ---------------------------------------------------------------------------------


def test_past_max_keys_the_oldest_key_is_forgotten_first() -> None:
    keys = store(max_keys=3)
    for n, key in enumerate(["a", "b", "c"]):
        keys.decide(key, A, f"e-{key}", n)
    decision, record, changes = keys.decide("d", A, "e-d", 3)
    assert decision is Decision.FIRST
    assert changes == [("d", record), ("a", None)]
    assert len(keys) == 3
    assert keys.decide("a", A, "again", 4)[0] is Decision.FIRST  # forgotten: new again
    assert keys.decide("c", A, "e-c", 5)[0] is Decision.REPLAY  # still known
    # a key that is asked about again is not made younger by it
    _, _, changes = keys.decide("e", A, "e-e", 6)
    assert ("c", None) in changes


def test_a_key_store_of_one_key() -> None:
    keys = store(max_keys=1)
    keys.decide("a", A, "e1", 0)
    assert keys.decide("b", A, "e2", 0)[2] == [("b", KeyRecord(A, "e2", 0)), ("a", None)]
    assert len(keys) == 1


# --- records and the changelog ----------------------------------------------------------------


@FIXED
@given(
    digest=st.binary(min_size=16, max_size=16),
    event_id=st.text(max_size=40),
    at=st.integers(0, 2**62),
)
def test_a_key_record_reads_back_as_written(digest: bytes, event_id: str, at: int) -> None:
    record = KeyRecord(digest, event_id, at)
    assert KeyRecord.decode(record.encode()) == record


def log_of(changes: Iterable[Change]) -> list[tuple[str, bytes | None]]:
    """The changes as the changelog holds them."""
    return [(key, None if record is None else record.encode()) for key, record in changes]


def compacted(log: list[tuple[str, bytes | None]], *, keep_tombstones: bool) -> list[Any]:
    """What a compacted topic keeps: each key's last entry, in the order of those entries."""
    last: dict[str, int] = {}
    for position, (key, _) in enumerate(log):
        last[key] = position
    kept = [log[p] for p in sorted(last.values())]
    return [e for e in kept if keep_tombstones or e[1] is not None]


#: a request: key, which of two requests, which call (event id)
requests = st.lists(
    st.tuples(
        st.sampled_from(["k1", "k2", "k3", "k4", "k5"]),
        st.sampled_from([A, B]),
        st.sampled_from(["e1", "e2", "e3", "e4"]),
        st.integers(0, RETENTION // 2),  # how much later than the one before
    ),
    max_size=60,
)


@settings(FIXED, max_examples=400)
@given(
    sequence=requests,
    restarts=st.lists(st.integers(0, 60), max_size=5),
    max_keys=st.integers(1, 6),
    compaction=st.sampled_from(["none", "keep tombstones", "drop tombstones"]),
)
def test_a_store_rebuilt_from_its_changes_decides_as_the_original(
    sequence: list[tuple[str, bytes, str, int]],
    restarts: list[int],
    max_keys: int,
    compaction: str,
) -> None:
    """Restarted anywhere (the changelog read back, maybe compacted), the store decides every
    later request exactly as the one that never stopped. Record time only moves forward here, as
    in a partition whose requests are stamped by the broker (see the test after this one)."""
    original = store(max_keys=max_keys)
    restarted = store(max_keys=max_keys)
    log: list[tuple[str, bytes | None]] = []
    at = 0
    for index, (key, digest, event_id, step) in enumerate(sequence):
        if index in restarts:
            entries = (
                log
                if compaction == "none"
                else compacted(log, keep_tombstones=compaction == "keep tombstones")
            )
            restarted = store(max_keys=max_keys)
            restarted.restore(entries)
            assert len(restarted) == len(original)
        at += step
        expected = original.decide(key, digest, event_id, at)
        got = restarted.decide(key, digest, event_id, at)
        assert got == expected, (index, key)
        log += log_of(expected[2])
        assert len(original) <= max_keys


@settings(FIXED, max_examples=400)
@given(
    sequence=st.lists(
        st.tuples(
            st.sampled_from(["k1", "k2", "k3", "k4"]),
            st.sampled_from([A, B]),
            st.sampled_from(["e1", "e2", "e3"]),
            st.none() | st.integers(0, 3 * RETENTION),  # any time, or none, in any order
        ),
        max_size=40,
    ),
    restarts=st.lists(st.integers(0, 40), max_size=4),
    max_keys=st.integers(1, 5),
)
def test_a_rebuilt_store_decides_as_the_original_whatever_the_record_times(
    sequence: list[tuple[str, bytes, str, int | None]], restarts: list[int], max_keys: int
) -> None:
    """Producers' clocks disagree (CreateTime) and the offline check has no time at all: the
    store's decisions may depend on nothing the changelog does not hold, or a restart could turn
    a duplicate into a second acceptance."""
    original = store(max_keys=max_keys)
    restarted = store(max_keys=max_keys)
    log: list[tuple[str, bytes | None]] = []
    for index, (key, digest, event_id, at) in enumerate(sequence):
        if index in restarts:
            restarted = store(max_keys=max_keys)
            restarted.restore(compacted(log, keep_tombstones=False))
        expected = original.decide(key, digest, event_id, at)
        assert restarted.decide(key, digest, event_id, at) == expected, (index, key)
        log += log_of(expected[2])


def test_a_duplicate_stays_a_duplicate_across_a_restart_with_clocks_out_of_order() -> None:
    """What the property above found: a duplicate that moved the clock wrote nothing, a key
    stamped before it was then recorded at the moved clock in one store and at its own time in
    the other, and one store forgot it sooner."""
    decisions = []
    for restart in (False, True):
        keys, log = store(retention_ms=100), []
        for key, event_id, at in (("k1", "e1", 0), ("k1", "e2", 50)):
            log += log_of(keys.decide(key, A, event_id, at)[2])
        if restart:
            keys = store(retention_ms=100)
            keys.restore(log)
        keys.decide("k2", A, "e3", 10)  # stamped by a producer whose clock is behind
        keys.decide("k9", A, "e4", 115)
        decisions.append(keys.decide("k2", A, "e5", 115)[0])
    assert decisions[0] is decisions[1]


def test_a_restored_store_keeps_the_clock_of_its_records() -> None:
    keys = store()
    log = log_of(keys.decide("k", A, "e1", 5_000)[2])
    restored = store()
    restored.restore(log)
    # a request stamped in the past is recorded at the restored clock, as in the original
    assert restored.decide("late", A, "e2", 10) == keys.decide("late", A, "e2", 10)


def test_the_last_entry_of_a_key_wins_on_restore() -> None:
    restored = store()
    restored.restore(
        [
            ("k", KeyRecord(A, "e1", 1).encode()),
            ("k", None),
            ("k", KeyRecord(B, "e2", 2).encode()),
            ("gone", KeyRecord(A, "e3", 3).encode()),
            ("gone", None),
        ]
    )
    assert len(restored) == 1
    assert restored.decide("k", B, "e9", 3)[1] == KeyRecord(B, "e2", 2)
    assert restored.decide("gone", A, "e3", 3)[0] is Decision.FIRST


# --- resolve: the owner's answer to one request ----------------------------------------------


def request(
    key: str, digest: bytes, call_id: str, *, arguments: bytes = b"{}", approval: bool = False
) -> bytes:
    call = AssembledCall("stream", call_id, "create_payment", arguments, topic="in")
    verdict = Verdict(
        Outcome.ACCEPTED,
        schema=REF,
        arguments_json=arguments,
        requires_approval=approval,
        idempotency_key=key,
        idempotency_digest=digest,
    )
    return idempotency_request(
        call, verdict, encode(call, verdict, EventLimits(1 << 20, MAX_FEEDBACK, MESSAGES))
    )


def event_of(value: bytes) -> dict[str, Any]:
    return dict(orjson.loads(value))


def test_the_first_request_is_accepted_as_it_was_sent() -> None:
    keys = store()
    value = request("k", A, "c1", arguments=b'{"amount_minor": 5}')
    resolution = resolve(keys, value, 100, MAX_FEEDBACK)
    assert (resolution.decision, resolution.outcome) == (Decision.FIRST, Outcome.ACCEPTED)
    assert resolution.event == value.partition(b"\n")[2]  # the event, untouched
    assert (resolution.call_id, resolution.tool, resolution.schema) == (
        "c1",
        "create_payment",
        REF,
    )
    first_event_id = event_of(resolution.event)["event_id"]
    assert resolution.changes == [(scoped_key(None, "k"), KeyRecord(A, first_event_id, 100))]
    assert not resolution.pending


def test_a_first_request_that_requires_approval_is_held_not_accepted() -> None:
    """Its key is remembered as any first's, and its event is the pending one."""
    value = request("k", A, "c1", arguments=b'{"amount_minor": 5}', approval=True)
    resolution = resolve(store(), value, 100, MAX_FEEDBACK)
    assert (resolution.decision, resolution.outcome, resolution.pending) == (
        Decision.FIRST,
        Outcome.ACCEPTED,
        True,
    )
    event = event_of(resolution.event)
    assert (event["outcome"], event["phase"]) == ("pending_approval", "approval")
    assert event["approval"]["fingerprint"] == request_digest(REF, {"amount_minor": 5}).hex()
    assert resolution.event_id == event["event_id"]


@pytest.mark.parametrize(
    ("digest", "decision", "code"),
    [(A, Decision.DUPLICATE, Code.DUPLICATE), (B, Decision.CONFLICT, Code.IDEMPOTENCY_CONFLICT)],
)
def test_a_later_call_with_the_key_is_rejected_naming_the_first_event(
    digest: bytes, decision: Decision, code: Code
) -> None:
    keys = store()
    first = resolve(keys, request("k", A, "c1"), 100, MAX_FEEDBACK)
    later = resolve(keys, request("k", digest, "c2"), 200, MAX_FEEDBACK)
    assert (later.decision, later.outcome) == (decision, Outcome.REJECTED)
    event = event_of(later.event)
    assert (event["outcome"], event["phase"], event["error_code"]) == (
        "rejected",
        "idempotency",
        code.value,
    )
    assert event["call_id"] == "c2"
    assert event["duplicate_of"] == event_of(first.event)["event_id"]
    assert event["idempotency_key"] == "k"
    assert "arguments" not in event
    assert later.changes == []
    assert later.call_id == "c2"


def test_a_replayed_request_is_accepted_again_and_writes_nothing() -> None:
    keys = store()
    value = request("k", A, "c1")
    first = resolve(keys, value, 100, MAX_FEEDBACK)
    again = resolve(keys, value, 150, MAX_FEEDBACK)
    assert (again.decision, again.outcome, again.event) == (
        Decision.REPLAY,
        Outcome.ACCEPTED,
        first.event,
    )
    assert again.changes == []


def test_what_is_not_a_request_is_a_value_error_and_changes_nothing() -> None:
    keys = store()
    resolve(keys, request("k", A, "c1"), 100, MAX_FEEDBACK)
    for value in (b"", b"{}", b"CGI1[]\n{}", b'CGI1{"key": "k"}\n{}'):
        with pytest.raises(ValueError):  # noqa: PT011
            resolve(keys, value, 10 * RETENTION, MAX_FEEDBACK)
    assert len(keys) == 1  # nothing aged: the bad record was never decided
