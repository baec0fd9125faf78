"""Approval: a call whose contract requires a person's approval waits for one, bound to its
arguments by their fingerprint.

The fingerprint of a call is BLAKE2b-128 of the RFC 8785 canonical form of [schema id, schema
version, arguments] (`worker.core.canonical`, integers exact), as 32 hex digits: two spellings of
the same arguments have one fingerprint, any change of tool, version or value another.

A call the gate accepted whose contract requires approval is not an accepted event: it is a
`pending_approval` event (`pending_event`: the accepted event in all but its outcome, phase
`approval`, and `approval.fingerprint`), written to the pending-approval topic keyed by its event
id. The worker that owns that partition holds it (`ApprovalStore.hold`) until a decision (the
published `approval-decision`, on the same topic, keyed by the same event id) names it, bound to
the fingerprint computed again from the pending event's tool, version and arguments (a pending
event stating another is no call, and is not held). A decision:

- `approve` with the fingerprint the call was held with, before its expiry: the call's accepted
  event, with `approval` saying who decided and when, goes to the validated topic, once;
- `deny`, before its expiry: a rejection `approval_denied` (phase `approval`, final);
- `expire` (written by callgate once its clock passes the call's expiry), or any decision that
  comes after the expiry: a rejection `approval_expired`, final;
- a decision naming another fingerprint (`fingerprint_mismatch`), no call held
  (`unknown_call`), a call already decided (`already_decided`), or an `expire` before the expiry
  (`not_expired`) is refused: a refusal record (the decision as received, and `refused` saying
  why) is written to the pending-approval topic, and the call stays as it was. A record that is
  no decision at all (`malformed`) decides nothing and is logged (it has no decision to echo).

Time is the records': a call's expiry counts from the time of its pending record, a decision's
time is its record's, and the store's time never goes back (the newest record time seen), so a
decision stamped earlier than a record already read is taken at the later time; the changelog
keeps that time (under `CLOCK_KEY`, when no call's entry says it), so a store rebuilt from it has
the time the original had. Nothing here reads a clock; the shell asks `due(now_ms)` which calls
to write an `expire` decision for.

A decided call is remembered (with its deciding record's offset) for `retention_ms` of store time:
its pending event written again (its input judged again after a crash) is ignored, a second
decision refused, and the very record that decided it, read again after a crash, decides it
again to the same event (and the same refusal, for a late approval or denial that expired it: no
crash point loses the event or makes a second, different one).
Every change is returned as a changelog entry (event id, value or None to forget) for the
caller to write, and `restore` rebuilds the store from them. Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import orjson

from worker.core.canonical import request_digest
from worker.core.events import derive_event, final_rejection
from worker.model import Code, Outcome, Phase, SchemaRef, Violation

#: what a pending event's record carries in its `outcome` header
PENDING_OUTCOME = "pending_approval"
#: the `record` header of what callgate and `callgate approve|deny` write beside pending events
RECORD_HEADER = "record"
DECISION_RECORD = "approval-decision"
REFUSAL_RECORD = "approval-refusal"
#: who `expire` decisions are by
CALLGATE = "callgate"
#: the bounds of a decision's members (the published approval-decision schema's)
MAX_BY_CHARS = 256
MAX_REASON_CHARS = 1024
#: the bytes an approved event may add to the accepted event the call was held as (every other
#: member keeps its text: `approved_event`): its `approval` member with its fingerprint, the
#: longest `decided_by` (each of its characters escaped as six bytes) and the widest time
APPROVAL_RESERVE = (
    len(b',"approval":{"fingerprint":"","decided_by":"","decided_at_ms":}')
    + 32
    + 6 * MAX_BY_CHARS
    + len(str(-(2**63)))
)

_HEX32 = re.compile(r"[0-9a-f]{32}")


class Decision(StrEnum):
    APPROVE = "approve"
    DENY = "deny"
    EXPIRE = "expire"


class Refusal(StrEnum):
    """Why a decision was refused (the `refused.code` of its refusal record)."""

    FINGERPRINT_MISMATCH = "fingerprint_mismatch"
    EXPIRED = "expired"
    UNKNOWN_CALL = "unknown_call"
    ALREADY_DECIDED = "already_decided"
    NOT_EXPIRED = "not_expired"
    MALFORMED = "malformed"


_REFUSALS = {
    Refusal.FINGERPRINT_MISMATCH: "the decision names other arguments than the call holds: it "
    "was made on arguments that differ from the call's",
    Refusal.EXPIRED: "the decision came after the call's approval expired; the call is expired",
    Refusal.UNKNOWN_CALL: "no call pending approval has this event id",
    Refusal.ALREADY_DECIDED: "the call was already decided",
    Refusal.NOT_EXPIRED: "the call's approval has not expired yet",
    Refusal.MALFORMED: "the record is not an approval decision",
}


def fingerprint(schema: SchemaRef, arguments: Any) -> str:
    """What an approval names: the tool, its schema version and the arguments, canonical."""
    return request_digest(schema, arguments).hex()


def event_fingerprint(fields: dict[str, Any]) -> str:
    """The fingerprint of the arguments an (accepted or pending) event carries."""
    schema = fields["schema"]
    return fingerprint(SchemaRef(schema["id"], schema["version"]), fields["arguments"])


def pending_event(accepted: bytes) -> tuple[bytes, str]:
    """The pending event of an accepted event whose contract requires approval, and its
    fingerprint. Every member keeps its value and place, the arguments their very text
    (`worker.core.events.derive_event`); `outcome`, `phase` and `approval` say it waits."""
    found = event_fingerprint(orjson.loads(accepted))
    changes = {
        "outcome": PENDING_OUTCOME,
        "phase": Phase.APPROVAL.value,
        "approval": {"fingerprint": found},
    }
    return derive_event(accepted, changes), found


@dataclass(frozen=True, slots=True)
class Decided:
    """How a held call was decided: the decision, the offset and time of its record, by whom."""

    decision: Decision
    offset: int
    at_ms: int
    by: str


@dataclass(frozen=True, slots=True)
class Held:
    """A call held for approval (or decided, and remembered): its pending event, its
    fingerprint, and the time of its pending record."""

    event: bytes
    fingerprint: str
    at_ms: int
    decided: Decided | None = None

    def encode(self) -> bytes:
        decided = self.decided
        return orjson.dumps(
            {
                "event": self.event.decode(),
                "fingerprint": self.fingerprint,
                "at": self.at_ms,
                "decided": None
                if decided is None
                else [decided.decision.value, decided.offset, decided.at_ms, decided.by],
            }
        )

    @classmethod
    def decode(cls, value: bytes) -> Held:
        fields = orjson.loads(value)
        decided = fields["decided"]
        return cls(
            fields["event"].encode(),
            fields["fingerprint"],
            int(fields["at"]),
            None
            if decided is None
            else Decided(Decision(decided[0]), int(decided[1]), int(decided[2]), decided[3]),
        )


#: The changelog key of the store's time (no event id: those are 32 hex digits).
CLOCK_KEY = "clock"


@dataclass(frozen=True, slots=True)
class Clock:
    """The store's time, as its changelog keeps it (under `CLOCK_KEY`): the newest record time
    read, where no call's entry written at that time says it."""

    at_ms: int

    def encode(self) -> bytes:
        return orjson.dumps({"now": self.at_ms})

    @classmethod
    def decode(cls, value: bytes) -> Clock:
        return cls(int(orjson.loads(value)["now"]))


