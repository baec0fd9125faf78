"""Exactly once: a transactional producer per owned partition, and its open transaction.

Kafka fences a former owner's transactions by transactional id only. aiokafka's
`send_offsets_to_transaction` does not carry the consumer group's generation (KIP-447), so with
one producer per worker a member paused past its session could, once resumed, commit a round
for partitions that have moved on: the new owner's events, twice. So, as Kafka Streams did
before KIP-447, each owned partition (input or idempotency requests) has a producer of its own,
`<prefix>-<topic>-<partition>`. When a partition's new owner opens its producer, the broker
completes the former owner's open transaction and refuses its later ones (`ProducerFenced`).

A partition's transaction is begun as soon as the previous one ends (beginning is local, and
the first `begin` waits until the broker has fenced the former owner, which is what makes a
restore after `open` read everything that owner committed). The records the rounds make from
the partition are written into its open transaction as they are made (`add`, `dispatch`); a
`commit` adds the partition's next input offset and commits all of it, or nothing. Records
made while a commit runs wait for the next transaction: a transaction holds exactly the rounds
its offset reflects.

Every step with the broker is bounded by the transaction timeout: the client's own waits for a
commit, its offsets or a producer id have none, and a commit that waited for good would stop
the worker's every partition. A commit not done in time is a failed one (the caller reopens
the partition, which aborts whatever the transaction holds). A step is never cancelled, though:
it runs as a task of its own that is read when it ends (`kafka.Requests`: aiokafka waits for a
transaction's offsets and its commit under `asyncio.shield`, and a step cut off there, then
fenced, left "Future exception was never retrieved"), and makes no further request once it is
given up; what is left of it when its producer stops is cancelled then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from worker.runtime.kafka import Requests
from worker.runtime.ledger import Partition
from worker.runtime.outbox import (
    Outbox,
    Record,
    Sink,
    observe_failed_transaction,
    transaction_error,
)

log = logging.getLogger("callgate.transactions")

#: How long a step still running when its producer has stopped may take to end (an answer the
#: stop gave it is read within a few loop turns; one pending then never comes): then cancelled.
STEPS_AFTER_STOP_S = 0.1

#: a step with the broker, told when it is given up (`Transactions._bounded`)
_Step = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


@dataclass(slots=True)
class _Open:
    """An owned partition's producer, its transaction's outbox, and what waits for the next."""

    producer: Any
    outbox: Outbox
    #: the producer's steps (`Transactions._bounded`), read to their end
    steps: Requests
    #: the transaction is being committed: what is made meanwhile goes into the next one
    committing: bool = False
    next: list[Record] = field(default_factory=list)


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
        #: a commit's writes get half of it, so that the rest of the commit has the rest
        self._timeout_s = timeout_s
        self._send_timeout_s = timeout_s / 2
        self._open: dict[Partition, _Open] = {}

    def outbox(self, where: Partition) -> Outbox | None:
        """The outbox of the partition's open transaction (None: the partition is not open)."""
        held = self._open.get(where)
        return None if held is None else held.outbox

    def __contains__(self, where: Partition) -> bool:
        return where in self._open

    def committing(self, where: Partition) -> bool:
        held = self._open.get(where)
        return held is not None and held.committing

    @property
    def held_records(self) -> int:
        """Records added and not committed (or let go) yet, every partition's."""
        return sum(held.outbox.held_records + len(held.next) for held in self._open.values())

    @property
    def held_bytes(self) -> int:
        return sum(
            held.outbox.held_bytes + sum(len(r.key or b"") + len(r.value or b"") for r in held.next)
            for held in self._open.values()
        )

    async def open(self, where: Partition) -> None:
        """Start the partition's producer and begin its transaction; returns once the broker has
        fenced the partition's former owner."""
        producer = self._new_producer(*where)
        steps = Requests("a step of a partition's transaction", log)
        try:
            await self._bounded(steps, self._start(producer), "open the partition's producer")
        except BaseException:
            await self._stop(producer, steps, 5.0)
            raise
        outbox = Outbox(producer, self._sink, self._clock, transactional=True)
        self._open[where] = _Open(producer, outbox, steps)

    def add(self, where: Partition, record: Record) -> None:
        """A record of the partition's open transaction (of the next, while one commits)."""
        held = self._open[where]
        if held.committing:
            held.next.append(record)
        else:
            held.outbox.add(record)

    def dispatch(self) -> None:
        """Write what the open transactions hold (their outboxes' senders do, beside)."""
        for held in self._open.values():
            if not held.committing:
                held.outbox.dispatch()

    async def close(self, where: Partition, timeout_s: float = 5.0) -> None:
        """Stop the partition's producer; what its open transaction holds is aborted."""
        held = self._open.pop(where, None)
        if held is not None:
            await held.outbox.close()
            await self._stop(held.producer, held.steps, timeout_s)

    async def close_all(self, timeout_s: float) -> None:
        await asyncio.gather(*(self.close(where, timeout_s) for where in list(self._open)))

    def commit(self, where: Partition, offset: int) -> asyncio.Task[None]:
        """Commit the partition's transaction: the records added so far and its next input
        offset, then begin the next transaction; records added from now on wait for it. The
        task raises KafkaError when the transaction is not committed: nothing of it is
        visible, and the producer is left as it is (one of `outbox.FENCED`, from a write or
        from the commit: a newer owner has the partition; anything else: reopening the
        partition aborts the transaction)."""
        held = self._open[where]
        assert not held.committing, "one commit of a partition at a time"
        held.committing = True
        return asyncio.ensure_future(self._commit(where, held, offset))

    async def _commit(self, where: Partition, held: _Open, offset: int) -> None:
        try:
            await self._bounded(
                held.steps, self._steps(held, where, offset), "commit a transaction"
            )
        except KafkaError:
            held.outbox.clear()
            held.next.clear()
            raise
        finally:
            held.committing = False
        if self._open.get(where) is not held:  # closed meanwhile: its records go with it
            return
        for record in held.next:
            held.outbox.add(record)
        held.next.clear()
        held.outbox.dispatch()

    def _steps(self, held: _Open, where: Partition, offset: int) -> _Step:
        async def steps(given_up: asyncio.Event) -> None:
            producer = held.producer
            # each request is made only while the transaction is still open (see
            # `transaction_error`) and the commit is waited for
            await self._send_all(held.outbox)
            self._raise_if_over(producer, given_up)
            await producer.send_offsets_to_transaction(
                {TopicPartition(*where): offset}, self._group
            )
            self._raise_if_over(producer, given_up)
            await producer.commit_transaction()
            if given_up.is_set():
                return  # made, though no longer waited for: said so; the partition reopens
            await producer.begin_transaction()

        return steps

    @staticmethod
    def _raise_if_over(producer: Any, given_up: asyncio.Event) -> None:
        if given_up.is_set():  # no further request: the step ends as if cancelled, unsaid
            raise asyncio.CancelledError
        error = transaction_error(producer)
        if error is not None:
            raise error

    @staticmethod
    def _start(producer: Any) -> _Step:
        async def start(given_up: asyncio.Event) -> None:
            await producer.start()
            if given_up.is_set():  # the producer is being stopped
                raise asyncio.CancelledError
            await producer.begin_transaction()

        return start

    async def _bounded(self, steps: Requests, step: _Step, what: str) -> None:
        """Run the step within the transaction timeout (else KafkaError). It runs on when it is
        given up (the timeout, or the caller cancelled), and makes no further request then."""
        given_up = asyncio.Event()
        try:
            await steps.wait(step(given_up), self._timeout_s)
        except TimeoutError:
            raise KafkaError(f"could not {what} within {self._timeout_s:.1f} s") from None
        finally:
            given_up.set()

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
                    f"records of the transaction not written within {self._send_timeout_s:.1f} s"
                )
            await outbox.wait_progress(outbox.backoff.base_s)

    @staticmethod
    async def _stop(producer: Any, steps: Requests, timeout_s: float) -> None:
        # a stopped producer answers nothing: what its stop answered is read within a few turns
        await steps.close(
            producer.stop(), timeout_s, "a transactional producer", after_s=STEPS_AFTER_STOP_S
        )
        observe_failed_transaction(producer)
