"""The delivery protocol: what is written, acknowledged and committed, in which order, and why.

The worker judges input in *rounds*: one fetched batch of its assigned partitions, and what that
batch makes. Per input partition the state of its open calls (and vendor streams) is kept in a
compacted changelog topic, co-partitioned with the input (`worker.runtime.checkpoints`). A
checkpoint reflects an input offset: every record before it was fed, none after.

`at_least_once` (the default; the only mode on a broker without transactions), for each round:

1. Fetch a batch; feed each partition's records to the processor. Every call the batch closes
   is judged and becomes one record: an outcome event, or (a call with an idempotency key) a
   request to the owner of the key. Records of idempotency requests are decided by their owner
   and become outcome events and key-store changes.
2. Take each input partition's checkpoint (what changed since the previous one) right away, so
   it reflects exactly the records fed so far.
3. Send every record of the round, batched per topic partition. The next round may start.
4. When every record of this round and of every earlier round is acknowledged, and the outcome
   topics were seen to exist after that (a broker may acknowledge writes to a deleted topic and
   drop them; the state must not move past outputs that may be gone), send the round's
   checkpoints, in round order (rounds ready together are sent together, each partition's
   frames in order; a frame names its place, so a restore applies them in order regardless).
5. When they are acknowledged, commit the round's input offsets (and the offsets of the
   idempotency requests it decided), at most once per `kafka.commit_interval_ms`: one commit
   at a time, beside the rounds (no round waits for it); a revoke or a stop waits for the
   commit in flight, then commits the rest.

Why each crash point loses nothing and never yields a second, different verdict:
- before 4: the last checkpoint is an earlier one; the partition is restored from it and the
  records after it are fed again. The reassembler decides by the records alone (record time, no
  wall clock), so the same calls close the same way: the re-emitted events equal the first ones
  but for the measured phase timings (same `event_id`, same verdict, same fields).
- between 4 and 5: on assignment the partition resumes right after the offset its checkpoint
  reflects, whatever the committed offset says; a call is never judged from a fragment.
- after 5: nothing is replayed.
A record that is acknowledged only after a retry may be written twice: an identical duplicate,
which consumers drop by `event_id`. An idempotency decision replayed after a crash finds its own
key-store change (written in step 3) and re-emits the same event (`Decision.REPLAY`).

`exactly_once` (needs transactions): each owned partition (input or idempotency requests) has a
transactional producer of its own, with the transactional id `<prefix>-<topic>-<partition>`
(`delivery.transactional_id_prefix`, by default the group id; `worker.runtime.transactions`).
Per round, steps 3 to 5 are one Kafka transaction per partition: the records the round made
from that partition, its checkpoint and its next input offset (`send_offsets_to_transaction`)
commit together or not at all. A partition whose transaction fails is rewound alone (restored
from its committed checkpoint, fetching resumed there). When a partition's next owner opens its
producer, the broker aborts the former owner's open transaction and refuses its later ones
(`ProducerFenced`), so a former owner paused past its session cannot commit a round for a
partition that has moved on; the fenced worker pauses the partition and forgets its state.
Consumers of the outcome topics read with `isolation.level=read_committed` and never see an
event twice.

`Ledger` below is the bookkeeping of steps 3 to 5 for `at_least_once`; it is pure.
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
