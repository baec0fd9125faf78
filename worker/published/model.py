"""A typed, frozen model of the records callgate publishes (the schemas beside this module).

For executors and agent loops that read the topics: `parse_event` reads an outcome event into
`Accepted`, `Rejected`, `Incomplete` or `PendingApproval` (by its `outcome`); `ApprovalDecision`
and `ToolResult` read the other two documents. Members a record has and this version does not
know are ignored, as the schemas ask of every reader. Codes, phases and reasons are plain
strings here (open sets: a newer gate may send a code this version does not list); their known
values are `worker.model.Code`, `Phase` and `IncompleteReason`.

    event = parse_event(record.value)
    if isinstance(event, Accepted):
        run(event.tool, event.arguments, key=event.idempotency_key)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class SchemaRef(_Record):
    """The contract (schema id and version) that judged a call."""

    id: str
    version: str


class Violation(_Record):
    path: str
    keyword: str
    message: str


class RetryFeedback(_Record):
    """What the model may be told about a rejection: no value from its input, bounded."""

    error_type: str
    schema_ref: SchemaRef | None = Field(alias="schema")
    instruction: str
    retryable: bool
    violations: tuple[Violation, ...]
    retry_budget_exhausted: bool = False
    violations_omitted: int = 0


class Repair(_Record):
    kind: str


class Source(_Record):
    topic: str
    partition: int
    first_offset: int
    last_offset: int


class Metrics(_Record):
    chunks: int
    bytes: int
    duplicate_chunks: int
    phases_us: dict[str, int]


class ApprovalRequested(_Record):
    """On a pending call: the fingerprint an approval must name."""

    fingerprint: str


class ApprovalGranted(_Record):
    """On an accepted call that required approval: the decision that released it."""

    fingerprint: str
    decided_by: str
    decided_at_ms: int


class TraceContext(_Record):
    """The correlation fields a call carried, passed on untouched."""

    trace_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    traceparent: str | None = None


class _Event(_Record):
    event_id: str
    stream_id: str
    call_id: str
    tool: str | None
    schema_ref: SchemaRef | None = Field(alias="schema")
    phase: str | None
    error_code: str | None
    reason: str | None
    violations: tuple[Violation, ...]
    retry_feedback: RetryFeedback | None
    repairs: tuple[Repair, ...]
    retryable: bool
    idempotency_key: str | None
    duplicate_of: str | None
    source: Source
    metrics: Metrics
    principal: str | None = None
    trace_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    traceparent: str | None = None
    attempt: int | None = None
    #: the kind of call the vendor made (`worker.model.CallKind`; an open set)
    call_kind: str = "function_call"
    #: who made the call when the model did not (OpenAI programmatic tool calling)
    caller: dict[str, Any] | None = None
    #: rejected before its stream ended (its later chunks dropped unread)
    early: bool = False
    #: with `early`: the input offset of the record whose chunk decided
    early_offset: int | None = None

    @property
    def trace(self) -> TraceContext:
        return TraceContext(
            trace_id=self.trace_id,
            run_id=self.run_id,
            step_id=self.step_id,
            traceparent=self.traceparent,
        )


class Accepted(_Event):
    """A call that passed every phase. Run it only with an `approval` when `requires_approval`."""

    outcome: Literal["accepted"]
    schema_ref: SchemaRef = Field(alias="schema")
    arguments: dict[str, Any]
    requires_approval: bool
    approval: ApprovalGranted | None = None


class Rejected(_Event):
    """The first phase that failed, its code, and feedback safe to hand back to the model."""

    outcome: Literal["rejected"]
    phase: str
    error_code: str
    retry_feedback: RetryFeedback


class Incomplete(_Event):
    outcome: Literal["incomplete"]
    phase: str
    reason: str


class PendingApproval(_Event):
    """A call waiting for a person's decision, bound to its arguments by `approval.fingerprint`."""

    outcome: Literal["pending_approval"]
    schema_ref: SchemaRef = Field(alias="schema")
    arguments: dict[str, Any]
    requires_approval: Literal[True]
    approval: ApprovalRequested


AnyEvent = Accepted | Rejected | Incomplete | PendingApproval
OutcomeEvent = Annotated[AnyEvent, Field(discriminator="outcome")]
_EVENTS: TypeAdapter[AnyEvent] = TypeAdapter(OutcomeEvent)


def parse_event(data: bytes | str | dict[str, Any]) -> AnyEvent:
    """An outcome event from its JSON (or its parsed object); pydantic's `ValidationError` when
    it is not one."""
    if isinstance(data, dict):
        return _EVENTS.validate_python(data)
    return _EVENTS.validate_json(data)


class Decision(StrEnum):
    APPROVE = "approve"
    DENY = "deny"
    EXPIRE = "expire"


class Refused(_Record):
    """Why callgate refused a decision (`worker.core.approval.Refusal`; an open set)."""

    code: str
    message: str


class ApprovalDecision(_Record):
    """A decision on a call pending approval; with `refused`, callgate's refusal of one."""

    event_id: str
    fingerprint: str
    decision: Decision
    by: str
    reason: str | None = None
    refused: Refused | None = None


class ResultStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"
    CONFLICT = "conflict"
    REFUSED = "refused"


class ResultError(_Record):
    type: str
    message: str


class ToolResult(_Record):
    """What an executor made of one accepted call (one per call, keyed by its call id)."""

    event_id: str
    call_id: str
    stream_id: str
    tool: str
    schema_ref: SchemaRef = Field(alias="schema")
    idempotency_key: str | None
    status: ResultStatus
    output: Any
    error: ResultError | None
    replayed: bool
    executed_event_id: str | None
    attempts: int
    principal: str | None = None
    trace_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    traceparent: str | None = None


__all__ = [
    "Accepted",
    "AnyEvent",
    "ApprovalDecision",
    "ApprovalGranted",
    "ApprovalRequested",
    "Decision",
    "Incomplete",
    "Metrics",
    "OutcomeEvent",
    "PendingApproval",
    "Refused",
    "Rejected",
    "Repair",
    "ResultError",
    "ResultStatus",
    "RetryFeedback",
    "SchemaRef",
    "Source",
    "ToolResult",
    "TraceContext",
    "Violation",
    "parse_event",
]
