"""The record processor: what the Kafka worker and the offline check both run.

Records of one partition, as they come, go to the native reassembler (which decodes envelopes
itself and vendor records through the `Decoder`); each call it closes is judged by the `Gate`
and becomes one `Emission`: the record to produce, and where (its `Route`). A record that cannot
be read is its own rejected call, so a poison record never stops a partition. Pure: nothing here
reads a clock, a file or a setting, or does I/O.

A partition's state (open calls and vendor streams) is written with `checkpoint` and rebuilt
with `restore`; the runtime decides when, and where it is kept.

A call the gate accepts whose contract requires approval is never an accepted event: it becomes
its `pending_approval` event (`worker.core.approval`), routed to the pending-approval topic
keyed by its event id (a keyed call goes to its key's owner first, which holds it the same way
once its key is decided). One whose event could not take an approval's record once approved,
or for which an event written later in its place (its key's owner's `duplicate` or
`idempotency_conflict`, its approval's denial or expiry) would exceed the event bound, is an
`event_too_large` rejection here.

With a `shadow` gate (candidate contracts), every call is judged by it too and its emission
carries the `Comparison` (`worker.core.flips`) of the two verdicts as each side's event is
written (one too large for the event bound is compared as the `event_too_large` rejection it
becomes); the verdict, the event and where it goes are the main gate's alone.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from enum import StrEnum
from functools import cache
from typing import Any, NamedTuple

import orjson

from worker._native import AssembledCall, Assembler, encode_event
from worker.adapters.decoder import Decoder
from worker.core.approval import APPROVAL_RESERVE, PENDING_OUTCOME, ended_event, pending_event
from worker.core.events import (
    WIDEST_ESCAPE,
    EventLimits,
    Headers,
    encode_written,
    idempotency_rejection,
    idempotency_request,
    record_headers,
    record_key,
    request_key,
    substitute_rejection,
    widest_call,
    widest_identifier,
    widest_phases,
    worst_case_event_bytes,
)
from worker.core.flips import Comparison, judge_both
from worker.core.pipeline import Gate
from worker.logs import call_fields
from worker.model import Code, Outcome, RepairKind, SchemaRef, Verdict

log = logging.getLogger("callgate.processor")


class Route(StrEnum):
    """Where an emission goes: an outcome topic, the owner of its idempotency key, or the
    pending-approval topic."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    INCOMPLETE = "incomplete"
    IDEMPOTENCY = "idempotency"
    PENDING_APPROVAL = "pending_approval"


_ROUTES = {
    Outcome.ACCEPTED: Route.ACCEPTED,
    Outcome.REJECTED: Route.REJECTED,
    Outcome.INCOMPLETE: Route.INCOMPLETE,
}


class Emission(NamedTuple):
    """One record to produce, and the call and verdict it came from (for metrics); with a
    shadow gate, the call's verdicts compared (each as its event is written)."""

    route: Route
    key: bytes
    value: bytes
    headers: Headers
    call: AssembledCall
    verdict: Verdict
    shadow: Comparison | None = None


#: the length of every event id (`duplicate_of` names one)
_AN_EVENT_ID = "0" * 32


def _derived_lengths(
    value: bytes, *, keyed: bool, held: bool, max_feedback_bytes: int
) -> list[int]:
    """How long each event derived later from the accepted `value` is, each built as it will
    be: a keyed call's `duplicate` / `idempotency_conflict` (its key's owner writes it from
    `value`, without the arguments, with its feedback), a held call's denial and expiry."""
    lengths = []
    if keyed:
        for code in (Code.DUPLICATE, Code.IDEMPOTENCY_CONFLICT):
            owners, _ = idempotency_rejection(value, code, _AN_EVENT_ID, max_feedback_bytes)
            lengths.append(len(owners))
    if held:
        pending, _ = pending_event(value)
        for code in (Code.APPROVAL_DENIED, Code.APPROVAL_EXPIRED):
            lengths.append(len(ended_event(pending, code, max_feedback_bytes)))
    return lengths


def _longest_later(value: bytes, verdict: Verdict, max_feedback_bytes: int) -> int:
    """The longest event that may be written for an accepted call in place of `value`, its
    event as written now: the events derived from it (`_derived_lengths`) and a held call's
    approved event (its decider's name at its longest); `value` for any other. Exact, and
    costly (each derived event is built): `_later_exceeds` asks it only when the bound of
    `_later_bound` says one may not fit."""
    longest = len(value)
    if verdict.outcome is not Outcome.ACCEPTED:
        return longest
    if verdict.requires_approval:
        longest = max(longest, len(value) + APPROVAL_RESERVE)
    derived = _derived_lengths(
        value,
        keyed=verdict.idempotency_digest is not None,
        held=verdict.requires_approval,
        max_feedback_bytes=max_feedback_bytes,
    )
    return max([longest, *derived])


