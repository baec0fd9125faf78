"""The outbox: records to produce, batched per topic partition, acknowledged, retried, replaced.

Records are added during a round and sent at its end with one `send_batch` per topic partition
(no future per record); each batch's acknowledgement is reported to the `Sink` per round.

The producer holds one unsent batch per topic partition: `send_batch` waits while the previous
one is there, which is until the request before it is acknowledged. So each topic partition has
a *sender* task of its own that hands its records over, oldest first, one batch after the other;
`dispatch()` gives them what is queued and returns at once, and the next round is judged while
they wait (the records of the rounds dispatched meanwhile go together, in the batch after the
one waiting). `flush()` also waits until every record was handed over (a transaction commits
only after that).

`dispatch()` never waits for the cluster: it is not even a coroutine. A keyed record's partition
needs its topic's partition count, read from the producer's metadata the first time the topic is
written to and again after its writes failed; for a topic that is gone aiokafka waits the whole
request timeout before it says so. That read is a *placer* task of the topic's, which hands the
topic's records to their senders once it knows (or fails them all at once, as one retriable
write); a round that waited for it would wait once per record, and the topic check that sees
the topic gone would wait behind it.

What goes wrong is handled by kind:

- a retriable error (a leader moved, a timeout, a topic or partition the producer's metadata
  does not show yet, even read again): the batch's records are sent again after a backoff that
  grows per topic while that topic keeps failing; the topic is *failing* until one of its
  batches is acknowledged (health is per topic: another topic's success says nothing about
  this one);
- a permanent error (record too large, invalid topic, not authorized): a batch of several is
  split and sent again one by one, to find the record at fault; a single record that fails for
  good is handed to `Sink.refused`, which may give a bounded substitute to send in its place
  (counted as the same record of its round), and the round moves on either way;
- an error of a transactional producer itself (fenced by a newer producer of its transactional
  id): no write through it can succeed again, whatever the topic. The outbox is *broken*: the
  records are dropped with the transaction they belong to, no topic is marked failing, and the
  transaction's owner (`worker.runtime.transactions`) raises the error instead of committing.

The partition of a keyed record is Kafka's default (murmur2 of the key, as the Java client),
computed natively; a record may also name its partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka.errors import (
    IllegalOperation,
    InvalidProducerEpoch,
    InvalidTopicError,
    KafkaError,
    ProducerFenced,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
)

from worker._native import partition_for_key

log = logging.getLogger("callgate.outbox")

Header = tuple[str, bytes]

#: Errors that no retry will cure.
PERMANENT_ERRORS: tuple[type[KafkaError], ...] = (
    RecordTooLargeError,
    InvalidTopicError,
    TopicAuthorizationFailedError,
)
try:  # the broker's MESSAGE_TOO_LARGE has its own class in some aiokafka versions
    from aiokafka.errors import MessageSizeTooLargeError

    PERMANENT_ERRORS = (*PERMANENT_ERRORS, MessageSizeTooLargeError)
except ImportError:  # pragma: no cover - depends on the aiokafka version
    pass


#: What a newer producer of the same transactional id makes the older one's writes and
#: commits raise.
FENCED: tuple[type[KafkaError], ...] = (ProducerFenced, InvalidProducerEpoch)
#: Errors of a transactional producer, not of the topic written to: it is fenced or may not
#: use its transactional id.
PRODUCER_ERRORS: tuple[type[KafkaError], ...] = (*FENCED, TransactionalIdAuthorizationFailed)


def transaction_error(producer: Any) -> KafkaError | None:
    """The error that ended a transactional producer's transaction, if one did.

    aiokafka reports it once (on the write or the request that met it), then refuses every later
    call of that transaction with `IllegalOperation` or a failed state assertion, neither of which
    says why: a fenced producer must be told from one that failed otherwise (reopening the
    partition of a fenced one would fence its new owner in turn).
    """
    manager = getattr(producer, "_txn_manager", None)
    if manager is None or manager.is_in_transaction():
        return None
    ended = manager.wait_for_transaction_end()  # None before the first transaction began
    if ended is None or not ended.done() or ended.cancelled():
        return None
    error = ended.exception()
    if error is None:
        return None
    return error if isinstance(error, KafkaError) else KafkaError(repr(error))


def observe_failed_transaction(producer: Any) -> None:
    """Read the errors aiokafka left, for a transactional producer whose transaction failed, on
    futures nobody awaits: the transaction's end (`transaction_error`) and the drain waiter of
    each batch the failure closed before it was sent. Done once the producer is stopped, so
    they are not logged as "exception was never retrieved" when it is collected: the error
    itself was already met, on the write or the request that failed."""
    transaction_error(producer)
    accumulator = getattr(producer, "_message_accumulator", None)
    if accumulator is None:
        return
    for batches in (*accumulator._batches.values(), accumulator._pending_batches):
        for batch in batches:
            waiter = batch._drain_waiter
            if waiter.done() and not waiter.cancelled():
                waiter.exception()


@dataclass(slots=True)
class Record:
    """One record to produce, for round `round_id`; `origin` is what a substitute is made from."""

    round_id: int
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    partition: int | None = None
    origin: Any = None
    attempts: int = 0
    #: sent in a batch of its own (after a permanent error of its batch, to find the culprit)
    alone: bool = False


class Sink(Protocol):
    """Who hears how records fared."""

    def acknowledged(self, record: Record) -> None: ...

    def refused(self, record: Record, error: KafkaError) -> Record | None:
        """A record failed for good: its substitute to send instead, or None."""
        ...

    def topic_failing(self, topic: str, error: KafkaError) -> None: ...

    def topic_recovered(self, topic: str) -> None: ...


class Producer(Protocol):
    """What the outbox uses of an `aiokafka.AIOKafkaProducer`."""

    def create_batch(self) -> Any: ...

    async def send_batch(
        self, batch: Any, topic: str, *, partition: int
    ) -> asyncio.Future[Any]: ...

    async def partitions_for(self, topic: str) -> set[int]: ...

    @property
    def client(self) -> MetadataClient: ...


class MetadataClient(Protocol):
    """What the outbox uses of a producer's `aiokafka.AIOKafkaClient`."""

    def force_metadata_update(self) -> Awaitable[bool]: ...


