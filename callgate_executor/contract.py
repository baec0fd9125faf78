"""The execute contract, decided for one call against what its key's execution recorded.

For an execution key `k` (the call's idempotency key in its principal's scope, as the gate
scopes it: `worker.core.canonical.scoped_key`; or its event id when its contract has none) and
a request `x` (tool, schema version and canonical arguments, digested as the gate digests them:
`worker.core.canonical.request_digest`), against the latest record of `k`:

- nothing recorded: RUN, attempt 1 (`k` gets a `started` record first);
- `k` recorded with another digest by another call: CONFLICT; nothing runs (by the same call,
  judged again with another request: its own record decides, as below, and it never runs as
  the other request);
- `k` finished (`done`) with an equal request: the recorded result. From the call that ran
  (same event id: a redelivery) it is ALREADY_DONE (its result was written with the record);
  from another call it is REPLAY, a result marked `replayed`;
- `k` `started` with an equal request and no `done`: the execution was interrupted (its
  executor died, or lost the partition, during the handler). A handler safe to retry RUNs
  again (attempt n + 1, the recorded event's execution continued); any other is INTERRUPTED:
  its result says so, and it never runs again.

A call is answered once, whatever its answer (`answer` decides, in this order):

1. the call was answered without running before (its `answered` record, `call:<event id>`):
   that answer again (ALREADY_DONE);
2. the call's own execution is the key's record (same event id): `done`, its recorded result
   (ALREADY_DONE); `started`, interrupted during its handler, as above (RUN again or
   INTERRUPTED; INTERRUPTED too when it would be refused now);
3. a refusal (`refusal`: no handler, a principal the contract does not allow, no approval or
   one naming other arguments, arguments the handler's type refuses): REFUSED; nothing runs and
   the key is left as it was (a refusal is the call's, not the key's: an equal request in a
   later call, approved, may run);
4. the key's record decides (`decide`), as above.

Every answer but a run is final when given: its records (`Answer.records`: a `done` record, and
for a call answered without running an `answered` record holding the answer) are written
before or with its result, so that a call delivered again (a redelivery after a crash or a
rebalance, a duplicate record) gets the same answer, never another, even after the handlers
changed.

Pure: no asyncio, no Kafka, no clock. Records are JSON, defined here once (`Execution`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from worker.core.approval import fingerprint
from worker.core.canonical import request_digest, scoped_key
from worker.model import CLIENT_RUN_KINDS, Phase
from worker.model import SchemaRef as CoreSchemaRef
from worker.published.model import Accepted, ResultError, ResultStatus, SchemaRef, ToolResult
from worker.runtime.topics import legal_topic_name
from worker.schemas.contract import principal_refusal

#: The record of a key is either an execution under way or a finished one.
STARTED = "started"
DONE = "done"
ANSWERED = "answered"


def not_to_run(event: Accepted) -> str | None:
    """Why an accepted event is no call for an executor to run (None: it is one): an MCP tool
    result the gate accepted (judged in phase `tool_output_validation`) is an answer, not a
    request; a call of a kind the client does not run (`worker.model.CLIENT_RUN_KINDS`: a
    remote MCP tool's approval request, which its MCP server runs once the client approved it,
    or a kind callgate does not know) is not the client's to run."""
    if Phase.TOOL_OUTPUT_VALIDATION.value in event.metrics.phases_us:
        return "an accepted MCP tool result, an answer and not a request"
    if event.call_kind not in CLIENT_RUN_KINDS:
        return f"a call of kind {event.call_kind[:64]!r}, which the client does not run"
    return None


def is_call(event: Accepted) -> bool:
    """Whether an accepted event is a call for an executor to run (`not_to_run`)."""
    return not_to_run(event) is None


def unreadable(event: Accepted) -> str | None:
    """Why an accepted event's request cannot be judged (None: it can): its arguments hold a
    number past a double's range (read as an infinity), which no digest or fingerprint holds
    and the gate never writes; such a record is no call."""
    try:
        digest_of(event)
    except ValueError as exc:
        return str(exc)
    return None


NO_HANDLER = ResultError(type="no_handler", message="no executor runs this tool")
NO_CONTRACT = ResultError(
    type="no_contract",
    message="the executor has no contract of this call's schema version to hold it to (its "
    "allow list, its approval, its output schema)",
)
APPROVAL_MISSING = ResultError(
    type="approval_missing", message="this tool requires an approval, and the call has none"
)
UNAUTHORIZED = ResultError(
    type="unauthorized", message="this call is not permitted: its principal may not call this tool"
)
APPROVAL_MISMATCH = ResultError(
    type="approval_fingerprint_mismatch",
    message="the call's approval names other arguments than the call carries",
)


