"""Whether the worker makes progress with Kafka: what /readyz answers, and what the log's view of
the broker (`worker.runtime.broker_log`) is fed from; and start-up's last steps, said once.

Observed between rounds on the loop's thread (`observe`); asked from the health server's thread
(`readiness`), which reads what the rounds last left. Time is the caller's clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from worker.runtime.broker_log import BrokerState
from worker.runtime.delivery import Delivery, Partition, Stats
from worker.runtime.fetcher import Fetcher, Membership
from worker.runtime.partitions import Assignment
from worker.runtime.topic_watch import TopicWatch

log = logging.getLogger("callgate.worker")


class StartSteps:
    """Start-up's last steps, each said once, in order (`benchmarks/startup.py` splits a start
    on these lines): records fetched, a round judged, events acknowledged."""

    def __init__(self) -> None:
        self._done = 0

    def fetched(self, records: int) -> None:
        if self._done == 0 and records:
            self._done = 1
            log.info("first records fetched: %d", records)

    def judged(self, events: int) -> None:
        if self._done == 1:
            self._done = 2
            log.info("first round judged: %d events made", events)

    def acknowledged(self, events: int) -> None:
        if self._done == 2 and events:
            self._done = 3
            log.info("first events acknowledged: %d", events)


class Progress:
    """The rule /readyz answers by (`readiness`), and each round's observation of it."""

    def __init__(
        self,
        *,
        ready_within_s: float,
        fetcher: Fetcher,
        delivery: Delivery,
        assignment: Assignment,
        topics: TopicWatch,
        stats: Stats,
        membership: Membership,
        broker: BrokerState,
        clock: Callable[[], float],
    ) -> None:
        self.ready_within_s = ready_within_s
        self._fetcher = fetcher
        self._delivery = delivery
        self._assignment = assignment
        self._topics = topics
        self._stats = stats
        self._membership = membership
        self._broker = broker
        self._clock = clock
        now = clock()
        #: when the last round ended, when writes were last acknowledged (or none waited)
        self._stepped_at = now
        self._acked_at = now
        #: the pulse's last beat (`ran`; None: it has not beaten, the rounds run without it)
        self._beat_at: float | None = None
        self._acks = 0
        #: the partitions whose fetches the broker has not answered within the bound
        self._unanswered: list[Partition] = []

    def ran(self, since: float) -> None:
        """The loop ran at `since` and now, not between (`Worker._pulse`). Time it did not run is
        not time Kafka failed to answer: after a stall of more than half the bound (a paused
        process), fetches and acknowledgements have the bound again from its end, since what
        Kafka sent meanwhile is read only now (a round right after it would find every answer
        late)."""
        now = self._clock()
        self._beat_at = now
        if now - since > self.ready_within_s / 2:
            self._acked_at = max(self._acked_at, now)
            self._fetcher.stalled()

    def observe(self) -> None:
        """A round ended: what readiness is decided from, and the broker's state with it (a stall
        the pulse has not said yet is taken from its last beat: the round may run first)."""
        now = self._clock()
        beat_at = self._beat_at
        if beat_at is not None and now - beat_at > self.ready_within_s / 2:
            self.ran(beat_at)
        self._stepped_at = now
        self._broker.round_ended()
        acks = self._stats.acknowledged + self._stats.checkpoints
        if acks != self._acks or not self._delivery.pending_records:
            self._acks, self._acked_at = acks, now
        assignment = self._assignment
        self._unanswered = (
            []
            if assignment.throttled
            else self._fetcher.unanswered(assignment.owned, self.ready_within_s)
        )
        self._broker.membership_lost = self._membership.lost
        self._broker.observe(self._problem(now))

    def _problem(self, now: float) -> str | None:
        """Why the worker is not making progress with Kafka (None: it is): fetches of an
        assigned partition not answered, or writes waiting with none acknowledged, within
        `metrics.ready_within_ms`."""
        bound = self.ready_within_s
        unanswered = self._unanswered
        if unanswered:
            shown = ", ".join(f"{t}[{p}]" for t, p in unanswered[:5])
            more = f" and {len(unanswered) - 5} more" if len(unanswered) > 5 else ""
            return (
                f"no fetch answered within {bound:g} s for {len(unanswered)} of "
                f"{len(self._assignment.owned)} partitions: {shown}{more}"
            )
        pending = self._delivery.pending_records
        if pending and now - self._acked_at > bound:
            waited = now - self._acked_at
            return f"{pending} records written and none acknowledged for {waited:.0f} s"
        return None

    def readiness(self) -> tuple[bool, str]:
        """Ready: joined the group, rounds running, every assigned partition being fetched has
        had a fetch answered within `metrics.ready_within_ms`, writes waiting have had an
        acknowledgement within it, and no topic's writes are failing. The reason says which
        does not hold."""
        if not self._assignment.joined:
            return False, "joining the consumer group"
        now = self._clock()
        if now - self._stepped_at > self.ready_within_s:
            return False, f"no round ended for {now - self._stepped_at:.0f} s"
        problem = self._problem(now)
        if problem is not None:
            return False, problem
        if self._topics.failing:
            failing = "; ".join(f"{t}: {e}" for t, e in sorted(self._topics.failing.items()))
            return False, f"writes failing ({failing}); {self._delivery.waiting()}"
        return True, f"consuming {len(self._assignment.owned)} partitions"
