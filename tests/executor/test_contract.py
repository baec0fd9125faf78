"""The execute contract as a pure decision: each step, the records, and generated histories held
to the contract (one run per key, the recorded result for equal repeats, conflicts otherwise)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate_executor import contract
from callgate_executor.contract import ANSWERED, DONE, STARTED, Execution, Outcome, Step, decide
from tests.support import published
from tests.support.executor import Judge, contract_settings
from worker.compose import build_registry
from worker.core.canonical import scoped_key
from worker.published import Document
from worker.published.model import Accepted, ResultError, ResultStatus, parse_event
from worker.schemas.contract import Contract

JUDGE = Judge()
REGISTRY = build_registry(contract_settings())
MAX_BYTES = contract_settings().limits.max_event_bytes
MAX_ID_BYTES = contract_settings().limits.max_id_bytes


def _event(value: bytes) -> Accepted:
    event = parse_event(value)
    assert isinstance(event, Accepted)
    return event


def _requires_approval(event: Accepted) -> bool:
    """Whether the executor's own contract of the call requires an approval."""
    found = REGISTRY.resolve(event.schema_ref.id, event.schema_ref.version)
    return isinstance(found, Contract) and found.meta.requires_approval


def _pay(key: str, amount: int, call_id: str) -> Accepted:
    return _event(JUDGE.pay(key, amount, call_id=call_id))


def test_the_execution_key_is_the_idempotency_key_else_the_event_id() -> None:
    keyed = _pay("k-1", 100, "c-key-1")
    assert contract.execution_key(keyed) == 'key:[null,"k-1"]'  # in the no-principal scope
    # a principal's key is in its own scope, as the gate's key's owner scopes it
    alice = _event(JUDGE.pay("k-1", 100, call_id="c-key-3", principal="alice"))
    assert contract.execution_key(alice) == 'key:["alice","k-1"]'
    unkeyed = _event(JUDGE.accepted("lookup", {"sku": "a"}, call_id="c-key-2"))
    assert contract.execution_key(unkeyed) == f"event:{unkeyed.event_id}"


def test_the_digest_is_of_the_normalized_request() -> None:
    a = _event(JUDGE.accepted("lookup", {"sku": "a"}, call_id="c-dig-1"))
    b = _event(JUDGE.accepted("lookup", {"sku": "a"}, call_id="c-dig-2"))
    c = _event(JUDGE.accepted("lookup", {"sku": "b"}, call_id="c-dig-3"))
    assert contract.digest_of(a) == contract.digest_of(b) != contract.digest_of(c)
    # member order and a number's spelling are not part of the request
    reordered = a.model_copy(update={"arguments": {"sku": "a"}})
    assert contract.digest_of(reordered) == contract.digest_of(a)
    one = a.model_copy(update={"arguments": {"n": 1}})
    one_float = a.model_copy(update={"arguments": {"n": 1.0}})
    assert contract.digest_of(one) == contract.digest_of(one_float)
    # another tool or version under the same key is another request
    other = a.model_copy(update={"schema_ref": a.schema_ref.model_copy(update={"version": "2"})})
    assert contract.digest_of(other) != contract.digest_of(a)


def _record(state: str, digest: str = "d1", event_id: str = "e1", attempts: int = 1) -> Execution:
    outcome = Outcome(ResultStatus.SUCCEEDED, {"ok": True}) if state == DONE else None
    return Execution("key:k", state, digest, event_id, "c1", "pay", attempts, outcome)


