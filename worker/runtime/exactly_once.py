"""`exactly_once`: each owned partition's round is one Kafka transaction; see `ExactlyOnce`.

Needs a broker with transactions. The producers, one per owned partition, and their
transactions are `worker.runtime.transactions`'.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from aiokafka.errors import KafkaError

from worker.errors import BrokerError
from worker.runtime.delivery import (
    NOTHING_LOST,
    Context,
    Judged,
    Kind,
    Lost,
    Origin,
    Outcomes,
    Partition,
)
from worker.runtime.outbox import FENCED, Record
from worker.runtime.transactions import Transactions

log = logging.getLogger("callgate.worker")


class ExactlyOnce(Outcomes):
    """Every round, for each owned partition it read (input or idempotency requests), in that
    partition's transaction (`worker.runtime.transactions`):

    1. Its records are judged (`worker.runtime.judging`) into the partition's transaction: its
       outcome events and idempotency requests, or an owner's events and key-store changes.
    2. An input partition is checkpointed right away (the checkpoint reflects exactly the
       records fed so far); the frames, and the tombstones of the frames a new generation
       replaces, join the transaction.
    3. The partition's next input offset joins it (`send_offsets_to_transaction`).
    4. The transaction commits: all of it, or nothing. Partitions commit concurrently.
    5. A partition whose transaction fails is rewound alone: its producer is stopped (which
       aborts what the transaction holds), opened again, and its state restored from its
       committed checkpoint; fetching resumes there. A partition whose producer was fenced (a
       newer owner opened its own, and the broker refuses this one's writes) is given up:
       paused and forgotten, never opened again before the group says it is this worker's (to
       reopen it would fence the new owner in turn). One the consumer still holds a session
       later was fenced for another reason (its transaction timed out): it is opened again.

    Crash points: a transaction not committed is aborted by the partition's next producer
    (its next owner's, or this worker's after a restart), so its events are never visible to a
    `read_committed` reader; the partition resumes right after its last committed checkpoint.
    A write that keeps failing fails its round, which is rewound and tried again by the next
    one (fetching never pauses for it: there would be nothing to try it).
    """

    def __init__(self, context: Context) -> None:
        super().__init__(context)
        settings = context.settings
        self._clock = context.clock
        self._session_s = settings.kafka.session_timeout_ms / 1000
        self._transactions = Transactions(
            context.kafka.transactional_producer,
            self,
            context.clock,
            group=settings.kafka.group_id,
            timeout_s=settings.delivery.transaction_timeout_ms / 1000,
        )
        #: partitions whose producer was fenced, and when (see step 5)
        self.fenced: dict[Partition, float] = {}

    async def start(self) -> None:
        pass

    def writable(self, where: Partition) -> bool:
        return where in self._transactions

    def add(self, record: Record) -> None:
        outbox = self._transactions.outbox(record.origin.partition)
        assert outbox is not None, "a record of a partition with no open transaction"
        outbox.add(record)

    async def submit(self, judged: Judged) -> Lost:
        """Steps 2 to 5 for each partition the round read."""
        state = self._context.state
        for where, frames in judged.checkpoints.items():
            self.add_frames(judged.id, where, frames)
            # a new generation's full frame and the deletion of the older ones commit together
            changelog = state.changelog(where[0])
            for key, value, headers in state.tombstones(where):
                origin = Origin(Kind.TOMBSTONE, where)
                self.add(Record(judged.id, changelog, key, value, headers, where[1], origin))
        places = list(judged.offsets)
        outcomes = await asyncio.gather(
            *(self._transactions.commit(where, judged.offsets[where]) for where in places),
            return_exceptions=True,
        )
        errors: dict[Partition, KafkaError] = {}
        for where, outcome in zip(places, outcomes, strict=True):
            if outcome is None:
                self._stats.commits += 1
            elif isinstance(outcome, KafkaError):
                errors[where] = outcome
            else:
                raise outcome
        if not errors:
            return NOTHING_LOST
        if any(not isinstance(error, FENCED) for error in errors.values()):
            # as at least once: a topic deleted makes every transaction that writes to it fail,
            # and the check says which (a state topic gone stops the worker)
            self._topic_watch.suspect()
            self._topic_watch.check_when_due()
        await asyncio.gather(*(self._transactions.close(where) for where in errors))
        rewind: list[Partition] = []
        fenced: list[Partition] = []
        for where, error in errors.items():
            if isinstance(error, FENCED):
                log.warning("%s[%d]: fenced, a newer owner has it: %r", *where, error)
                self.fenced[where] = self._clock()
                fenced.append(where)
            else:
                log.warning("%s[%d]: transaction failed; rewinding it: %r", *where, error)
                self._stats.rewinds += 1
                rewind.append(where)
        return Lost(rewind=tuple(rewind), fenced=tuple(fenced))

    async def advance(self, *, force: bool = False) -> Lost:
        """Step 5's last case: a partition fenced a session ago and still held is taken back."""
        due = [w for w, at in self.fenced.items() if self._clock() - at >= self._session_s]
        if not due:
            return NOTHING_LOST
        held = self._context.fetcher.holds()
        back = []
        for where in due:
            del self.fenced[where]
            if where in held:
                log.warning(
                    "%s[%d]: still assigned a session after it was fenced: resuming", *where
                )
                back.append(where)
        return Lost(rewind=tuple(back))

    # -- flow, partitions, stop ----------------------------------------------------------------

    @property
    def pending_records(self) -> int:
        return 0

    @property
    def pauses_while_failing(self) -> bool:
        return False

    def waiting(self) -> str:
        return "rounds rewound until done"

    async def open(self, partitions: Iterable[Partition]) -> None:
        """Open the partitions' producers and transactions (which fences their former
        owner's)."""
        transactions = self._transactions
        opened = await asyncio.gather(
            *(transactions.open(where) for where in partitions if where not in transactions),
            return_exceptions=True,
        )
        errors = [error for error in opened if error is not None]
        if errors:
            raise BrokerError(f"cannot open the partitions' transactions: {errors[0]!r}")

    async def release(self, partitions: Iterable[Partition]) -> None:
        for where in partitions:
            self.fenced.pop(where, None)
            await self._transactions.close(where)

    def forget(self, partitions: Iterable[Partition]) -> None:
        pass

    def clear(self) -> None:
        pass

    async def drain(self, deadline: float) -> None:
        pass

    def idle(self) -> bool:
        return True

    async def settled(self) -> None:
        pass

    async def close(self, timeout_s: float) -> None:
        await self._transactions.close_all(timeout_s)
