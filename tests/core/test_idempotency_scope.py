"""An idempotency key is its principal's: at the gate, at the key's owner and in the executor.

The README: two calls share a key only when they name the same principal (calls naming none
share the no-principal scope); per (principal, key), the first call is accepted, an equal
request from another call is `duplicate` naming the first, a different one
`idempotency_conflict`. The executor keys its executions the same way: per (principal, key) the
first runs, an equal request gets its recorded result (`replayed`, naming the call that ran), a
different one is a `conflict`.

Generated here: sequences of `pay` calls by several principals (and by none) reusing a few keys
with a few amounts, each through the gate's processor and its key's owner (the store rebuilt
from its changelog before any call, or not), and each accepted event through the executor's
contract. Every decision must be the README's rule applied per (principal, key), and no answer
may name another principal's call.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate_executor import contract
from callgate_executor.contract import Execution, Outcome, Step
from tests.support.executor import INPUT, contract_settings
from tests.support.traffic import envelopes
from worker.check import FileRecord
from worker.compose import build_processor, build_registry
from worker.core.events import read_idempotency_request
from worker.core.idempotency import Decision, KeyStore, resolve
from worker.core.processor import Route
from worker.published.model import Accepted, ResultStatus, parse_event

FIXED = settings(derandomize=True, deadline=None, print_blob=True, max_examples=150)
SETTINGS = contract_settings()
PROCESSOR = build_processor(SETTINGS, build_registry(SETTINGS))
OFFSETS = itertools.count()
MAX_BYTES = SETTINGS.limits.max_event_bytes
MAX_ID_BYTES = SETTINGS.limits.max_id_bytes
PRINCIPALS = [None, "alice", "bob", ""]


class Drawn(NamedTuple):
    principal: str | None
    key: str
    amount: int
    restart: bool  # the key's owner rebuilt from its changelog before this call


class Gated(NamedTuple):
    """One call as the gate sent it to its key's owner: the record's key, the owner's
    decision and the event it wrote, and the accepted event (what an executor is given)."""

    route_key: bytes
    decision: Decision
    event: dict[str, Any]
    accepted: Accepted
    changes: list[tuple[str, bytes | None]]  # for the owner's changelog


CALLS = st.builds(
    Drawn,
    st.sampled_from(PRINCIPALS),
    st.sampled_from(["k1", "k2"]),
    st.sampled_from([100, 200]),
    st.booleans(),
)


def gate(drawn: Drawn, store: KeyStore) -> Gated:
    n = next(OFFSETS)
    arguments = {
        "amount_minor": drawn.amount,
        "currency": "EUR",
        "recipient": "acme",
        "idempotency_key": drawn.key,
    }
    text = orjson.dumps(arguments).decode()
    messages = envelopes(f"scope-{n}", f"c{n}", "pay", text, principal=drawn.principal)
    records = [
        FileRecord(INPUT, 0, 10 * n + i, None, m.key, m.value, m.headers)
        for i, m in enumerate(messages)
    ]
    (emission,) = PROCESSOR.feed(INPUT, 0, records)
    assert emission.route is Route.IDEMPOTENCY, orjson.loads(emission.value)
    accepted = parse_event(read_idempotency_request(emission.value).event)
    assert isinstance(accepted, Accepted)
    assert accepted.principal == drawn.principal
    resolution = resolve(store, emission.value, None, 4096)
    changes = [(k, r.encode() if r is not None else None) for k, r in resolution.changes]
    event = orjson.loads(resolution.event)
    return Gated(emission.key, resolution.decision, event, accepted, changes)


@FIXED
@given(calls=st.lists(CALLS, min_size=1, max_size=12))
def test_each_call_is_decided_by_its_own_principals_key(calls: list[Drawn]) -> None:
    store = KeyStore(max_keys=100, retention_ms=7 * 24 * 3600 * 1000)
    changelog: list[tuple[str, bytes | None]] = []
    first: dict[tuple[str | None, str], tuple[str, int]] = {}  # the README's, per scope
    principal_of: dict[str, str | None] = {}  # every call's event id: its principal
    route_keys: dict[tuple[str | None, str], bytes] = {}
    for drawn in calls:
        if drawn.restart:
            store = KeyStore(max_keys=100, retention_ms=7 * 24 * 3600 * 1000)
            store.restore(changelog)
        before = len(store)
        gated = gate(drawn, store)
        scope = (drawn.principal, drawn.key)
        event_id = gated.event["event_id"]
        principal_of[event_id] = drawn.principal
        known = first.get(scope)
        if known is None:
            first[scope] = (event_id, drawn.amount)
            assert gated.decision is Decision.FIRST, (drawn, gated.event)
            assert gated.event["outcome"] == "accepted"
            assert len(store) == before + 1
        else:
            expected = Decision.DUPLICATE if known[1] == drawn.amount else Decision.CONFLICT
            assert gated.decision is expected, (drawn, gated.event)
            assert gated.event["duplicate_of"] == known[0]
        named = gated.event.get("duplicate_of")
        if named is not None:
            assert principal_of[named] == drawn.principal, "a rejection names another's call"
        assert gated.event["idempotency_key"] == drawn.key
        assert gated.event.get("principal") == drawn.principal
        # one scope, one record key on the requests topic; two scopes, two
        assert route_keys.setdefault(scope, gated.route_key) == gated.route_key
        assert list(route_keys.values()).count(gated.route_key) == 1
        changelog.extend(gated.changes)


@FIXED
@given(calls=st.lists(CALLS, min_size=1, max_size=12))
def test_the_executor_runs_each_principals_key_once(calls: list[Drawn]) -> None:
    """Every accepted event is delivered to the executor (as a gate's events may be: the
    executor holds the contract without its key's owner)."""
    state: dict[str, Execution] = {}
    store = KeyStore(max_keys=100, retention_ms=7 * 24 * 3600 * 1000)
    ran: dict[tuple[str | None, str], tuple[str, int]] = {}
    principal_of: dict[str, str | None] = {}
    for drawn in calls:
        event = gate(drawn, store).accepted
        principal_of[event.event_id] = drawn.principal
        answer = contract.answer(event, state, refusal=None, retry_safe=False)
        scope = (drawn.principal, drawn.key)
        known = ran.get(scope)
        if known is None:
            assert answer.step is Step.RUN, (drawn, answer)
            assert answer.begun is not None
            state[answer.begun.key] = answer.begun
            output = {"payment_id": len(ran) + 1, "status": "paid"}
            answer = contract.ran(
                event,
                answer.begun,
                Outcome(ResultStatus.SUCCEEDED, output),
                max_bytes=MAX_BYTES,
                max_id_bytes=MAX_ID_BYTES,
            )
            ran[scope] = (event.event_id, drawn.amount)
        elif known[1] == drawn.amount:
            assert answer.step is Step.REPLAY, (drawn, answer)
            assert answer.result is not None
            assert answer.result.executed_event_id == known[0]
        else:
            assert answer.step is Step.CONFLICT, (drawn, answer)
        for record in answer.records:
            state[record.key] = record
        assert answer.result is not None
        executed = answer.result.executed_event_id
        if executed is not None:
            assert principal_of[executed] == drawn.principal, "a result names another's call"
