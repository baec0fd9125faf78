"""Outcome events as records: value, key and headers, defined here once.

The event's JSON is written by the native core (`worker._native.encode_event`, whose docstring
shows every field). This module adds what surrounds it:

- `encode`: the event of a verdict, never longer than the bound (`EventLimits`). A rejection
  that would be too long loses its violations (the event says how many, `violations_omitted`)
  and then its feedback's; an event that still does not fit, or an accepted one that does not
  fit at all (a version adapter grew the arguments), is replaced by a rejection
  `event_too_large`, whose violation is bounded as every violation is.
- `record_key` / `record_headers`: key `call_id`, headers `outcome`, `tool`, `schema-version`,
  so executors filter without parsing (each list of headers built once, and shared).
- the idempotency request (the accepted event waiting for its key's owner) and the rejections
  the owner derives from it (`duplicate`, `idempotency_conflict`).
- `derive_event`: every event written later from another (the owner's rejections, an approval's
  pending, approved, denied and expired events) changes only the members it names; every other
  member keeps its text byte for byte (the arguments as judged, a caller as given), never read
  and written again.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from worker._native import AssembledCall, encode_event, event_members
from worker.core.canonical import scoped_key
from worker.core.feedback import build_feedback
from worker.logs import call_fields
from worker.model import CallKind, Code, Outcome, Phase, SchemaRef, Verdict, Violation
from worker.schemas.contract import ViolationLimits
from worker.schemas.report import bounded_violation

log = logging.getLogger("callgate.events")

Headers = list[tuple[str, bytes]]
#: the W3C trace context header an outcome record carries when the worker traces (the gate
#: span's), and a keyed call's request to its key's owner
TRACEPARENT = "traceparent"

#: The longest topic name Kafka allows (a check's input name is cut to it too).
MAX_TOPIC_BYTES = 249
_UNBOUNDED = sys.maxsize
#: A character JSON writes as six bytes (`\u0001`): the widest an identifier's byte can grow.
_WIDEST_CHAR = "\x01"
#: The most bytes a JSON string (the event writer's, orjson's) spends on one character of it,
#: or on one byte of its UTF-8: the escape of `_WIDEST_CHAR`.
WIDEST_ESCAPE = len(orjson.dumps(_WIDEST_CHAR)) - len(b'""')

_REQUEST_TAG = b"CGI1"


@dataclass(frozen=True, slots=True)
class EventLimits:
    """The bounds an event is written within; all of them come from the settings."""

    max_event_bytes: int
    max_feedback_bytes: int
    #: how much a violation may say: one that callgate writes in a substitute's place is
    #: bounded as the gate bounds every other (`bounded_violation`)
    violations: ViolationLimits


def encode(call: AssembledCall, verdict: Verdict, limits: EventLimits) -> bytes:
    """The event of `call` as judged, at most `max_event_bytes` long (see the module
    docstring)."""
    return encode_written(call, verdict, limits)[0]


def encode_written(
    call: AssembledCall, verdict: Verdict, limits: EventLimits
) -> tuple[bytes, Verdict]:
    """`encode`, and the verdict the event was written from: `verdict` itself, or what replaced
    it. Where the event goes (its topic, its headers) follows the second, never the first: an
    accepted call whose event became `event_too_large` is a rejection.

    Each try is smaller than the one before: the event as judged, a rejection without its
    violations, the rejection `event_too_large`, and last the smallest event, which holds only
    the call's own identifiers and fixed text (no schema, no key): the settings refuse bounds
    under which that one could exceed `max_event_bytes` (`worst_case_event_bytes`)."""
    max_bytes, max_feedback_bytes = limits.max_event_bytes, limits.max_feedback_bytes
    event = encode_event(call, verdict, max_bytes)
    if event is not None:
        return event, verdict
    if verdict.outcome is Outcome.REJECTED and verdict.violations:
        shorter = _without_violations(verdict, max_feedback_bytes)
        event = encode_event(call, shorter, max_bytes)
        if event is not None:
            return event, shorter
    detail = _too_large_detail(max_bytes)
    substitute = substitute_rejection(verdict, Code.EVENT_TOO_LARGE, detail, limits)
    event = encode_event(call, substitute, max_bytes)
    if event is not None:
        return event, substitute
    smallest = _smallest(verdict, detail, limits)
    event = encode_event(call, smallest, max_bytes)
    if event is None:  # identifiers past the bounds the settings allow: never from a record
        event = encode_event(call, smallest, _UNBOUNDED)
        assert event is not None
        log.error(
            "the smallest event of call %r (event %s) is %d bytes, over the bound of %d",
            call.call_id[:64],
            call.event_id,
            len(event),
            max_bytes,
            extra=call_fields(call),
        )
    return event, smallest


def _too_large_detail(max_bytes: int) -> str:
    return f"the event would exceed {max_bytes} bytes"


def _smallest(verdict: Verdict, detail: str, limits: EventLimits) -> Verdict:
    """The `event_too_large` rejection with nothing but fixed text: no schema, no key."""
    violations = _substitute_violations(Code.EVENT_TOO_LARGE, detail, limits)
    return Verdict(
        Outcome.REJECTED,
        phase=Phase.DELIVERY,
        code=Code.EVENT_TOO_LARGE,
        violations=violations,
        retryable=False,
        feedback=build_feedback(
            Code.EVENT_TOO_LARGE,
            None,
            violations,
            retryable=False,
            budget_exhausted=False,
            max_bytes=limits.max_feedback_bytes,
        ),
        phases_us=verdict.phases_us,
    )


def worst_case_event_bytes(max_id_bytes: int, limits: EventLimits) -> int:
    """How long the smallest event (see `encode_written`) can be: that of the widest call
    (`widest_call`)."""
    judged = Verdict(Outcome.REJECTED, phases_us=widest_phases())
    detail = _too_large_detail(limits.max_event_bytes)
    smallest = _smallest(judged, detail, limits)
    event = encode_event(widest_call(max_id_bytes), smallest, _UNBOUNDED)
    assert event is not None
    return len(event)


def widest_identifier(max_id_bytes: int) -> str:
    """An identifier of `max_id_bytes` whose every byte JSON writes as six."""
    return _WIDEST_CHAR * max_id_bytes


#: the numbers' longest decimals (the event writes them as i64)
_WIDEST_NUMBER = 2**63 - 1


def widest_phases() -> dict[str, int]:
    """Every phase's time, at its widest."""
    return {phase.value: _WIDEST_NUMBER for phase in Phase}