@pytest.mark.parametrize(
    "case",
    [
        (None, "d1", "e1", False, Step.RUN, 1),
        (_record(DONE), "d2", "e2", True, Step.CONFLICT, 0),
        (_record(STARTED), "d2", "e2", True, Step.CONFLICT, 0),
        (_record(DONE), "d1", "e1", False, Step.ALREADY_DONE, 0),
        (_record(DONE), "d1", "e2", False, Step.REPLAY, 0),
        (_record(STARTED, attempts=2), "d1", "e1", True, Step.RUN, 3),
        (_record(STARTED), "d1", "e1", False, Step.INTERRUPTED, 0),
        (_record(DONE), "d2", "e1", True, Step.ALREADY_DONE, 0),
        (_record(STARTED), "d2", "e1", True, Step.INTERRUPTED, 0),
    ],
    ids=[
        "new",
        "conflict",
        "conflict-started",
        "redelivered",
        "replay",
        "retry",
        "interrupted",
        "rejudged-done",
        "rejudged-started",
    ],
)
def test_each_step(case: tuple[Execution | None, str, str, bool, Step, int]) -> None:
    """(the key's record, the request's digest and event id, retry_safe) -> (step, attempt)"""
    recorded, digest, event_id, retry_safe, step, attempt = case
    decision = decide(recorded, digest, event_id, retry_safe)
    assert (decision.step, decision.attempt, decision.recorded) == (step, attempt, recorded)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@given(
    output=json_values,
    status=st.sampled_from(list(ResultStatus)),
    error=st.none() | st.builds(ResultError, type=st.text(max_size=8), message=st.text()),
    attempts=st.integers(1, 10),
)
def test_records_read_back_as_written(
    output: Any, status: ResultStatus, error: ResultError | None, attempts: int
) -> None:
    done = Execution("key:k", DONE, "d", "e", "c", "t", attempts, Outcome(status, output, error))
    started = Execution("event:e", STARTED, "d", "e", "c", "t", attempts)
    refused = Outcome(ResultStatus.REFUSED, error=contract.APPROVAL_MISMATCH)
    for record in (
        done,
        started,
        Execution("call:e", ANSWERED, "d", "e", "c", "t", 0),
        Execution("call:e", ANSWERED, "d", "e", "c", "t", 0, refused),
        Execution("key:k", DONE, "d", "e", "c", "t", attempts, done.outcome, ("s.t", "2")),
    ):
        assert Execution.decode(record.encode()) == record
        # a record written before the request's schema was kept
        older = orjson.loads(record.encode())
        del older["schema"]
        assert Execution.decode(orjson.dumps(older)) == replace(record, schema=None)


def test_a_record_of_another_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown execution state"):
        Execution.decode(b'{"key":"k","state":"maybe"}')


def test_every_kind_of_result_holds_to_the_published_schema() -> None:
    event = _pay("k-res", 5, "c-res")
    repeat = _pay("k-res", 5, "c-res-2")
    begun = contract.started(event, "key:k-res", "d", 1, event.event_id)
    for outcome in (
        Outcome(ResultStatus.SUCCEEDED, {"payment_id": 1, "status": "paid"}),
        Outcome(ResultStatus.FAILED, error=ResultError(type="ValueError", message="m")),
        Outcome(ResultStatus.INTERRUPTED, error=contract.INTERRUPTED_ERROR),
    ):
        done = contract.finished(begun, outcome)
        for result in (
            contract.recorded_result(event, done),
            contract.recorded_result(repeat, done),
        ):
            published.check(Document.TOOL_RESULT, contract.encode_result(result))
    published.check(Document.TOOL_RESULT, contract.encode_result(contract.conflict_result(event)))
    refused = contract.refused_result(event, ResultError(type="approval_missing", message="m"))
    record = published.check(Document.TOOL_RESULT, contract.encode_result(refused))
    assert (record["executed_event_id"], record["attempts"], record["output"]) == (None, 0, None)


def _approved(arguments: dict[str, Any], call_id: str) -> Accepted:
    return _event(JUDGE.approved("wire", arguments, call_id=call_id))