#: A changelog entry: the event id, and what is held of it (None: forgotten); or `CLOCK_KEY` and
#: the store's time.
Change = tuple[str, Held | Clock | None]


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """A decision as read from its record (the published approval-decision document)."""

    event_id: str
    fingerprint: str
    decision: Decision
    by: str
    reason: str | None

    def fields(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "fingerprint": self.fingerprint,
            "decision": self.decision.value,
            "by": self.by,
            "reason": self.reason,
        }


def read_decision(value: bytes | None) -> DecisionRecord:
    """A decision from a record's value; ValueError saying what is wrong if it is not one."""
    if value is None:
        raise ValueError("the record has no value")
    try:
        fields = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise ValueError("the record is not JSON") from None
    if not isinstance(fields, dict):
        raise ValueError("a decision is a JSON object")
    event_id, found, by = fields.get("event_id"), fields.get("fingerprint"), fields.get("by")
    reason = fields.get("reason")
    if not (type(event_id) is str and _HEX32.fullmatch(event_id)):
        raise ValueError("a decision's event_id is 32 lowercase hex digits")
    if not (type(found) is str and _HEX32.fullmatch(found)):
        raise ValueError("a decision's fingerprint is 32 lowercase hex digits")
    named = fields.get("decision")
    if named not in {d.value for d in Decision}:
        raise ValueError("a decision is approve, deny or expire")
    decision = Decision(named)
    if not (type(by) is str and 0 < len(by) <= MAX_BY_CHARS):
        raise ValueError(f"a decision's by is a name of 1 to {MAX_BY_CHARS} characters")
    if not (reason is None or (type(reason) is str and len(reason) <= MAX_REASON_CHARS)):
        raise ValueError(f"a decision's reason is null or at most {MAX_REASON_CHARS} characters")
    return DecisionRecord(event_id, found, decision, by, reason)