def approval_refusal(event: Accepted, *, contract_requires: bool) -> ResultError | None:
    """Why a call whose contract requires approval may not run: it has no approval, or its
    approval's fingerprint differs from the one recomputed from its tool, version and arguments
    (by the gate's own `worker.core.approval.fingerprint`); None when it may run. A call needs
    an approval when its event says so or when the executor's own contract of its schema and
    version does (`contract_requires`): an event saying it needs none is not taken at its word
    for a contract that requires one (an event of a gate whose contract did not, say)."""
    if not (event.requires_approval or contract_requires):
        return None
    if event.approval is None:
        return APPROVAL_MISSING
    ref = event.schema_ref
    if event.approval.fingerprint != fingerprint(
        CoreSchemaRef(ref.id, ref.version), event.arguments
    ):
        return APPROVAL_MISMATCH
    return None


def refusal(
    event: Accepted,
    *,
    handled: bool,
    contracted: bool,
    contract_requires_approval: bool,
    allowed_principals: frozenset[str] | None,
    argument_error: ResultError | None,
) -> ResultError | None:
    """Why a call may not run at all, first reason first: no handler (`handled` false), no
    contract of the call's schema id and version in the executor's own registry (`contracted`
    false: nothing to hold the run to, as for a schema id it does not know), its principal not
    on the executor's contract's allow list (`allowed_principals`, None: no list or no
    contract; the gate's own rule, `worker.schemas.contract.principal_refusal`: an event of a
    gate under another contract, or written by another writer of the topic, is not taken at
    its word), its approval (`approval_refusal`, with whether the executor's contract of the
    call requires one), its arguments refused by the handler's type (`argument_error`); None
    when it may run."""
    if not handled:
        return NO_HANDLER
    if not contracted:
        return NO_CONTRACT
    if principal_refusal(allowed_principals, event.principal) is not None:
        return UNAUTHORIZED
    approval = approval_refusal(event, contract_requires=contract_requires_approval)
    return approval or argument_error


def execution_key(event: Accepted) -> str:
    """What an execution is recorded under: `key:<the idempotency key in its principal's
    scope>` (the gate's own `worker.core.canonical.scoped_key`: calls of two principals never
    share a key), else `event:<event id>` (one namespace each, so no key can name another
    call's event)."""
    if event.idempotency_key is not None:
        return f"key:{scoped_key(event.principal, event.idempotency_key)}"
    return f"event:{event.event_id}"


def digest_of(event: Accepted) -> str:
    """The request's digest (hex): tool schema id, version and canonical arguments."""
    ref = event.schema_ref
    return request_digest(CoreSchemaRef(ref.id, ref.version), event.arguments).hex()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one run of a handler came to (the members a result and a `done` record share)."""

    status: ResultStatus
    output: Any = None
    error: ResultError | None = None


@dataclass(frozen=True, slots=True)
class Emitted:
    """A record a handler asked to be written with its result (`Call.emit`)."""

    topic: str
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class Execution:
    """The latest record of an execution key, as the executions topic holds it."""

    key: str
    state: str  # STARTED, DONE or ANSWERED
    digest: str
    event_id: str
    call_id: str
    tool: str
    attempts: int
    #: DONE: what the run came to; ANSWERED: the answer (refused, conflict), or None for a
    #: replay of the key's `done` record
    outcome: Outcome | None = None
    #: the request's schema id and version (None in a record written before it was kept)
    schema: tuple[str, str] | None = None

    def encode(self) -> bytes:
        outcome = self.outcome
        return orjson.dumps(
            {
                "key": self.key,
                "state": self.state,
                "digest": self.digest,
                "event_id": self.event_id,
                "call_id": self.call_id,
                "tool": self.tool,
                "attempts": self.attempts,
                "status": outcome.status.value if outcome else None,
                "output": outcome.output if outcome else None,
                "error": outcome.error.model_dump() if outcome and outcome.error else None,
                "schema": list(self.schema) if self.schema is not None else None,
            }
        )

    @classmethod
    def decode(cls, value: bytes) -> Execution:
        """A record as `encode` wrote it; ValueError (or KeyError) for anything else."""
        fields = orjson.loads(value)
        state = fields["state"]
        if state not in (STARTED, DONE, ANSWERED):
            raise ValueError(f"unknown execution state {state!r}")
        outcome = None
        if fields["status"] is not None:
            error = fields["error"]
            outcome = Outcome(
                ResultStatus(fields["status"]),
                fields["output"],
                ResultError.model_validate(error) if error is not None else None,
            )
        return cls(
            key=str(fields["key"]),
            state=state,
            digest=str(fields["digest"]),
            event_id=str(fields["event_id"]),
            call_id=str(fields["call_id"]),
            tool=str(fields["tool"]),
            attempts=int(fields["attempts"]),
            outcome=outcome,
            schema=_schema_of(fields.get("schema")),
        )


def _schema_of(value: Any) -> tuple[str, str] | None:
    """A record's `schema` member: [id, version], or absent (None)."""
    if value is None:
        return None
    schema_id, version = value
    return str(schema_id), str(version)


