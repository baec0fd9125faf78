"""The bookkeeping of `at_least_once` (`worker.runtime.at_least_once`), steps 3 to 5: which
rounds' records are acknowledged, whose checkpoints may be sent, whose offsets committed. Pure:
no I/O, time passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

#: (topic, partition)
Partition = tuple[str, int]


class Stage(Enum):
    SENDING = 1  # step 3: records sent, not all acknowledged
    CHECKPOINTING = 2  # step 4: checkpoints sent, not all acknowledged
    DONE = 3  # step 5: offsets may be committed


@dataclass(slots=True)
class Round:
    id: int
    #: records sent in step 3 and not acknowledged yet, per input partition they came from
    outstanding: dict[Partition, int]
    #: what is written in step 4, per input partition: records (key, value, headers) in order
    checkpoints: dict[Partition, list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]]
    #: what is committed in step 5: the next offset to read, per partition
    offsets: dict[Partition, int]
    stage: Stage = Stage.SENDING
    #: checkpoint records sent in step 4 and not acknowledged yet, per input partition
    checkpoints_outstanding: dict[Partition, int] = field(default_factory=dict)
    #: when the last of its records was acknowledged (the worker's clock)
    acked_at: float | None = None


@dataclass(slots=True)
class Ledger:
    """Rounds in flight, oldest first, moved through the protocol's steps in order.

    Records and checkpoint records are counted per input partition, so forgetting a partition
    (revoked, or rewound to its checkpoint) forgets what was still owed for it, whether the
    outbox dropped those records or still sends them: a round never waits for a record that
    will not be acknowledged, and a late acknowledgement of a forgotten one counts for nothing.
    """

    _rounds: deque[Round] = field(default_factory=deque)
    _by_id: dict[int, Round] = field(default_factory=dict)
    _committable: dict[Partition, int] = field(default_factory=dict)
    pending_records: int = 0

    def open_round(
        self,
        round_id: int,
        records: Mapping[Partition, int],
        checkpoints: Mapping[Partition, list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]],
        offsets: Mapping[Partition, int],
    ) -> None:
        """Step 3: a round's records, counted per input partition, were handed to the outbox
        (ids only ever grow)."""
        outstanding = {where: count for where, count in records.items() if count}
        round_ = Round(round_id, outstanding, dict(checkpoints), dict(offsets))
        if not outstanding:
            round_.acked_at = float("-inf")
        self._rounds.append(round_)
        self._by_id[round_id] = round_
        self.pending_records += sum(outstanding.values())

    def acknowledged(self, round_id: int, where: Partition, now: float, count: int = 1) -> None:
        """`count` records of the round (step 3) made from partition `where` were acknowledged
        at `now`."""
        round_ = self._by_id.get(round_id)
        if round_ is None or round_.stage is not Stage.SENDING:
            return
        owed = round_.outstanding.get(where)
        if owed is None:
            return  # the partition was forgotten
        count = min(count, owed)
        self.pending_records -= count
        if count < owed:
            round_.outstanding[where] = owed - count
            return
        del round_.outstanding[where]
        if not round_.outstanding:
            round_.acked_at = now

    def awaiting_verification(self) -> bool:
        """Some round's records are all acknowledged and its checkpoints wait (step 4)."""
        return any(r.stage is Stage.SENDING and not r.outstanding for r in self._rounds)

    def checkpoints_to_send(self, verified_at: float) -> list[Round]:
        """Step 4: rounds whose records, and every earlier round's, were all acknowledged
        before `verified_at` (when the outcome topics were last seen to exist), and whose
        checkpoints are not sent yet, oldest first. Marks them as checkpointing."""
        ready: list[Round] = []
        for round_ in self._rounds:
            if round_.stage is not Stage.SENDING:
                continue
            if round_.outstanding or round_.acked_at is None or round_.acked_at > verified_at:
                break
            round_.stage = Stage.CHECKPOINTING
            round_.checkpoints_outstanding = {
                where: len(frames) for where, frames in round_.checkpoints.items() if frames
            }
            ready.append(round_)
        self._settle()
        return ready

    def checkpoint_acknowledged(self, round_id: int, where: Partition, count: int = 1) -> None:
        """`count` checkpoint records of the round, of partition `where`, were acknowledged."""
        round_ = self._by_id.get(round_id)
        if round_ is None or round_.stage is not Stage.CHECKPOINTING:
            return
        owed = round_.checkpoints_outstanding.get(where)
        if owed is None:
            return  # the partition was forgotten
        if count < owed:
            round_.checkpoints_outstanding[where] = owed - count
            return
        del round_.checkpoints_outstanding[where]
        self._settle()

    def _settle(self) -> None:
        """Step 5: rounds fully written, in order, hand their offsets to the next commit."""
        while self._rounds:
            head = self._rounds[0]
            if head.stage is not Stage.CHECKPOINTING or head.checkpoints_outstanding:
                break
            head.stage = Stage.DONE
            self._rounds.popleft()
            del self._by_id[head.id]
            self._committable.update(head.offsets)

    def take_committable(self) -> dict[Partition, int]:
        """The offsets to commit now (each partition's latest); they are handed out once."""
        offsets, self._committable = self._committable, {}
        return offsets

    def recommit(self, offsets: Mapping[Partition, int]) -> None:
        """A commit failed: its offsets are committable again (unless newer ones are)."""
        for tp, offset in offsets.items():
            self._committable.setdefault(tp, offset)

    def forget(self, partitions: Iterable[Partition], now: float) -> None:
        """Partitions were revoked or rewound: nothing in flight may checkpoint or commit them,
        and nothing still owed for them is waited for. A round that waited only for them is
        acknowledged at `now`."""
        gone = set(partitions)
        for round_ in self._rounds:
            waiting = bool(round_.outstanding)
            for where in gone:
                self.pending_records -= round_.outstanding.pop(where, 0)
                round_.checkpoints.pop(where, None)
                round_.checkpoints_outstanding.pop(where, None)
                round_.offsets.pop(where, None)
            if waiting and not round_.outstanding:
                round_.acked_at = now
        for where in gone:
            self._committable.pop(where, None)
        self._settle()

    @property
    def rounds_in_flight(self) -> int:
        return len(self._rounds)

    def idle(self) -> bool:
        """Nothing sent is waiting for an acknowledgement, and nothing waits to be committed."""
        return not self._rounds and not self._committable
