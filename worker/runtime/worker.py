"""`callgate run`: the Kafka shell around the pure processor. Start, the round loop, stop.

Lifecycle: built (every part made from the settings by `parts`, nothing connected), `start`
(clients connected, the outcome topics and the inputs named checked to exist, internal topics
made sure of, the consumer and the delivery started, the group subscribed to), `run` (rounds
until `request_stop`, or a fatal error, which it raises), `close` (what is in flight
acknowledged, checkpointed and committed, within the grace period; the clients closed).

The parts, each in its own module: the consumer (`fetcher`), judging a batch (`judging`), the
partitions owned and their state (`partitions`: assignment, restore, checkpoints), and the
delivery guarantee (`delivery`: `at_least_once` or `exactly_once`), which says what is written,
acknowledged and committed, in which order. A round fetches a batch, judges it into records
handed to the delivery, and moves what is in flight along; it never waits for the previous
round's acknowledgements.

Rebalances wait for the round in progress to end (the consumer calls its rebalance listener from
a task of its own, and a partition given up in the middle of a round would lose its producer
under a commit that then never ends). A revoked partition's rounds are finished (bounded), its
offsets committed, its state dropped; an assigned partition's state is restored and fetching
resumes where that state ends. Written topics are checked (`topic_watch`): a deleted outcome
topic rewinds every partition to its checkpoint and is waited for, a deleted state topic stops
the worker. Between rounds: readiness observed (`progress`), lag read, and `expire` decisions
written for calls held for approval past their expiry (`expiries`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from worker.core.idempotency import KeyStore
from worker.core.processor import Processor
from worker.errors import BrokerError, CallgateError, InfrastructureError
from worker.metrics import Metrics
from worker.runtime.delivery import Delivery, Partition, Stats
from worker.runtime.fetcher import AUTHORIZATION_ERRORS, Fetcher
from worker.runtime.kafka import Kafka, Listener, close_within
from worker.runtime.partitions import Assignment
from worker.runtime.parts import build_parts
from worker.runtime.progress import Progress, StartSteps
from worker.runtime.provision import missing_topics, must_exist, refused, subscription
from worker.settings import Settings

if TYPE_CHECKING:  # the otel extra: imported only when tracing is on
    from worker.runtime.tracing import CallTracing

log = logging.getLogger("callgate.worker")

__all__ = ["Stats", "Worker"]

#: How often each owned partition's lag is read (between rounds).
LAG_INTERVAL_S = 1.0
#: how often the loop's pulse beats (`Worker._pulse`): a stall is seen within this of its end
PULSE_S = 0.25


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
        wall: Callable[[], float] = time.time,
        tracing: CallTracing | None = None,
    ) -> None:
        self.settings = settings
        self.processor = processor
        self.metrics = metrics
        #: every part built from the settings (`worker.runtime.parts`)
        self._parts = build_parts(
            settings,
            processor,
            new_key_store,
            metrics,
            kafka=kafka,
            clock=clock,
            wall=wall,
            tracing=tracing,
        )
        self.stats = self._parts.stats
        self.state = self._parts.state
        self.approvals = self._parts.approvals
        #: reachable or not, said once per change (`worker.runtime.broker_log`)
        self.broker = self._parts.broker
        # made by `start`, each once what it needs is started
        self._fetcher: Fetcher | None = None
        self._delivery: Delivery | None = None
        self._assignment: Assignment | None = None
        self._progress: Progress | None = None
        self._rounds = itertools.count()
        self._start_steps = StartSteps()
        self._stop = asyncio.Event()
        #: held by a round from its fetched batch to its end, and by a rebalance
        self._round = asyncio.Lock()
        self._fatal: InfrastructureError | None = None
        self._lag_reported = float("-inf")

    @property
    def delivery(self) -> Delivery:
        assert self._delivery is not None, "start() first"
        return self._delivery

    @property
    def fetcher(self) -> Fetcher:
        assert self._fetcher is not None, "start() first"
        return self._fetcher

    @property
    def assignment(self) -> frozenset[Partition]:
        """The partitions this worker judges now (assigned, restored, not fenced)."""
        return frozenset(() if self._assignment is None else self._assignment.owned)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Check and make the topics, connect, join. Raises `BrokerError` or `ConfigError`."""
        settings, parts = self.settings, self._parts
        try:
            await parts.kafka.start()
            log.info("connected to %s", ",".join(settings.kafka.bootstrap_servers))
            missing = await parts.kafka.missing_topics(must_exist(settings))
            if missing:
                raise missing_topics(missing, settings.topics.input_topics)
            log.info("topics checked: the inputs named and the outcome topics exist")
            await self.state.prepare(settings.topics.input_topics)
            log.info("internal topics made sure of: idempotency, approvals, changelogs")
            self._fetcher = parts.fetcher()
            await self._fetcher.consumer.start()
            self._delivery = parts.delivery(
                self._fetcher, self._stop_fatally, lambda: next(self._rounds)
            )
            await self._delivery.start()
            self._assignment = parts.assignment(self._fetcher, self._delivery, self._stop_fatally)
            self._progress = parts.progress(self._fetcher, self._delivery, self._assignment)
        except AUTHORIZATION_ERRORS as exc:
            await self._close_clients()
            raise refused(settings, exc) from None
        except KafkaError as exc:
            await self._close_clients()
            servers = ",".join(settings.kafka.bootstrap_servers)
            raise BrokerError(f"cannot work with Kafka at {servers}: {exc!r}") from None
        except CallgateError:
            await self._close_clients()
            raise
        self.fetcher.subscribe(
            subscription(settings), Listener(self._on_revoked, self._on_assigned)
        )
        log.info(
            "started: group %s, input %s, %s",
            settings.kafka.group_id,
            settings.topics.input,
            settings.delivery.guarantee,
        )

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
    def fatal(self) -> InfrastructureError | None:
        """The error the worker stopped for (said in its log when it stopped)."""
        return self._fatal

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> None:
        """Rounds until `request_stop()`. Infrastructure errors are retried, never raised, but
        for a fatal one (state that cannot be kept), which stops the worker."""
        pulse = asyncio.create_task(self._pulse(), name="callgate-pulse")
        try:
            while not self._stop.is_set():
                await self.step()
        finally:
            await _ended(pulse)
        if self._fatal is not None:
            raise self._fatal

    async def _pulse(self) -> None:
        """The loop's beat, beside the rounds: a gap between two beats is a time the loop did
        not run (the process paused, the loop blocked), wherever a round was (fetching,
        judging, rebalancing); a round's own span (`step`) cannot see a stall that began
        after its fetch. `Membership.ran` decides what such a gap means for the group, and
        `Progress.ran` for readiness."""
        since = self._parts.clock()
        if self._progress is not None:
            self._progress.ran(since)  # the first beat: a stall is seen from here on
        while True:
            await asyncio.sleep(PULSE_S)
            self._parts.membership.ran(since)
            if self._progress is not None:
                self._progress.ran(since)
            since = self._parts.clock()

    def idle(self) -> bool:
        """Nothing handed to the delivery waits for an acknowledgement or a commit."""
        return self._delivery is None or self._delivery.idle()

    async def close(self) -> None:
        """Within the grace period: what is in flight acknowledged, checkpointed, committed."""
        deadline = self._parts.clock() + self.settings.shutdown_grace_s
        if self._assignment is not None:
            self._assignment.throttle(True)
        if self._delivery is not None:
            await self._delivery.drain(deadline - 0.5)
            if not self._delivery.idle():
                log.warning(
                    "grace period over with %d records unacknowledged; their input is not "
                    "committed and will be judged again, to the same verdicts",
                    self._delivery.pending_records,
                )
        await self._close_clients(max(0.1, deadline - self._parts.clock()))
        log.info(
            "stopped: %d records, %d events, %d commits",
            self.stats.records,
            self.stats.emitted,
            self.stats.commits,
        )

    async def _close_clients(self, timeout_s: float = 5.0) -> None:
        if self._assignment is not None:
            self._assignment.closed = True
        self._parts.topics.cancel()
        delivery, self._delivery = self._delivery, None
        if delivery is not None:
            await delivery.close(timeout_s / 2)
        await close_within(self._parts.kafka.close(), timeout_s / 2, "the admin client")
        fetcher, self._fetcher = self._fetcher, None
        if fetcher is not None:
            await fetcher.close(timeout_s / 2)
        await self._parts.expiries.close(timeout_s / 2)

    # -- a round -------------------------------------------------------------------------------

    async def step(self) -> None:
        """Fetch one batch (the next one is fetched meanwhile), judge it, hand what it made to
        the delivery, move what is in flight along."""
        fetcher, assignment, delivery = self.fetcher, self._assignment, self.delivery
        assert assignment is not None
        began = self._parts.clock()
        try:
            room = self._parts.flow.max_records - delivery.pending_records
            batch = await fetcher.fetch(self._stop, room)
        except OffsetOutOfRangeError as exc:
            async with self._round:
                await fetcher.skip_deleted(exc.args[0], assignment.owned)
            return
        except AUTHORIZATION_ERRORS as exc:  # for good: stop, naming the missing grant
            self._stop_fatally(refused(self.settings, exc))
            return
        finally:
            self._parts.membership.ran(began)
            self.broker.membership_lost = self._parts.membership.lost
        if self._stop.is_set():
            return  # what was fetched is fetched again by whoever judges it next
        self._start_steps.fetched(sum(len(r) for r in batch.values()))
        async with self._round:
            await assignment.act_on(self._parts.topics.finished())
            batch = assignment.judgeable(batch)
            if self._parts.topics.failing:
                # A failing write may mean its topic was deleted: a check says whether (such a
                # topic never acknowledges, so nothing else may wait for a check)
                self._parts.topics.check_when_due()
            if self._parts.topics.missing:  # nothing is judged until the topic is back
                fetcher.put_back(batch)
            elif batch:
                delivery.submit(self._parts.judge.round(next(self._rounds), batch, delivery.add))
                self._start_steps.judged(self.stats.emitted)
            await assignment.recover(await delivery.advance())
            self._start_steps.acknowledged(self.stats.events)
            self._parts.flow.regulate(delivery, assignment, self._parts.topics, self.stats)
            assert self._progress is not None
            self._progress.observe()
            if self._parts.clock() - self._lag_reported >= LAG_INTERVAL_S:
                self._lag_reported = self._parts.clock()
                await fetcher.report_lag(assignment.owned)
        await self._parts.expiries.ask()

    # -- rebalance -----------------------------------------------------------------------------

    async def _on_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._round:
            self.stats.rebalances += 1
            self.metrics.rebalance()
            if revoked and self._assignment is not None:
                await self._assignment.release([(tp.topic, tp.partition) for tp in revoked])

    async def _on_assigned(self, assigned: list[TopicPartition]) -> None:
        self._parts.membership.assigned()
        try:
            async with self._round:
                if self._assignment is not None:
                    await self._assignment.open([(tp.topic, tp.partition) for tp in assigned])
        finally:
            self._parts.membership.settled()

    # -- readiness -----------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """For /readyz (asked on the health server's thread): not stopping, started, and the
        rule `Progress.readiness` states."""
        if self._stop.is_set():
            return False, "stopping"
        if self._progress is None or self._delivery is None:
            return False, "starting"
        return self._progress.readiness()


async def _ended(pulse: asyncio.Task[None]) -> None:
    """The pulse cancelled and ended (it ends at its next turn: it only sleeps), so that no task
    of the worker is left pending once `run` returns; a failure of its own is a bug, said."""
    pulse.cancel()
    await asyncio.wait((pulse,), timeout=PULSE_S)
    if pulse.done() and not pulse.cancelled() and pulse.exception() is not None:
        log.error("the loop's pulse failed", exc_info=pulse.exception())