@cache
def _derived_growth() -> int:
    """The most an event derived from an accepted event (`_derived_lengths`) is longer than it,
    beyond the escaped schema id and version its feedback repeats: measured once on a template,
    a keyed and held call of empty identifiers judged by a schema of empty id and version, with
    the shortest arguments (`{}`: they are always an object) and `requires_approval` true (the
    shorter value of the member a derived event drops). Every other member of an accepted event
    is carried over as its very text (`worker.core.events.derive_event`); the feedback with
    its bound is never longer than without one."""
    call = AssembledCall("", "", "", b"", idempotency_key="")
    template = Verdict(
        Outcome.ACCEPTED,
        schema=SchemaRef("", ""),
        arguments_json=b"{}",
        requires_approval=True,
        idempotency_key="",
    )
    value = encode_event(call, template, sys.maxsize)
    assert value is not None
    derived = _derived_lengths(value, keyed=True, held=True, max_feedback_bytes=sys.maxsize)
    return max(derived) - len(value)


def _derived_bound(value: bytes, schema: SchemaRef | None) -> int:
    """A bound, never below it, of every event derived from the accepted `value` judged by
    `schema` (`_derived_lengths`), from lengths alone: its feedback repeats the schema's id and
    version, each character escaped in at most `WIDEST_ESCAPE` bytes."""
    shown = 0 if schema is None else len(schema.id) + len(schema.version)
    return len(value) + _derived_growth() + WIDEST_ESCAPE * shown


def _later_bound(value: bytes, verdict: Verdict) -> int:
    """A bound, never below it, of `_longest_later`, from lengths alone: nothing is built."""
    longest = len(value)
    if verdict.outcome is not Outcome.ACCEPTED:
        return longest
    held = verdict.requires_approval
    if held:
        longest += APPROVAL_RESERVE
    if held or verdict.idempotency_digest is not None:
        longest = max(longest, _derived_bound(value, verdict.schema))
    return longest


def _later_exceeds(value: bytes, verdict: Verdict, limits: EventLimits) -> bool:
    """Whether an event written later in place of `value` (`_longest_later`) would exceed the
    event bound: the events are built to decide only when their bound says they may."""
    if _later_bound(value, verdict) <= limits.max_event_bytes:
        return False
    return _longest_later(value, verdict, limits.max_feedback_bytes) > limits.max_event_bytes


def promised_event_bytes(max_id_bytes: int, limits: EventLimits, schema: SchemaRef) -> int:
    """The most bytes an event written for a call judged by `schema` may need beside its
    arguments: the smallest event (`worst_case_event_bytes`), and an accepted call's event and
    every event written later in its place (`_longest_later`), for the widest call
    (`widest_call`) with an idempotency key as wide as any identifier, held for approval, with
    every repair. An accepted call whose arguments are at most `max_bytes` is never
    `event_too_large` where `max_event_bytes` holds `max_bytes` and this: the settings check it
    for the shortest schema id and version, the composition for each contract's."""
    key = widest_identifier(max_id_bytes)
    accepted = Verdict(
        Outcome.ACCEPTED,
        schema=schema,
        arguments_json=b"{}",
        repairs=tuple(RepairKind),
        requires_approval=True,
        idempotency_key=key,
        idempotency_digest=bytes(16),
        phases_us=widest_phases(),
    )
    value = encode_event(widest_call(max_id_bytes), accepted, sys.maxsize)
    assert value is not None
    # the arguments are embedded without their insignificant whitespace: at most `max_bytes`
    arguments = len(accepted.arguments_json or b"")
    around_arguments = len(value) - arguments + APPROVAL_RESERVE
    derived = _derived_lengths(
        value, keyed=True, held=True, max_feedback_bytes=limits.max_feedback_bytes
    )
    return max([worst_case_event_bytes(max_id_bytes, limits), around_arguments, *derived])