def decision_record(
    event_id: str, found: str, decision: Decision, by: str, reason: str | None = None
) -> bytes:
    """A decision's record value (as `callgate approve|deny` and the expiry write it)."""
    return orjson.dumps(DecisionRecord(event_id, found, decision, by, reason).fields())


def refusal_record(received: DecisionRecord, code: Refusal) -> bytes:
    """What is written where a decision is refused: the decision as received, and why."""
    fields = received.fields()
    fields["refused"] = {"code": code.value, "message": _REFUSALS[code]}
    return orjson.dumps(fields)


def is_refusal(value: bytes | None) -> bool:
    """Whether a record of the pending-approval topic is a refusal (written by callgate)."""
    if not value:
        return False
    try:
        fields = orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    return isinstance(fields, dict) and "refused" in fields


class Ruling(StrEnum):
    """What a decision record did."""

    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Ruled:
    """A decision record ruled on: the outcome event to write (None: none), the refusal record
    to write (None: none), and the store's changes."""

    ruling: Ruling
    event: bytes | None
    outcome: Outcome | None
    code: Code | None
    refusal: Refusal | None
    refusal_record: bytes | None
    #: why a `malformed` record is no decision (for the log)
    detail: str | None
    event_id: str | None
    call_id: str | None
    tool: str | None
    schema: SchemaRef | None
    changes: list[Change]


