"""The agent's side: a rejected call, or an executor's result, as the next model turn.

Every tool call a model makes must be answered in the next request, in its vendor's shape:

- OpenAI Chat Completions: a `{"role": "tool", "tool_call_id", "content"}` message;
- OpenAI Responses: a `{"type": "function_call_output", "call_id", "output"}` input item;
- Anthropic Messages: a `{"type": "tool_result", "tool_use_id", "content", "is_error"}` block,
  sent in a `user` message (`anthropic_user_turn`, all of a turn's results in one message).

`retry_turn` answers a rejected call with its sanitized retry feedback only (the error type,
the schema, the violations' paths, keywords and messages, the instruction: never a value the
model sent), and says whether the model should be asked to try again: not when the feedback
says the rejection is not retryable, nor once the retry budget is spent (the gate's, which it
marks `retry_budget_exhausted`, or the caller's `budget` of attempts). The call is answered
either way, so the conversation stays valid; the loop stops asking for retries.

`result_turn` answers a call with the executor's result (tool-result.v1): the output when it
succeeded, else the error (an error in Anthropic's `is_error`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from worker.published.model import Rejected, ResultStatus, ToolResult


class Vendor(StrEnum):
    OPENAI_CHAT = "openai_chat"
    OPENAI_RESPONSES = "openai_responses"
    ANTHROPIC = "anthropic"


@dataclass(frozen=True, slots=True)
class NextTurn:
    """The answer to one call in its vendor's shape, and whether to ask the model to retry."""

    message: dict[str, Any]
    retry: bool


def answer(vendor: Vendor, call_id: str, text: str, *, is_error: bool) -> dict[str, Any]:
    """The vendor's answer to call `call_id` with `text` (Anthropic also says `is_error`)."""
    if vendor is Vendor.OPENAI_CHAT:
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    if vendor is Vendor.OPENAI_RESPONSES:
        return {"type": "function_call_output", "call_id": call_id, "output": text}
    return {"type": "tool_result", "tool_use_id": call_id, "content": text, "is_error": is_error}


def retry_turn(event: Rejected, vendor: Vendor, *, budget: int | None = None) -> NextTurn:
    """The answer to a rejected call (see the module docstring). `budget`: the most attempts
    the caller allows a call (its `attempt`, as the event carries it, counts from 1)."""
    feedback = event.retry_feedback
    spent = feedback.retry_budget_exhausted or (
        budget is not None and (event.attempt or 1) >= budget
    )
    retry = feedback.retryable and not spent
    body: dict[str, Any] = {
        "error": feedback.error_type,
        "instruction": feedback.instruction
        if retry
        else f"{feedback.instruction} Do not call this tool again for this request.",
        "violations": [v.model_dump() for v in feedback.violations],
        "retry": retry,
    }
    if feedback.schema_ref is not None:
        body["schema"] = {"id": feedback.schema_ref.id, "version": feedback.schema_ref.version}
    if feedback.violations_omitted:
        body["violations_omitted"] = feedback.violations_omitted
    text = orjson.dumps(body).decode()
    return NextTurn(answer(vendor, event.call_id, text, is_error=True), retry)


def result_turn(result: ToolResult, vendor: Vendor) -> dict[str, Any]:
    """The answer to an executed call: its output as JSON text, or its error."""
    if result.status is ResultStatus.SUCCEEDED:
        return answer(vendor, result.call_id, orjson.dumps(result.output).decode(), is_error=False)
    error = result.error
    body = {
        "status": result.status.value,
        "error": error.type if error else result.status.value,
        "message": error.message if error else "",
    }
    return answer(vendor, result.call_id, orjson.dumps(body).decode(), is_error=True)


def anthropic_user_turn(*blocks: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's next message: every `tool_result` block of a turn in one `user` message."""
    return {"role": "user", "content": list(blocks)}
