"""A rejected call, or an executor's result, as the next model turn: each vendor's shape as
its SDK types it (openai, anthropic), only the sanitized feedback, and the retry budget."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic.types import MessageParam, ToolResultBlockParam
from openai.types.chat import ChatCompletionToolMessageParam
from openai.types.responses.response_input_param import FunctionCallOutput
from pydantic import TypeAdapter

from callgate_executor import contract
from callgate_executor.agent import Vendor, anthropic_user_turn, result_turn, retry_turn
from callgate_executor.contract import Outcome
from tests.support.executor import Judge
from worker.core.processor import Route
from worker.published.model import Accepted, Rejected, ResultError, ResultStatus, parse_event

JUDGE = Judge()
SECRET = "hunter2-secret"

#: each vendor's type of the answer to a tool call, as its SDK declares it
SHAPES: dict[Vendor, Any] = {
    Vendor.OPENAI_CHAT: ChatCompletionToolMessageParam,
    Vendor.OPENAI_RESPONSES: FunctionCallOutput,
    Vendor.ANTHROPIC: ToolResultBlockParam,
}


def _rejected(call_id: str, arguments: str) -> Rejected:
    route, value = JUDGE.judged("pay", arguments, call_id=call_id)
    assert route is Route.REJECTED
    event = parse_event(value)
    assert isinstance(event, Rejected)
    return event


def _as_sdk_types_it(vendor: Vendor, message: dict[str, Any]) -> None:
    """The message is what the vendor's SDK types as its answer: every member it declares,
    each of its type, and no member it does not declare."""
    shape = SHAPES[vendor]
    TypeAdapter(shape).validate_python(message, strict=True)
    assert shape.__required_keys__ <= message.keys() <= shape.__annotations__.keys()


def _schema_violation(call_id: str) -> Rejected:
    # a wrong type, and a property the schema does not declare, named after a secret
    arguments = orjson.dumps(
        {
            "amount_minor": "100",
            "currency": "EUR",
            "recipient": "acme",
            "idempotency_key": "k",
            SECRET: SECRET,
        }
    ).decode()
    return _rejected(call_id, arguments)


@pytest.mark.parametrize("vendor", list(Vendor))
def test_a_rejection_is_answered_in_the_vendors_shape(vendor: Vendor) -> None:
    event = _schema_violation(f"agent-{vendor}")
    turn = retry_turn(event, vendor)
    _as_sdk_types_it(vendor, turn.message)
    assert turn.retry is True
    text = orjson.dumps(turn.message).decode()
    assert SECRET not in text  # the sanitized feedback only, never a value or key it sent
    body = orjson.loads(turn.message.get("content") or turn.message.get("output") or b"null")
    assert body["error"] == "schema_violation"
    assert body["schema"] == {"id": "shop.pay", "version": "1"}
    assert {v["path"] for v in body["violations"]} >= {"/amount_minor"}
    assert body["instruction"] == event.retry_feedback.instruction
    call_ref = {"tool_call_id", "call_id", "tool_use_id"} & turn.message.keys()
    assert [turn.message[name] for name in call_ref] == [event.call_id]
    if vendor is Vendor.ANTHROPIC:
        assert turn.message["is_error"] is True
        TypeAdapter(MessageParam).validate_python(anthropic_user_turn(turn.message))


def test_the_retry_budget_stops_the_retries_but_answers_the_call() -> None:
    event = _schema_violation("agent-budget")
    exhausted = event.model_copy(
        update={
            "retry_feedback": event.retry_feedback.model_copy(
                update={"retry_budget_exhausted": True}
            )
        }
    )
    for stopped in (
        retry_turn(exhausted, Vendor.OPENAI_CHAT),
        retry_turn(event.model_copy(update={"attempt": 3}), Vendor.OPENAI_CHAT, budget=3),
    ):
        assert stopped.retry is False
        body = orjson.loads(stopped.message["content"])
        assert body["retry"] is False
        assert body["instruction"].endswith("Do not call this tool again for this request.")
    assert retry_turn(event.model_copy(update={"attempt": 2}), Vendor.OPENAI_CHAT, budget=3).retry


def test_a_rejection_that_is_not_retryable_is_not_retried() -> None:
    event = _schema_violation("agent-not-retryable")
    final = event.model_copy(
        update={"retry_feedback": event.retry_feedback.model_copy(update={"retryable": False})}
    )
    turn = retry_turn(final, Vendor.ANTHROPIC)
    assert turn.retry is False
    assert orjson.loads(turn.message["content"])["retry"] is False


@pytest.mark.parametrize("vendor", list(Vendor))
def test_a_result_is_answered_in_the_vendors_shape(vendor: Vendor) -> None:
    accepted = parse_event(JUDGE.pay(f"agent-res-{vendor}", 5, call_id=f"agent-res-{vendor}"))
    assert isinstance(accepted, Accepted)
    begun = contract.started(accepted, "key:x", "d", 1, accepted.event_id)
    paid = contract.recorded_result(
        accepted, contract.finished(begun, Outcome(ResultStatus.SUCCEEDED, {"payment_id": 1}))
    )
    failed = contract.recorded_result(
        accepted,
        contract.finished(
            begun, Outcome(ResultStatus.FAILED, error=ResultError(type="T", message="m"))
        ),
    )
    ok, error = result_turn(paid, vendor), result_turn(failed, vendor)
    _as_sdk_types_it(vendor, ok)
    _as_sdk_types_it(vendor, error)
    text = ok.get("content") or ok.get("output")
    assert orjson.loads(text) == {"payment_id": 1}
    assert orjson.loads(error.get("content") or error.get("output")) == {
        "status": "failed",
        "error": "T",
        "message": "m",
    }
    if vendor is Vendor.ANTHROPIC:
        assert (ok["is_error"], error["is_error"]) == (False, True)
