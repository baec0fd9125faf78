"""The key owners: this worker's partitions of the idempotency topic and their key stores.

A call with an idempotency key reaches, through `<group>-idempotency-requests`, the worker that
owns its key's partition. `KeyOwners` decides each request against that partition's store
(`worker.core.idempotency`: first, replay, duplicate, conflict) and says what to write: the
outcome event, and the store's changes for its compacted changelog `<group>-idempotency-keys`
(same partition). On assignment a partition's store is rebuilt from that changelog.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from worker.core.idempotency import KeyStore, Resolution, resolve

log = logging.getLogger("callgate.keys")


@dataclass(frozen=True, slots=True)
class Decided:
    """One request decided: its resolution, the changelog records (key, value or None), and
    the request's record (its headers carry the call's trace)."""

    resolution: Resolution
    changes: list[tuple[bytes, bytes | None]]
    request: Any


class KeyOwners:
    def __init__(
        self, requests_topic: str, new_store: Callable[[], KeyStore], max_feedback_bytes: int
    ) -> None:
        self._requests = requests_topic
        self._new_store = new_store
        self._max_feedback_bytes = max_feedback_bytes
        self._stores: dict[int, KeyStore] = {}

    def __len__(self) -> int:
        """Keys remembered by every partition this worker owns."""
        return sum(len(store) for store in self._stores.values())

    def decide(self, partition: int, requests: Iterable[Any]) -> Iterator[Decided]:
        """The decisions on a partition's requests, in order. A record that is not a request
        (garbage on an internal topic) is logged and skipped."""
        store = self._stores.get(partition)
        if store is None:
            store = self._stores[partition] = self._new_store()
        for request in requests:
            try:
                resolution = resolve(
                    store, request.value, request.timestamp, self._max_feedback_bytes
                )
            except (ValueError, KeyError, TypeError) as exc:
                log.error(
                    "%s[%d]@%d is not an idempotency request: %r",
                    self._requests,
                    partition,
                    request.offset,
                    exc,
                )
                continue
            changes = [
                (key.encode(), record.encode() if record is not None else None)
                for key, record in resolution.changes
            ]
            yield Decided(resolution, changes, request)

    def restore(self, partition: int, changelog: Iterable[Any]) -> None:
        """Rebuild a partition's store from its changelog records, in log order."""
        store = self._new_store()
        store.restore((r.key.decode(), r.value) for r in changelog if r.key is not None)
        self._stores[partition] = store
        log.info("%s[%d]: %d idempotency keys restored", self._requests, partition, len(store))

    def drop(self, partition: int) -> None:
        self._stores.pop(partition, None)
