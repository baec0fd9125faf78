"""The idempotency store on its own: verdicts by key and digest, and its memory bound."""

from __future__ import annotations

from worker.core.idempotency import IdempotencyStore, Seen, canonical_digest
from worker.model import SchemaRef

REF = SchemaRef("payments.create_payment", "1")


def test_digest_ignores_key_order_but_not_values_or_version() -> None:
    a = canonical_digest(REF, {"x": 1, "y": [1, 2]})
    assert a == canonical_digest(REF, {"y": [1, 2], "x": 1})
    assert a != canonical_digest(REF, {"x": 2, "y": [1, 2]})
    assert a != canonical_digest(SchemaRef(REF.id, "2"), {"x": 1, "y": [1, 2]})


def test_new_replay_duplicate_conflict() -> None:
    store = IdempotencyStore(10)
    digest = canonical_digest(REF, {"x": 1})
    assert store.lookup("k", digest, "origin-1") is Seen.NEW
    store.remember("k", digest, "origin-1")
    assert store.lookup("k", digest, "origin-1") is Seen.REPLAY
    assert store.lookup("k", digest, "origin-2") is Seen.DUPLICATE
    assert store.lookup("k", canonical_digest(REF, {"x": 2}), "origin-2") is Seen.CONFLICT


def test_the_store_is_bounded_oldest_key_forgotten_first() -> None:
    store = IdempotencyStore(3)
    digest = canonical_digest(REF, {})
    for key in ("a", "b", "c", "d"):
        store.remember(key, digest, key)
    assert len(store) == 3
    assert store.lookup("a", digest, "a") is Seen.NEW
    assert store.lookup("d", digest, "d") is Seen.REPLAY
