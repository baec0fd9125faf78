"""`callgate run`: the Kafka shell around the pure `Processor`. Start, run loop, graceful stop.

One loop, one batch at a time: fetch a batch (`getmany`), feed every record to the processor,
tick its idle timeout, send every resulting outcome event without awaiting each one, record the
batch in the `DeliveryLedger`, then commit whatever offsets are acknowledged in full. The broker's
acknowledgements arrive as future callbacks; a failed send is sent again after a backoff and
never acknowledged until it succeeds, so a commit never passes an unacknowledged output. Too many
unacknowledged outputs, or a failing producer, pause the assigned partitions (the loop keeps
polling, so the group membership stays alive) until the backlog drains.

Each commit carries, as metadata, the offset fed so far; after a crash or a reassignment the
`ReplayGuard` uses it to drop what the replay re-judges from fragments of already-judged calls.
On revoke: wait (bounded) for in-flight outputs, commit what is safe, drop the partitions' open
calls. On stop (SIGTERM/SIGINT): stop fetching, finish the current batch, wait for its outputs,
commit, close the clients, all within `shutdown_grace_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from worker.core.processor import Emission, InboundRecord, Processor
from worker.errors import BrokerError
from worker.health import HealthServer
from worker.metrics import Metrics, NullMetrics, build_metrics
from worker.model import Code, Outcome
from worker.runtime.delivery import (
    Backoff,
    DeliveryLedger,
    FlowControl,
    FlowDecision,
    Partition,
    ReplayGuard,
    replay_mark,
)
from worker.runtime.kafka_options import consumer_options, producer_options
from worker.settings import Settings

log = logging.getLogger("callgate.runner")

_POISON = frozenset({Code.MALFORMED_RECORD, Code.UNKNOWN_FORMAT})


@dataclass(slots=True)
class RunnerStats:
    """Counts since start, for the demo's progress line and the tests."""

    records: int = 0
    emitted: int = 0
    acknowledged: int = 0
    produce_errors: int = 0
    commits: int = 0
    commit_errors: int = 0
    rebalances: int = 0
    pauses: int = 0
    replayed_fragments: int = 0


def decode_headers(headers: Sequence[tuple[str, bytes]] | None) -> dict[str, str]:
    """Kafka header values as text (an undecodable byte becomes U+FFFD, never an exception)."""
    if not headers:
        return {}
    return {name: (value or b"").decode("utf-8", "replace") for name, value in headers}


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, runner: Runner) -> None:
        self._runner = runner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._runner._on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._runner._on_assigned(list(assigned))