class ApprovalStore:
    """The calls one partition of the pending-approval topic holds, and those it decided."""

    def __init__(self, *, expiry_ms: int, retention_ms: int, max_feedback_bytes: int) -> None:
        self._expiry_ms = expiry_ms
        self._retention_ms = retention_ms
        self._max_feedback_bytes = max_feedback_bytes
        self._held: OrderedDict[str, Held] = OrderedDict()
        #: the newest record time read (the store's time; it never goes back)
        self._now = 0

    def __len__(self) -> int:
        """Calls pending (not decided)."""
        return sum(1 for held in self._held.values() if held.decided is None)

    def _advance(self, at_ms: int | None) -> tuple[int, list[Change]]:
        """The store's time at a record of time `at_ms`, and what that forgets: decided calls
        past their retention."""
        if at_ms is not None and at_ms > self._now:
            self._now = at_ms
        deadline = self._now - self._retention_ms
        gone = [
            event_id
            for event_id, held in self._held.items()
            if held.decided is not None and held.decided.at_ms <= deadline
        ]
        for event_id in gone:
            del self._held[event_id]
        return self._now, [(event_id, None) for event_id in gone]

    def _timed(self, changes: list[Change], before: int) -> list[Change]:
        """A record's changes, and the store's time if they do not say it: a record that moved
        the time on from `before`, or forgot calls, and wrote no call's entry of that time (a
        refused or malformed decision, a pending event written again), so that a store rebuilt
        from the changelog has the time the original had (its time never goes back, a restart
        included)."""
        if not (self._now > before or any(value is None for _, value in changes)):
            return changes
        for _, value in changes:
            if isinstance(value, Held):
                decided = value.decided
                if (decided.at_ms if decided is not None else value.at_ms) == self._now:
                    return changes
        changes.append((CLOCK_KEY, Clock(self._now)))
        return changes

    def hold(self, event_id: str, event: bytes, at_ms: int | None) -> list[Change]:
        """A pending event read: the call is held from its record's time (one held or decided
        already is left as it is: its pending event was written again)."""
        before = self._now
        return self._timed(self._hold(event_id, event, at_ms), before)

    def _hold(self, event_id: str, event: bytes, at_ms: int | None) -> list[Change]:
        # what is no pending event is refused before it moves the time or forgets anything
        if not _HEX32.fullmatch(event_id):
            raise ValueError("a pending event is keyed by its event id, 32 lowercase hex digits")
        fields = orjson.loads(event)
        found = event_fingerprint(fields)
        if fields["approval"]["fingerprint"] != found:
            # what an approval names is computed again from the tool, version and arguments: a
            # pending event stating another fingerprint is no call to hold
            raise ValueError("the pending event's fingerprint is not that of its arguments")
        now, changes = self._advance(at_ms)
        if event_id in self._held:
            return changes
        held = Held(event, found, now)
        self._held[event_id] = held
        changes.append((event_id, held))
        return changes

    def due(self, now_ms: int) -> list[tuple[str, str]]:
        """The calls pending past their expiry at `now_ms` (the shell's clock): event id and
        fingerprint of each, for an `expire` decision."""
        return [
            (event_id, held.fingerprint)
            for event_id, held in self._held.items()
            if held.decided is None and held.at_ms + self._expiry_ms <= now_ms
        ]

    def decide(
        self, value: bytes | None, key: bytes | None, offset: int, at_ms: int | None
    ) -> Ruled:
        """Rule on a decision record (its value, key, offset and time)."""
        before = self._now
        ruled = self._decide(value, key, offset, at_ms)
        return replace(ruled, changes=self._timed(ruled.changes, before))

    def _decide(
        self, value: bytes | None, key: bytes | None, offset: int, at_ms: int | None
    ) -> Ruled:
        now, changes = self._advance(at_ms)
        try:
            received = read_decision(value)
        except ValueError as exc:
            return Ruled(
                Ruling.REFUSED,
                None,
                None,
                None,
                Refusal.MALFORMED,
                None,
                str(exc),
                _key_id(key),
                None,
                None,
                None,
                changes,
            )
        held = self._held.get(received.event_id)
        if held is None:
            return self._refused(received, Refusal.UNKNOWN_CALL, changes)
        if held.decided is not None:
            if _decided_by(held.decided, received, offset):
                # the record that decided it, read again after a crash: the same event again,
                # and the same refusal (a decision that came late expired it)
                ruled = replace(self._rule(received, held, held.decided, changes), changes=changes)
                if held.decided.decision is not Decision.EXPIRE or (
                    received.decision is Decision.EXPIRE
                ):
                    return ruled
                return replace(
                    ruled,
                    refusal=Refusal.EXPIRED,
                    refusal_record=refusal_record(received, Refusal.EXPIRED),
                )
            return self._refused(received, Refusal.ALREADY_DECIDED, changes)
        expired = now >= held.at_ms + self._expiry_ms
        refusal: Refusal | None = None
        if received.decision is Decision.EXPIRE:
            if not expired:
                return self._refused(received, Refusal.NOT_EXPIRED, changes)
        elif received.fingerprint != held.fingerprint:
            return self._refused(received, Refusal.FINGERPRINT_MISMATCH, changes)
        elif expired:
            refusal = Refusal.EXPIRED  # too late: refused, and the call expires now
        decision = Decision.EXPIRE if expired else received.decision
        decided = Decided(decision, offset, now, CALLGATE if expired else received.by)
        decided_held = replace(held, decided=decided)
        self._held[received.event_id] = decided_held
        changes.append((received.event_id, decided_held))
        ruled = self._rule(received, held, decided, changes)
        if refusal is None:
            return ruled
        return replace(
            ruled,
            refusal=refusal,
            refusal_record=refusal_record(received, refusal),
        )

    def _rule(
        self, received: DecisionRecord, held: Held, decided: Decided, changes: list[Change]
    ) -> Ruled:
        fields = orjson.loads(held.event)
        schema = SchemaRef(fields["schema"]["id"], fields["schema"]["version"])
        if decided.decision is Decision.APPROVE:
            event, outcome, code, ruling = (
                approved_event(held.event, decided),
                Outcome.ACCEPTED,
                None,
                Ruling.APPROVED,
            )
        else:
            denied = decided.decision is Decision.DENY
            code = Code.APPROVAL_DENIED if denied else Code.APPROVAL_EXPIRED
            event = ended_event(held.event, code, self._max_feedback_bytes)
            outcome, ruling = Outcome.REJECTED, Ruling.DENIED if denied else Ruling.EXPIRED
        return Ruled(
            ruling,
            event,
            outcome,
            code,
            None,
            None,
            None,
            received.event_id,
            fields["call_id"],
            fields.get("tool"),
            schema,
            changes,
        )

    def _refused(self, received: DecisionRecord, code: Refusal, changes: list[Change]) -> Ruled:
        held = self._held.get(received.event_id)
        fields = orjson.loads(held.event) if held is not None else {}
        schema = fields.get("schema")
        return Ruled(
            Ruling.REFUSED,
            None,
            None,
            None,
            code,
            refusal_record(received, code),
            None,
            received.event_id,
            fields.get("call_id"),
            fields.get("tool"),
            SchemaRef(schema["id"], schema["version"]) if schema else None,
            changes,
        )

    def restore(self, entries: Iterable[tuple[str, bytes | None]]) -> None:
        """Rebuild from changelog entries in log order (the last entry of an event id wins);
        the store's time is the newest its entries say."""
        clock = 0
        for event_id, value in entries:
            if event_id == CLOCK_KEY:
                clock = Clock.decode(value).at_ms if value is not None else 0
                continue
            self._held.pop(event_id, None)
            if value is not None:
                self._held[event_id] = Held.decode(value)
        times = [h.decided.at_ms if h.decided else h.at_ms for h in self._held.values()]
        self._now = max([clock, *times])


