"""`callgate run`'s process set-up (the rest of `serve` runs in the process tests)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from worker.runtime.serve import YOUNG_OBJECTS_PER_FETCHED_RECORD, settle_heap


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector's thresholds and frozen heap as they were, after the test."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("collector")
def test_settling_the_heap_freezes_it_and_spaces_the_young_collections_by_the_fetch() -> None:
    gc.unfreeze()
    _, middle, old = gc.get_threshold()
    settle_heap(2_000)
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (2_000 * YOUNG_OBJECTS_PER_FETCHED_RECORD, middle, old)
    settle_heap(1)  # a tiny fetch keeps Python's own threshold
    assert gc.get_threshold() == (700, middle, old)


@pytest.mark.usefixtures("collector")
def test_cyclic_garbage_is_still_collected_without_being_asked_after_settling() -> None:
    settle_heap(2_000)
    threshold = gc.get_threshold()[0]

    class Node:
        def __init__(self) -> None:
            self.other: Node | None = None

    collected: list[int] = []
    gc.callbacks.append(lambda phase, info: collected.append(info.get("collected", 0)))
    try:
        for _ in range(threshold):  # pairs left as garbage: past the threshold
            first, second = Node(), Node()
            first.other, second.other = second, first
    finally:
        gc.callbacks.pop()
    assert sum(collected) > 0
