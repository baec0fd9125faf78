"""Flow control: when to pause fetching, and when to resume it.

Fetching pauses while more records (or bytes) than the limits wait for their acknowledgement
(exactly_once: their commit), or while the rounds must wait (a topic's writes fail, under
at_least_once; a topic written to is gone), and resumes once the backlog is down to half the
limits and nothing holds the rounds (the hysteresis keeps it from flapping). The worker keeps
polling while paused, so its group membership stays.
"""

from __future__ import annotations


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