@dataclass(slots=True)
class _TopicHealth:
    failures: int = 0
    retry_at: float = 0.0


@dataclass(slots=True)
class Backoff:
    """Exponential delay for a failing topic: base, doubling, capped."""

    base_s: float = 0.1
    cap_s: float = 5.0

    def delay(self, failures: int) -> float:
        return 0.0 if failures == 0 else min(self.cap_s, self.base_s * 2 ** (failures - 1))


@dataclass
class Outbox:
    producer: Producer
    sink: Sink
    clock: Callable[[], float]
    backoff: Backoff = field(default_factory=Backoff)
    #: the producer is a transaction's: its own errors break the outbox (see the module doc)
    transactional: bool = False
    #: the producer error that broke a transactional outbox
    broken: KafkaError | None = None
    _queued: list[Record] = field(default_factory=list)
    _retry: list[Record] = field(default_factory=list)
    _health: dict[str, _TopicHealth] = field(default_factory=dict)
    _partitions: dict[str, list[int]] = field(default_factory=dict)
    in_flight: int = 0
    #: records added and not acknowledged, refused or let go yet, and their bytes (key and value)
    held_records: int = 0
    held_bytes: int = 0
    _progress: asyncio.Event = field(default_factory=asyncio.Event)
    #: records given to a topic partition's sender and not handed to the producer yet
    _waiting: dict[tuple[str, int], list[Record]] = field(default_factory=dict)
    _senders: dict[tuple[str, int], asyncio.Task[None]] = field(default_factory=dict)
    #: per topic partition, the records its sender took and is handing over
    _handing: dict[tuple[str, int], int] = field(default_factory=dict)
    #: the records of a topic whose partition count its placer is reading (keyed ones, and
    #: any added behind them)
    _unplaced: dict[str, list[Record]] = field(default_factory=dict)
    _placers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    #: what a sender raised that is not the producer's error (a bug): raised by the next call
    _sender_error: BaseException | None = None

    def add(self, record: Record) -> None:
        self._hold(record, 1)
        self._queued.append(record)

    def _hold(self, record: Record, sign: int) -> None:
        self.held_records += sign
        self.held_bytes += sign * (len(record.key or b"") + len(record.value or b""))

    def _kept(self, records: list[Record], drop: Callable[[Record], bool]) -> list[Record]:
        kept = []
        for record in records:
            if drop(record):
                self._hold(record, -1)
            else:
                kept.append(record)
        return kept

    async def wait_progress(self, timeout_s: float) -> None:
        """Until an acknowledgement or a failure arrives, or the timeout."""
        self._progress.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._progress.wait(), timeout=timeout_s)

    async def wait_idle(self) -> None:
        """Until nothing sent is waiting for its acknowledgement."""
        while self.in_flight:
            self._progress.clear()
            await self._progress.wait()

    def discard(self, drop: Callable[[Record], bool]) -> None:
        """Forget queued records that no longer matter (their partition was revoked); what a
        sender is handing over already goes."""
        self._queued = self._kept(self._queued, drop)
        self._retry = self._kept(self._retry, drop)
        for where, waiting in self._waiting.items():
            self._waiting[where] = self._kept(waiting, drop)
        for topic, unplaced in self._unplaced.items():
            self._unplaced[topic] = self._kept(unplaced, drop)

    def clear(self) -> None:
        """Forget everything queued (an aborted transaction, a rewind)."""
        self.discard(lambda record: True)

    @property
    def queued(self) -> int:
        """Records not handed to the producer yet."""
        waiting = sum(len(records) for records in self._waiting.values())
        unplaced = sum(len(records) for records in self._unplaced.values())
        handing = sum(self._handing.values())
        return len(self._queued) + len(self._retry) + unplaced + waiting + handing

    async def close(self) -> None:
        """Stop the senders (before the producer stops: a call pending on a stopped producer
        never returns)."""
        tasks = [*self._placers.values(), *self._senders.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._placers.clear()
        self._senders.clear()

    def failing_topics(self) -> list[str]:
        return [topic for topic, health in self._health.items() if health.failures]

    async def flush(self) -> None:
        """`dispatch()`, then wait until every record was handed to the producer."""
        self.dispatch()
        while self._placers or self._senders:
            await asyncio.wait([*self._placers.values(), *self._senders.values()])
            self._raise_sender_error()

    def dispatch(self) -> None:
        """Give everything queued, and every retry that is due, to its topic partition's sender
        (a keyed record of a topic whose partition count is not known yet: to its placer)."""
        self._raise_sender_error()
        now = self.clock()
        due = [r for r in self._retry if now >= self._health_of(r.topic).retry_at]
        if due:
            self._retry = [r for r in self._retry if now < self._health_of(r.topic).retry_at]
        records, self._queued = due + self._queued, []
        if records:
            self._hand_over(records)

    def _hand_over(self, records: list[Record]) -> None:
        groups: dict[tuple[str, int], list[Record]] = {}
        for record in records:
            topic, partition = record.topic, record.partition
            if partition is None and topic in self._partitions:
                partition = _partition_of(record.key, self._partitions[topic])
            # a record behind one waiting for its topic's placer waits too: a partition keeps
            # the order its records were added in
            if partition is None or topic in self._unplaced:
                self._unplaced.setdefault(topic, []).append(record)
                if topic not in self._placers:
                    self._placers[topic] = asyncio.create_task(self._placer(topic))
            else:
                groups.setdefault((topic, partition), []).append(record)
        for where, group in groups.items():
            self._waiting.setdefault(where, []).extend(group)
            if where not in self._senders:
                self._senders[where] = asyncio.create_task(self._sender(*where))

    def _raise_sender_error(self) -> None:
        error, self._sender_error = self._sender_error, None
        if error is not None:
            raise error

    async def _sender(self, topic: str, partition: int) -> None:
        """Hand the topic partition's waiting records to the producer until none are left."""
        where = (topic, partition)
        try:
            while waiting := self._waiting.pop(where, None):
                self._handing[where] = len(waiting)
                together = [r for r in waiting if not r.alone]
                if together:
                    await self._send(topic, partition, together)
                for record in waiting:
                    if record.alone:
                        await self._send(topic, partition, [record])
        except Exception as exc:  # a bug: the round that dispatches next raises it
            self._sender_error = exc
        finally:
            self._handing.pop(where, None)
            self._senders.pop(where, None)
            self._progress.set()

    async def _placer(self, topic: str) -> None:
        """Read the topic's partition count, then hand the records waiting for it (those that
        arrive meanwhile too) to their partitions' senders. A failed read fails them together:
        one retriable write of the topic, or each record refused for good."""
        try:
            try:
                partitions = sorted(await self.producer.partitions_for(topic))
                if not partitions:
                    raise KafkaError(f"topic {topic!r} has no partitions")
            except KafkaError as exc:
                records = self._unplaced.pop(topic, [])
                if isinstance(exc, PERMANENT_ERRORS):
                    for record in records:
                        self._failed([record], exc)
                elif records:
                    self._failed(records, exc)
                return
            self._partitions[topic] = partitions
            self._hand_over(self._unplaced.pop(topic, []))
        except Exception as exc:  # a bug: the round that dispatches next raises it
            self._sender_error = exc
        finally:
            self._placers.pop(topic, None)
            self._progress.set()

    async def _send(self, topic: str, partition: int, records: list[Record]) -> None:
        batch = self.producer.create_batch()
        in_batch: list[Record] = []
        for record in records:
            if (
                batch.append(
                    key=record.key, value=record.value, timestamp=None, headers=record.headers
                )
                is None
            ):
                await self._submit(batch, topic, partition, in_batch)
                batch, in_batch = self.producer.create_batch(), []
                batch.append(
                    key=record.key, value=record.value, timestamp=None, headers=record.headers
                )
            in_batch.append(record)
        if in_batch:
            await self._submit(batch, topic, partition, in_batch)

    async def _submit(self, batch: Any, topic: str, partition: int, records: list[Record]) -> None:
        for record in records:
            record.attempts += 1
        try:
            if not await self._known(topic, partition):
                raise UnknownTopicOrPartitionError(
                    f"{topic}[{partition}] is not in the producer's view of the cluster yet"
                )
            future = await self.producer.send_batch(batch, topic, partition=partition)
        except KafkaError as exc:
            self._failed(records, exc)
            return
        except IllegalOperation as exc:
            if not self.transactional:
                raise
            # the transaction is over: its error was reported on an earlier write or request
            self._break(transaction_error(self.producer) or KafkaError(f"{exc}"), records)
            return
        self.in_flight += len(records)
        future.add_done_callback(lambda done: self._done(done, topic, records))

    async def _known(self, topic: str, partition: int) -> bool:
        """Whether the producer's view of the cluster has the partition (aiokafka asserts it
        does). A partition added to a topic (a changelog grown with its input) shows only once
        that view is read again, which is done here, at once."""
        if partition in await self.producer.partitions_for(topic):
            return True
        await self.producer.client.force_metadata_update()
        return partition in await self.producer.partitions_for(topic)

    def _done(self, done: asyncio.Future[Any], topic: str, records: list[Record]) -> None:
        self.in_flight -= len(records)
        self._progress.set()
        error = None if not done.cancelled() else KafkaError("send cancelled")
        if error is None:
            exc = done.exception()
            if exc is not None:
                error = exc if isinstance(exc, KafkaError) else KafkaError(repr(exc))
        if error is not None:
            self._failed(records, error)
            return
        health = self._health_of(topic)
        if health.failures:
            health.failures = 0
            health.retry_at = 0.0
            log.info("topic %s: writes succeed again", topic)
            self.sink.topic_recovered(topic)
        for record in records:
            self._hold(record, -1)
            self.sink.acknowledged(record)

    def _failed(self, records: list[Record], error: KafkaError) -> None:
        if self.transactional and isinstance(error, PRODUCER_ERRORS):
            self._break(error, records)
            return
        if isinstance(error, PERMANENT_ERRORS):
            if len(records) > 1:  # find the record at fault: send each alone
                for record in records:
                    record.alone = True
                    self._queued.append(record)
                return
            (record,) = records
            log.error("topic %s refused a record for good: %r", record.topic, error)
            self._hold(record, -1)
            substitute = self.sink.refused(record, error)
            if substitute is not None:
                self.add(substitute)
            return
        topic = records[0].topic
        health = self._health_of(topic)
        health.failures += 1
        health.retry_at = self.clock() + self.backoff.delay(health.failures)
        if health.failures == 1:
            log.warning("topic %s: write failed, will retry: %r", topic, error)
        self.sink.topic_failing(topic, error)
        self._partitions.pop(topic, None)  # the partition count may have changed
        self._retry.extend(records)

    def _break(self, error: KafkaError, records: list[Record]) -> None:
        """The records are dropped with the transaction they belong to."""
        for record in records:
            self._hold(record, -1)
        if self.broken is None:
            # the round that owns the transaction reports it, once, as fenced or failed
            log.info("a transactional producer can write no more: %r", error)
            self.broken = error

    def _health_of(self, topic: str) -> _TopicHealth:
        health = self._health.get(topic)
        if health is None:
            health = self._health[topic] = _TopicHealth()
        return health


def _partition_of(key: bytes | None, partitions: list[int]) -> int:
    """Kafka's default partition of a keyed record; the first partition for no key."""
    return partitions[0] if key is None else partitions[partition_for_key(key, len(partitions))]
