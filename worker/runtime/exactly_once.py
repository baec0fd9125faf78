"""`exactly_once`: each owned partition writes into a Kafka transaction; see `ExactlyOnce`.

Needs a broker with transactions. The producers, one per owned partition, and their
transactions are `worker.runtime.transactions`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from aiokafka.errors import KafkaError, TransactionalIdAuthorizationFailed

from worker.errors import BrokerError
from worker.runtime.broker_log import REPEATS
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
from worker.runtime.kafka import transactional_id
from worker.runtime.outbox import FENCED, Record
from worker.runtime.provision import not_authorized
from worker.runtime.transactions import Transactions

log = logging.getLogger("callgate.worker")


class ExactlyOnce(Outcomes):
    """Each owned partition (input or idempotency requests) has a producer and a transaction
    of its own (`worker.runtime.transactions`), and goes through these steps:

    1. A round's records from the partition (`worker.runtime.judging`: its outcome events and
       idempotency requests, or an owner's events and key-store changes) are written into the
       partition's open transaction at once, by its outbox's senders beside the rounds.
    2. Every `kafka.commit_interval_ms` (and when it is revoked, and at a stop) the partition,
       if it was read since its last commit, commits beside the rounds: an input partition is
       checkpointed (the checkpoint reflects exactly the records fed so far; its frames, and
       the tombstones of the frames a new generation replaces, join the transaction); its next
       input offset joins it (`send_offsets_to_transaction`); the transaction commits, all of
       it or nothing, and the next begins. What the rounds make meanwhile waits for the next.
    3. A partition whose commit fails is rewound alone: its producer is stopped (which aborts
       what the transaction holds), opened again, and its state restored from its committed
       checkpoint; fetching resumes there.
    4. A partition whose producer was fenced (a newer owner opened its own, and the broker
       refuses this one's writes) is given up: paused and forgotten, and never opened again
       before the group says it is this worker's: to open it would fence the new owner in
       turn. So is a partition whose commit failed while the worker's membership is taken for
       lost (`fetcher.Membership`: a round outlived the session, the worker stalled): its new
       owner may hold it already. One the consumer still holds a session later was fenced for
       another reason (its transaction timed out): it is opened again.

    Crash points: a transaction not committed is aborted by the partition's next producer (its
    next owner's, or this worker's after a restart), so its events are never visible to a
    `read_committed` reader; the partition resumes right after its last committed checkpoint.
    A write that keeps failing fails its commit, which is rewound and tried again (fetching
    never pauses for it: there would be nothing to try it); too many records (or bytes) not
    committed pause fetching until the commits catch up.
    """

    def __init__(self, context: Context) -> None:
        super().__init__(context)
        settings = context.settings
        self._clock = context.clock
        self._membership = context.membership
        self._session_s = settings.kafka.session_timeout_ms / 1000
        self._interval_s = settings.kafka.commit_interval_ms / 1000
        self._transactions = Transactions(
            context.kafka.transactional_producer,
            self,
            context.clock,
            group=settings.kafka.group_id,
            timeout_s=settings.delivery.transaction_timeout_ms / 1000,
        )
        #: each partition read since its last commit: its next input offset
        self._read: dict[Partition, int] = {}
        #: the commits running beside the rounds
        self._commits: dict[Partition, asyncio.Task[None]] = {}
        self._last_commit = float("-inf")
        #: partitions whose producer was fenced, and when (see step 4)
        self.fenced: dict[Partition, float] = {}

    async def start(self) -> None:
        pass

    def writable(self, where: Partition) -> bool:
        return where in self._transactions

    def add(self, record: Record) -> None:
        self._transactions.add(record.origin.partition, record)

    def submit(self, judged: Judged) -> None:
        """Step 1 is done (the records were added): the partitions wait for their commit."""
        self._read.update(judged.offsets)

    async def advance(self, *, force: bool = False) -> Lost:
        """Step 1's writes, the commits of step 2 that are due, what became of those done
        (steps 3 and 4), and the partitions taken back."""
        self._transactions.dispatch()
        lost = await self._done()
        if self._read and (force or self._clock() - self._last_commit >= self._interval_s):
            self._commit(list(self._read))
        if force and self._commits:
            await asyncio.wait(self._commits.values())
            lost = lost + await self._done()
        return lost

    def _commit(self, partitions: list[Partition]) -> None:
        """Step 2 for the partitions that are not committing already."""
        self._last_commit = self._clock()
        state = self._context.state
        for where in partitions:
            if where in self._commits or where not in self._transactions:
                continue
            offset = self._read.pop(where)
            if state.is_input(where):
                frames, offset = state.checkpoint(where)
                round_id = self._context.next_round()
                self.add_frames(round_id, where, frames)
                # a new generation's full frame and the deletion of the older ones commit
                # together
                changelog = state.changelog(where[0])
                for key, value, headers in state.tombstones(where):
                    origin = Origin(Kind.TOMBSTONE, where)
                    self.add(Record(round_id, changelog, key, value, headers, where[1], origin))
            self._commits[where] = self._transactions.commit(where, offset)

    async def _done(self) -> Lost:
        """Steps 3 and 4 for the commits done, and the fenced partitions taken back."""
        errors: dict[Partition, KafkaError] = {}
        for where, task in list(self._commits.items()):
            if not task.done():
                continue
            del self._commits[where]
            error = task.exception() if not task.cancelled() else KafkaError("cancelled")
            if error is None:
                self._stats.commits += 1
                continue
            if not isinstance(error, KafkaError):
                raise error
            errors[where] = error
        lost = NOTHING_LOST
        if errors:
            for where in errors:
                self._read.pop(where, None)  # nothing more goes into a failed transaction
            lost = self._lost(errors)
            # a fenced producer can write no more; a failed one is opened again (`rewind`)
            await asyncio.gather(*(self._transactions.close(where) for where in lost.fenced))
        return lost + Lost(rewind=tuple(self._take_back()))

    def _lost(self, errors: dict[Partition, KafkaError]) -> Lost:
        if any(not isinstance(error, FENCED) for error in errors.values()):
            # as at least once: a topic deleted makes every transaction that writes to it fail,
            # and the check says which (a state topic gone stops the worker)
            self._topic_watch.suspect()
            self._topic_watch.check_when_due()
        rewind: list[Partition] = []
        fenced: list[Partition] = []
        for where, error in errors.items():
            if self._membership.lost:
                # expected once a round outlived the session, which was logged as a warning
                log.info(
                    "%s[%d]: commit failed while the worker may have lost its place in the "
                    "group (a round outlived the session): giving it up until the group "
                    "assigns it again: %r",
                    *where,
                    error,
                )
            elif isinstance(error, FENCED):
                log.warning("%s[%d]: fenced, a newer owner has it: %r", *where, error)
            else:
                log.warning("%s[%d]: commit failed; rewinding it: %r", *where, error, extra=REPEATS)
                self._stats.rewinds += 1
                rewind.append(where)
                continue
            self.fenced[where] = self._clock()
            fenced.append(where)
        return Lost(rewind=tuple(rewind), fenced=tuple(fenced))

    def _take_back(self) -> list[Partition]:
        """Step 4's last case: a partition fenced a session ago and still held."""
        if self._membership.lost:
            return []
        due = [w for w, at in self.fenced.items() if self._clock() - at >= self._session_s]
        if not due:
            return []
        held = self._context.fetcher.holds()
        back = []
        for where in due:
            del self.fenced[where]
            if where in held:
                log.warning(
                    "%s[%d]: still assigned a session after it was fenced: resuming", *where
                )
                back.append(where)
        return back

    # -- flow, partitions, stop ----------------------------------------------------------------

    @property
    def pending_records(self) -> int:
        return self._transactions.held_records

    @property
    def pending_bytes(self) -> int:
        return self._transactions.held_bytes

    @property
    def pauses_while_failing(self) -> bool:
        return False

    def waiting(self) -> str:
        return "rounds rewound until done"

    async def open(self, partitions: Iterable[Partition]) -> None:
        """Open the partitions' producers and transactions (which fences their former
        owner's)."""
        transactions = self._transactions
        opening = [where for where in partitions if where not in transactions]
        opened = await asyncio.gather(
            *(transactions.open(where) for where in opening), return_exceptions=True
        )
        errors = [(w, error) for w, error in zip(opening, opened, strict=True) if error is not None]
        for (topic, partition), error in errors:
            if isinstance(error, TransactionalIdAuthorizationFailed):
                settings = self._context.settings
                name = transactional_id(settings, topic, partition)
                raise not_authorized(settings, "transactional-id", name)
        if errors:
            raise BrokerError(f"cannot open the partitions' transactions: {errors[0][1]!r}")

    async def rewind(self, partitions: Iterable[Partition]) -> None:
        """Abort what the partitions' transactions hold (their producers stopped), and open
        them again."""
        again = list(partitions)
        await self._close(again)
        await self.open(again)

    async def release(self, partitions: Iterable[Partition]) -> None:
        """Commit what the partitions' transactions hold (bounded by the transaction timeout),
        then stop their producers. Not when the membership is taken for lost: the partitions
        may be another member's already, and the commit would fail anyway."""
        gone = list(partitions)
        if not self._membership.lost:
            await self._finish(gone)
            self._commit([where for where in gone if where in self._read])
            await self._finish(gone)
        await self._close(gone)

    async def _finish(self, partitions: list[Partition]) -> None:
        """Until the partitions' commits in flight are done; what became of them does not
        matter any more (the partitions leave)."""
        running = [self._commits.pop(where) for where in partitions if where in self._commits]
        if running:
            await asyncio.wait(running)
        for task in running:
            if not task.cancelled() and task.exception() is None:
                self._stats.commits += 1

    async def _close(self, partitions: list[Partition]) -> None:
        for where in partitions:
            self.fenced.pop(where, None)
            self._read.pop(where, None)
            commit = self._commits.pop(where, None)
            if commit is not None:
                commit.cancel()
                with contextlib.suppress(asyncio.CancelledError, KafkaError):
                    await commit
        await asyncio.gather(*(self._transactions.close(where) for where in partitions))

    def forget(self, partitions: Iterable[Partition]) -> None:
        for where in partitions:
            self._read.pop(where, None)

    async def drain(self, deadline: float) -> None:
        """Commit what every partition's transaction holds, until done or the deadline."""
        try:
            await asyncio.wait_for(self.advance(force=True), max(0.0, deadline - self._clock()))
        except TimeoutError:
            log.warning("committing cut off at its deadline")

    def idle(self) -> bool:
        return not self._read and not self._commits

    async def settled(self) -> None:
        if self._commits:
            await asyncio.wait(self._commits.values())

    async def close(self, timeout_s: float) -> None:
        for task in self._commits.values():
            task.cancel()
        self._commits.clear()
        await self._transactions.close_all(timeout_s)