def widest_call(max_id_bytes: int) -> AssembledCall:
    """The call whose event is the longest any call's can be, beside what its verdict says:
    every identifier `widest_identifier`, the longest call kind and a caller of
    `max_id_bytes` (embedded as it is), on a topic with the longest name Kafka allows, with
    every number at its widest."""
    ident = widest_identifier(max_id_bytes)
    return AssembledCall(
        ident,
        ident,
        ident,
        call_kind=max(CallKind, key=len),
        caller="{" + " " * (max_id_bytes - 2) + "}",
        principal=ident,
        trace_id=ident,
        run_id=ident,
        step_id=ident,
        traceparent=ident,
        attempt=2**32 - 1,
        topic=_WIDEST_CHAR * MAX_TOPIC_BYTES,
        partition=2**31 - 1,
        first_offset=_WIDEST_NUMBER,
        last_offset=_WIDEST_NUMBER,
        chunks=2**32 - 1,
        duplicate_chunks=2**32 - 1,
        nbytes=_WIDEST_NUMBER,
    )


def _without_violations(verdict: Verdict, max_feedback_bytes: int) -> Verdict:
    assert verdict.code is not None
    feedback = build_feedback(
        verdict.code,
        verdict.schema,
        (),
        retryable=verdict.retryable,
        budget_exhausted=bool(
            verdict.retry_feedback and verdict.retry_feedback.get("retry_budget_exhausted")
        ),
        max_bytes=max_feedback_bytes,
        omitted=len(verdict.violations),
    )
    return Verdict(
        Outcome.REJECTED,
        phase=verdict.phase,
        code=verdict.code,
        schema=verdict.schema,
        violations=(),
        repairs=verdict.repairs,
        retryable=verdict.retryable,
        feedback=feedback,
        idempotency_key=verdict.idempotency_key,
        phases_us=verdict.phases_us,
    )


def substitute_rejection(verdict: Verdict, code: Code, detail: str, limits: EventLimits) -> Verdict:
    """What is sent instead of an event that cannot be written as judged (phase `delivery`):
    its violation says `detail`, cut to the bound of every violation's message."""
    violations = _substitute_violations(code, detail, limits)
    return _rejection(verdict, Phase.DELIVERY, code, violations, limits.max_feedback_bytes)


