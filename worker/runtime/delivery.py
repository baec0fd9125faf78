"""Delivery bookkeeping, pure: which offsets may be committed, and when to pause fetching.

`DeliveryLedger` keeps the batches whose outcome events are not all acknowledged yet, in fetch
order. A batch carries the commit offsets the processor allowed right after it; those offsets
become committable only when that batch and every earlier one are fully acknowledged, so a commit
never passes an unacknowledged output. `FlowControl` turns the number of unacknowledged outputs
and the producer's health into pause/resume decisions, with hysteresis. `ReplayGuard` recognises,
after a restart or a reassignment, the events that only re-judge fragments of calls the previous
owner already judged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar

from worker.model import AssembledCall, Code, IncompleteReason, Verdict

#: (topic, partition); aiokafka's TopicPartition is a named tuple of the same shape.
Partition = tuple[str, int]

#: What a batch unlocks per partition: an offset, or (offset, replay mark) in the runner.
P = TypeVar("P")


@dataclass(slots=True)
class _Batch(Generic[P]):
    id: int
    outstanding: int
    offsets: dict[Partition, P] = field(default_factory=dict)


class DeliveryLedger(Generic[P]):
    """Batches of outputs in flight, in order, and the commit positions they unlock."""

    def __init__(self) -> None:
        self._batches: deque[_Batch[P]] = deque()
        self._by_id: dict[int, _Batch[P]] = {}
        self._next_id = 0
        self._ready: dict[Partition, P] = {}
        self._committed: dict[Partition, P] = {}
        self.pending = 0

    def record_batch(self, outputs: int, offsets: Mapping[Partition, P]) -> int:
        """A batch's `outputs` events were sent; `offsets` are safe once they are acknowledged."""
        batch = _Batch(self._next_id, outputs, dict(offsets))
        self._next_id += 1
        self._batches.append(batch)
        self._by_id[batch.id] = batch
        self.pending += outputs
        self._release()
        return batch.id

    def acknowledge(self, batch_id: int, count: int = 1) -> None:
        """`count` outputs of that batch were acknowledged by the broker."""
        batch = self._by_id.get(batch_id)
        if batch is None:
            return
        count = min(count, batch.outstanding)
        batch.outstanding -= count
        self.pending -= count
        self._release()

    def _release(self) -> None:
        while self._batches and self._batches[0].outstanding == 0:
            batch = self._batches.popleft()
            del self._by_id[batch.id]
            self._ready.update(batch.offsets)

    def committable(self) -> dict[Partition, P]:
        """Offsets acknowledged in full that differ from what was last committed."""
        return {tp: off for tp, off in self._ready.items() if self._committed.get(tp) != off}

    def mark_committed(self, offsets: Mapping[Partition, P]) -> None:
        self._committed.update(offsets)

    def committed(self, tp: Partition) -> P | None:
        return self._committed.get(tp)

    def forget(self, partitions: Iterable[Partition]) -> None:
        """A partition was revoked: nothing in flight may commit for it any more."""
        gone = set(partitions)
        for batch in self._batches:
            for tp in gone:
                batch.offsets.pop(tp, None)
        for tp in gone:
            self._ready.pop(tp, None)
            self._committed.pop(tp, None)

    @property
    def batches_in_flight(self) -> int:
        return len(self._batches)


class FlowDecision(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    KEEP = "keep"


class FlowControl:
    """Pause above `limit` unacknowledged outputs or while the producer fails; resume at half."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.paused = False

    def update(self, pending: int, producer_failing: bool) -> FlowDecision:
        if not self.paused and (producer_failing or pending > self.limit):
            self.paused = True
            return FlowDecision.PAUSE
        if self.paused and not producer_failing and pending <= self.limit // 2:
            self.paused = False
            return FlowDecision.RESUME
        return FlowDecision.KEEP


class Backoff:
    """Exponential retry delay for failed produces: base, doubling, capped; reset on success."""

    def __init__(self, base_s: float = 0.1, cap_s: float = 5.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self._failures = 0

    def failed(self) -> float:
        """Record one more failure; the delay before the next try."""
        self._failures += 1
        return self.delay

    @property
    def delay(self) -> float:
        if self._failures == 0:
            return 0.0
        return float(min(self.cap_s, self.base_s * 2 ** (self._failures - 1)))

    def succeeded(self) -> None:
        self._failures = 0


REPLAY_MARK_PREFIX = "callgate:fed="


def replay_mark(fed: int) -> str:
    """Commit metadata: every record before `fed` had been fed when this offset was committed."""
    return f"{REPLAY_MARK_PREFIX}{fed}"


class ReplayGuard:
    """Drops what a replay re-judges from fragments of calls that were already judged.

    A commit stops at the first offset C of the oldest open call, so records in [C, F) (F: the
    offset fed when C was committed, kept in the commit's metadata) are fed twice after a crash
    or a reassignment. Some of them belong to calls that began before C: such a call was closed,
    and its outcome acknowledged, before C was committed (else C would not pass its first offset).
    Fed again without their beginning, they would come out as a `sequence_gap` that starts with a
    gap, or as an undecodable record: new events, with new ids, for calls already judged. Inside
    the window those are dropped; everything else is emitted again with its original event_id.
    """

    _FRAGMENT_CODES = frozenset({Code.MALFORMED_RECORD, Code.UNKNOWN_FORMAT})

    def __init__(self) -> None:
        self._until: dict[Partition, int] = {}
        self.dropped = 0

    def resume(self, tp: Partition, committed: int | None, metadata: str | None) -> None:
        """The partition was assigned; what its last commit said."""
        self._until.pop(tp, None)
        if committed is None or not metadata or not metadata.startswith(REPLAY_MARK_PREFIX):
            return
        try:
            mark = int(metadata[len(REPLAY_MARK_PREFIX) :])
        except ValueError:
            return
        if mark > committed:
            self._until[tp] = mark

    @property
    def active(self) -> bool:
        """Some partition is still inside its replay window."""
        return bool(self._until)

    def window(self, tp: Partition) -> int | None:
        return self._until.get(tp)

    def fed(self, tp: Partition, next_offset: int) -> None:
        """Records before `next_offset` were fed: the window closes once it is passed."""
        until = self._until.get(tp)
        if until is not None and next_offset >= until:
            del self._until[tp]

    def forget(self, tp: Partition) -> None:
        self._until.pop(tp, None)

    def is_judged_fragment(self, call: AssembledCall, verdict: Verdict) -> bool:
        if not self._until or call.source is None:
            return False
        source = call.source
        until = self._until.get((source.topic, source.partition))
        if until is None or source.first_offset >= until:
            return False
        starts_with_gap = verdict.reason is IncompleteReason.SEQUENCE_GAP and call.chunks == 0
        fragment = starts_with_gap or verdict.code in self._FRAGMENT_CODES
        if fragment:
            self.dropped += 1
        return fragment