def _decided_by(decided: Decided, received: DecisionRecord, offset: int) -> bool:
    """Whether the decision record at `offset` is the one that decided the call: the record at
    that offset, and what it decided (a decision that came after the expiry, whoever wrote it and
    whatever it said, expired the call, by callgate)."""
    if decided.offset != offset:
        return False
    if decided.decision is Decision.EXPIRE:
        return decided.by == CALLGATE
    return (decided.decision, decided.by) == (received.decision, received.by)


def _key_id(key: bytes | None) -> str | None:
    if key is None:
        return None
    text = key.decode("utf-8", "replace")
    return text if _HEX32.fullmatch(text) else None


def approved_event(pending: bytes, decided: Decided) -> bytes:
    """The accepted event of a call approved: its pending event, accepted, with the decision;
    every other member as the pending event has it, the arguments their very text."""
    fields = orjson.loads(pending)
    changes = {
        "outcome": Outcome.ACCEPTED.value,
        "phase": None,
        "approval": {
            "fingerprint": fields["approval"]["fingerprint"],
            "decided_by": decided.by,
            "decided_at_ms": decided.at_ms,
        },
    }
    return derive_event(pending, changes)


_ENDINGS = {
    Code.APPROVAL_DENIED: "a person denied this call",
    Code.APPROVAL_EXPIRED: "no decision came before the call's approval expired",
}


def ended_event(pending: bytes, code: Code, max_feedback_bytes: int) -> bytes:
    """The final rejection of a call denied or expired: its pending event, rejected in phase
    `approval`, without its arguments (what the decider wrote is never shown); every other
    member as the pending event has it."""
    violations = (Violation("", "approval", _ENDINGS[code]),)
    fields = orjson.loads(pending)
    changes = final_rejection(fields, Phase.APPROVAL, code, violations, max_feedback_bytes)
    return derive_event(pending, changes, ("arguments", "requires_approval", "approval"))