class Runner:
    """The worker. `await start()`, `await run()` until `request_stop()`, then `await close()`."""

    def __init__(
        self,
        settings: Settings,
        processor: Processor,
        metrics: Metrics | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.processor = processor
        self.metrics = metrics if metrics is not None else NullMetrics()
        self.stats = RunnerStats()
        self._clock = clock
        topics = settings.topics
        self._topic_of = {
            Outcome.ACCEPTED: topics.accepted,
            Outcome.REJECTED: topics.rejected,
            Outcome.INCOMPLETE: topics.incomplete,
        }
        self._consumer_options = consumer_options(settings)
        self._producer_options = producer_options(settings)
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        #: per partition, (offset safe to commit, offset fed so far)
        self.ledger: DeliveryLedger[tuple[int, int]] = DeliveryLedger()
        self._fed: dict[Partition, int] = {}
        self._guard = ReplayGuard()
        self._flow = FlowControl(settings.kafka.max_pending_produces)
        self._backoff = Backoff()
        self._retry: list[tuple[int, Emission]] = []
        self._retry_at = 0.0
        self._failing = False
        self._drained = asyncio.Event()
        self._drained.set()
        self._stop = asyncio.Event()
        self._joined = False
        self._assignment: frozenset[TopicPartition] = frozenset()

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect the producer, then join the consumer group. Raises `BrokerError`."""
        producer = AIOKafkaProducer(**self._producer_options)
        consumer = AIOKafkaConsumer(**self._consumer_options)
        self._producer, self._consumer = producer, consumer
        try:
            await producer.start()
            await consumer.start()
        except KafkaError as exc:
            await self._close_clients()
            servers = ",".join(self.settings.kafka.bootstrap_servers)
            raise BrokerError(f"cannot connect to Kafka at {servers}: {exc}") from None
        topics = self.settings.topics
        listener = _Listener(self)
        if topics.input_pattern:
            consumer.subscribe(pattern=topics.input_pattern, listener=listener)
        else:
            consumer.subscribe(topics=topics.input_topics, listener=listener)
        log.info(
            "started: group %s, input %s", self.settings.kafka.group_id, self.settings.topics.input
        )

    def request_stop(self) -> None:
        """Stop fetching after the current batch (safe to call from a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> None:
        """The loop: until `request_stop()`. Infrastructure errors are retried, never raised."""
        while not self._stop.is_set():
            await self.step()

    async def close(self) -> None:
        """Drain within the grace period: outputs acknowledged, offsets committed, clients shut."""
        deadline = self._clock() + self.settings.shutdown_grace_s
        consumer = self._consumer
        if consumer is not None and self._assignment:
            consumer.pause(*self._assignment)
        while self.ledger.pending and self._clock() < deadline - 0.5:
            await self._resend_failed()
            await self._wait_drained(min(0.2, max(0.0, deadline - 0.5 - self._clock())))
        if self.ledger.pending:
            log.warning(
                "grace period over with %d outcome events unacknowledged; their inputs stay "
                "uncommitted and will be replayed",
                self.ledger.pending,
            )
        await self._commit()
        await self._close_clients(max(0.1, deadline - self._clock()))
        log.info(
            "stopped: %d records, %d events, %d commits",
            self.stats.records,
            self.stats.emitted,
            self.stats.commits,
        )

    async def _close_clients(self, timeout_s: float = 5.0) -> None:
        producer, consumer = self._producer, self._consumer
        self._producer = self._consumer = None
        for client in (producer, consumer):
            if client is None:
                continue
            try:
                await asyncio.wait_for(client.stop(), timeout=max(0.1, timeout_s / 2))
            except (TimeoutError, KafkaError) as exc:
                log.warning("closing %s: %s", type(client).__name__, exc or type(exc).__name__)

    # -- one iteration -------------------------------------------------------------------------

    async def step(self) -> None:
        """Fetch one batch, judge it, send its events, commit what is acknowledged."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        kafka = self.settings.kafka
        try:
            batch = await consumer.getmany(
                timeout_ms=kafka.fetch_timeout_ms, max_records=kafka.fetch_max_records
            )
        except KafkaError as exc:
            log.warning("fetch failed: %s", exc)
            batch = {}
        now = self._clock()
        processor, metrics = self.processor, self.metrics
        emissions: list[Emission] = []
        records = 0
        for tp, fetched in batch.items():
            emissions.extend(
                processor.feed_many(
                    (
                        InboundRecord(
                            record.topic,
                            record.partition,
                            record.offset,
                            record.key,
                            record.value,
                            decode_headers(record.headers),
                        )
                        for record in fetched
                    ),
                    now,
                )
            )
            records += len(fetched)
            if fetched:
                next_offset = fetched[-1].offset + 1
                self._fed[(tp.topic, tp.partition)] = next_offset
                highwater = consumer.highwater(tp)
                if highwater is not None:
                    metrics.set_lag(tp.topic, tp.partition, max(0, highwater - next_offset))
        emissions.extend(processor.expire(now))
        guard = self._guard
        if guard.active and emissions:
            kept = [e for e in emissions if not guard.is_judged_fragment(e.call, e.verdict)]
            self.stats.replayed_fragments += len(emissions) - len(kept)
            emissions = kept
        for tp in batch:
            guard.fed((tp.topic, tp.partition), self._fed.get((tp.topic, tp.partition), 0))
        self.stats.records += records
        if records:
            metrics.add_chunks(records)
        for emission in emissions:
            call = emission.call
            metrics.observe(emission.verdict, processor.tool_name(call.tool))
            if call.duplicate_chunks:
                metrics.add_duplicate_chunks(call.duplicate_chunks)
            if emission.verdict.code in _POISON:
                metrics.poison_record(emission.verdict.code)
        metrics.set_open_calls(processor.open_calls)
        metrics.set_buffered_bytes(processor.buffered_bytes)
        if records or emissions:
            await self._send_batch(emissions, self._safe_offsets())
        await self._resend_failed()
        await self._commit()
        self._apply_flow()

    def _safe_offsets(self) -> dict[Partition, tuple[int, int]]:
        positions: dict[Partition, tuple[int, int]] = {}
        commit_offset = self.processor.commit_offset
        for tp in self._assignment:
            offset = commit_offset(tp.topic, tp.partition)
            if offset is not None:
                key = (tp.topic, tp.partition)
                positions[key] = (offset, self._fed.get(key, offset))
        return positions

    async def _send_batch(
        self, emissions: list[Emission], offsets: Mapping[Partition, tuple[int, int]]
    ) -> None:
        batch_id = self.ledger.record_batch(len(emissions), offsets)
        if emissions:
            self._drained.clear()
        self.stats.emitted += len(emissions)
        await self._send_all([(batch_id, emission) for emission in emissions])

    async def _send_all(self, items: list[tuple[int, Emission]]) -> None:
        """Hand every event to the producer; once a send to a topic fails, queue the rest of
        that topic's events unsent (other topics go on).

        A send can hang for the request timeout (an unknown topic's metadata); trying each
        remaining event would stall the loop once per event.
        """
        failed_topics: set[str] = set()
        for batch_id, emission in items:
            topic = self._topic_of[emission.verdict.outcome]
            if topic in failed_topics:
                self._retry.append((batch_id, emission))
            elif not await self._send(batch_id, emission):
                failed_topics.add(topic)

    async def _send(self, batch_id: int, emission: Emission) -> bool:
        producer = self._producer
        if producer is None:
            self._failed(batch_id, emission, "producer closed")
            return False
        try:
            future = await producer.send(
                self._topic_of[emission.verdict.outcome],
                value=emission.value,
                key=emission.key,
                headers=list(emission.headers),
            )
        except KafkaError as exc:
            self._failed(batch_id, emission, str(exc) or type(exc).__name__)
            return False
        future.add_done_callback(lambda done: self._on_sent(done, batch_id, emission))
        return True

    def _on_sent(self, done: asyncio.Future[Any], batch_id: int, emission: Emission) -> None:
        error = None if done.cancelled() else done.exception()
        if done.cancelled() or error is not None:
            self._failed(batch_id, emission, str(error) or type(error).__name__)
            return
        if self._failing:
            log.info("producer recovered")
        self._failing = False
        self._backoff.succeeded()
        self.stats.acknowledged += 1
        self.ledger.acknowledge(batch_id)
        if self.ledger.pending == 0:
            self._drained.set()

    def _failed(self, batch_id: int, emission: Emission, reason: str) -> None:
        if not self._failing:
            log.warning("produce failed, will retry: %s", reason)
        self._failing = True
        self.stats.produce_errors += 1
        self.metrics.produce_error()
        self._retry.append((batch_id, emission))
        self._retry_at = self._clock() + self._backoff.failed()

    async def _resend_failed(self) -> None:
        if not self._retry or self._clock() < self._retry_at:
            return
        retry, self._retry = self._retry, []
        await self._send_all(retry)

    async def _wait_drained(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), timeout=timeout_s)

    async def _commit(self, only: frozenset[Partition] | None = None) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        assigned = {(tp.topic, tp.partition) for tp in self._assignment}
        offsets = {
            tp: offset
            for tp, offset in self.ledger.committable().items()
            if tp in assigned and (only is None or tp in only)
        }
        if not offsets:
            return
        request = {
            TopicPartition(*tp): (offset, replay_mark(fed)) for tp, (offset, fed) in offsets.items()
        }
        try:
            await consumer.commit(request)
        except KafkaError as exc:
            self.stats.commit_errors += 1
            self.metrics.commit_error()
            log.warning("commit failed (will retry with the next batch): %s", exc)
            return
        self.ledger.mark_committed(offsets)
        self.stats.commits += 1

    def _apply_flow(self) -> None:
        decision = self._flow.update(self.ledger.pending, self._failing)
        consumer = self._consumer
        if consumer is None or decision is FlowDecision.KEEP or not self._assignment:
            return
        if decision is FlowDecision.PAUSE:
            log.warning(
                "pausing %d partitions: %d events unacknowledged%s",
                len(self._assignment),
                self.ledger.pending,
                ", producer failing" if self._failing else "",
            )
            consumer.pause(*self._assignment)
            self.stats.pauses += 1
        else:
            log.info("resuming %d partitions", len(self._assignment))
            consumer.resume(*self._assignment)

    # -- rebalance -----------------------------------------------------------------------------

    async def _on_revoked(self, revoked: list[TopicPartition]) -> None:
        self.stats.rebalances += 1
        self.metrics.rebalance()
        if not revoked:
            return
        budget = max(1.0, self.settings.kafka.session_timeout_ms / 2000)
        deadline = self._clock() + budget
        while self.ledger.pending and self._clock() < deadline:
            await self._resend_failed()
            await self._wait_drained(min(0.2, max(0.0, deadline - self._clock())))
        gone = frozenset((tp.topic, tp.partition) for tp in revoked)
        await self._commit(only=gone)
        for topic, partition in gone:
            self.processor.revoke(topic, partition)
            self.metrics.forget_partition(topic, partition)
            self._guard.forget((topic, partition))
            self._fed.pop((topic, partition), None)
        self.ledger.forget(gone)
        self._assignment = self._assignment - set(revoked)
        log.info("revoked %d partitions", len(gone))

    async def _on_assigned(self, assigned: list[TopicPartition]) -> None:
        self._assignment = frozenset(assigned)
        await self._load_replay_marks(assigned)
        self._joined = True
        self.metrics.set_assigned_partitions(len(assigned))
        if self._flow.paused and self._consumer is not None and assigned:
            self._consumer.pause(*assigned)
        log.info("assigned %d partitions", len(assigned))

    async def _load_replay_marks(self, assigned: list[TopicPartition]) -> None:
        consumer = self._consumer
        if consumer is None or not assigned:
            return
        try:
            # aiokafka's public `committed()` drops the commit metadata, which holds the mark
            found = await consumer._coordinator.fetch_committed_offsets(assigned)
        except KafkaError as exc:
            log.warning("cannot read the replay marks (replays may re-judge fragments): %s", exc)
            return
        for tp in assigned:
            entry = found.get(tp)
            offset = entry.offset if entry is not None and entry.offset >= 0 else None
            metadata = entry.metadata if entry is not None else None
            self._guard.resume((tp.topic, tp.partition), offset, metadata)
            window = self._guard.window((tp.topic, tp.partition))
            if window is not None:
                log.info("%s[%d]: replaying %s..%d", tp.topic, tp.partition, offset, window)

    # -- readiness -----------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """For /readyz: joined the group and the output producer is healthy."""
        if self._stop.is_set():
            return False, "stopping"
        if self._consumer is None:
            return False, "starting"
        if not self._joined:
            return False, "joining the consumer group"
        if self._failing:
            return False, "outcome producer failing; fetching paused"
        return True, f"consuming {len(self._assignment)} partitions"


async def run_until_stopped(runner: Runner, *, handle_signals: bool = True) -> None:
    """Start, loop until SIGTERM/SIGINT (or `request_stop()`), then drain and close."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    for number in signals:
        loop.add_signal_handler(number, runner.request_stop)
    try:
        await runner.start()
        try:
            await runner.run()
        finally:
            await runner.close()
    finally:
        for number in signals:
            loop.remove_signal_handler(number)


def serve(settings: Settings) -> int:
    """`callgate run`: build everything from the settings, serve until stopped; the exit status.

    Raises `ConfigError` or `SchemaLoadError` before anything connects when a setting or a
    contract is wrong (the command line turns them into one message and status 2).
    """
    processor = Processor.from_settings(settings)
    metrics = build_metrics(
        settings.metrics.enabled, processor.tool_names, engine=settings.schemas.engine
    )
    runner = Runner(settings, processor, metrics)
    # always served: the probes need /healthz and /readyz even with metrics off (empty /metrics)
    health = HealthServer(metrics.registry, runner.readiness)
    port = health.start(settings.metrics.host, settings.metrics.port)
    log.info("health and metrics on http://%s:%d/", settings.metrics.host, port)
    try:
        asyncio.run(run_until_stopped(runner))
    except BrokerError as exc:
        log.error("%s", exc)
        return 1
    finally:
        health.stop()
    return 0
