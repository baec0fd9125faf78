"""Outcome events: the one JSON object emitted per call (DESIGN.md "Outcome event").

`event_id` is derived from where the call came from, so a replay of the same input after a crash
or a rebalance emits the same id and consumers can de-duplicate.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from worker.model import AssembledCall, Outcome, Verdict


def event_id(call: AssembledCall) -> str:
    source = call.source
    where = f"{source.topic}\0{source.partition}\0{source.first_offset}" if source else ""
    text = f"{where}\0{call.stream_id}\0{call.call_id}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def build_event(call: AssembledCall, verdict: Verdict) -> dict[str, Any]:
    schema = verdict.schema
    source = call.source
    trace = call.trace
    event: dict[str, Any] = {
        "event_id": event_id(call),
        "outcome": verdict.outcome.value,
        "stream_id": call.stream_id,
        "call_id": call.call_id,
        "tool": call.tool,
        "schema": {"id": schema.id, "version": schema.version} if schema else None,
        "phase": verdict.phase.value if verdict.phase else None,
        "error_code": verdict.code.value if verdict.code else None,
        "reason": verdict.reason.value if verdict.reason else None,
        "violations": [
            {"path": v.path, "keyword": v.keyword, "message": v.message} for v in verdict.violations
        ],
        "retry_feedback": verdict.retry_feedback,
        "repairs": [{"kind": r.kind.value} for r in verdict.repairs],
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
            "phases_us": {phase.value: us for phase, us in verdict.phases_us.items()},
        },
    }
    if verdict.outcome is Outcome.ACCEPTED:
        event["arguments"] = verdict.arguments
        event["requires_approval"] = verdict.requires_approval
    for name in ("trace_id", "run_id", "step_id", "traceparent", "attempt"):
        value = getattr(trace, name)
        if value is not None:
            event[name] = value
    return event


def encode_event(call: AssembledCall, verdict: Verdict) -> bytes:
    return orjson.dumps(build_event(call, verdict))
