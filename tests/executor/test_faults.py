"""One call's fault stays that call's failure: whatever a handler, its argument model or its
output raise (any `BaseException`, a `CancelledError` of its own included) is a recorded result,
never an exception into the executor; only the executor's own cancellation stops a run; and
whatever a handler emits is written only when it fits the bound and names a topic it may."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, model_serializer, model_validator

from callgate_executor import contract
from callgate_executor.contract import Emitted
from callgate_executor.handlers import (
    Call,
    HandlerSpec,
    note_interrupts,
    run_handler,
    typed_arguments,
)
from tests.support.executor import Judge
from tests.support.faults import RAISABLE, expected_failure
from worker.published.model import Accepted, ResultError, ResultStatus, parse_event

JUDGE = Judge()
EVENT = parse_event(JUDGE.accepted("lookup", {"sku": "s"}, call_id="faults-lookup"))
assert isinstance(EVENT, Accepted)


class Lookup(BaseModel):
    sku: str


def _call() -> Call[Lookup]:
    return Call(
        arguments=Lookup(sku="s"),
        event=EVENT,
        idempotency_key=None,
        execution_key=f"event:{EVENT.event_id}",
        traceparent=None,
        deadline=time.time() + 5,
        attempt=1,
    )


def _spec(handler: Any, arguments: type[BaseModel] = Lookup) -> HandlerSpec:
    return HandlerSpec("lookup", "shop.lookup", None, handler, arguments, False, 5.0)


def _raising_handler(exc: BaseException, where: str) -> Any:
    class Raising(BaseModel):
        @model_serializer
        def _dump(self) -> dict[str, Any]:
            raise exc

    async def handler(call: Call[Lookup]) -> Any:
        if where == "after_await":
            await asyncio.sleep(0)
        if where == "output":
            return Raising()
        raise exc

    return handler


@pytest.mark.asyncio
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(exc=st.sampled_from(RAISABLE), where=st.sampled_from(["body", "after_await", "output"]))
async def test_whatever_a_handler_raises_is_its_calls_failure(
    exc: BaseException, where: str
) -> None:
    """README (the executor's outcomes): a handler raising anything, a `CancelledError` or a
    `KeyboardInterrupt` of its own included, fails its call, recorded as any failure."""
    try:
        outcome = await run_handler(_spec(_raising_handler(exc, where)), _call(), None, 32)
    except BaseException as escaped:
        pytest.fail(f"{escaped!r} raised at {where} escaped the run")
    assert outcome.status is ResultStatus.FAILED
    assert outcome.error == expected_failure(exc, where)
    assert asyncio.current_task() is not None
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


#: what a handler returns after swallowing a cancellation: an output, valid or not, or a model
RETURNED = st.sampled_from([None, {}, {"sku": "s", "stock": 1}, "text", Lookup(sku="s")])


@pytest.mark.asyncio
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    instead=st.none() | st.sampled_from(RAISABLE) | st.tuples(RETURNED),
    awaits_first=st.booleans(),
)
async def test_the_executors_cancellation_stops_the_run_whatever_the_handler_makes_of_it(
    instead: BaseException | tuple[Any] | None, awaits_first: bool
) -> None:
    """The executor cancelling a run (its stop, a revoke past the grace) stops it with nothing
    recorded, whether the handler lets the cancellation through, raises something else, or
    swallows it and returns an output (at once, or after awaiting its own clean-up)."""
    entered = asyncio.Event()

    async def handler(call: Call[Lookup]) -> Any:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if awaits_first:
                await asyncio.sleep(0)
            if instead is None:
                raise
            if isinstance(instead, tuple):
                return instead[0]
            raise instead from None

    run = asyncio.create_task(run_handler(_spec(handler), _call(), None, 32))
    await asyncio.wait_for(entered.wait(), 5)
    run.cancel()
    done, _ = await asyncio.wait([run], timeout=5)
    assert done == {run}
    assert run.cancelled(), run.result()


@pytest.mark.asyncio
async def test_a_handler_past_its_deadline_times_out_whatever_it_raises_then() -> None:
    async def handler(call: Call[Lookup]) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    spec = HandlerSpec("lookup", "shop.lookup", None, handler, Lookup, False, 0.01)
    outcome = await run_handler(spec, _call(), None, 32)
    assert outcome.status is ResultStatus.TIMED_OUT


@settings(max_examples=200, deadline=None)
@given(exc=st.sampled_from(RAISABLE))
def test_whatever_an_argument_model_raises_refuses_the_call(exc: BaseException) -> None:
    """README: arguments the handler's type refuses, or its validator fails on with any
    exception, are a `refused` result (`argument_type`), never an exception into the executor
    (which stopped at that record on every restart)."""

    class Failing(BaseModel):
        sku: str

        @model_validator(mode="before")
        @classmethod
        def _check(cls, data: Any) -> Any:
            raise exc

    try:
        refusal = typed_arguments(_spec(None, Failing), EVENT)
    except BaseException as escaped:
        pytest.fail(f"{escaped!r} escaped the argument type")
    assert isinstance(refusal, ResultError)
    assert refusal.type == "argument_type"
    refused = contract.refusal(
        EVENT,
        handled=True,
        contracted=True,
        contract_requires_approval=False,
        allowed_principals=None,
        argument_error=refusal,
    )
    answer = contract.answer(EVENT, {}, refusal=refused, retry_safe=False)
    assert answer.step is contract.Step.REFUSED


#: the smallest bound the settings allow, so that records around it are quick to make
SMALL = 65_536
OWN = ("tool-calls.validated", "ex.requests", "ex.executions", "tool-results")

topics = st.sampled_from(["ledger", "a.b_c-1", "x" * 249]) | st.sampled_from(
    [*OWN, "", ".", "..", "a b", "é", "x" * 250, 5, None]
)
sizes = st.integers(0, 2 * SMALL) | st.integers(SMALL - 300, SMALL + 10)
emitted = st.builds(
    lambda topic, key, size, as_text: Emitted(
        topic,  # type: ignore[arg-type]
        key,
        "v" * size if as_text else b"v" * size,  # type: ignore[arg-type]
    ),
    topics,
    st.none() | st.binary(max_size=300) | st.just("text key"),
    sizes,
    st.booleans(),
)


def _fit(record: Emitted) -> bool:
    return len(record.key or b"") + len(record.value) <= SMALL


def _writable(record: Emitted) -> bool:
    return (
        isinstance(record.topic, str)
        and record.topic not in OWN
        and record.topic not in ("", ".", "..")
        and record.topic.isascii()
        and " " not in record.topic
        and len(record.topic) <= 249
        and isinstance(record.value, bytes)
        and isinstance(record.key, bytes | None)
    )


@settings(max_examples=300, deadline=None)
@given(records=st.lists(emitted, max_size=4), output=st.integers(0, SMALL), ok=st.booleans())
def test_what_a_handler_emits_is_written_only_when_it_fits_and_may_be(
    records: list[Emitted], output: int, ok: bool
) -> None:
    """README: the records a handler emits are written with its result only when it
    succeeded, each names a legal topic that is none of the executor's own, holds bytes, and
    its key and value fit CALLGATE_LIMITS__MAX_EVENT_BYTES; else the call fails
    (`emit_refused`, `output_too_large`) and none is written."""
    begun = contract.started(EVENT, contract.execution_key(EVENT), "d", 1, EVENT.event_id)
    if ok:
        outcome = contract.Outcome(ResultStatus.SUCCEEDED, output={"text": "x" * output})
    else:
        outcome = contract.Outcome(ResultStatus.FAILED, error=ResultError(type="t", message="m"))
    answer = contract.ran(
        EVENT, begun, outcome, max_bytes=SMALL, max_id_bytes=256, emitted=records, own_topics=OWN
    )
    assert answer.result is not None
    written = [contract.encode_result(answer.result), *(r.encode() for r in answer.records)]
    assert max(len(value) for value in written) <= SMALL
    assert all(_writable(r) and _fit(r) for r in answer.emitted)
    if not ok:
        assert answer.emitted == ()
        assert answer.result.status is ResultStatus.FAILED
        return
    if not all(_writable(r) for r in records):
        assert (answer.result.error, answer.emitted) == (contract.EMIT_REFUSED, ())
    elif not all(_fit(r) for r in records):
        assert (answer.result.error, answer.emitted) == (contract.OUTPUT_TOO_LARGE, ())
    elif answer.result.status is ResultStatus.SUCCEEDED:
        assert answer.emitted == tuple(records)
    else:
        assert answer.result.error == contract.OUTPUT_TOO_LARGE  # the output itself


@pytest.mark.asyncio
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    where=st.sampled_from(["body", "after_await", "output", "arguments"]),
    made_of_it=st.sampled_from(["through", "converted", "swallowed"]),
    own=st.booleans(),
)
async def test_a_ctrl_c_in_a_tools_code_stops_the_run_and_is_never_its_result(
    where: str, made_of_it: str, own: bool
) -> None:
    """SIGINT's `KeyboardInterrupt` lands in whatever code runs: in a handler (before or after
    it awaited), its output model or its argument model, which lets it through, makes another
    exception of it (pydantic's serializer does) or swallows it. With the executor's noting
    installed (`note_interrupts`, as `run` installs it) it stops the run (it propagates, as
    that `KeyboardInterrupt`) and nothing is recorded; a `KeyboardInterrupt` the tool raises
    itself stays its call's failure."""

    def interrupt() -> None:
        if own:
            raise KeyboardInterrupt
        try:
            signal.raise_signal(signal.SIGINT)  # its handler runs here, and raises
        except KeyboardInterrupt:
            if made_of_it == "converted":
                raise RuntimeError("made something else of it") from None
            if made_of_it == "through":
                raise

    class Interrupting(BaseModel):
        @model_serializer
        def _dump(self) -> dict[str, Any]:
            interrupt()
            return {}

    class InterruptedArguments(BaseModel):
        sku: str

        @model_validator(mode="after")
        def _check(self) -> InterruptedArguments:
            interrupt()
            return self

    async def handler(call: Call[Lookup]) -> Any:
        if where == "after_await":
            await asyncio.sleep(0)
        if where == "output":
            return Interrupting()
        interrupt()
        return {"sku": "s"}

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    restore = note_interrupts()
    try:
        if where == "arguments":
            spec = _spec(handler, InterruptedArguments)
            if own:
                refused = typed_arguments(spec, EVENT)
                assert isinstance(refused, ResultError)
                assert refused.type == "argument_type"
            else:
                with pytest.raises(KeyboardInterrupt):
                    typed_arguments(spec, EVENT)
        elif own:
            outcome = await run_handler(_spec(handler), _call(), None, 32)
            assert outcome.status is ResultStatus.FAILED
        else:
            with pytest.raises(KeyboardInterrupt):
                await run_handler(_spec(handler), _call(), None, 32)
    finally:
        restore()
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("first_done", [0, 1])
def test_interrupts_are_noted_until_the_last_executor_is_done(first_done: int) -> None:
    """Two executors in one process (as the rebalance tests run them): SIGINT's handler is
    wrapped once, and put back as it was found when the last is done, in either order."""

    def found(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, found)
    try:
        done = [note_interrupts(), note_interrupts()]
        wrapped = signal.getsignal(signal.SIGINT)
        assert wrapped is not found
        done[first_done]()
        assert signal.getsignal(signal.SIGINT) is wrapped
        done[first_done]()  # twice: once counts
        assert signal.getsignal(signal.SIGINT) is wrapped
        done[1 - first_done]()
        assert signal.getsignal(signal.SIGINT) is found
    finally:
        signal.signal(signal.SIGINT, previous)
