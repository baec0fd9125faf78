"""The approval owners: this worker's partitions of the pending-approval topic and their stores.

A call whose contract requires approval reaches, as its `pending_approval` event keyed by its
event id, the worker that owns that partition of the pending-approval topic
(`CALLGATE_TOPICS__PENDING_APPROVAL`); so does every decision on it (`callgate approve|deny`,
keyed the same). `ApprovalOwners` holds each pending call and rules on each decision against
that partition's store (`worker.core.approval`), and says what to write: the outcome event of a
call approved, denied or expired, a refusal record on the pending-approval topic for a decision
refused, and the store's changes for its compacted changelog `<group>-approvals` (same
partition). On assignment a partition's store is rebuilt from that changelog.

Refusal records (written here, read back) are skipped. `due` names the calls whose expiry the
worker's clock has passed, for the `expire` decisions the worker writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from worker.core.approval import (
    PENDING_OUTCOME,
    ApprovalStore,
    Change,
    Ruled,
    is_refusal,
)

log = logging.getLogger("callgate.approvals")


@dataclass(frozen=True, slots=True)
class Taken:
    """One record of the pending-approval topic taken: a decision ruled on (None: a pending
    call held), and the changelog records (key, value or None)."""

    ruled: Ruled | None
    changes: list[tuple[bytes, bytes | None]]


def _encoded(changes: list[Change]) -> list[tuple[bytes, bytes | None]]:
    return [
        (event_id.encode(), held.encode() if held is not None else None)
        for event_id, held in changes
    ]


class ApprovalOwners:
    def __init__(self, pending_topic: str, new_store: Callable[[], ApprovalStore]) -> None:
        self._pending = pending_topic
        self._new_store = new_store
        self._stores: dict[int, ApprovalStore] = {}
        #: expire decisions asked for and not seen decided yet (event id -> when asked)
        self._asked: dict[str, int] = {}

    def __len__(self) -> int:
        """Calls pending approval in every partition this worker owns."""
        return sum(len(store) for store in self._stores.values())

    def take(self, partition: int, records: Iterable[Any]) -> Iterator[Taken]:
        """What a partition's records do, in order: a pending event is held, a decision is
        ruled on, a refusal (callgate's own) is skipped."""
        store = self._stores.get(partition)
        if store is None:
            store = self._stores[partition] = self._new_store()
        for record in records:
            headers = dict(record.headers or ())
            if headers.get("outcome") == PENDING_OUTCOME.encode():
                event_id = (record.key or b"").decode("utf-8", "replace")
                try:
                    changes = store.hold(event_id, record.value, record.timestamp)
                except (ValueError, KeyError, TypeError) as exc:
                    log.error(
                        "%s[%d]@%d is not a pending event: %r",
                        self._pending,
                        partition,
                        record.offset,
                        exc,
                    )
                    continue
                yield Taken(None, _encoded(changes))
                continue
            if is_refusal(record.value):
                continue
            ruled = store.decide(record.value, record.key, record.offset, record.timestamp)
            if ruled.ruling != "refused" and ruled.event_id is not None:
                self._asked.pop(ruled.event_id, None)
            yield Taken(ruled, _encoded(ruled.changes))

    def due(self, now_ms: int, again_after_ms: int) -> list[tuple[int, str, str]]:
        """The calls past their expiry at `now_ms` to write an `expire` decision for
        (partition, event id, fingerprint): each once, and again after `again_after_ms` if it
        is still pending then."""
        found = []
        for partition, store in self._stores.items():
            for event_id, fingerprint in store.due(now_ms):
                asked = self._asked.get(event_id)
                if asked is not None and now_ms - asked < again_after_ms:
                    continue
                self._asked[event_id] = now_ms
                found.append((partition, event_id, fingerprint))
        return found

    def restore(self, partition: int, changelog: Iterable[Any]) -> None:
        """Rebuild a partition's store from its changelog records, in log order."""
        store = self._new_store()
        store.restore((r.key.decode(), r.value) for r in changelog if r.key is not None)
        self._stores[partition] = store
        log.info("%s[%d]: %d calls pending approval restored", self._pending, partition, len(store))

    def drop(self, partition: int) -> None:
        self._stores.pop(partition, None)