def test_a_call_requiring_approval_runs_only_with_an_approval_of_its_own_arguments() -> None:
    arguments = {"amount_minor": 5, "idempotency_key": "w1"}
    unapproved = _event(JUDGE.accepted("wire", arguments, call_id="c-appr-1"))
    assert unapproved.requires_approval
    assert unapproved.approval is None
    assert (
        contract.approval_refusal(unapproved, contract_requires=True) == contract.APPROVAL_MISSING
    )
    approved = _approved(arguments, "c-appr-2")
    assert approved.approval is not None
    assert contract.approval_refusal(approved, contract_requires=True) is None
    # an approval whose fingerprint was tampered with, or carried over to other arguments
    approval = approved.approval
    tampered = approved.model_copy(
        update={"approval": approval.model_copy(update={"fingerprint": "0" * 32})}
    )
    assert contract.approval_refusal(tampered, contract_requires=True) == contract.APPROVAL_MISMATCH
    moved = approved.model_copy(update={"arguments": {**arguments, "amount_minor": 500}})
    assert contract.approval_refusal(moved, contract_requires=True) == contract.APPROVAL_MISMATCH
    other_version = approved.model_copy(
        update={"schema_ref": approved.schema_ref.model_copy(update={"version": "2"})}
    )
    assert (
        contract.approval_refusal(other_version, contract_requires=True)
        == contract.APPROVAL_MISMATCH
    )
    # a call that needs no approval needs none
    assert (
        contract.approval_refusal(_pay("k-appr", 100, "c-appr-3"), contract_requires=False) is None
    )
    refused = contract.refused_result(tampered, contract.APPROVAL_MISMATCH)
    record = published.check(Document.TOOL_RESULT, contract.encode_result(refused))
    assert (record["status"], record["error"]["type"]) == (
        "refused",
        "approval_fingerprint_mismatch",
    )


def test_a_refusal_is_the_calls_answer_for_good_and_leaves_its_key_free() -> None:
    arguments = {"amount_minor": 7, "idempotency_key": "w-once"}
    forged = _event(JUDGE.approved("wire", arguments, call_id="c-once-1", fingerprint="0" * 32))
    state: dict[str, Execution] = {}
    first = contract.answer(
        forged,
        state,
        refusal=contract.refusal(
            forged,
            handled=True,
            contracted=True,
            contract_requires_approval=True,
            allowed_principals=None,
            argument_error=None,
        ),
        retry_safe=True,
    )
    assert first.step is Step.REFUSED
    assert first.result == contract.refused_result(forged, contract.APPROVAL_MISMATCH)
    (note,) = first.records
    assert note.key == contract.answered_key(forged.event_id)
    state[note.key] = Execution.decode(note.encode())  # as a restored member reads it
    # delivered again, even to an executor that has no handler for it now: the same answer
    for handled in (True, False):
        refusal = contract.refusal(
            forged,
            handled=handled,
            contracted=True,
            contract_requires_approval=True,
            allowed_principals=None,
            argument_error=None,
        )
        again = contract.answer(forged, state, refusal=refusal, retry_safe=True)
        assert (again.step, again.result, again.records) == (Step.ALREADY_DONE, first.result, ())
        assert again.to_write(exactly_once=True, delivered=False) is None
        assert again.to_write(exactly_once=False, delivered=True) is None
        assert again.to_write(exactly_once=False, delivered=False) == first.result
    # the key is not the refused call's: an equal request, approved, runs under it
    approved = _approved(arguments, "c-once-2")
    run = contract.answer(approved, state, refusal=None, retry_safe=True)
    assert run.step is Step.RUN
    assert run.begun is not None
    assert run.begun.key == contract.execution_key(forged) == 'key:[null,"w-once"]'


# -- generated deliveries against the README's contract ------------------------------------------
#
# A partition of the requests topic worked as the executor works it (`contract.answer`, then the
# records before or with the result, then the offset; a crash loses what was not written and
# the member's memory, and the record is delivered again), held to a reference written from
# the README: per call one answer (refused: no handler, no approval or a tampered one; else per
# key the first request runs, an equal one gets its recorded result, a different one a
# conflict); every call has exactly one result under exactly_once, and under at_least_once
# one, or after a crash the same one again.