def schema_of(event: Accepted) -> tuple[str, str]:
    """The schema id and version a call's request is judged under, as its records keep it."""
    return event.schema_ref.id, event.schema_ref.version


class Step(StrEnum):
    RUN = "run"
    REPLAY = "replay"
    ALREADY_DONE = "already_done"
    CONFLICT = "conflict"
    INTERRUPTED = "interrupted"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Decision:
    """The step for one call, and the record that decided it (None: the key is new)."""

    step: Step
    recorded: Execution | None
    #: RUN: the attempt this run is (1 for a new key)
    attempt: int = 0


def answered_key(event_id: str) -> str:
    """What a call answered without running is remembered under."""
    return f"call:{event_id}"


def answered(event: Accepted, digest: str, outcome: Outcome | None) -> Execution:
    """The record of a call answered without running, holding its answer (`outcome`: refused or
    conflict; None: a replay of its key's `done` record, which never changes)."""
    key = answered_key(event.event_id)
    tool = event.tool or ""
    return Execution(
        key, ANSWERED, digest, event.event_id, event.call_id, tool, 0, outcome, schema_of(event)
    )


def decide(recorded: Execution | None, digest: str, event_id: str, retry_safe: bool) -> Decision:
    """The step for a request (`digest`, from call `event_id`) given its key's latest record.
    The record of this very call decides whatever request it carries now (a gate that judged
    the call again after a crash, under other contracts, may send another): it is answered as
    it was, and a run of it interrupted is never run again as another request."""
    if recorded is None:
        return Decision(Step.RUN, None, attempt=1)
    own = recorded.event_id == event_id
    if recorded.digest != digest and not own:
        return Decision(Step.CONFLICT, recorded)
    if recorded.state == DONE:
        return Decision(Step.ALREADY_DONE if own else Step.REPLAY, recorded)
    if retry_safe and recorded.digest == digest:
        return Decision(Step.RUN, recorded, attempt=recorded.attempts + 1)
    return Decision(Step.INTERRUPTED, recorded)


def started(event: Accepted, key: str, digest: str, attempt: int, executed: str) -> Execution:
    """The record written before a handler runs (`executed`: the event whose execution it is)."""
    tool = event.tool or ""
    return Execution(
        key, STARTED, digest, executed, event.call_id, tool, attempt, None, schema_of(event)
    )


def finished(begun: Execution, outcome: Outcome) -> Execution:
    return Execution(
        begun.key,
        DONE,
        begun.digest,
        begun.event_id,
        begun.call_id,
        begun.tool,
        begun.attempts,
        outcome,
        begun.schema,
    )


#: The executor's own error types (tool-result.v1 `error.type`).
CONFLICT_ERROR = ResultError(
    type="idempotency_conflict",
    message="this idempotency key was already used for a different request; nothing ran",
)
OUTPUT_TOO_LARGE = ResultError(
    type="output_too_large",
    message="the tool's output, or a record it emitted, is larger than the executor may write",
)
EMIT_REFUSED = ResultError(
    type="emit_refused",
    message="the tool emitted a record the executor does not write: to a topic that is no "
    "legal name or is one of the executor's own, or a value or key that is not bytes",
)
INTERRUPTED_ERROR = ResultError(
    type="interrupted",
    message="the executor stopped while the tool ran; whether it took effect is unknown, and "
    "it is not run again",
)


def result(
    event: Accepted,
    status: ResultStatus,
    *,
    output: Any = None,
    error: ResultError | None = None,
    replayed: bool = False,
    executed_event_id: str | None,
    attempts: int,
) -> ToolResult:
    """The tool result of one call (tool-result.v1)."""
    return ToolResult(
        event_id=event.event_id,
        call_id=event.call_id,
        stream_id=event.stream_id,
        tool=event.tool or "",
        schema_ref=SchemaRef(id=event.schema_ref.id, version=event.schema_ref.version),
        idempotency_key=event.idempotency_key,
        status=status,
        output=output if status is ResultStatus.SUCCEEDED else None,
        error=error,
        replayed=replayed,
        executed_event_id=executed_event_id,
        attempts=attempts,
        principal=event.principal,
        trace_id=event.trace_id,
        run_id=event.run_id,
        step_id=event.step_id,
        traceparent=event.traceparent,
    )


