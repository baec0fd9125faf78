"""Outcome events: the one JSON object emitted per call (DESIGN.md "Outcome event").

`event_id` is derived from where the call came from, so a replay of the same input after a crash
or a rebalance emits the same id and consumers can de-duplicate.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Any

import orjson

from worker.model import NO_TRACE, AssembledCall, Outcome, Phase, Verdict

# The enums are str subclasses: orjson writes a member exactly as its value, so members go into
# the event as they are (an enum's `.value` is a Python-level property, and costs more than the
# rest of an entry). Phase names are dict keys, which orjson wants as plain str: looked up here.
_PHASE_NAMES: dict[Phase, str] = {phase: phase.value for phase in Phase}
_TRACE_FIELDS = ("trace_id", "run_id", "step_id", "traceparent", "attempt")


def event_id(call: AssembledCall) -> str:
    """The call's identity: its partition, stream and call id (not its offsets).

    Offsets are left out on purpose: a replay that starts inside a call already judged feeds
    only its tail, which comes out with another first offset (and verdict); it must still name
    the same call, so consumers that de-duplicate by `event_id` drop it.
    """
    source = call.source
    where = f"{source.topic}\0{source.partition}" if source else ""
    text = f"{where}\0{call.stream_id}\0{call.call_id}".encode("utf-8", "surrogatepass")
    return blake2b(text, digest_size=16).hexdigest()


def build_event(call: AssembledCall, verdict: Verdict) -> dict[str, Any]:
    schema = verdict.schema
    source = call.source
    trace = call.trace
    violations = verdict.violations
    repairs = verdict.repairs
    names = _PHASE_NAMES
    event: dict[str, Any] = {
        "event_id": event_id(call),
        "outcome": verdict.outcome,
        "stream_id": call.stream_id,
        "call_id": call.call_id,
        "tool": call.tool,
        "schema": {"id": schema.id, "version": schema.version} if schema else None,
        "phase": verdict.phase,
        "error_code": verdict.code,
        "reason": verdict.reason,
        "violations": [
            {"path": v.path, "keyword": v.keyword, "message": v.message} for v in violations
        ]
        if violations
        else [],
        "retry_feedback": verdict.retry_feedback,
        "repairs": [{"kind": r.kind} for r in repairs] if repairs else [],
        "retryable": verdict.retryable,
        "idempotency_key": call.idempotency_key,
        "source": {
            "topic": source.topic,
            "partition": source.partition,
            "first_offset": source.first_offset,
            "last_offset": source.last_offset,
        }
        if source
        else None,
        "metrics": {
            "chunks": call.chunks,
            "bytes": verdict.nbytes,
            "duplicate_chunks": call.duplicate_chunks,
            "phases_us": {names[phase]: us for phase, us in verdict.phases_us.items()},
        },
    }
    if verdict.outcome is Outcome.ACCEPTED:
        event["arguments"] = verdict.arguments
        event["requires_approval"] = verdict.requires_approval
    if trace is not NO_TRACE and trace != NO_TRACE:
        for name in _TRACE_FIELDS:
            value = getattr(trace, name)
            if value is not None:
                event[name] = value
    return event


def encode_event(call: AssembledCall, verdict: Verdict) -> bytes:
    return orjson.dumps(build_event(call, verdict))
