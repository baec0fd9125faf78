"""Flow control: when to pause fetching, and when to resume it.

Fetching pauses while more records (or bytes) than the limits wait for their acknowledgement
(exactly_once: their commit), or while the rounds must wait (a topic's writes fail, under
at_least_once; a topic written to is gone), and resumes once the backlog is down to half the
limits and nothing holds the rounds (the hysteresis keeps it from flapping). The worker keeps
polling while paused, so its group membership stays.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.runtime.delivery import Delivery, Stats
    from worker.runtime.partitions import Assignment
    from worker.runtime.topic_watch import TopicWatch

log = logging.getLogger("callgate.worker")


class FlowControl:
    """Pause above `max_records` or `max_bytes` in flight, or while held; resume at half."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.paused = False

    def update(self, records: int, nbytes: int, held: bool) -> bool | None:
        """True: pause now; False: resume now; None: keep as is."""
        over = records > self.max_records or nbytes > self.max_bytes
        if not self.paused and (held or over):
            self.paused = True
            return True
        under = records <= self.max_records // 2 and nbytes <= self.max_bytes // 2
        if self.paused and not held and under:
            self.paused = False
            return False
        return None

    def regulate(
        self, delivery: Delivery, assignment: Assignment, topics: TopicWatch, stats: Stats
    ) -> None:
        """After a round: pause or resume fetching the owned partitions as `update` decides
        from what the delivery has in flight and what holds it, and say so."""
        held = (bool(topics.failing) and delivery.pauses_while_failing) or topics.missing
        decision = self.update(delivery.pending_records, delivery.pending_bytes, held)
        if decision is None or not assignment.owned:
            return
        owned = len(assignment.owned)
        if decision:
            failing = topics.failing
            log.warning(
                "pausing %d partitions: %d records unacknowledged%s",
                owned,
                delivery.pending_records,
                f", failing: {', '.join(sorted(failing))}" if failing else "",
            )
            stats.pauses += 1
        else:
            log.info("resuming %d partitions", owned)
        assignment.throttle(decision)