def recorded_result(event: Accepted, recorded: Execution) -> ToolResult:
    """The result `event` gets from a finished execution: its own, or a replay of another's."""
    assert recorded.outcome is not None, "only a finished execution has a result"
    outcome = recorded.outcome
    return result(
        as_recorded(event, recorded),
        outcome.status,
        output=outcome.output,
        error=outcome.error,
        replayed=recorded.event_id != event.event_id,
        executed_event_id=recorded.event_id,
        attempts=recorded.attempts,
    )


def as_recorded(event: Accepted, record: Execution) -> Accepted:
    """The call as its own record answered it: a result of the call names the schema it was
    answered under, whatever its event says now (a gate that judged it again after a crash,
    under other contracts, may name another); another call's record changes nothing."""
    if record.event_id != event.event_id or record.schema is None:
        return event
    schema_id, version = record.schema
    ref = event.schema_ref.model_copy(update={"id": schema_id, "version": version})
    return event.model_copy(update={"schema_ref": ref})


def conflict_result(event: Accepted) -> ToolResult:
    return result(
        event, ResultStatus.CONFLICT, error=CONFLICT_ERROR, executed_event_id=None, attempts=0
    )


def refused_result(event: Accepted, error: ResultError) -> ToolResult:
    return result(event, ResultStatus.REFUSED, error=error, executed_event_id=None, attempts=0)


def encode_result(tool_result: ToolResult) -> bytes:
    """A result as the tool-results topic holds it: the published members, unset ones left out
    where the schema lets them be absent (the trace fields and the principal)."""
    data = tool_result.model_dump(mode="json", by_alias=True)
    for optional in ("principal", "trace_id", "run_id", "step_id", "traceparent"):
        if data.get(optional) is None:
            data.pop(optional, None)
    return orjson.dumps(data)


@dataclass(frozen=True, slots=True)
class Answer:
    """What a call gets: its step, its result (None: RUN, the handler's outcome decides it),
    and the records to write before or with that result (a `done` record, an `answered` one)."""

    step: Step
    result: ToolResult | None
    records: tuple[Execution, ...] = ()
    #: RUN: the `started` record to write (committed) before the handler runs
    begun: Execution | None = None
    #: a run that succeeded: the records its handler emitted, written before or with its result
    emitted: tuple[Emitted, ...] = ()

    def to_write(self, *, exactly_once: bool, delivered: bool) -> ToolResult | None:
        """The result to write (None: only the offset). A call answered before needs none
        under exactly_once (its result was committed with its records), nor when this member
        wrote it (`delivered`); else whether it was written cannot be known, and the same
        result is written again."""
        if self.step is Step.ALREADY_DONE and (exactly_once or delivered):
            return None
        return self.result


def answer(
    event: Accepted,
    state: Mapping[str, Execution],
    *,
    refusal: ResultError | None,
    retry_safe: bool,
) -> Answer:
    """The answer to a call given the latest records of its partition (`state`), the reason
    it may not run (`refusal`, see the function of that name) and whether its handler is safe
    to retry: the module docstring's order. An ALREADY_DONE answer's result is the one the
    call got before (None only for an `answered` record without its answer)."""
    note = state.get(answered_key(event.event_id))
    key = execution_key(event)
    recorded = state.get(key)
    if note is not None:
        return Answer(Step.ALREADY_DONE, answered_result(event, note, recorded))
    digest = digest_of(event)
    own = recorded is not None and recorded.event_id == event.event_id
    if refusal is not None and not own:
        outcome = Outcome(ResultStatus.REFUSED, error=refusal)
        note = answered(event, digest, outcome)
        return Answer(Step.REFUSED, refused_result(event, refusal), (note,))
    decision = decide(recorded, digest, event.event_id, retry_safe and refusal is None)
    recorded = decision.recorded
    if decision.step is Step.RUN:
        executed = recorded.event_id if recorded is not None else event.event_id
        begun = started(event, key, digest, decision.attempt, executed)
        return Answer(Step.RUN, None, begun=begun)
    if decision.step is Step.CONFLICT:
        note = answered(event, digest, Outcome(ResultStatus.CONFLICT, error=CONFLICT_ERROR))
        return Answer(Step.CONFLICT, conflict_result(event), (note,))
    assert recorded is not None
    if decision.step is Step.ALREADY_DONE:
        return Answer(Step.ALREADY_DONE, recorded_result(event, recorded))
    if decision.step is Step.REPLAY:
        note = answered(event, digest, None)
        return Answer(Step.REPLAY, recorded_result(event, recorded), (note,))
    interrupted = Outcome(ResultStatus.INTERRUPTED, error=INTERRUPTED_ERROR)
    done = finished(recorded, interrupted)
    return Answer(Step.INTERRUPTED, recorded_result(event, done), _with_note(event, done))


