"""One run of a handler: its outcomes (succeeded, failed, timed out), the output held to the
contract's output schema by the gate's tool-output path, typed arguments, and the lookup."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from callgate_executor import Executor, contract
from callgate_executor.handlers import (
    Call,
    Handlers,
    HandlerSpec,
    ToolError,
    run_handler,
    typed_arguments,
)
from tests.support.executor import Judge, contract_settings
from worker.compose import build_registry
from worker.published.model import Accepted, ResultError, ResultStatus, parse_event
from worker.schemas.contract import Contract

JUDGE = Judge()
REGISTRY = build_registry(contract_settings())


class Pay(BaseModel):
    amount_minor: int
    currency: str
    recipient: str
    idempotency_key: str


class Strict(BaseModel):
    amount_minor: str  # not what the contract says: the model refuses the arguments


def _event(call_id: str, amount: int = 100) -> Accepted:
    event = parse_event(JUDGE.pay(f"key-{call_id}", amount, call_id=call_id))
    assert isinstance(event, Accepted)
    return event


def _contract() -> Contract:
    found = REGISTRY.resolve("shop.pay", "1")
    assert isinstance(found, Contract)
    assert found.output_check is not None
    return found


def _spec(handler: Any, timeout_s: float = 5.0, arguments: type[BaseModel] = Pay) -> HandlerSpec:
    return HandlerSpec("pay", "shop.pay", None, handler, arguments, True, timeout_s)


def _call(event: Accepted) -> Call[Pay]:
    return Call(
        arguments=Pay.model_validate(event.arguments),
        event=event,
        idempotency_key=event.idempotency_key,
        execution_key=contract.execution_key(event),
        traceparent=event.traceparent,
        deadline=time.time() + 5,
        attempt=1,
    )


async def _run(handler: Any, call_id: str, timeout_s: float = 5.0) -> Any:
    spec = _spec(handler, timeout_s)
    return await run_handler(spec, _call(_event(call_id)), _contract().output_check, 32)


@pytest.mark.asyncio
async def test_a_handler_gets_typed_arguments_and_its_key() -> None:
    seen: list[Call[Pay]] = []

    async def pay(call: Call[Pay]) -> dict[str, Any]:
        seen.append(call)
        return {"payment_id": 7, "status": "paid"}

    outcome = await _run(pay, "h-ok")
    assert outcome.status is ResultStatus.SUCCEEDED
    assert outcome.output == {"payment_id": 7, "status": "paid"}
    (call,) = seen
    assert call.arguments == Pay(
        amount_minor=100, currency="EUR", recipient="acme", idempotency_key="key-h-ok"
    )
    assert call.idempotency_key == "key-h-ok"
    assert 0 < call.remaining_s() <= 5


@pytest.mark.asyncio
async def test_output_its_contract_refuses_fails_the_call() -> None:
    async def pay(call: Call[Pay]) -> dict[str, Any]:
        return {"payment_id": "seven", "status": "paid", "card": "4111111111111111"}

    outcome = await _run(pay, "h-bad-output")
    assert outcome.status is ResultStatus.FAILED
    assert outcome.error.type == "output_schema_violation"
    assert "4111" not in outcome.error.message  # named by path and keyword, never the value
    assert "/payment_id" in outcome.error.message


@pytest.mark.asyncio
async def test_a_model_output_is_its_json() -> None:
    class Paid(BaseModel):
        payment_id: int
        status: str

    async def pay(call: Call[Pay]) -> Paid:
        return Paid(payment_id=3, status="paid")

    outcome = await _run(pay, "h-model")
    assert (outcome.status, outcome.output) == (
        ResultStatus.SUCCEEDED,
        {"payment_id": 3, "status": "paid"},
    )


@pytest.mark.asyncio
async def test_output_that_is_no_json_fails_the_call() -> None:
    async def pay(call: Call[Pay]) -> object:
        return object()

    outcome = await _run(pay, "h-not-json")
    assert (outcome.status, outcome.error) == (
        ResultStatus.FAILED,
        ResultError(type="output_not_json", message="the tool returned no JSON value"),
    )


@pytest.mark.asyncio
async def test_a_handler_that_raises_fails_its_call_without_saying_why() -> None:
    async def pay(call: Call[Pay]) -> None:
        raise RuntimeError("db password is hunter2")

    outcome = await _run(pay, "h-raise")
    assert (outcome.status, outcome.error) == (
        ResultStatus.FAILED,
        ResultError(type="RuntimeError", message="the tool failed"),
    )


@pytest.mark.asyncio
async def test_a_tool_error_says_what_the_handler_chose() -> None:
    async def pay(call: Call[Pay]) -> None:
        raise ToolError("the recipient is not on file", type="unknown_recipient")

    outcome = await _run(pay, "h-tool-error")
    assert outcome.error == ResultError(
        type="unknown_recipient", message="the recipient is not on file"
    )
    long = await _run(_raising(ToolError("x" * 5000)), "h-tool-error-long")
    assert long.error.type == "ToolError"
    assert len(long.error.message) == 512


def _raising(exc: Exception) -> Any:
    async def handler(call: Call[Pay]) -> None:
        raise exc

    return handler


@pytest.mark.asyncio
async def test_a_handler_past_its_deadline_times_out() -> None:
    never = asyncio.Event()

    async def pay(call: Call[Pay]) -> None:
        await never.wait()

    started = time.monotonic()
    outcome = await _run(pay, "h-timeout", timeout_s=0.05)
    assert time.monotonic() - started < 5
    assert outcome.status is ResultStatus.TIMED_OUT
    assert outcome.error == ResultError(
        type="deadline", message="the tool did not finish within its deadline of 0.05 s"
    )


def test_arguments_the_handlers_type_refuses_are_named_without_values() -> None:
    event = _event("h-typed", amount=424242)
    refusal = typed_arguments(_spec(None, arguments=Strict), event)
    assert isinstance(refusal, ResultError)
    assert refusal.type == "argument_type"
    assert "amount_minor" in refusal.message
    assert "424242" not in refusal.message
    assert typed_arguments(_spec(None), event) == Pay.model_validate(event.arguments)


def test_handlers_are_found_by_schema_id_and_version() -> None:
    handlers = Handlers()
    any_version = HandlerSpec("pay", "shop.pay", None, _raising(ValueError()), Pay, True, 1.0)
    version_1 = HandlerSpec("shop.pay", "shop.pay", "1", _raising(ValueError()), Pay, True, 1.0)
    handlers.add(any_version)
    event = _event("h-find")
    assert handlers.find(event) is any_version
    handlers.add(version_1)
    assert handlers.find(event) is version_1  # a version's own handler, by whichever name
    only_id = Handlers()
    only_id.add(version_1)
    assert only_id.find(event) is version_1
    other_version = event.model_copy(
        update={"schema_ref": event.schema_ref.model_copy(update={"version": "2"})}
    )
    assert only_id.find(other_version) is None
    with pytest.raises(ValueError, match="registered already"):
        handlers.add(any_version)


_IDENTITY = _event("h-identity")
#: every name a handler may be registered by: (name, the schema id its contract has)
_NAMES = [
    ("pay", "shop.pay"),
    ("shop.pay", "shop.pay"),
    ("lookup", "shop.lookup"),
    ("shop.lookup", "shop.lookup"),
    ("wire", "shop.wire"),
    ("shop.wire", "shop.wire"),
]
_LABELS = ["pay", "lookup", "wire", "shop.pay", "shop.wire", "other", None]


@settings(max_examples=200, deadline=None)
@given(
    registered=st.lists(
        st.tuples(st.sampled_from(_NAMES), st.sampled_from([None, "1"])),
        min_size=1,
        max_size=6,
        unique_by=lambda r: (r[0][1], r[1]),
    ),
    schema_id=st.sampled_from(["shop.pay", "shop.lookup", "shop.wire"]),
    label=st.sampled_from(_LABELS),
)
def test_a_call_is_given_the_handler_of_its_schema_whatever_tool_it_names(
    registered: list[tuple[tuple[str, str], str | None]], schema_id: str, label: str | None
) -> None:
    """The handler, the approval and the output of a call are one identity: its event's schema
    id and version (the event's `tool`, which another writer of the topic or a gate under other
    contracts may set to anything, is never looked up): a `wire` event relabelled as another
    schema's never gets `wire`'s handler, nor a call of `wire`'s schema another's."""
    executor = Executor(contract_settings(kafka={"bootstrap_servers": "127.0.0.1:9"}))
    for (name, _), version in registered:
        executor.register(
            name, _raising(ValueError()), arguments=Pay, version=version, retry_safe=False
        )
    event = _IDENTITY.model_copy(
        update={
            "tool": label,
            "schema_ref": _IDENTITY.schema_ref.model_copy(update={"id": schema_id}),
        }
    )
    found = executor._handlers.find(event)
    mine = {version: name for (name, sid), version in registered if sid == schema_id}
    if not mine:
        assert found is None
        return
    assert found is not None
    assert found.schema_id == schema_id
    expected = "1" if "1" in mine else None  # a version's own handler, else the any-version one
    assert (found.tool, found.version) == (mine[expected], expected)
