"""Idempotency: the same key with the same canonical call is a duplicate, with another a conflict.

Bounded in memory: the oldest keys are forgotten first. A replay of the very call that was accepted
(same source position, as after a crash or a rebalance) is neither: it is accepted again, so it
carries the same event as the first time.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable
from enum import StrEnum
from typing import Any

import orjson

from worker.model import SchemaRef


class Seen(StrEnum):
    NEW = "new"
    REPLAY = "replay"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


def canonical_digest(schema: SchemaRef, arguments: Any) -> bytes:
    """A digest of (schema id, version, arguments) that ignores key order and whitespace."""
    text = orjson.dumps([schema.id, schema.version, arguments], option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(text, digest_size=16).digest()


class IdempotencyStore:
    def __init__(self, max_keys: int) -> None:
        self._max_keys = max_keys
        self._entries: OrderedDict[str, tuple[bytes, Hashable]] = OrderedDict()

    def lookup(self, key: str, digest: bytes, origin: Hashable) -> Seen:
        entry = self._entries.get(key)
        if entry is None:
            return Seen.NEW
        known_digest, known_origin = entry
        if known_digest != digest:
            return Seen.CONFLICT
        return Seen.REPLAY if known_origin == origin else Seen.DUPLICATE

    def remember(self, key: str, digest: bytes, origin: Hashable) -> None:
        self._entries[key] = (digest, origin)
        self._entries.move_to_end(key)
        if len(self._entries) > self._max_keys:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
