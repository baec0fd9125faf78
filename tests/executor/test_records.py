"""Whatever a record of the validated (or requests) topic holds, the executor reads it as a call
it can answer or as no call: generated records made from the gate's own accepted events, with
numbers of any size, cut short, garbled, of another outcome, never stop it."""

from __future__ import annotations

import orjson
from aiokafka.structs import ConsumerRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate_executor import contract
from callgate_executor.executor import _accepted
from tests.support.executor import Judge
from worker.published.model import ResultError, ResultStatus

JUDGE = Judge()
_PAY = {"amount_minor": 5, "currency": "EUR", "recipient": "acme", "idempotency_key": "rec"}
EVENTS = [
    JUDGE.accepted("pay", _PAY, call_id="rec-pay"),
    JUDGE.accepted("lookup", {"sku": "s"}, call_id="rec-lookup"),
    JUDGE.approved("wire", {"amount_minor": 5, "idempotency_key": "rec-w"}, call_id="rec-wire"),
]

#: number texts of any magnitude, as a record may spell them (past a double's range included)
numbers = st.builds(
    lambda sign, digits, exponent: f"{sign}{digits}e{exponent}".encode(),
    st.sampled_from(["", "-"]),
    st.integers(min_value=1, max_value=10**6),
    st.integers(min_value=-20, max_value=20) | st.integers(min_value=300, max_value=400),
)


def _record(value: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("tool-calls.validated", 0, 7, 0, 0, b"k", value, None, 1, len(value), [])


@st.composite
def records(draw: st.DrawFn) -> bytes:
    value = draw(st.sampled_from(EVENTS))
    how = draw(st.sampled_from(["number", "cut", "garble", "flag"]))
    if how == "number":
        # an argument's number replaced, as a hand-written or foreign record may hold it
        return value.replace(b'"amount_minor":5', b'"amount_minor":' + draw(numbers))
    if how == "cut":
        return value[: draw(st.integers(min_value=0, max_value=len(value)))]
    if how == "garble":
        at = draw(st.integers(min_value=0, max_value=len(value)))
        return value[:at] + draw(st.binary(min_size=1, max_size=8)) + value[at:]
    fields = orjson.loads(value)
    fields[draw(st.sampled_from(["outcome", "requires_approval", "arguments", "schema"]))] = draw(
        st.sampled_from([None, "rejected", True, 1.5, [], {}])
    )
    return orjson.dumps(fields)


@settings(max_examples=300, deadline=None)
@given(value=records(), handled=st.booleans(), retry_safe=st.booleans())
def test_every_record_is_a_call_the_executor_answers_or_none(
    value: bytes, handled: bool, retry_safe: bool
) -> None:
    event = _accepted(_record(value))
    if event is None:
        return
    refusal = contract.refusal(
        event,
        handled=handled,
        contracted=True,
        contract_requires_approval=True,
        allowed_principals=None,
        argument_error=None,
    )
    answer = contract.answer(event, {}, refusal=refusal, retry_safe=retry_safe)
    assert answer.step in (contract.Step.RUN, contract.Step.REFUSED)
    assert contract.execution_key(event)


#: the smallest bound the settings allow, so that outputs past it are quick to make
SMALL = 65_536
#: the settings' default bound of an identifier
ID_BYTES = 256


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(min_value=0, max_value=2 * SMALL) | st.integers(SMALL - 600, SMALL + 100),
    error_type=st.booleans(),
    own=st.booleans(),
)
def test_a_run_never_writes_a_record_past_the_bound(size: int, error_type: bool, own: bool) -> None:
    """README: a run's result and its records are never larger than
    `CALLGATE_LIMITS__MAX_EVENT_BYTES`: an output (or a `ToolError`'s type) that would make one
    larger, or the result of an equal repeat whatever its identifiers, fails the call
    `output_too_large`, recorded as any failure."""
    accepted = _accepted(_record(EVENTS[1]))
    assert accepted is not None
    executed = accepted.event_id if own else "another-event"
    begun = contract.started(accepted, contract.execution_key(accepted), "d", 1, executed)
    if error_type:
        error = ResultError(type="x" * size, message="m")
        outcome = contract.Outcome(ResultStatus.FAILED, error=error)
    else:
        outcome = contract.Outcome(ResultStatus.SUCCEEDED, output={"text": "x" * size})
    answer = contract.ran(accepted, begun, outcome, max_bytes=SMALL, max_id_bytes=ID_BYTES)
    assert answer.result is not None
    written = [contract.encode_result(answer.result), *(r.encode() for r in answer.records)]
    assert max(len(value) for value in written) <= SMALL
    unbounded = contract.ran(accepted, begun, outcome, max_bytes=10 * SMALL, max_id_bytes=ID_BYTES)
    assert unbounded.result is not None
    fits = (
        max(
            contract.widest_result_bytes(unbounded.result, ID_BYTES),
            *(len(r.encode()) for r in unbounded.records),
        )
        <= SMALL
    )
    if fits:
        assert answer == unbounded
    else:
        assert answer.result.status is ResultStatus.FAILED
        assert answer.result.error == contract.OUTPUT_TOO_LARGE
        assert answer.records[0].state == contract.DONE


@st.composite
def identifiers(draw: st.DrawFn, limit: int) -> str:
    """An identifier of at most `limit` UTF-8 bytes (often all of them): a character JSON
    writes in one byte, in two or more, or escaped in six, repeated."""
    character = draw(st.sampled_from(["a", "\x01", "\x1f", '"', "\\", "é", "€", "😀"]))
    length = draw(st.integers(0, limit) | st.just(limit))
    return character * (length // len(character.encode()))


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(SMALL - 12_000, SMALL - 500),
    caller=st.lists(
        identifiers(ID_BYTES),
        min_size=len(contract.CALLER_MEMBERS),
        max_size=len(contract.CALLER_MEMBERS),
    ),
    restored=st.booleans(),
)
def test_an_equal_repeat_gets_the_recorded_result_within_the_bound(
    size: int, caller: list[str], restored: bool
) -> None:
    """README: an equal repeat under a key gets the recorded result, and no result the executor
    writes passes `CALLGATE_LIMITS__MAX_EVENT_BYTES`, whatever the identifiers of the call that
    repeats it (each up to `CALLGATE_LIMITS__MAX_ID_BYTES`; its principal is the key's): a run
    whose output fits its own result but not a repeat's was recorded, and its repeat's result
    passed the bound (a record the topic may refuse, stopping the executor at it on every
    restart)."""
    first = _accepted(_record(EVENTS[0]))
    assert first is not None
    ran = contract.answer(first, {}, refusal=None, retry_safe=True)
    assert ran.begun is not None
    outcome = contract.Outcome(ResultStatus.SUCCEEDED, output={"text": "x" * size})
    done = contract.ran(first, ran.begun, outcome, max_bytes=SMALL, max_id_bytes=ID_BYTES)
    assert done.result is not None
    state = {r.key: r for r in done.records}
    if restored:  # a member that restored the partition from what was written
        state = {r.key: contract.Execution.decode(r.encode()) for r in done.records}
    repeat = first.model_copy(
        update={
            "event_id": "f" * 32,
            **dict(zip(contract.CALLER_MEMBERS, caller, strict=True)),
        }
    )
    again = contract.answer(repeat, state, refusal=None, retry_safe=True)
    assert again.step is contract.Step.REPLAY
    assert again.result is not None
    assert len(contract.encode_result(again.result)) <= SMALL
    assert (again.result.status, again.result.output, again.result.error) == (
        done.result.status,
        done.result.output,
        done.result.error,
    )
    assert again.result.executed_event_id == first.event_id
