"""The execute contract as a pure decision: each step, the records, and generated histories held
to the contract (one run per key, the recorded result for equal repeats, conflicts otherwise)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate_executor import contract
from callgate_executor.contract import ANSWERED, DONE, STARTED, Execution, Outcome, Step, decide
from tests.support import published
from tests.support.executor import Judge
from worker.core.approval import Decided, Decision, approved_event, pending_event
from worker.published import Document
from worker.published.model import Accepted, ResultError, ResultStatus, parse_event

JUDGE = Judge()


def _event(value: bytes) -> Accepted:
    event = parse_event(value)
    assert isinstance(event, Accepted)
    return event


def _pay(key: str, amount: int, call_id: str) -> Accepted:
    return _event(JUDGE.pay(key, amount, call_id=call_id))


def test_the_execution_key_is_the_idempotency_key_else_the_event_id() -> None:
    keyed = _pay("k-1", 100, "c-key-1")
    assert contract.execution_key(keyed) == "key:k-1"
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
    ],
    ids=["new", "conflict", "conflict-started", "redelivered", "replay", "retry", "interrupted"],
)
def test_each_step(case: tuple[Execution | None, str, str, bool, Step, int]) -> None:
    """(the key's record, the request's digest and event id, retry_safe) -> (step, attempt)"""
    recorded, digest, event_id, retry_safe, step, attempt = case
    decision = decide(recorded, digest, event_id, retry_safe)
    assert (decision.step, decision.attempt, decision.recorded) == (step, attempt, recorded)
    # a call answered already is done, whatever its key's record says
    assert decide(recorded, digest, event_id, retry_safe, answered=True).step is Step.ALREADY_DONE


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
    for record in (done, started, Execution("call:e", ANSWERED, "d", "e", "c", "t", 0)):
        assert Execution.decode(record.encode()) == record


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
    """A `shop.wire` call as the gate releases it once approved: held (its pending event, with
    the gate's fingerprint), then approved (`worker.core.approval`)."""
    accepted = JUDGE.accepted("wire", arguments, call_id=call_id)
    pending, _ = pending_event(accepted)
    decided = Decided(Decision.APPROVE, offset=0, at_ms=1, by="ops")
    return _event(approved_event(orjson.loads(pending), decided))


def test_a_call_requiring_approval_runs_only_with_an_approval_of_its_own_arguments() -> None:
    arguments = {"amount_minor": 5, "idempotency_key": "w1"}
    unapproved = _event(JUDGE.accepted("wire", arguments, call_id="c-appr-1"))
    assert unapproved.requires_approval
    assert unapproved.approval is None
    assert contract.approval_refusal(unapproved) == contract.APPROVAL_MISSING
    approved = _approved(arguments, "c-appr-2")
    assert approved.approval is not None
    assert contract.approval_refusal(approved) is None
    # an approval whose fingerprint was tampered with, or carried over to other arguments
    approval = approved.approval
    tampered = approved.model_copy(
        update={"approval": approval.model_copy(update={"fingerprint": "0" * 32})}
    )
    assert contract.approval_refusal(tampered) == contract.APPROVAL_MISMATCH
    moved = approved.model_copy(update={"arguments": {**arguments, "amount_minor": 500}})
    assert contract.approval_refusal(moved) == contract.APPROVAL_MISMATCH
    other_version = approved.model_copy(
        update={"schema_ref": approved.schema_ref.model_copy(update={"version": "2"})}
    )
    assert contract.approval_refusal(other_version) == contract.APPROVAL_MISMATCH
    # a call that needs no approval needs none
    assert contract.approval_refusal(_pay("k-appr", 100, "c-appr-3")) is None
    refused = contract.refused_result(tampered, contract.APPROVAL_MISMATCH)
    record = published.check(Document.TOOL_RESULT, contract.encode_result(refused))
    assert (record["status"], record["error"]["type"]) == (
        "refused",
        "approval_fingerprint_mismatch",
    )


# -- generated histories -------------------------------------------------------------------------


class Model:
    """The executor's loop over one partition, with the decision under test and a crash switch:
    what it records, what runs, and each call's results."""

    def __init__(self, retry_safe: bool) -> None:
        self.retry_safe = retry_safe
        self.state: dict[str, Execution] = {}
        self.runs: dict[str, int] = {}
        self.results: dict[str, list[dict[str, Any]]] = {}

    def request(self, event: Accepted, crash: bool) -> bool:
        """One request; `crash`: the executor dies during the handler. True: it was done."""
        key, digest = contract.execution_key(event), contract.digest_of(event)
        answered = contract.answered_key(event.event_id) in self.state
        decision = decide(
            self.state.get(key), digest, event.event_id, self.retry_safe, answered=answered
        )
        recorded = decision.recorded
        if decision.step is Step.RUN:
            executed = recorded.event_id if recorded else event.event_id
            begun = contract.started(event, key, digest, decision.attempt, executed)
            self.state[key] = begun
            self.runs[key] = self.runs.get(key, 0) + 1
            if crash:
                return False
            outcome = Outcome(ResultStatus.SUCCEEDED, {"amount": event.arguments["amount_minor"]})
            self.state[key] = done = contract.finished(begun, outcome)
            result = contract.recorded_result(event, done)
        elif decision.step is Step.INTERRUPTED:
            assert recorded is not None
            done = contract.finished(
                recorded, Outcome(ResultStatus.INTERRUPTED, error=contract.INTERRUPTED_ERROR)
            )
            self.state[key] = done
            result = contract.recorded_result(event, done)
        elif decision.step is Step.CONFLICT:
            result = contract.conflict_result(event)
        elif decision.step is Step.ALREADY_DONE:
            return True  # its result is written already (exactly_once)
        else:
            assert recorded is not None
            result = contract.recorded_result(event, recorded)
        if result.executed_event_id != event.event_id:
            note = contract.answered(event, digest)
            self.state[note.key] = note
        self.results.setdefault(event.event_id, []).append(
            published.check(Document.TOOL_RESULT, contract.encode_result(result))
        )
        return True


_GENERATED: dict[tuple[str, int, int], Accepted] = {}


def _generated(key: str, amount: int, call: int) -> Accepted:
    """The accepted event of one generated call, judged once (a call id is judged once)."""
    where = (key, amount, call)
    if where not in _GENERATED:
        _GENERATED[where] = _pay(f"gen-{key}", amount, f"gen-{key}-{amount}-{call}")
    return _GENERATED[where]


requests = st.lists(
    st.tuples(st.sampled_from("ab"), st.integers(1, 2), st.integers(0, 3), st.booleans()),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(history=requests, retry_safe=st.booleans())
def test_generated_histories_hold_the_contract(
    history: list[tuple[str, int, int, bool]], retry_safe: bool
) -> None:
    """Requests (key, amount, call, crash?) delivered in order, a crashed one again first:
    per key the first request decides; equal requests get its result, others a conflict;
    a handler runs again only after a crash, and only when safe to retry."""
    model = Model(retry_safe)
    first: dict[str, tuple[int, str]] = {}
    crashes: dict[str, int] = {}
    events: dict[str, Accepted] = {}
    for key, amount, call, crash in history:
        event = _generated(key, amount, call)
        events[event.event_id] = event
        first.setdefault(key, (amount, event.event_id))
        if not model.request(event, crash):
            crashes[f"key:gen-{key}"] = crashes.get(f"key:gen-{key}", 0) + 1
            assert model.request(event, False)  # redelivered after the crash, and done
    for key, (amount, first_event) in first.items():
        runs = model.runs[f"key:gen-{key}"]
        crashed = crashes.get(f"key:gen-{key}", 0)
        assert runs == (1 + crashed if retry_safe else 1)
        for event_id, results in model.results.items():
            event = events[event_id]
            if event.idempotency_key != f"gen-{key}":
                continue
            assert len(results) == 1, "one result per call"
            (result,) = results
            if event.arguments["amount_minor"] != amount:
                assert result["status"] == "conflict"
                assert result["executed_event_id"] is None
            elif crashed and not retry_safe:
                assert result["status"] == "interrupted"
            else:
                assert result["status"] == "succeeded"
                assert result["output"] == {"amount": amount}
                assert result["executed_event_id"] == first_event
                assert result["replayed"] == (event_id != first_event)


def test_an_accepted_tool_result_is_not_a_call() -> None:
    call = _pay("k-is-call", 1, "c-is-call")
    assert contract.is_call(call)
    phases = {**call.metrics.phases_us, "tool_output_validation": 3}
    result = call.model_copy(
        update={"metrics": call.metrics.model_copy(update={"phases_us": phases})}
    )
    assert not contract.is_call(result)
