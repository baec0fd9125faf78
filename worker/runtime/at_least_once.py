"""`at_least_once`: one producer, and the order of writes that makes a crash replay, not lose.

The default guarantee, and the only one on a broker without transactions. What is sent waits
in the `Ledger` (`worker.runtime.ledger`) for its acknowledgements, round by round; see
`AtLeastOnce` for the steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka.errors import KafkaError

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
from worker.runtime.kafka import close_within
from worker.runtime.ledger import Ledger
from worker.runtime.outbox import Outbox, Record

log = logging.getLogger("callgate.worker")


class AtLeastOnce(Outcomes):
    """The rounds, and what follows them, in order:

    1. A round's batch is judged: every call the batch closes becomes one record, an outcome
       event or (a call with an idempotency key) a request to the owner of the key; an owner's
       decisions on requests are outcome events and key-store changes (`worker.runtime.
       judging`). The records are written at once, batched per topic partition, by the
       outbox's senders beside the rounds (`worker.runtime.outbox`); the next round is judged
       meanwhile.
    2. Every `kafka.commit_interval_ms` (and when partitions are revoked, and at a stop), each
       input partition fed since its last checkpoint is checkpointed: the checkpoint reflects
       exactly the records fed so far, and joins the rounds in flight as one of its own.
    3. When every record of the rounds before a checkpoint is acknowledged, and the outcome
       topics were seen to exist after that (a broker may acknowledge writes to a deleted topic
       and drop them; the state must not move past outputs that may be gone), the checkpoint
       is sent (checkpoints ready together are sent together, each partition's frames in
       order; a frame names its place, so a restore applies them in order regardless).
    4. When it is acknowledged, the input offsets it reflects are committed (and the offsets
       of the idempotency requests decided by the rounds before it), at most once per
       `kafka.commit_interval_ms`: one commit at a time, beside the rounds; a revoke or a stop
       waits for the commit in flight, then commits the rest.

    Crash points: before 3, the last checkpoint is an earlier one, and the records after it are
    judged again into the same events; between 3 and 4, the partition resumes right after its
    checkpoint, whatever the committed offset says; after 4, nothing is replayed. A record
    acknowledged only after a retry may be written twice: an identical duplicate, which
    consumers drop by `event_id`. Too many records (or bytes) unacknowledged, or a topic whose
    writes fail, pause fetching (`worker.runtime.flow`) until the backlog drains.
    """

    def __init__(self, context: Context) -> None:
        super().__init__(context)
        kafka = context.settings.kafka
        self._topics = context.topics
        self._clock = context.clock
        self._commit_interval_s = kafka.commit_interval_ms / 1000
        self._request_timeout_s = kafka.request_timeout_ms / 1000
        self._session_s = kafka.session_timeout_ms / 1000
        self.ledger = Ledger()
        self._producer: Any = None
        self._outbox: Outbox | None = None
        #: input partitions fed since their last checkpoint
        self._fed: set[Partition] = set()
        self._last_checkpoint = float("-inf")
        self._last_commit = 0.0
        #: the offset commit running beside the rounds (`_commit_when_due`)
        self._committing: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._producer = self._context.kafka.producer()
        try:
            await self._producer.start()
        except BaseException:
            await self._stop_producer(5.0)
            raise
        self._outbox = Outbox(self._producer, self, self._clock)

    def writable(self, where: Partition) -> bool:
        return True

    def add(self, record: Record) -> None:
        assert self._outbox is not None, "start() first"
        self._outbox.add(record)

    def submit(self, judged: Judged) -> None:
        """Step 1 is done (the records were added): the round waits for their
        acknowledgements. Its input partitions wait for their next checkpoint; the offsets of
        the idempotency requests it decided are committed after it."""
        state = self._context.state
        offsets = {}
        for where, offset in judged.offsets.items():
            if state.is_input(where):
                self._fed.add(where)
            else:
                offsets[where] = offset
        self.ledger.open_round(judged.id, judged.records, {}, offsets)

    async def advance(self, *, force: bool = False) -> Lost:
        """Step 1's writes, and steps 2 to 4 for whatever they are due for."""
        outbox = self._outbox
        assert outbox is not None, "start() first"
        outbox.dispatch()
        if self._fed and (
            force or self._clock() - self._last_checkpoint >= self._commit_interval_s
        ):
            self._checkpoint()
        # checkpoints wait for a check (the worker also has one made while writes fail)
        if self.ledger.awaiting_verification():
            self._topics.check_when_due()
        for round_ in self.ledger.checkpoints_to_send(self._topics.verified_at):
            for where, frames in round_.checkpoints.items():
                self.add_frames(round_.id, where, frames)
        outbox.dispatch()
        await self._commit_when_due(force=force)
        return NOTHING_LOST

    def _checkpoint(self) -> None:
        """Step 2: every input partition fed since its last checkpoint, checkpointed now."""
        state = self._context.state
        checkpoints, offsets = {}, {}
        for where in self._fed:
            checkpoints[where], offsets[where] = state.checkpoint(where)
        self._fed.clear()
        self._last_checkpoint = self._clock()
        self.ledger.open_round(self._context.next_round(), {}, checkpoints, offsets)

    async def _commit_when_due(self, *, force: bool) -> None:
        """Step 4: commit the offsets whose rounds are acknowledged and checkpointed. A due
        commit runs beside the rounds, as the topic check does: a round never waits for the
        group coordinator's answer (a commit took 5-20 ms of a loaded round), and one commit is
        in flight at a time. A forced one (revoke, stop) waits for the one in flight, then
        commits what is left, so a partition's offsets are committed (or tried) before it
        leaves."""
        committing = self._committing
        if committing is not None:
            if not committing.done() and not force:
                return
            self._committing = None
            await committing  # a commit's Kafka errors are handled inside; a bug surfaces here
        if force:
            await self._commit(self.ledger.take_committable())
        elif self._clock() - self._last_commit >= self._commit_interval_s:
            offsets = self.ledger.take_committable()
            if offsets:
                self._committing = asyncio.ensure_future(self._commit(offsets))

    async def _commit(self, offsets: Mapping[Partition, int]) -> None:
        try:
            committed = await self._context.fetcher.commit(offsets, self._request_timeout_s)
        except (KafkaError, TimeoutError) as exc:
            self._stats.commit_errors += 1
            self._metrics.commit_error()
            log.warning(
                "commit failed (the next one carries these offsets): %r", exc, extra=REPEATS
            )
            self.ledger.recommit(offsets)
            return
        if committed:
            self._last_commit = self._clock()
            self._stats.commits += 1

    # -- the outbox's callbacks (its `Sink`) ---------------------------------------------------

    def acknowledged(self, record: Record) -> None:
        super().acknowledged(record)
        origin: Origin = record.origin
        if origin.kind in (Kind.OUTPUT, Kind.KEY_CHANGE, Kind.SHADOW):
            self.ledger.acknowledged(record.round_id, origin.partition, self._clock())
        elif origin.kind is Kind.CHECKPOINT:
            self.ledger.checkpoint_acknowledged(record.round_id, origin.partition)
            if origin.full_frame:
                for key, value, headers in self._context.state.tombstones(origin.partition):
                    self.add(
                        Record(
                            record.round_id,
                            record.topic,
                            key,
                            value,
                            headers,
                            partition=record.partition,
                            origin=Origin(Kind.TOMBSTONE, origin.partition),
                        )
                    )

    def refused(self, record: Record, error: KafkaError) -> Record | None:
        substitute = super().refused(record, error)
        if substitute is None and record.origin.kind in (Kind.OUTPUT, Kind.SHADOW):
            # dropped: as good as acknowledged, or its round would wait for it for ever
            self.ledger.acknowledged(record.round_id, record.origin.partition, self._clock())
        return substitute

    # -- flow, partitions, stop ----------------------------------------------------------------

    @property
    def pending_records(self) -> int:
        return 0 if self._outbox is None else self._outbox.held_records

    @property
    def pending_bytes(self) -> int:
        return 0 if self._outbox is None else self._outbox.held_bytes

    @property
    def pauses_while_failing(self) -> bool:
        return True

    def waiting(self) -> str:
        return "fetching paused"

    async def open(self, partitions: Iterable[Partition]) -> None:
        pass

    async def rewind(self, partitions: Iterable[Partition]) -> None:
        self.forget(partitions)

    async def release(self, partitions: Iterable[Partition]) -> None:
        """Finish what is in flight (bounded: half a session), then forget the partitions."""
        await self.drain(self._clock() + max(1.0, self._session_s / 2))
        self.forget(partitions)

    def forget(self, partitions: Iterable[Partition]) -> None:
        gone = set(partitions)
        self._fed -= gone
        self.ledger.forget(gone, self._clock())
        if self._outbox is not None:
            self._outbox.discard(lambda record: record.origin.partition in gone)

    async def drain(self, deadline: float) -> None:
        """Send, checkpoint and commit what is in flight, until done or the deadline (a hard
        one: a commit that waits on the group is cut off, and its offsets committed later or
        by the partition's next owner)."""
        try:
            await asyncio.wait_for(self._drain_until_idle(deadline), deadline - self._clock())
        except TimeoutError:
            # a member that stalled past its session said so: its commits are refused anyway
            say = log.info if self._context.membership.lost else log.warning
            say("draining cut off at its deadline")

    async def _drain_until_idle(self, deadline: float) -> None:
        outbox = self._outbox
        while outbox is not None and self._clock() < deadline:
            await self.advance(force=True)
            if self.ledger.idle() and not outbox.queued and not outbox.in_flight:
                return
            await outbox.wait_progress(min(0.1, max(0.0, deadline - self._clock())))

    def idle(self) -> bool:
        return self.ledger.idle() and not self._fed

    async def settled(self) -> None:
        if self._committing is not None:
            await self._committing

    async def close(self, timeout_s: float) -> None:
        if self._committing is not None:
            self._committing.cancel()
            with contextlib.suppress(asyncio.CancelledError, KafkaError, TimeoutError):
                await self._committing
        if self._outbox is not None:
            await self._outbox.close()
        await self._stop_producer(timeout_s)

    async def _stop_producer(self, timeout_s: float) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        await close_within(producer.stop(), timeout_s, "the producer")