#: where a delivery's processing may stop: during the handler (a run only); before anything
#: of its answer is written; with its records written but not its result; with its result
#: written but not its offset (the last two: at_least_once only, exactly_once writes them at once)
CRASHES = ("handler", "unwritten", "unresulted", "uncommitted")


@dataclass(frozen=True)
class Made:
    """A generated call: its event, and what the README says decides its answer."""

    event: Accepted
    identity: tuple[str, int]  # the request: tool (and version) and arguments (the amount)
    approval: str | None  # None (needs none), or how its approval is: missing, tampered


def _make_pool() -> list[Made]:
    made: list[Made] = []
    for key in ("a", "b"):
        for amount in (1, 2):
            for call in (0, 1):
                event = _pay(f"pool-{key}", amount, f"pool-{key}-{amount}-{call}")
                made.append(Made(event, ("pay", amount), None))
    for call in (0, 1):
        lookup = _event(JUDGE.accepted("lookup", {"sku": "s"}, call_id=f"pool-lookup-{call}"))
        made.append(Made(lookup, ("lookup", 0), None))
    for amount in (5, 6):
        arguments = {"amount_minor": amount, "idempotency_key": "pool-w"}
        for call in (0, 1):
            call_id = f"pool-wire-{amount}-{call}"
            approved = _approved(arguments, call_id)
            made.append(Made(approved, ("wire", amount), None))
            missing = _event(JUDGE.accepted("wire", arguments, call_id=f"{call_id}-missing"))
            made.append(Made(missing, ("wire", amount), "approval_missing"))
            forged = JUDGE.approved("wire", arguments, call_id=f"{call_id}-t", fingerprint="f" * 32)
            tampered = _event(forged)
            made.append(Made(tampered, ("wire", amount), "approval_fingerprint_mismatch"))
        # an approval of amount 5 carried over to arguments of 6
        moved = _approved({**arguments, "amount_minor": 5}, f"pool-wire-moved-{amount}")
        moved = moved.model_copy(update={"arguments": arguments})
        if amount != 5:
            made.append(Made(moved, ("wire", amount), "approval_fingerprint_mismatch"))
    # the same calls judged again after a gate's crash under other contracts: their event ids,
    # another request (another amount or sku, another version)
    for original in (made[0], made[5], made[8]):
        event = original.event
        tool, amount = original.identity
        version = event.schema_ref.model_copy(update={"version": "2"})
        if tool == "pay":
            other = {**event.arguments, "amount_minor": 3 - amount}
            rejudged = event.model_copy(update={"arguments": other, "schema_ref": version})
            made.append(Made(rejudged, (f"{tool} v2", 3 - amount), None))
        else:
            rejudged = event.model_copy(update={"arguments": {"sku": "t"}, "schema_ref": version})
            made.append(Made(rejudged, (f"{tool} v2", 1), None))
    return made


POOL = _make_pool()


def _handled(made: Made) -> Outcome:
    """What the handlers do: an amount of 2 is declined (a final failure), the rest succeeds."""
    tool, amount = made.identity
    if amount == 2:
        return Outcome(ResultStatus.FAILED, error=ResultError(type="declined", message="no"))
    return Outcome(ResultStatus.SUCCEEDED, {"tool": tool, "amount": amount})


