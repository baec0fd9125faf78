"""The parts a `Worker` wires, built from the settings: the composition root's Kafka half.

`worker.compose` builds what `callgate check` and `callgate run` share (the processor, the
metrics, the stores) and imports no Kafka client; the rest of `callgate run` is built here, from
those and the settings, and nowhere else. `build_parts` makes what exists before the worker
connects; what needs a connection (the consumer, the delivery, the partitions owned and
readiness) `Parts` makes as the worker's start reaches it, since each is started in turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker.compose import build_approval_store
from worker.core.idempotency import KeyStore
from worker.core.processor import Processor
from worker.errors import InfrastructureError
from worker.metrics import Metrics
from worker.runtime import provision
from worker.runtime.approvals import ApprovalOwners
from worker.runtime.at_least_once import AtLeastOnce
from worker.runtime.broker_log import BrokerState
from worker.runtime.delivery import Context, Delivery, Stats
from worker.runtime.exactly_once import ExactlyOnce
from worker.runtime.expiries import Expiries
from worker.runtime.fetcher import Fetcher, Membership
from worker.runtime.flow import FlowControl
from worker.runtime.judging import Judge
from worker.runtime.kafka import Kafka
from worker.runtime.keys import KeyOwners
from worker.runtime.partitions import Assignment, State
from worker.runtime.progress import Progress
from worker.runtime.topic_watch import TopicWatch
from worker.runtime.topics import approvals_topic, keys_topic, requests_topic
from worker.settings import Settings

if TYPE_CHECKING:  # the otel extra: imported only when tracing is on
    from worker.runtime.tracing import CallTracing


@dataclass(frozen=True, slots=True)
class Parts:
    """What a worker wires: each part built once, from the same settings, clocks and counts."""

    settings: Settings
    metrics: Metrics
    stats: Stats
    kafka: Kafka
    clock: Callable[[], float]
    #: what the consumer stamps its fetch answers with
    wall: Callable[[], float]
    #: the topics outputs are written to (the shadow topic too): they must exist, never input
    outcome_topics: frozenset[str]
    #: the written topics, checked when a write fails (`worker.runtime.topic_watch`)
    topics: TopicWatch
    approvals: ApprovalOwners
    expiries: Expiries
    judge: Judge
    state: State
    flow: FlowControl
    membership: Membership
    #: reachable or not, said once per change (`worker.runtime.broker_log`)
    broker: BrokerState

    def fetcher(self) -> Fetcher:
        """The group consumer, to be started."""
        settings = self.settings
        kafka = settings.kafka
        return Fetcher(
            self.kafka.consumer(),
            self.metrics,
            fetch_timeout_ms=kafka.fetch_timeout_ms,
            max_records=kafka.fetch_max_records,
            read_committed=settings.delivery.guarantee == "exactly_once",
            wall=self.wall,
        )

    def delivery(
        self,
        fetcher: Fetcher,
        stop_fatally: Callable[[InfrastructureError], None],
        next_round: Callable[[], int],
    ) -> Delivery:
        """The settings' delivery guarantee over `fetcher`, to be started."""
        context = Context(
            settings=self.settings,
            kafka=self.kafka,
            fetcher=fetcher,
            state=self.state,
            topics=self.topics,
            metrics=self.metrics,
            stats=self.stats,
            substitute=self.judge.substitute,
            stop_fatally=stop_fatally,
            clock=self.clock,
            next_round=next_round,
            membership=self.membership,
            outcome_topics=self.outcome_topics,
        )
        exactly_once = self.settings.delivery.guarantee == "exactly_once"
        return ExactlyOnce(context) if exactly_once else AtLeastOnce(context)

    def assignment(
        self,
        fetcher: Fetcher,
        delivery: Delivery,
        stop_fatally: Callable[[InfrastructureError], None],
    ) -> Assignment:
        """The partitions owned, over the started consumer and delivery."""
        return Assignment(self.state, fetcher, delivery, self.metrics, stop_fatally)

    def progress(self, fetcher: Fetcher, delivery: Delivery, assignment: Assignment) -> Progress:
        """Readiness, once everything it observes is there."""
        return Progress(
            ready_within_s=self.settings.metrics.ready_within_ms / 1000,
            fetcher=fetcher,
            delivery=delivery,
            assignment=assignment,
            topics=self.topics,
            stats=self.stats,
            membership=self.membership,
            broker=self.broker,
            clock=self.clock,
        )


def build_parts(
    settings: Settings,
    processor: Processor,
    new_key_store: Callable[[], KeyStore],
    metrics: Metrics,
    *,
    kafka: Kafka | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    tracing: CallTracing | None = None,
) -> Parts:
    """Every part a worker needs before it connects, on `kafka` (by default, a client of the
    settings' cluster)."""
    kafka = kafka or Kafka(settings)
    stats = Stats()
    group = settings.kafka.group_id
    requests = requests_topic(group)
    pending = settings.topics.pending_approval
    keys = keys_topic(group)
    approvals_changelog = approvals_topic(group)
    outcome_topics = frozenset(settings.written_topics)
    topics = TopicWatch(
        kafka.missing_topics,
        clock,
        settings.kafka.topic_check_interval_ms / 1000,
        written=[*sorted(outcome_topics), requests, pending],
    )
    owners = KeyOwners(requests, new_key_store, settings.limits.max_feedback_bytes)
    approvals = ApprovalOwners(pending, lambda: build_approval_store(settings))
    judge = Judge(
        settings,
        processor,
        owners,
        metrics,
        stats,
        approvals=approvals,
        requests_topic=requests,
        keys_topic=keys,
        tracing=tracing,
        approvals_topic=approvals_changelog,
    )
    state = State(
        kafka,
        processor,
        owners,
        topics,
        metrics,
        approvals=approvals,
        group=group,
        requests_topic=requests,
        keys_topic=keys,
        pending_topic=pending,
        approvals_topic=approvals_changelog,
        stores=provision.stores(settings),
        checkpoint_record_bytes=settings.delivery.checkpoint_record_bytes,
        changelog_max_bytes=provision.checkpoint_batch(settings),
    )
    session_s = settings.kafka.session_timeout_ms / 1000
    return Parts(
        settings=settings,
        metrics=metrics,
        stats=stats,
        kafka=kafka,
        clock=clock,
        wall=wall,
        outcome_topics=outcome_topics,
        topics=topics,
        approvals=approvals,
        expiries=Expiries(kafka, approvals, pending, clock=clock, wall=wall),
        judge=judge,
        state=state,
        flow=FlowControl(settings.kafka.max_in_flight_records, settings.kafka.max_in_flight_bytes),
        membership=Membership(session_s, settings.kafka.heartbeat_interval_ms / 1000, clock),
        broker=BrokerState(clock, session_s=session_s),
    )