def _substitute_violations(code: Code, detail: str, limits: EventLimits) -> tuple[Violation, ...]:
    return (bounded_violation(Violation("", code.value, detail), limits.violations),)


def _rejection(
    verdict: Verdict,
    phase: Phase,
    code: Code,
    violations: tuple[Violation, ...],
    max_feedback_bytes: int,
    *,
    duplicate_of: str | None = None,
) -> Verdict:
    """`verdict` replaced by a final rejection (its schema and key kept)."""
    return Verdict(
        Outcome.REJECTED,
        phase=phase,
        code=code,
        schema=verdict.schema,
        violations=violations,
        retryable=False,
        feedback=build_feedback(
            code,
            verdict.schema,
            violations,
            retryable=False,
            budget_exhausted=False,
            max_bytes=max_feedback_bytes,
        ),
        idempotency_key=verdict.idempotency_key,
        duplicate_of=duplicate_of,
        phases_us=verdict.phases_us,
    )


def record_key(call: AssembledCall) -> bytes:
    return call.call_id.encode()


@lru_cache(maxsize=1024)
def record_headers(outcome: str, tool: str | None, version: str | None) -> Headers:
    """The headers of an event of `tool` at schema `version` (None: no contract). Built once
    per combination (the last 1,024 kept) and shared by every record: never change one."""
    return [
        ("outcome", outcome.encode()),
        ("tool", (tool or "").encode()),
        ("schema-version", version.encode() if version is not None else b""),
    ]


# -- idempotency: the request to the key's owner, and what the owner derives ----------------------


def request_key(call: AssembledCall, verdict: Verdict) -> str:
    """What a keyed call is decided under, and its request routed by: its key in its
    principal's scope (`worker.core.canonical.scoped_key`)."""
    assert verdict.idempotency_key is not None, "only keyed calls go to a key's owner"
    return scoped_key(call.principal, verdict.idempotency_key)


def idempotency_request(call: AssembledCall, verdict: Verdict, event: bytes) -> bytes:
    """The accepted `event`, waiting for the decision of the owner of its key (`key`: its
    scoped key, `request_key`)."""
    assert verdict.idempotency_digest is not None, "a keyed call has its request's digest"
    schema = verdict.schema
    header = orjson.dumps(
        {
            "key": request_key(call, verdict),
            "digest": verdict.idempotency_digest.hex(),
            "event_id": call.event_id,
            "call_id": call.call_id,
            "tool": call.tool,
            "schema": [schema.id, schema.version] if schema else None,
        }
    )
    return _REQUEST_TAG + header + b"\n" + event


@dataclass(frozen=True, slots=True)
class IdempotencyRequest:
    """An accepted event waiting for its key's owner, and what the owner needs to know of it."""

    #: the call's key in its principal's scope (`request_key`), what the owner decides by
    key: str
    digest: bytes
    event_id: str
    call_id: str
    tool: str | None
    schema: SchemaRef | None
    event: bytes


def request_overhead_bytes(max_id_bytes: int) -> int:
    """The most an idempotency request's record (`idempotency_request`, keyed by
    `request_key`) holds beside the event it carries: its record key and the header before the
    event, which hold the call's key in its principal's scope (both at `max_id_bytes`, the key's
    bound wherever it came from), its call id and tool, and its schema's id and version, each
    counted as an identifier; measured with the writer on the widest call (`widest_call`)."""
    call = widest_call(max_id_bytes)
    ident = widest_identifier(max_id_bytes)
    verdict = Verdict(
        Outcome.ACCEPTED,
        schema=SchemaRef(ident, ident),
        idempotency_key=ident,
        idempotency_digest=bytes(16),
    )
    return len(request_key(call, verdict).encode()) + len(idempotency_request(call, verdict, b""))


def read_idempotency_request(value: bytes) -> IdempotencyRequest:
    """The request in a record of the idempotency topic; ValueError if it is not one."""
    if not value.startswith(_REQUEST_TAG) or b"\n" not in value:
        raise ValueError("not an idempotency request")
    header, _, event = value[len(_REQUEST_TAG) :].partition(b"\n")
    fields = orjson.loads(header)
    if not isinstance(fields, dict):
        raise ValueError("an idempotency request's header must be an object")
    tool, schema = fields.get("tool"), fields.get("schema")
    if not (tool is None or type(tool) is str):
        raise ValueError("an idempotency request's tool is a string or null")
    if not (schema is None or (type(schema) is list and [type(p) for p in schema] == [str, str])):
        raise ValueError("an idempotency request's schema is [id, version] or null")
    return IdempotencyRequest(
        key=_text(fields, "key"),
        digest=bytes.fromhex(_text(fields, "digest")),
        event_id=_text(fields, "event_id"),
        call_id=_text(fields, "call_id"),
        tool=tool,
        schema=SchemaRef(schema[0], schema[1]) if schema else None,
        event=event,
    )