#: the members of a result that differ from call to call under one key: the identifiers of the
#: call it answers (the key, its principal, the schema and the executed event are the key's, an
#: event id is 32 hex digits whoever's it is)
CALLER_MEMBERS = (
    "call_id",
    "stream_id",
    "tool",
    "trace_id",
    "run_id",
    "step_id",
    "traceparent",
)


def widest_result_bytes(tool_result: ToolResult, max_id_bytes: int) -> int:
    """How large `tool_result`'s outcome makes the result of any call under its key (an equal
    repeat gets it, `replayed`): each of the call's identifiers at `max_id_bytes`, every byte
    of them written as six (`\\u0001`)."""
    widest = "\x01" * max_id_bytes
    return len(encode_result(tool_result.model_copy(update=dict.fromkeys(CALLER_MEMBERS, widest))))


def ran(
    event: Accepted,
    begun: Execution,
    outcome: Outcome,
    *,
    max_bytes: int,
    max_id_bytes: int,
    emitted: Sequence[Emitted] = (),
    own_topics: Collection[str] = (),
) -> Answer:
    """The answer of a call whose handler ran (from `begun`) to `outcome`, with the records it
    `emitted` (written only when it succeeded). `failed` instead, `output_too_large`, when its
    result as any call under its key may get it (`widest_result_bytes`) or one of its records,
    or an emitted record's key and value, would pass `max_bytes`; `emit_refused` when an
    emitted record is not one to write (`emit_refusal`). Whatever a handler made is thus a
    result and records the executor writes, for this call and every equal repeat: a write the
    producer or a topic refuses would stop the executor, and a handler safe to retry would run
    again and again."""
    emits = tuple(emitted) if outcome.status is ResultStatus.SUCCEEDED else ()
    refused = emit_refusal(emits, own_topics)
    if refused is not None:
        return _ran(event, begun, Outcome(ResultStatus.FAILED, error=refused))
    answer = _ran(event, begun, outcome, emits)
    assert answer.result is not None
    sizes = [
        widest_result_bytes(answer.result, max_id_bytes),
        *(len(r.encode()) for r in answer.records),
        *(len(e.key or b"") + len(e.value) for e in emits),
    ]
    if max(sizes) <= max_bytes:
        return answer
    return _ran(event, begun, Outcome(ResultStatus.FAILED, error=OUTPUT_TOO_LARGE))


def emit_refusal(emitted: Sequence[Emitted], own_topics: Collection[str]) -> ResultError | None:
    """Why records a handler emitted are not written (None: they are): one names a topic that
    is no legal name or is one of the executor's own (its state, its requests, its input, its
    results, which a record of the handler's would corrupt or forge), or its value or key is not
    bytes."""
    for record in emitted:
        if (
            not legal_topic_name(record.topic)
            or record.topic in own_topics
            or not isinstance(record.value, bytes)
            or not isinstance(record.key, bytes | None)
        ):
            return EMIT_REFUSED
    return None


def _ran(
    event: Accepted, begun: Execution, outcome: Outcome, emitted: tuple[Emitted, ...] = ()
) -> Answer:
    done = finished(begun, outcome)
    return Answer(Step.RUN, recorded_result(event, done), _with_note(event, done), emitted=emitted)


def _with_note(event: Accepted, done: Execution) -> tuple[Execution, ...]:
    """A `done` record, with an `answered` record for the call when it is another call's
    execution that it finished (a retry, an interruption)."""
    if done.event_id == event.event_id:
        return (done,)
    return (done, answered(event, done.digest, None))


def answered_result(
    event: Accepted, note: Execution, recorded: Execution | None
) -> ToolResult | None:
    """The result a call answered without running got (`note`), given its key's record."""
    outcome = note.outcome
    if outcome is not None:
        if outcome.status is ResultStatus.CONFLICT:
            return conflict_result(as_recorded(event, note))
        assert outcome.error is not None, "a refusal says why"
        return refused_result(as_recorded(event, note), outcome.error)
    if recorded is not None and recorded.state == DONE and recorded.digest == note.digest:
        return recorded_result(as_recorded(event, note), recorded)
    return None
