"""`callgate run`: the Kafka shell around the pure processor. Start, the round loop, stop.

Lifecycle: `start` (output topics checked to exist, internal topics made sure of, clients
connected, group joined), `run` (rounds until `request_stop`), `close` (what is in flight
acknowledged, checkpointed and committed, within the grace period).

A round fetches a batch and hands each partition's records, as they come, to the processor (an
input topic) or to the key owner (the idempotency requests topic); what they make goes to the
outbox, and the protocol of `worker.runtime.delivery` moves the round from sent to acknowledged
to checkpointed to committed. A round never waits for the previous round's acknowledgements: the
next fetch overlaps them. Under `exactly_once` each round is one transaction instead.

Rebalances wait for the round in progress to end (the consumer calls its rebalance listener from
a task of its own, and a partition given up in the middle of a round would lose its producer
under a commit that then never ends). A revoked partition's rounds are finished (bounded), its
offsets committed, its state dropped; an assigned input partition is restored from its
changelog (made, or given the partition, first when the input is new or grew) and fetching
resumes right after the offset its checkpoint reflects; an assigned idempotency partition
restores its keys.
At least once, a failing topic or too many unacknowledged records pause fetching (the loop keeps
polling, so the group membership stays) until the backlog drains; exactly once, a round whose
writes fail is rewound and the next round tries again. Under both, a failing write has the
topics checked: a deleted outcome topic is waited for, a deleted state topic stops the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, NoOffsetForPartitionError, OffsetOutOfRangeError

from worker.core.events import encode, record_headers, substitute_rejection
from worker.core.idempotency import KeyStore
from worker.core.processor import Emission, Processor, Route
from worker.errors import (
    BrokerError,
    CallgateError,
    ConfigError,
    InfrastructureError,
    StateError,
)
from worker.metrics import Metrics
from worker.model import Code, Outcome, Phase
from worker.runtime.checkpoints import ChangelogRecord, Writer, new_writer_id, restore
from worker.runtime.delivery import Ledger, Partition
from worker.runtime.flow import FlowControl
from worker.runtime.kafka import Kafka, Listener
from worker.runtime.keys import KeyOwners
from worker.runtime.outbox import FENCED, Outbox, Record
from worker.runtime.topic_watch import TopicWatch
from worker.runtime.topics import (
    TopicSpec,
    changelog_topic,
    input_subscription,
    keys_topic,
    requests_topic,
    state_topics_deleted,
)
from worker.runtime.transactions import Transactions
from worker.settings import Settings

log = logging.getLogger("callgate.worker")


@dataclass(slots=True)
class Stats:
    """Counts since start, for logs and tests."""

    records: int = 0
    emitted: int = 0
    acknowledged: int = 0
    #: outcome events acknowledged (what a reader of the outcome topics can count)
    events: int = 0
    substituted: int = 0
    dropped: int = 0
    commits: int = 0
    commit_errors: int = 0
    rebalances: int = 0
    pauses: int = 0
    checkpoints: int = 0
    checkpoint_bytes: int = 0
    rewinds: int = 0


#: Why a topic fails when it does not exist at all.

#: What an outbox record is, for its acknowledgement.
OUTPUT, CHECKPOINT, TOMBSTONE, KEY_CHANGE = "output", "checkpoint", "tombstone", "key-change"


@dataclass(slots=True)
class Origin:
    kind: str
    partition: Partition
    emission: Emission | None = None
    #: the last record of a checkpoint frame: its size and kind, counted once acknowledged
    frame_bytes: int = 0
    full_frame: bool = False


@dataclass(slots=True)
class RoundResult:
    id: int
    #: records made, per input partition they came from
    records: dict[Partition, int] = field(default_factory=dict)
    checkpoints: dict[Partition, list[ChangelogRecord]] = field(default_factory=dict)
    offsets: dict[Partition, int] = field(default_factory=dict)


class Worker:
    """The worker. `await start()`, `await run()` until `request_stop()`, then `await close()`."""

    def __init__(
        self,
        settings: Settings,
        processor: Processor,
        new_key_store: Callable[[], KeyStore],
        metrics: Metrics,
        *,
        kafka: Kafka | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.processor = processor
        self.metrics = metrics
        self.stats = Stats()
        self._kafka = kafka or Kafka(settings)
        self._clock = clock
        topics = settings.topics
        group = settings.kafka.group_id
        self._group = group
        self._requests = requests_topic(group)
        self._keys = keys_topic(group)
        self._topic_of: dict[str, str] = {
            Route.ACCEPTED: topics.accepted,
            Route.REJECTED: topics.rejected,
            Route.INCOMPLETE: topics.incomplete,
            Route.IDEMPOTENCY: self._requests,
        }
        self._outcome_topics = frozenset((topics.accepted, topics.rejected, topics.incomplete))
        self._topics = TopicWatch(
            self._kafka.missing_topics,
            clock,
            settings.kafka.topic_check_interval_ms / 1000,
            written=[*sorted(self._outcome_topics), self._requests],
        )
        # the state topics: the keys', and each input's changelog once made sure of
        self._topics.watch_state([self._keys])
        #: input topic -> how many partitions its changelog was made sure to have
        self._changelog_partitions: dict[str, int] = {}
        self._exactly_once = settings.delivery.guarantee == "exactly_once"
        self._consumer: Any = None
        #: at_least_once: one producer and its outbox; exactly_once: one per owned partition
        self._producer: Any = None
        self._outbox: Outbox | None = None
        self._transactions: Transactions | None = None
        #: exactly_once: partitions whose producer was fenced, and when (see `_take_back`)
        self._fenced: dict[Partition, float] = {}
        self.ledger = Ledger()
        self._writers: dict[Partition, Writer] = {}
        self._owners = KeyOwners(self._requests, new_key_store, settings.limits.max_feedback_bytes)
        self._assignment: set[TopicPartition] = set()
        self._flow = FlowControl(settings.kafka.max_pending_produces)
        self._stop = asyncio.Event()
        #: held by a round from its fetched batch to its end, and by a rebalance
        self._round = asyncio.Lock()
        self._stop_requested: asyncio.Future[Any] | None = None  # `_stop.wait()`, for fetches
        self._joined = False
        self._fatal: InfrastructureError | None = None
        self._last_commit = 0.0
        #: the offset commit running beside the rounds (`_commit_when_due`)
        self._committing: asyncio.Task[None] | None = None
        self._next_round = 0
        self._dropped = (0, 0)  # the reassembler's dropped-chunk counts already reported

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Check and make the topics, connect, join. Raises `BrokerError` or `ConfigError`."""
        settings = self.settings
        try:
            await self._kafka.start()
            await self._prepare_topics()
            self._consumer = self._kafka.consumer()
            await self._consumer.start()
            if not self._exactly_once:
                self._producer = self._kafka.producer()
                await self._producer.start()
        except KafkaError as exc:
            await self._close_clients()
            servers = ",".join(settings.kafka.bootstrap_servers)
            raise BrokerError(f"cannot work with Kafka at {servers}: {exc!r}") from None
        except CallgateError:
            await self._close_clients()
            raise
        if self._exactly_once:
            self._transactions = Transactions(
                self._kafka.transactional_producer,
                self,
                self._clock,
                group=self._group,
                timeout_s=settings.delivery.transaction_timeout_ms / 1000,
            )
        else:
            self._outbox = Outbox(self._producer, self, self._clock)
        listener = Listener(self._on_revoked, self._on_assigned)
        topics = settings.topics
        if topics.input_pattern:
            pattern = input_subscription(topics.input_pattern, self._group, self._outcome_topics)
            self._consumer.subscribe(pattern=pattern, listener=listener)
        else:
            self._consumer.subscribe(
                topics=[*topics.input_topics, self._requests], listener=listener
            )
        log.info(
            "started: group %s, input %s, %s",
            self._group,
            topics.input,
            settings.delivery.guarantee,
        )

    async def _prepare_topics(self) -> None:
        """The outcome topics must exist (a broker may acknowledge writes to a missing topic
        and lose them); the internal ones are created when missing, and checked."""
        topics = self.settings.topics
        missing = await self._kafka.missing_topics(
            [topics.accepted, topics.rejected, topics.incomplete]
        )
        if missing:
            raise BrokerError(f"output topics do not exist: {', '.join(missing)}")
        partitions = self.settings.idempotency.partitions
        await self._kafka.ensure_topics(
            [
                TopicSpec(self._requests, partitions, compacted=False),
                TopicSpec(self._keys, partitions, compacted=True),
            ]
        )
        await self._ensure_changelogs(dict.fromkeys(topics.input_topics, 0))

    async def _ensure_changelogs(self, inputs: Mapping[str, int]) -> None:
        """Each input topic's changelog exists, compacted, with a partition for each of the
        input's; it is watched from then on (a state topic deleted stops the worker). `inputs`:
        input topic -> the partitions it has at least (those its assignment shows: the
        cluster's answer may lag the assignment). Inputs named are made sure of at start;
        those a pattern matches when first assigned, and again when a partition beyond their
        changelog's is (the input grew). Raises `ConfigError` for a changelog that cannot
        serve, `BrokerError` or `KafkaError` from the broker."""
        listed = await self._kafka.partition_counts(inputs)
        counts: dict[str, int] = {}
        for name, at_least in inputs.items():
            count = max(listed.get(name, 0), at_least)
            if count:  # a named input not made yet gets its changelog when first assigned
                counts[name] = count
        specs = [
            TopicSpec(changelog_topic(self._group, name), count, compacted=True, grows=True)
            for name, count in counts.items()
        ]
        await self._kafka.ensure_topics(specs)
        self._changelog_partitions.update(counts)
        self._topics.watch_state(spec.name for spec in specs)

    def request_stop(self) -> None:
        """Stop fetching after the current round (safe to call from a signal handler)."""
        self._stop.set()

    def _stop_fatally(self, error: InfrastructureError) -> None:
        """Stop, and have `run` raise `error`: state that cannot be kept or read."""
        log.error("%s", error)
        if self._fatal is None:
            self._fatal = error
        self.request_stop()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> None:
        """Rounds until `request_stop()`. Infrastructure errors are retried, never raised, but
        for a fatal one (state that cannot be kept), which stops the worker."""
        while not self._stop.is_set():
            await self.step()
        if self._fatal is not None:
            raise self._fatal

    async def close(self) -> None:
        """Within the grace period: what is in flight acknowledged, checkpointed, committed."""
        deadline = self._clock() + self.settings.shutdown_grace_s
        if self._consumer is not None and self._assignment:
            self._consumer.pause(*self._assignment)
        if not self._exactly_once:
            await self._drain(deadline - 0.5)
            if not self.ledger.idle():
                log.warning(
                    "grace period over with %d records unacknowledged; their input is not "
                    "committed and will be judged again, to the same verdicts",
                    self.ledger.pending_records,
                )
        await self._close_clients(max(0.1, deadline - self._clock()))
        log.info(
            "stopped: %d records, %d events, %d commits",
            self.stats.records,
            self.stats.emitted,
            self.stats.commits,
        )

    async def _drain(self, deadline: float) -> None:
        """Send, checkpoint and commit what is in flight, until done or the deadline (a hard
        one: a commit that waits on the group is cut off, and its offsets committed later or
        by the partition's next owner)."""
        try:
            await asyncio.wait_for(self._drain_until_idle(deadline), deadline - self._clock())
        except TimeoutError:
            log.warning("draining cut off at its deadline")

    async def _drain_until_idle(self, deadline: float) -> None:
        outbox = self._outbox
        while outbox is not None and self._clock() < deadline:
            await self._advance(force_commit=True)
            if self.ledger.idle() and not outbox.queued and not outbox.in_flight:
                return
            await outbox.wait_progress(min(0.1, max(0.0, deadline - self._clock())))

    async def _close_clients(self, timeout_s: float = 5.0) -> None:
        for pending in (self._stop_requested, self._committing):
            if pending is not None:
                pending.cancel()
        self._topics.cancel()
        if self._transactions is not None:
            await self._transactions.close_all(timeout_s / 2)
        if self._outbox is not None:
            await self._outbox.close()
        producer, consumer = self._producer, self._consumer
        self._producer = self._consumer = None
        try:
            await asyncio.wait_for(self._kafka.close(), timeout=max(0.1, timeout_s / 2))
        except (TimeoutError, KafkaError) as exc:
            log.warning("closing the admin client: %r", exc)
        for client in (producer, consumer):
            if client is None:
                continue
            try:
                await asyncio.wait_for(client.stop(), timeout=max(0.1, timeout_s / 2))
            except (TimeoutError, KafkaError) as exc:
                log.warning("closing %s: %r", type(client).__name__, exc)

    # -- a round -------------------------------------------------------------------------------

    async def step(self) -> None:
        """Fetch one batch, judge it, send what it made, move earlier rounds along."""
        try:
            batch = await self._fetch()
        except OffsetOutOfRangeError as exc:
            async with self._round:
                await self._skip_deleted(exc.args[0])
            return
        except NoOffsetForPartitionError as exc:
            # a partition being assigned, not placed yet: its restore places it (a fetch runs
            # beside the rebalance listener)
            log.debug("fetch: %r", exc)
            return
        except KafkaError as exc:
            log.warning("fetch failed: %r", exc)
            batch = {}
        if self._stop.is_set():
            return  # what was fetched is fetched again by whoever judges it next
        async with self._round:
            # a partition revoked while this batch was fetched is its next owner's
            batch = {tp: records for tp, records in batch.items() if tp in self._assignment}
            if self._topics.missing:
                await self._recheck_missing(batch)
            elif self._exactly_once:
                if batch:
                    await self._transaction(batch)
                await self._apply_check()
                if self._fenced:
                    await self._take_back()
            else:
                if batch:
                    result = self._judge(batch)
                    self.ledger.open_round(
                        result.id, result.records, result.checkpoints, result.offsets
                    )
                await self._advance()
            self._apply_flow()

    async def _fetch(self) -> Mapping[TopicPartition, list[Any]]:
        """The next batch; nothing once a stop is requested. The consumer waits out a rebalance
        in progress whatever the fetch timeout, and a stop must not wait for the group."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        kafka = self.settings.kafka
        fetch = asyncio.ensure_future(
            consumer.getmany(timeout_ms=kafka.fetch_timeout_ms, max_records=kafka.fetch_max_records)
        )
        if self._stop_requested is None:
            self._stop_requested = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait((fetch, self._stop_requested), return_when=asyncio.FIRST_COMPLETED)
        if not fetch.done():
            fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError, KafkaError):
                await fetch
            return {}
        batch: Mapping[TopicPartition, list[Any]] = fetch.result()
        return batch

    async def _skip_deleted(self, out_of_range: Mapping[TopicPartition, int]) -> None:
        """Fetch positions the log no longer has: the records there were deleted before they
        were judged (retention shorter than the lag, records deleted by hand), or the log is
        shorter than it was (the topic was recreated). Fetching goes on from the log's start,
        and the loss is said: the calls in the deleted records get no verdict, or one from
        what is left of them."""
        consumer = self._consumer
        if consumer is None:
            return
        try:
            positions = {}
            for tp, at in out_of_range.items():
                # a partition revoked or restored since the fetch has moved on from `at`
                if tp in self._assignment and await consumer.position(tp) == at:
                    positions[tp] = at
            starts = await consumer.beginning_offsets(list(positions)) if positions else {}
        except KafkaError as exc:  # the next fetch raises again, and this is tried again
            log.warning("cannot read where %d partitions start: %r", len(out_of_range), exc)
            return
        for tp, at in positions.items():
            start = starts[tp]
            if at < start:
                log.error(
                    "%s[%d]: records %d to %d were deleted before they were judged: their "
                    "calls get no verdict, or one from what is left; fetching from %d",
                    tp.topic,
                    tp.partition,
                    at,
                    start - 1,
                    start,
                )
                self.metrics.input_records_deleted(start - at)
            else:
                log.error(
                    "%s[%d]: offset %d is past the end of the log (was the topic recreated?); "
                    "fetching from its start, %d",
                    tp.topic,
                    tp.partition,
                    at,
                    start,
                )
            consumer.seek(tp, start)

    def _judge(self, batch: Mapping[TopicPartition, list[Any]]) -> RoundResult:
        """Steps 1 and 2: the batch judged into the outbox, each input partition checkpointed."""
        result = RoundResult(self._next_round)
        self._next_round += 1
        for tp, fetched in batch.items():
            if not fetched:
                continue
            where = (tp.topic, tp.partition)
            self.stats.records += len(fetched)
            result.offsets[where] = fetched[-1].offset + 1
            highwater = self._consumer.highwater(tp) if self._consumer is not None else None
            if highwater is not None:
                self.metrics.set_lag(
                    tp.topic, tp.partition, max(0, highwater - result.offsets[where])
                )
            if tp.topic == self._requests:
                result.records[where] = self._decide_keys(result.id, tp.partition, fetched)
                continue
            self.metrics.add_records(len(fetched))
            for emission in self.processor.feed(tp.topic, tp.partition, fetched):
                self._add(
                    Record(
                        result.id,
                        self._topic_of[emission.route],
                        emission.key,
                        emission.value,
                        emission.headers,
                        origin=Origin(OUTPUT, where, emission),
                    )
                )
                self._observe(emission)
                result.records[where] = result.records.get(where, 0) + 1
                self.stats.emitted += 1
            result.checkpoints[where] = self._checkpoint(tp.topic, tp.partition)
        assembler = self.processor.assembler
        self.metrics.set_open_calls(assembler.open_calls)
        self.metrics.set_buffered_bytes(assembler.buffered_bytes)
        duplicate, late = assembler.duplicate_chunks, assembler.late_chunks
        self.metrics.add_dropped_chunks(duplicate - self._dropped[0], late - self._dropped[1])
        self._dropped = (duplicate, late)
        return result

    def _checkpoint(self, topic: str, partition: int) -> list[ChangelogRecord]:
        where = (topic, partition)
        writer = self._writers.get(where)
        if writer is None:
            writer = Writer(self.settings.delivery.checkpoint_record_bytes, new_writer_id())
            self._writers[where] = writer
        full = writer.wants_full()
        body = self.processor.checkpoint(topic, partition, full=full)
        offset = self.processor.next_offset(topic, partition)
        assert offset is not None, "checkpoint after feeding"
        return writer.frame(body, full=full, offset=offset)

    def _decide_keys(self, round_id: int, partition: int, fetched: list[Any]) -> int:
        """The owner's decisions on idempotency requests: events, and key-store changes."""
        where = (self._requests, partition)
        count = 0
        for decided in self._owners.decide(partition, fetched):
            resolution = decided.resolution
            schema = resolution.schema
            version = schema.version if schema is not None else None
            headers = record_headers(resolution.outcome, resolution.tool, version)
            topic = self._topic_of[resolution.outcome]
            event = resolution.event
            self._add(
                Record(
                    round_id,
                    topic,
                    resolution.call_id.encode(),
                    event,
                    headers,
                    None,
                    Origin(OUTPUT, where),
                )
            )
            for key, value in decided.changes:
                self._add(
                    Record(
                        round_id, self._keys, key, value, [], partition, Origin(KEY_CHANGE, where)
                    )
                )
            count += 1 + len(decided.changes)
            self.metrics.idempotency_decision(resolution.decision)
            self.metrics.decided(
                resolution.outcome,
                resolution.tool,
                Phase.IDEMPOTENCY if resolution.code is not None else None,
                resolution.code,
            )
        self.metrics.set_idempotency_keys(len(self._owners))
        return count

    def _add(self, record: Record) -> None:
        if self._transactions is not None:
            outbox = self._transactions.outbox(record.origin.partition)
            assert outbox is not None, "a record of a partition with no open transaction"
            outbox.add(record)
        else:
            assert self._outbox is not None, "start() first"
            self._outbox.add(record)

    def _observe(self, emission: Emission) -> None:
        # a keyed call's phases and repairs count here; its outcome where its key's owner decides
        self.metrics.observe(emission.verdict, emission.call.tool)

    # -- steps 3 to 5 (at least once) ----------------------------------------------------------

    async def _advance(self, *, force_commit: bool = False) -> None:
        outbox = self._outbox
        assert outbox is not None
        outbox.dispatch()
        # Checkpoints wait for the check. A failing write may mean its topic was deleted: such a
        # topic never acknowledges, and when every round in flight owes it records none waits
        # for the check, so the failing writes start it too.
        if self._topics.failing or self.ledger.awaiting_verification():
            self._topics.check_when_due()
        await self._apply_check()
        for round_ in self.ledger.checkpoints_to_send(self._topics.verified_at):
            for (topic, partition), frames in round_.checkpoints.items():
                self._add_frames(round_.id, topic, partition, frames)
        outbox.dispatch()
        await self._commit_when_due(force=force_commit)

    async def _commit_when_due(self, *, force: bool) -> None:
        """Step 5: commit the offsets whose rounds are acknowledged and checkpointed. A due
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
        interval = self.settings.kafka.commit_interval_ms / 1000
        if force:
            await self._commit(self.ledger.take_committable())
        elif self._clock() - self._last_commit >= interval:
            offsets = self.ledger.take_committable()
            if offsets:
                self._committing = asyncio.ensure_future(self._commit(offsets))

    def _add_frames(
        self, round_id: int, topic: str, partition: int, frames: list[ChangelogRecord]
    ) -> None:
        changelog = changelog_topic(self._group, topic)
        size = sum(len(value or b"") for _, value, _ in frames)
        full = bool(frames) and dict(frames[0][2]).get("frame-kind") == b"full"
        last = len(frames) - 1
        for index, (key, value, headers) in enumerate(frames):
            origin = Origin(CHECKPOINT, (topic, partition))
            if index == last:
                origin.frame_bytes, origin.full_frame = size, full
            self._add(Record(round_id, changelog, key, value, headers, partition, origin))

    async def _commit(self, offsets: Mapping[Partition, int]) -> None:
        consumer = self._consumer
        if consumer is None or not offsets:
            return
        assigned = {(tp.topic, tp.partition) for tp in self._assignment}
        request: dict[TopicPartition, int] = {}
        for (topic, partition), offset in offsets.items():
            if (topic, partition) not in assigned:
                continue
            tp = TopicPartition(topic, partition)
            highwater = consumer.highwater(tp)
            if highwater is not None and offset > highwater:
                # the broker's log is shorter than what was read: it lost data (a restart of
                # a memory-only broker); committing would skip whatever it holds now
                log.error(
                    "%s[%d]: not committing %d, past the log's end %d",
                    topic,
                    partition,
                    offset,
                    highwater,
                )
                continue
            request[tp] = offset
        if not request:
            return
        # the client retries a commit for as long as the coordinator is unavailable: bounded
        # here, as a revoke and a stop wait for it
        timeout_s = self.settings.kafka.request_timeout_ms / 1000
        try:
            await asyncio.wait_for(consumer.commit(request), timeout_s)
        except (KafkaError, TimeoutError) as exc:
            self.stats.commit_errors += 1
            self.metrics.commit_error()
            log.warning("commit failed (the next one carries these offsets): %r", exc)
            self.ledger.recommit(offsets)
            return
        self._last_commit = self._clock()
        self.stats.commits += 1

    # -- the outbox's callbacks (its `Sink`) ---------------------------------------------------

    def acknowledged(self, record: Record) -> None:
        origin: Origin = record.origin
        if origin.kind in (OUTPUT, KEY_CHANGE):
            self.stats.acknowledged += 1
            if record.topic in self._outcome_topics:
                self.stats.events += 1
            self.ledger.acknowledged(record.round_id, origin.partition, self._clock())
        elif origin.kind == CHECKPOINT:
            self.ledger.checkpoint_acknowledged(record.round_id, origin.partition)
            if origin.frame_bytes:
                self.stats.checkpoints += 1
                self.stats.checkpoint_bytes += origin.frame_bytes
                self.metrics.checkpoint(origin.frame_bytes, full=origin.full_frame)
            writer = self._writers.get(origin.partition)
            if origin.full_frame and writer is not None and not self._exactly_once:
                for key, value, headers in writer.tombstones():
                    self._add(
                        Record(
                            record.round_id,
                            record.topic,
                            key,
                            value,
                            headers,
                            origin=Origin(TOMBSTONE, origin.partition),
                            partition=record.partition,
                        )
                    )

    def refused(self, record: Record, error: KafkaError) -> Record | None:
        origin: Origin = record.origin
        if origin.kind in (CHECKPOINT, KEY_CHANGE):
            self._stop_fatally(
                StateError(
                    f"{record.topic} refuses writes for good ({error!r}): the worker stops, "
                    "as state it cannot keep would be lost"
                )
            )
            return None
        if origin.kind == TOMBSTONE:
            return None
        emission = origin.emission
        rejected = self.settings.topics.rejected
        if emission is None or record.topic == rejected:
            self.stats.dropped += 1
            self.metrics.event_dropped()
            log.error(
                "an event for %s was refused for good, with no place for a substitute: %r",
                record.topic,
                error,
            )
            self.ledger.acknowledged(record.round_id, origin.partition, self._clock())
            return None
        limits = self.settings.limits
        detail = f"{record.topic} refused the event ({type(error).__name__})"
        substitute = substitute_rejection(
            emission.verdict, Code.OUTPUT_REFUSED, detail, limits.max_feedback_bytes
        )
        call = emission.call
        value = encode(call, substitute, limits.max_event_bytes, limits.max_feedback_bytes)
        self.stats.substituted += 1
        self.metrics.event_substituted()
        return Record(
            record.round_id,
            rejected,
            call.call_id.encode(),
            value,
            record_headers(
                Outcome.REJECTED,
                call.tool,
                substitute.schema.version if substitute.schema is not None else None,
            ),
            None,
            Origin(OUTPUT, origin.partition),
        )

    async def _recheck_missing(self, batch: Mapping[TopicPartition, list[Any]]) -> None:
        """While a topic is missing nothing is judged (a batch fetched before the pause is
        fetched again after the rewind); see every interval whether it is back."""
        if batch:
            log.debug("dropping a batch of %d partitions while a topic is missing", len(batch))
            await self._rewind()
        self._topics.check_when_due()
        await self._topics.wait(0.05)
        await self._apply_check()

    async def _apply_check(self) -> None:
        """Act on a finished check (`worker.runtime.topic_watch`). A broker may acknowledge
        writes to a deleted topic and drop them: when one is found gone, the outputs since the
        last checkpoint may be too, so every partition is rewound to its checkpoint, once (the
        calls are judged and sent again once the topic is back), and nothing is judged until
        it is. A deleted state topic (a changelog, the idempotency keys) took the state with
        it: the worker stops."""
        found = self._topics.finished()
        if found is None:
            return
        if found.state_gone:
            self._stop_fatally(state_topics_deleted(found.state_gone))
        elif found.newly_missing:
            if self._outbox is not None:
                self._outbox.clear()
            await self._rewind()

    def topic_failing(self, topic: str, error: KafkaError) -> None:
        self.metrics.produce_error()
        self._topics.write_failing(topic, error)

    def topic_recovered(self, topic: str) -> None:
        self._topics.write_recovered(topic)

    def _apply_flow(self) -> None:
        # Under exactly_once a write that keeps failing fails its round, which is rewound and
        # tried again by the next one: pausing would leave nothing to try it.
        failing = self._topics.failing
        pause_for_failing = bool(failing) and not self._exactly_once
        decision = self._flow.update(self.ledger.pending_records, pause_for_failing)
        consumer = self._consumer
        if consumer is None or decision is None or not self._assignment:
            return
        if decision:
            log.warning(
                "pausing %d partitions: %d records unacknowledged%s",
                len(self._assignment),
                self.ledger.pending_records,
                f", failing: {', '.join(sorted(failing))}" if failing else "",
            )
            consumer.pause(*self._assignment)
            self.stats.pauses += 1
        else:
            log.info("resuming %d partitions", len(self._assignment))
            consumer.resume(*self._assignment)

    # -- exactly once --------------------------------------------------------------------------

    async def _transaction(self, batch: Mapping[TopicPartition, list[Any]]) -> None:
        """Steps 3 to 5 per partition, each in its own transaction (`worker.runtime.transactions`):
        what the partition's records made, its checkpoint and the tombstones it allows, and its
        next input offset. Partitions commit concurrently; one that fails is rewound alone."""
        transactions = self._transactions
        assert transactions is not None, "start() first"
        owned = {
            tp: records for tp, records in batch.items() if (tp.topic, tp.partition) in transactions
        }
        result = self._judge(owned)
        for (topic, partition), frames in result.checkpoints.items():
            self._add_frames(result.id, topic, partition, frames)
            for key, value, headers in self._writers[(topic, partition)].tombstones():
                self._add(
                    Record(
                        result.id,
                        changelog_topic(self._group, topic),
                        key,
                        value,
                        headers,
                        partition=partition,
                        origin=Origin(TOMBSTONE, (topic, partition)),
                    )
                )
        places = list(result.offsets)
        outcomes = await asyncio.gather(
            *(transactions.commit(where, result.offsets[where]) for where in places),
            return_exceptions=True,
        )
        errors: dict[Partition, KafkaError] = {}
        for where, outcome in zip(places, outcomes, strict=True):
            if outcome is None:
                self.stats.commits += 1
            elif isinstance(outcome, KafkaError):
                errors[where] = outcome
            else:
                raise outcome
        if not errors:
            return
        if any(not isinstance(error, FENCED) for error in errors.values()):
            # as at least once: a topic deleted makes every transaction that writes to it fail,
            # and the check says which (a state topic gone stops the worker)
            self._topics.suspect()
            self._topics.check_when_due()
        await asyncio.gather(*(transactions.close(where) for where in errors))
        failed: list[TopicPartition] = []
        for where, error in errors.items():
            if isinstance(error, FENCED):
                log.warning("%s[%d]: fenced, a newer owner has it: %r", *where, error)
                self._fenced[where] = self._clock()
                if self._consumer is not None:
                    self._consumer.pause(TopicPartition(*where))
                self._forget([TopicPartition(*where)])
                continue
            log.warning("%s[%d]: transaction failed; rewinding it: %r", *where, error)
            self.stats.rewinds += 1
            failed.append(TopicPartition(*where))
        await self._open(failed)

    async def _take_back(self) -> None:
        """A fenced partition is normally revoked by the group within a session. One that the
        consumer still holds a session later was fenced for another reason (its transaction
        timed out): it is opened again, which fences its stale producer in turn."""
        consumer = self._consumer
        session_s = self.settings.kafka.session_timeout_ms / 1000
        due = [w for w, at in self._fenced.items() if self._clock() - at >= session_s]
        if consumer is None or not due:
            return
        held = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        back = []
        for where in due:
            del self._fenced[where]
            if where in held:
                log.warning(
                    "%s[%d]: still assigned a session after it was fenced: resuming", *where
                )
                back.append(TopicPartition(*where))
        if back:
            await self._open(back)

    async def _rewind(self) -> None:
        """Forget every partition's state and restore it as committed; fetch from there."""
        partitions = list(self._assignment)
        self._forget(partitions)
        await self._restore(partitions)

    # -- rebalance -----------------------------------------------------------------------------

    async def _on_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._round:
            await self._give_up(revoked)

    async def _on_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._round:
            await self._open(assigned)

    async def _give_up(self, revoked: list[TopicPartition]) -> None:
        """Finish what is in flight (at_least_once, bounded), then forget the partitions."""
        self.stats.rebalances += 1
        self.metrics.rebalance()
        if not revoked:
            return
        if not self._exactly_once:
            budget = max(1.0, self.settings.kafka.session_timeout_ms / 2000)
            await self._drain(self._clock() + budget)
        self._forget(revoked)
        if self._transactions is not None:
            for tp in revoked:
                self._fenced.pop((tp.topic, tp.partition), None)
                await self._transactions.close((tp.topic, tp.partition))
        log.info("revoked %d partitions", len(revoked))

    def _forget(self, partitions: list[TopicPartition]) -> None:
        """Drop the partitions' state and whatever is queued for them."""
        gone = {(tp.topic, tp.partition) for tp in partitions}
        for topic, partition in gone:
            if topic == self._requests:
                self._owners.drop(partition)
            else:
                self.processor.drop(topic, partition)
                self._writers.pop((topic, partition), None)
            self.metrics.forget_partition(topic, partition)
        self.ledger.forget(gone, self._clock())
        self.metrics.set_idempotency_keys(len(self._owners))
        if self._outbox is not None:
            self._outbox.discard(lambda record: record.origin.partition in gone)
        self._assignment -= set(partitions)

    async def _open(self, assigned: list[TopicPartition]) -> None:
        """Open the partitions' transactions (exactly_once), then restore them."""
        if self._consumer is None or not assigned:
            return
        self._consumer.pause(*assigned)
        transactions = self._transactions
        if transactions is not None:
            opening = [(tp.topic, tp.partition) for tp in assigned]
            opened = await asyncio.gather(
                *(transactions.open(where) for where in opening if where not in transactions),
                return_exceptions=True,
            )
            errors = [error for error in opened if error is not None]
            if errors:
                self._stop_fatally(
                    BrokerError(f"cannot open the partitions' transactions: {errors[0]!r}")
                )
                return
        await self._restore(assigned)

    async def _restore(self, assigned: list[TopicPartition]) -> None:
        """Restore each assigned partition's state, and fetch it from where that state ends:
        an input partition right after its checkpoint (else its committed offset), an
        idempotency partition from its committed offset. Nothing is fetched from a partition
        before its state is back (it stays paused until then)."""
        consumer = self._consumer
        if consumer is None or not assigned:
            return
        consumer.pause(*assigned)
        unprepared: dict[str, int] = {}  # input topic -> partitions its assignment shows
        for tp in assigned:
            made = self._changelog_partitions.get(tp.topic, 0)
            if tp.topic != self._requests and tp.partition >= made:
                unprepared[tp.topic] = max(unprepared.get(tp.topic, 0), tp.partition + 1)
        state_of = {
            tp: (
                self._keys if tp.topic == self._requests else changelog_topic(self._group, tp.topic)
            )
            for tp in assigned
        }
        try:
            if unprepared:
                await self._ensure_changelogs(unprepared)
            logs = await self._kafka.read_to_end(
                [(topic, tp.partition) for tp, topic in state_of.items()]
            )
            for tp in assigned:
                records = logs.get((state_of[tp], tp.partition), [])
                offset = None
                if tp.topic == self._requests:
                    self._owners.restore(tp.partition, records)
                else:
                    offset = self._restore_partition(tp, records)
                if offset is None:
                    offset = await consumer.committed(tp)
                if offset is None:
                    await consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, offset)
        except StateError as exc:
            self._stop_fatally(exc)
            return
        except ConfigError as exc:  # a changelog that cannot serve the input assigned
            self._stop_fatally(StateError(str(exc)))
            return
        except (BrokerError, KafkaError) as exc:
            self._stop_fatally(
                BrokerError(f"cannot read the state of {len(assigned)} partitions: {exc!r}")
            )
            return
        except Exception as exc:  # a state it cannot read stops the worker
            # raised into the consumer's rebalance listener, this would be logged and the
            # partitions left paused for good: stop instead, and say why
            where = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in assigned)
            self._stop_fatally(
                StateError(
                    f"cannot restore the checkpointed state of {where}: {exc}; the worker "
                    "stops rather than judge their calls without it"
                )
            )
            return
        if self._consumer is not consumer:  # closed while restoring
            return
        self._assignment |= set(assigned)
        self._joined = True
        self.metrics.set_assigned_partitions(len(self._assignment))
        self.metrics.set_idempotency_keys(len(self._owners))
        if not self._flow.paused:
            consumer.resume(*assigned)
        log.info("assigned %d partitions", len(assigned))

    def _restore_partition(self, tp: TopicPartition, records: list[Any]) -> int | None:
        """An input partition's state from its changelog; the offset it reflects, if any."""
        restored = restore(
            ((r.key, r.value, list(r.headers or ())) for r in records),
            self.settings.delivery.checkpoint_record_bytes,
            new_writer_id(),
        )
        self._writers[(tp.topic, tp.partition)] = restored.writer
        self.processor.drop(tp.topic, tp.partition)
        if not restored.frames:
            return None
        self.processor.restore(tp.topic, tp.partition, restored.frames)
        log.info(
            "%s[%d]: restored from %d checkpoint frames; fetching from %d",
            tp.topic,
            tp.partition,
            len(restored.frames),
            restored.offset,
        )
        return restored.offset

    # -- readiness -----------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """For /readyz: joined the group, no topic failing, not stopping."""
        if self._stop.is_set():
            return False, "stopping"
        if self._consumer is None:
            return False, "starting"
        if not self._joined:
            return False, "joining the consumer group"
        if self._topics.failing:
            failing = "; ".join(f"{t}: {e}" for t, e in sorted(self._topics.failing.items()))
            waiting = "fetching paused" if not self._exactly_once else "rounds rewound until done"
            return False, f"writes failing ({failing}); {waiting}"
        return True, f"consuming {len(self._assignment)} partitions"