def _text(fields: dict[str, Any], name: str) -> str:
    value = fields.get(name)
    if type(value) is not str:
        raise ValueError(f"an idempotency request needs a string {name!r}")
    return value


def idempotency_rejection(
    event: bytes, code: Code, first_event_id: str, max_feedback_bytes: int
) -> tuple[bytes, dict[str, Any]]:
    """The accepted `event` turned into its `duplicate` / `idempotency_conflict` rejection.

    Returns the event's bytes and its fields. Every field the two have in common keeps its
    value and place; what `encode_event` writes only on accepted events goes.
    """
    fields = orjson.loads(event)
    violations = _key_violations(code)
    changes = final_rejection(fields, Phase.IDEMPOTENCY, code, violations, max_feedback_bytes)
    changes["reason"] = None
    changes["duplicate_of"] = first_event_id
    dropped = ("arguments", "requires_approval")
    derived = derive_event(event, changes, dropped)
    fields.update(changes)
    for name in dropped:
        fields.pop(name, None)
    return derived, fields


def final_rejection(
    fields: dict[str, Any],
    phase: Phase,
    code: Code,
    violations: tuple[Violation, ...],
    max_feedback_bytes: int,
) -> dict[str, Any]:
    """The members a final rejection written later from the event of `fields` sets
    (`derive_event`): its outcome, phase, code, violations and feedback (naming the event's
    schema), not retryable."""
    schema = fields.get("schema")
    ref = SchemaRef(schema["id"], schema["version"]) if schema else None
    return {
        "outcome": Outcome.REJECTED.value,
        "phase": phase.value,
        "error_code": code.value,
        "violations": [
            {"path": v.path, "keyword": v.keyword, "message": v.message} for v in violations
        ],
        "retry_feedback": build_feedback(
            code,
            ref,
            violations,
            retryable=False,
            budget_exhausted=False,
            max_bytes=max_feedback_bytes,
        ).fields,
        "retryable": False,
    }


def key_rejection(
    verdict: Verdict, code: Code, first_event_id: str, max_feedback_bytes: int
) -> Verdict:
    """The verdict of an accepted keyed call that its key's owner rejected (`duplicate`,
    `idempotency_conflict`): what `idempotency_rejection` writes, as a verdict."""
    violations = _key_violations(code)
    return _rejection(
        verdict,
        Phase.IDEMPOTENCY,
        code,
        violations,
        max_feedback_bytes,
        duplicate_of=first_event_id,
    )


def _key_violations(code: Code) -> tuple[Violation, ...]:
    message = (
        "a call with this idempotency key was already accepted"
        if code is Code.DUPLICATE
        else "this idempotency key was used for a different call"
    )
    return (Violation("", "idempotency_key", message),)


# -- events derived from events -------------------------------------------------------------------


def derive_event(event: bytes, changes: Mapping[str, Any], dropped: Collection[str] = ()) -> bytes:
    """The event written later from `event`: each member of `changes` given its value (in its
    place, or last when `event` has none), each member `dropped` left out, and every other member
    kept as its text was, byte for byte: the arguments as judged (`1e15`, `-0`, escapes) and a
    caller as given are never read and written again, so every event of a call carries the text
    that was judged, and is longer than `event` only by what changed. Its members' spans are the
    native core's (`event_members`); ValueError when `event` is not one JSON object or names a
    member twice."""
    out: list[bytes] = []
    placed = set()
    for name, start, stop in event_members(event):
        if name in dropped:
            continue
        if name in changes:
            placed.add(name)
            out.append(_member(name, changes[name]))
        else:
            out.append(event[start:stop])
    for name, value in changes.items():
        if name not in placed and name not in dropped:
            out.append(_member(name, value))
    return b"{" + b",".join(out) + b"}"


def _member(name: str, value: Any) -> bytes:
    return orjson.dumps(name) + b":" + orjson.dumps(value)
