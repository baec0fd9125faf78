"""The execute-once rule, decided by the owner of a key: first, replay, duplicate or conflict.

A key is the call's idempotency key in its principal's scope (`worker.core.canonical.scoped_key`):
calls of two principals (or of one and of none) never share a key, whatever key they name.
For a key `k` and a request `x` (tool, schema version, arguments in canonical form, see
`worker.core.canonical`), against what the owner remembers of `k`:

- `k` unknown: FIRST. The call is accepted and `k` remembered with `x`'s digest and the event.
- `k` known with the same event id: REPLAY (the very call that was accepted, judged again after
  a crash or a rebalance): accepted again, the same event.
- `k` known with an equal `x` from another call: DUPLICATE, rejected `duplicate` naming the
  first event; executors must not run it again.
- `k` known with a different `x`: CONFLICT, rejected `idempotency_conflict`.

A key is remembered for `retention_ms` of the partition's own time and at most `max_keys` keys
per partition, the oldest forgotten first; after that the key is new again. The partition's time
at a request is the request's timestamp, but never earlier than the newest key remembered (a
producer's clock may be behind; the offline check has no time at all).

Every change is returned as a changelog entry (key, value or None to forget) for the caller to
write, and `restore` rebuilds the store from those entries. The keys are the store's only state
(its time is read from them, not kept beside them), so a store rebuilt from its changelog, even
a compacted one, decides every later request as the original would. Pure: time is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import orjson

from worker._native import AssembledCall
from worker.core.approval import pending_event
from worker.core.events import (
    idempotency_rejection,
    key_rejection,
    read_idempotency_request,
    request_key,
)
from worker.model import Code, Outcome, SchemaRef, Verdict


class Decision(StrEnum):
    FIRST = "first"
    REPLAY = "replay"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What is remembered of a key: the first request's digest and event, and when."""

    digest: bytes
    event_id: str
    at_ms: int

    def encode(self) -> bytes:
        return orjson.dumps(
            {"digest": self.digest.hex(), "event_id": self.event_id, "at": self.at_ms}
        )

    @classmethod
    def decode(cls, value: bytes) -> KeyRecord:
        fields = orjson.loads(value)
        return cls(bytes.fromhex(fields["digest"]), fields["event_id"], int(fields["at"]))


#: A changelog entry: the key, and its record (None: forgotten).
Change = tuple[str, KeyRecord | None]


class KeyStore:
    """The keys of one partition of the idempotency topic."""

    def __init__(self, *, max_keys: int, retention_ms: int) -> None:
        self._max_keys = max_keys
        self._retention_ms = retention_ms
        self._keys: OrderedDict[str, KeyRecord] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._keys)

    def decide(
        self, key: str, digest: bytes, event_id: str, at_ms: int | None
    ) -> tuple[Decision, KeyRecord, list[Change]]:
        """The decision on one request, the record that decided it, and the changes to write."""
        now = self._newest()
        if at_ms is not None and at_ms > now:
            now = at_ms
        changes = self._expire(now)
        known = self._keys.get(key)
        if known is None:
            record = KeyRecord(digest, event_id, now)
            self._keys[key] = record
            changes.append((key, record))
            while len(self._keys) > self._max_keys:
                oldest, _ = self._keys.popitem(last=False)
                changes.append((oldest, None))
            return Decision.FIRST, record, changes
        if known.event_id == event_id:
            return Decision.REPLAY, known, changes
        if known.digest == digest:
            return Decision.DUPLICATE, known, changes
        return Decision.CONFLICT, known, changes

    def _newest(self) -> int:
        """The time of the newest key remembered (keys are in time order), 0 when none is."""
        return next(reversed(self._keys.values())).at_ms if self._keys else 0

    def _expire(self, now: int) -> list[Change]:
        deadline = now - self._retention_ms
        changes: list[Change] = []
        while self._keys:
            key, record = next(iter(self._keys.items()))
            if record.at_ms > deadline:
                break
            del self._keys[key]
            changes.append((key, None))
        return changes

    def restore(self, entries: Iterable[tuple[str, bytes | None]]) -> None:
        """Rebuild from changelog entries in log order (the last entry of a key wins)."""
        for key, value in entries:
            self._keys.pop(key, None)
            if value is not None:
                self._keys[key] = KeyRecord.decode(value)
        ordered = sorted(self._keys.items(), key=lambda item: item[1].at_ms)
        self._keys = OrderedDict(ordered)


def rejection_code(decision: Decision) -> Code | None:
    """The code a decision rejects with (`duplicate`, `idempotency_conflict`); None: accepted."""
    if decision is Decision.DUPLICATE:
        return Code.DUPLICATE
    if decision is Decision.CONFLICT:
        return Code.IDEMPOTENCY_CONFLICT
    return None


@dataclass(frozen=True, slots=True)
class Resolution:
    """What the owner of a key emits for one request: the event, and the changes to write. An
    accepted call whose contract requires approval is its pending event (`pending`), for the
    pending-approval topic."""

    decision: Decision
    event: bytes
    outcome: Outcome
    #: the rejection's code (`duplicate`, `idempotency_conflict`), None when accepted
    code: Code | None
    call_id: str
    tool: str | None
    schema: SchemaRef | None
    changes: list[Change]
    event_id: str = ""
    pending: bool = False


def resolve(
    store: KeyStore, request: bytes, at_ms: int | None, max_feedback_bytes: int
) -> Resolution:
    """Decide one idempotency request against the store. ValueError if it is not a request."""
    found = read_idempotency_request(request)
    decision, record, changes = store.decide(found.key, found.digest, found.event_id, at_ms)
    event, outcome, code = found.event, Outcome.ACCEPTED, rejection_code(decision)
    pending = False
    if code is not None:
        event, _ = idempotency_rejection(found.event, code, record.event_id, max_feedback_bytes)
        outcome = Outcome.REJECTED
    elif orjson.loads(event).get("requires_approval") is True:
        event, _ = pending_event(event)
        pending = True
    return Resolution(
        decision,
        event,
        outcome,
        code,
        found.call_id,
        found.tool,
        found.schema,
        changes,
        found.event_id,
        pending,
    )


def decide_here(
    store: KeyStore, call: AssembledCall, verdict: Verdict, max_feedback_bytes: int
) -> Verdict:
    """`verdict` on `call` as its key's owner decides it, the owner being this process (no
    time: keys age by the store's own, as in `callgate check`). An accepted call with a key is
    accepted, or rejected `duplicate` / `idempotency_conflict`; any other verdict is returned
    as it is."""
    if verdict.outcome is not Outcome.ACCEPTED or verdict.idempotency_digest is None:
        return verdict
    decision, record, _ = store.decide(
        request_key(call, verdict), verdict.idempotency_digest, call.event_id, None
    )
    code = rejection_code(decision)
    if code is None:
        return verdict
    return key_rejection(verdict, code, record.event_id, max_feedback_bytes)