class Member:
    """The executor working one partition (its decisions: `contract`) over the records it
    wrote to the executions topic, the results topic, and what each handler ran."""

    def __init__(self, exactly_once: bool, retry_safe: bool) -> None:
        self.exactly_once, self.retry_safe = exactly_once, retry_safe
        self.log: list[bytes] = []
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.runs: Counter[str] = Counter()
        self.state: dict[str, Execution] = {}
        self.delivered: set[str] = set()

    def crash(self) -> None:
        """A new member: the partition restored from what was written, nothing else."""
        self.state = {}
        for value in self.log:
            record = Execution.decode(value)
            self.state[record.key] = record
        self.delivered = set()

    def _record(self, record: Execution) -> None:
        self.log.append(record.encode())
        self.state[record.key] = record

    def deliver(self, made: Made, handled: bool, crash: str | None) -> bool:
        """One delivery; False: it stopped at `crash` (its offset uncommitted)."""
        event = made.event
        refusal = contract.refusal(
            event,
            handled=handled,
            contracted=True,
            contract_requires_approval=_requires_approval(event),
            allowed_principals=None,
            argument_error=None,
        )
        retry_safe = handled and self.retry_safe
        answer = contract.answer(event, self.state, refusal=refusal, retry_safe=retry_safe)
        if answer.step is Step.RUN:
            assert answer.begun is not None
            self._record(answer.begun)
            self.runs[answer.begun.key] += 1
            if crash == "handler":
                self.crash()
                return False
            answer = contract.ran(
                event,
                answer.begun,
                _handled(made),
                max_bytes=MAX_BYTES,
                max_id_bytes=MAX_ID_BYTES,
            )
        result = answer.to_write(
            exactly_once=self.exactly_once, delivered=event.event_id in self.delivered
        )
        if result is None:
            return True
        if crash == "unwritten" or (self.exactly_once and crash in CRASHES[2:]):
            self.crash()
            return False
        for record in answer.records:
            self._record(record)
        if crash == "unresulted":
            self.crash()
            return False
        wire = published.check(Document.TOOL_RESULT, contract.encode_result(result))
        self.results.setdefault(event.event_id, []).append(wire)
        self.delivered.add(event.event_id)
        if crash == "uncommitted":
            self.crash()
            return False
        return True


@dataclass
class KeyRef:
    key: str
    identity: tuple[str, int]
    executed: str  # the call that ran
    attempts: int = 0
    final: tuple[Any, ...] | None = None  # (status, error type, output)


class Reference:
    """The README's contract, told per call: the answer each call gets (status, error type,
    output, executed_event_id, replayed, attempts), and how often each key's handler runs."""

    def __init__(self, exactly_once: bool, retry_safe: bool) -> None:
        self.exactly_once, self.retry_safe = exactly_once, retry_safe
        self.answers: dict[str, tuple[Any, ...]] = {}
        self.keys: dict[str, KeyRef] = {}
        self.runs: Counter[str] = Counter()
        #: the calls whose result the member now working has written itself (a new member,
        #: after a crash, cannot know which were written: it writes an answered call's again)
        self.known: set[str] = set()

    def deliver(self, made: Made, handled: bool, crash: str | None) -> bool:
        """One delivery; False when the executor stops before its offset is committed."""
        done = self._deliver(made, handled, crash)
        if not done:
            self.known = set()
        return done

    def _deliver(self, made: Made, handled: bool, crash: str | None) -> bool:
        event = made.event
        eid = event.event_id
        if self.exactly_once and crash in ("unresulted", "uncommitted"):
            crash = "unwritten"  # one transaction: nothing of it is written
        if eid in self.answers:  # answered once, for good: its result again, if unknown
            if self.exactly_once or eid in self.known:
                return True
            return self._answer(eid, crash, self.answers[eid])
        key_id = event.idempotency_key
        exec_key = f"key:{scoped_key(event.principal, key_id)}" if key_id else f"event:{eid}"
        key = self.keys.get(exec_key)
        if key is not None and key.executed == eid and key.final is None:
            # its run was interrupted: safe to retry, still handled and the same request, it
            # runs again
            if not (self.retry_safe and handled and key.identity == made.identity):
                key.final = ("interrupted", "interrupted", None)
                return self._answer(eid, crash, (*key.final, eid, False, key.attempts))
            return self._run(made, key, crash)
        refusal = "no_handler" if not handled else made.approval
        if refusal is not None:
            return self._answer(eid, crash, ("refused", refusal, None, None, False, 0))
        if key is None:
            key = self.keys[exec_key] = KeyRef(exec_key, made.identity, eid)
            return self._run(made, key, crash)
        if key.identity != made.identity:
            return self._answer(
                eid, crash, ("conflict", "idempotency_conflict", None, None, False, 0)
            )
        assert key.final is not None, "an interrupted run is delivered again before the next"
        return self._answer(eid, crash, (*key.final, key.executed, True, key.attempts))

    def _run(self, made: Made, key: KeyRef, crash: str | None) -> bool:
        key.attempts += 1
        self.runs[key.key] += 1
        if crash in ("handler", "unwritten"):
            return False
        outcome = _handled(made)
        error = outcome.error.type if outcome.error else None
        key.final = (outcome.status.value, error, outcome.output)
        eid = made.event.event_id
        return self._answer(
            eid, crash, (*key.final, key.executed, key.executed != eid, key.attempts)
        )

    def _answer(self, eid: str, crash: str | None, answer: tuple[Any, ...]) -> bool:
        if crash == "unwritten":
            return False
        self.answers[eid] = answer
        if crash == "unresulted":
            return False
        self.known.add(eid)
        return crash != "uncommitted"


