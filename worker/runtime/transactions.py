"""Exactly once: a transactional producer per owned partition, and its round's transaction.

Kafka fences a former owner's transactions by transactional id only. aiokafka's
`send_offsets_to_transaction` does not carry the consumer group's generation (KIP-447), so with
one producer per worker a member paused past its session could, once resumed, commit a round
for partitions that have moved on: the new owner's events, twice. So, as Kafka Streams did
before KIP-447, each owned partition (input or idempotency requests) has a producer of its own,
`<prefix>-<topic>-<partition>`. When a partition's new owner opens its producer, the broker
completes the former owner's open transaction and refuses its later ones (`ProducerFenced`).

A partition's transaction is begun as soon as the previous one ends (beginning is local, and
the first `begin` waits until the broker has fenced the former owner, which is what makes a
restore after `open` read everything that owner committed). A round's transaction holds what
the round made from the partition (events, idempotency requests or key-store changes,
checkpoint frames and the tombstones they allow) and the partition's next input offset; it
commits all of that or nothing.

Every step with the broker is bounded by the transaction timeout: the client's own waits for a
commit, its offsets or a producer id have none, and a round that waited for good would stop the
worker's every partition. A round not committed in time is a failed round (the caller reopens
the partition, which aborts whatever the transaction holds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from worker.runtime.delivery import Partition
from worker.runtime.outbox import Outbox, Sink, transaction_error

log = logging.getLogger("callgate.transactions")


class Transactions:
    """The producers and open transactions of the partitions this worker owns."""

    def __init__(
        self,
        new_producer: Callable[[str, int], Any],
        sink: Sink,
        clock: Callable[[], float],
        *,
        group: str,
        timeout_s: float,
    ) -> None:
        self._new_producer = new_producer
        self._sink = sink
        self._clock = clock
        self._group = group
        #: a round's writes get half of it, so that its commit has the rest
        self._timeout_s = timeout_s
        self._send_timeout_s = timeout_s / 2
        #: each open partition's producer (an `AIOKafkaProducer`) and its outbox
        self._open: dict[Partition, tuple[Any, Outbox]] = {}

    def outbox(self, where: Partition) -> Outbox | None:
        """Where the partition's records of this round go (None: the partition is not open)."""
        held = self._open.get(where)
        return None if held is None else held[1]

    def __contains__(self, where: Partition) -> bool:
        return where in self._open

    async def open(self, where: Partition) -> None:
        """Start the partition's producer and begin its transaction; returns once the broker has
        fenced the partition's former owner."""
        producer = self._new_producer(*where)
        try:
            await self._bounded(self._start(producer), "open the partition's producer")
        except BaseException:
            await self._stop(producer, 5.0)
            raise
        outbox = Outbox(producer, self._sink, self._clock, transactional=True)
        self._open[where] = (producer, outbox)

    async def close(self, where: Partition, timeout_s: float = 5.0) -> None:
        """Stop the partition's producer; what its open transaction holds is aborted."""
        held = self._open.pop(where, None)
        if held is not None:
            producer, outbox = held
            await outbox.close()
            await self._stop(producer, timeout_s)

    async def close_all(self, timeout_s: float) -> None:
        await asyncio.gather(*(self.close(where, timeout_s) for where in list(self._open)))

    async def commit(self, where: Partition, offset: int) -> None:
        """Commit the partition's round: its queued records and its next input offset, then
        begin the next transaction. Raises KafkaError when the round is not committed: nothing
        of it is visible, and the producer is left as it is (one of `outbox.FENCED`, from a write or
        from the commit: a newer owner has the partition; anything else: reopening the
        partition aborts the transaction)."""
        producer, outbox = self._open[where]
        try:
            await self._bounded(self._commit(producer, outbox, where, offset), "commit a round")
        except KafkaError:
            outbox.clear()
            raise

    async def _commit(self, producer: Any, outbox: Outbox, where: Partition, offset: int) -> None:
        # each request is made only while the transaction is still open (see `transaction_error`)
        await self._send_all(outbox)
        self._raise_if_over(producer)
        await producer.send_offsets_to_transaction({TopicPartition(*where): offset}, self._group)
        self._raise_if_over(producer)
        await producer.commit_transaction()
        await producer.begin_transaction()

    @staticmethod
    def _raise_if_over(producer: Any) -> None:
        error = transaction_error(producer)
        if error is not None:
            raise error

    @staticmethod
    async def _start(producer: Any) -> None:
        await producer.start()
        await producer.begin_transaction()

    async def _bounded(self, step: Coroutine[Any, Any, None], what: str) -> None:
        try:
            await asyncio.wait_for(step, self._timeout_s)
        except TimeoutError:
            raise KafkaError(f"could not {what} within {self._timeout_s:.1f} s") from None

    async def _send_all(self, outbox: Outbox) -> None:
        """Every queued record written (retriable errors retried, refused records replaced)
        within the send timeout; else KafkaError (the producer's own error once it has one)."""
        deadline = self._clock() + self._send_timeout_s
        while True:
            await outbox.flush()
            await outbox.wait_idle()
            if outbox.broken is not None:
                raise outbox.broken
            if not outbox.queued:
                return
            if self._clock() >= deadline:
                raise KafkaError(
                    f"records of the round not written within {self._send_timeout_s:.1f} s"
                )
            await outbox.wait_progress(outbox.backoff.base_s)

    @staticmethod
    async def _stop(producer: Any, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(producer.stop(), timeout=max(0.1, timeout_s))
        except (TimeoutError, KafkaError) as exc:
            log.warning("closing a transactional producer: %r", exc)