class Processor:
    def __init__(
        self,
        assembler: Assembler,
        decoder: Decoder,
        gate: Gate,
        limits: EventLimits,
        *,
        shadow: Gate | None = None,
    ) -> None:
        self.assembler = assembler
        self.decoder = decoder
        self.gate = gate
        self.shadow = shadow
        self.limits = limits

    def feed(self, topic: str, partition: int, records: Iterable[Any]) -> list[Emission]:
        """One partition's records (`offset`, `timestamp`, `key`, `value`, `headers`, and
        `topic`/`partition` for vendor records), in offset order, to the emissions they make."""
        calls = self.assembler.feed_records(topic, partition, records, self.decoder.decode)
        emit = self.emit
        return [emit(call) for call in calls]

    def assemble(self, topic: str, partition: int, records: Iterable[Any]) -> list[AssembledCall]:
        """`feed` without judging: the calls the records close, each for `emit` (the shell's
        traced rounds judge them one at a time, inside each call's spans)."""
        return self.assembler.feed_records(topic, partition, records, self.decoder.decode)

    def flush(self) -> list[Emission]:
        """End of all input (offline): every open call ends `stream_ended`."""
        return [self.emit(call) for call in self.assembler.flush()]

    def emit(self, call: AssembledCall) -> Emission:
        """The emission of one closed call. Never raises for what a call holds: a failure to
        write its event is that call's `internal_error` rejection (logged)."""
        value, verdict = self._written(call, self.gate.judge(call))
        shadow = None
        if self.shadow is not None:
            candidate = self.shadow
            shadow = judge_both(call, verdict, lambda c: self._written(c, candidate.judge(c))[1])
        schema = verdict.schema
        if verdict.idempotency_digest is not None and verdict.outcome is Outcome.ACCEPTED:
            request = idempotency_request(call, verdict, value)
            key = request_key(call, verdict).encode()
            return Emission(Route.IDEMPOTENCY, key, request, [], call, verdict, shadow)
        version = schema.version if schema is not None else None
        if verdict.outcome is Outcome.ACCEPTED and verdict.requires_approval:
            pending, _ = pending_event(value)
            headers = record_headers(PENDING_OUTCOME, call.tool, version)
            key = call.event_id.encode()
            return Emission(Route.PENDING_APPROVAL, key, pending, headers, call, verdict, shadow)
        headers = record_headers(verdict.outcome, call.tool, version)
        route = _ROUTES[verdict.outcome]
        return Emission(route, record_key(call), value, headers, call, verdict, shadow)

    def _written(self, call: AssembledCall, judged: Verdict) -> tuple[bytes, Verdict]:
        """The event of `judged` and the verdict it was written from: where it goes follows
        the second (an accepted call whose event, or an event written later in its place,
        cannot be written is an `event_too_large` rejection, never an accepted or keyed
        emission)."""
        limits = self.limits
        try:
            value, verdict = encode_written(call, judged, limits)
            if _later_exceeds(value, verdict, limits):
                detail = (
                    f"an event written for it later (its key's owner's, its approval's) would "
                    f"exceed {limits.max_event_bytes} bytes"
                )
                return self.substitute(call, verdict, Code.EVENT_TOO_LARGE, detail)
            return value, verdict
        except Exception:
            log.exception(
                "internal error writing the event of call %r of stream %r (event %s)",
                call.call_id,
                call.stream_id,
                call.event_id,
                extra=call_fields(call),
            )
            detail = "callgate failed to write this call's event"
            return self.substitute(call, judged, Code.INTERNAL_ERROR, detail)

    def substitute(
        self, call: AssembledCall, verdict: Verdict, code: Code, detail: str
    ) -> tuple[bytes, Verdict]:
        """The event written instead of `verdict`'s, a rejection `code` in phase `delivery`
        saying `detail` (cut to the bound of every violation's message), and the verdict it
        was written from (`encode_written`)."""
        substitute = substitute_rejection(verdict, code, detail, self.limits)
        return encode_written(call, substitute, self.limits)

    # -- partitions ---------------------------------------------------------------------------

    def drop(self, topic: str, partition: int) -> None:
        """Forget a partition (revoked): its next owner restores it from its checkpoint."""
        self.assembler.drop_partition(topic, partition)
        self.decoder.drop(topic, partition)

    def checkpoint(self, topic: str, partition: int, *, full: bool) -> bytes:
        """The partition's state: all of it (`full`), or what changed since the last one."""
        native = (
            self.assembler.snapshot(topic, partition)
            if full
            else self.assembler.delta(topic, partition)
        )
        adapters = orjson.dumps(self.decoder.state(topic, partition, full=full))
        return len(native).to_bytes(4, "big") + native + adapters

    def restore(self, topic: str, partition: int, checkpoints: list[bytes]) -> None:
        """Rebuild a partition from a full checkpoint and the ones after it, in order."""
        natives: list[bytes] = []
        states: list[Any] = []
        for checkpoint in checkpoints:
            size = int.from_bytes(checkpoint[:4], "big")
            natives.append(checkpoint[4 : 4 + size])
            states.append(orjson.loads(checkpoint[4 + size :]))
        self.assembler.restore(topic, partition, natives)
        self.decoder.restore(topic, partition, states)

    def next_offset(self, topic: str, partition: int) -> int | None:
        """The offset after the last record fed to the partition (what a checkpoint reflects)."""
        return self.assembler.next_offset(topic, partition)