deliveries = st.lists(
    st.tuples(
        st.integers(0, len(POOL) - 1),
        st.booleans() | st.just(True),  # the tool's handler registered at that delivery
        st.sampled_from((None,) * 6 + CRASHES),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(history=deliveries, retry_safe=st.booleans(), exactly_once=st.booleans())
def test_generated_deliveries_hold_the_readme_contract(
    history: list[tuple[int, bool, str | None]], retry_safe: bool, exactly_once: bool
) -> None:
    """Calls delivered in any order, repeated, refused (no handler, an approval missing or
    tampered with), conflicting, with the executor stopping anywhere: each call gets the
    reference's answer, and one result (under at_least_once, after a crash, the same again)."""
    member = Member(exactly_once, retry_safe)
    reference = Reference(exactly_once, retry_safe)
    crashes = 0
    for index, handled, crashed in history:
        made, crash = POOL[index], crashed
        # delivered until its offset is committed (again after a crash: the same record)
        while True:
            done = member.deliver(made, handled, crash)
            assert reference.deliver(made, handled, crash) == done, (made.event.call_id, crash)
            if done:
                break
            crashes += 1
            crash = None
    for made in {POOL[index].event.event_id: POOL[index] for index, _, _ in history}.values():
        eid = made.event.event_id
        results = member.results[eid]
        first = results[0]
        assert all(result == first for result in results), "one answer per call"
        if exactly_once or not crashes:
            assert len(results) == 1, results
        else:
            assert len(results) <= 1 + crashes
        error = first["error"]["type"] if first["error"] else None
        got: tuple[Any, ...] = (first["status"], error, first["output"])
        got += (first["executed_event_id"], first["replayed"], first["attempts"])
        assert got == reference.answers[eid], made.event.call_id
    assert member.runs == reference.runs


def test_an_accepted_tool_result_is_not_a_call() -> None:
    call = _pay("k-is-call", 1, "c-is-call")
    assert contract.is_call(call)
    phases = {**call.metrics.phases_us, "tool_output_validation": 3}
    result = call.model_copy(
        update={"metrics": call.metrics.model_copy(update={"phases_us": phases})}
    )
    assert not contract.is_call(result)


# -- whether a call needs an approval is its contract's, not only its event's --------------------

_APPROVABLE = [
    ("pay", {"amount_minor": 3, "currency": "EUR", "recipient": "acme", "idempotency_key": "nr"}),
    ("lookup", {"sku": "s"}),
    ("wire", {"amount_minor": 3, "idempotency_key": "needs"}),
]
_ACCEPTED = {
    tool: _event(JUDGE.accepted(tool, arguments, call_id=f"needs-{tool}"))
    for tool, arguments in _APPROVABLE
}
_APPROVED = _approved({"amount_minor": 4, "idempotency_key": "needs"}, "needs-wire-approved")


@settings(max_examples=200, deadline=None)
@given(
    tool=st.sampled_from([tool for tool, _ in _APPROVABLE]),
    says_required=st.booleans(),
    approval=st.sampled_from(["none", "own", "forged", "other_arguments"]),
)
def test_a_call_its_contract_requires_an_approval_for_never_runs_without_one(
    tool: str, says_required: bool, approval: str
) -> None:
    """README (the executor's refusals): a call whose contract requires approval and that has
    none, or one naming other arguments, is refused, whatever its event's `requires_approval`
    says (an event of a gate whose contract did not require one, a record written by hand)."""
    event = _ACCEPTED[tool]
    granted = _APPROVED.approval
    assert granted is not None
    if approval == "own":
        fingerprint = contract.fingerprint(
            contract.CoreSchemaRef(event.schema_ref.id, event.schema_ref.version), event.arguments
        )
        granted = granted.model_copy(update={"fingerprint": fingerprint})
    elif approval == "forged":
        granted = granted.model_copy(update={"fingerprint": "0" * 32})
    event = event.model_copy(
        update={
            "requires_approval": says_required,
            "approval": None if approval == "none" else granted,
        }
    )
    needed = says_required or _requires_approval(event)
    assert needed is (says_required or tool == "wire")
    expected = None
    if needed and approval == "none":
        expected = contract.APPROVAL_MISSING
    elif needed and approval != "own":
        expected = contract.APPROVAL_MISMATCH
    refusal = contract.refusal(
        event,
        handled=True,
        contracted=True,
        contract_requires_approval=_requires_approval(event),
        allowed_principals=None,
        argument_error=None,
    )
    assert refusal == expected, (tool, says_required, approval)


_PRINCIPALS = [None, "ops", "eve", ""]
_ALLOWED = st.none() | st.frozensets(st.sampled_from(["ops", "eve", ""]), max_size=3)
#: calls that may run but for their principal (the wire call approved)
_RUNNABLE = {
    **_ACCEPTED,
    "wire": _approved({"amount_minor": 3, "idempotency_key": "needs"}, "needs-wire-ok"),
}


@settings(max_examples=200, deadline=None)
@given(
    tool=st.sampled_from([tool for tool, _ in _APPROVABLE]),
    principal=st.sampled_from(_PRINCIPALS),
    allowed=_ALLOWED,
    handled=st.booleans(),
)
def test_a_call_whose_principal_its_contract_does_not_allow_never_runs(
    tool: str, principal: str | None, allowed: frozenset[str] | None, handled: bool
) -> None:
    """README (the executor's refusals): a call whose principal the executor's contract does
    not allow (not on its allow list, or naming none when it has one) is refused
    `unauthorized`, as the gate would have refused it, whatever the gate that accepted it
    judged it by; the refusal is the call's, and its key stays free."""
    event = _RUNNABLE[tool].model_copy(update={"principal": principal})
    refusal = contract.refusal(
        event,
        handled=handled,
        contracted=True,
        contract_requires_approval=_requires_approval(event),
        allowed_principals=allowed,
        argument_error=None,
    )
    allows = allowed is None or (principal is not None and principal in allowed)
    if not handled:
        assert refusal == contract.NO_HANDLER
    else:
        assert refusal == (None if allows else contract.UNAUTHORIZED), (principal, allowed)
    state: dict[str, Execution] = {}
    answer = contract.answer(event, state, refusal=refusal, retry_safe=True)
    assert (answer.step is Step.RUN) is (handled and allows)
    if answer.step is Step.REFUSED:
        assert answer.result is not None
        assert answer.result.error == refusal
        assert [r.key for r in answer.records] == [contract.answered_key(event.event_id)]
