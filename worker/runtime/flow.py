"""Flow control: when to pause fetching, and when to resume it.

Fetching pauses while more records than the limit wait for their acknowledgement or while a
topic's writes fail, and resumes once the backlog is down to half the limit and no topic fails
(the hysteresis keeps it from flapping). The worker keeps polling while paused, so its group
membership stays.
"""

from __future__ import annotations


class FlowControl:
    """Pause above `limit` unacknowledged records or while a topic fails; resume at half."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.paused = False

    def update(self, pending: int, failing: bool) -> bool | None:
        """True: pause now; False: resume now; None: keep as is."""
        if not self.paused and (failing or pending > self.limit):
            self.paused = True
            return True
        if self.paused and not failing and pending <= self.limit // 2:
            self.paused = False
            return False
        return None
