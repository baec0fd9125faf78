"""What the log says when Kafka goes away: each change of state once, the repeats counted.

With the broker down, the Kafka client (aiokafka) logs every failed connection, metadata
refresh, fetch, heartbeat and commit, and the worker every failed fetch, commit and topic check:
thousands of ERROR lines a minute that say one thing. So:

- The worker's own view decides the state (`BrokerState`, fed between rounds by
  `worker.runtime.progress`: the fetches of its partitions answered, its writes acknowledged,
  both within `metrics.ready_within_ms`, the rule /readyz answers by). Each change is one line:
  `Kafka unreachable: <why>` (ERROR), `Kafka still unreachable after <n> min: <why>; <k> client
  warnings and errors since` every `REMINDER_S` (ERROR), `Kafka reachable again after <n> s; <k>
  client warnings and errors meanwhile` (WARNING).
- A repeat (`RepeatFilter`, on the log's handlers): a warning or an error of the client's
  loggers (`aiokafka.*`), or of the worker's marked `extra=REPEATS` (its fetch, commit and topic
  check failures), is counted in `callgate_kafka_client_log_records_total{level}`. It is
  written only while Kafka is reachable and the worker's group membership is not taken for lost
  (a member that stalled past its session says so once, and the refused heartbeats and commits
  that follow are that event), and each kind (logger and message) at most once per
  `REMINDER_S`, on one line, at WARNING: a traceback the client attaches is cut to its
  exception's repr, and the client's ERROR is one request's failure (a coordinator not found
  yet, a connection refused), which the worker's own lines judge (the failure is an expected
  one, not a bug in the worker).

Time is the caller's clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from worker.metrics import Metrics

log = logging.getLogger("callgate.kafka")

#: `extra=` of the worker's own log calls that repeat while Kafka is away
REPEATS = {"repeats": True}
#: how often an outage is said again, and how often a kind of repeat may be written
REMINDER_S = 300.0
#: the loggers of the Kafka client
CLIENT_LOGGER = "aiokafka"
#: the attribute a record carries once the filter decided on it
_DECIDED = "callgate_repeat_written"


class BrokerState:
    """Reachable or not, as the worker sees it; says each change once (see the module doc)."""

    def __init__(
        self,
        clock: Callable[[], float],
        reminder_s: float = REMINDER_S,
        *,
        session_s: float | None = None,
    ) -> None:
        self._clock = clock
        self.reminder_s = reminder_s
        #: a worker whose last round ended longer ago than its session stalled (a paused
        #: process): what the client logs as it runs again (a heartbeat refused, the group's
        #: coordinator marked dead) is that event, which the worker says once it has a round
        self._session_s = session_s
        self._round_at: float | None = None
        #: when Kafka was found unreachable (None: reachable)
        self.lost_at: float | None = None
        self._said_at = 0.0
        #: the worker takes its group membership for lost (`fetcher.Membership`: it stalled past
        #: its session); it said so, and the client's and its own failures that follow (a
        #: heartbeat, a commit refused) are that one event
        self.membership_lost = False
        #: the repeats counted (by the filter, on any thread) and at the last line said
        self.repeats = 0
        self._repeats_said = 0

    @property
    def reachable(self) -> bool:
        return self.lost_at is None

    @property
    def quiet(self) -> bool:
        """Whether repeats are only counted: the event they come from is said by the worker."""
        return self.lost_at is not None or self.membership_lost or self.stalled

    @property
    def stalled(self) -> bool:
        """The last round ended longer ago than the session (none ran yet: no)."""
        at, session_s = self._round_at, self._session_s
        return at is not None and session_s is not None and self._clock() - at > session_s

    def round_ended(self) -> None:
        self._round_at = self._clock()

    def observe(self, problem: str | None) -> None:
        """What the worker sees now: None (fetches answered, writes acknowledged) or what is
        wrong."""
        now = self._clock()
        if problem is None:
            if self.lost_at is not None:
                log.warning(
                    "Kafka reachable again after %.0f s; %d client warnings and errors meanwhile",
                    now - self.lost_at,
                    self.repeats - self._repeats_said,
                )
                self.lost_at = None
            return
        if self.lost_at is None:
            self.lost_at = self._said_at = now
            self._repeats_said = self.repeats
            log.error("Kafka unreachable: %s", problem)
        elif now - self._said_at >= self.reminder_s:
            self._said_at = now
            log.error(
                "Kafka still unreachable after %.0f min: %s; %d client warnings and errors since",
                (now - self.lost_at) / 60,
                problem,
                self.repeats - self._repeats_said,
            )


class RepeatFilter(logging.Filter):
    """On the log's handlers: counts the repeats, writes a kind of them once per reminder
    interval while Kafka is reachable, none while it is not."""

    def __init__(self, state: BrokerState, metrics: Metrics, clock: Callable[[], float]) -> None:
        super().__init__()
        self._state = state
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()  # the health server's thread may log too
        #: (logger, message) -> when it was last written
        self._written: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        decided = getattr(record, _DECIDED, None)  # a record passes each handler's filters
        if decided is not None:
            return bool(decided)
        if record.levelno < logging.WARNING or not _is_repeat(record):
            return True
        keep = self._keep(record)
        setattr(record, _DECIDED, keep)
        return keep

    def _keep(self, record: logging.LogRecord) -> bool:
        self._metrics.client_log_record(record.levelno >= logging.ERROR)
        with self._lock:
            self._state.repeats += 1
            if self._state.quiet:
                return False
            kind = (record.name, str(record.msg))
            now = self._clock()
            last = self._written.get(kind)
            if last is not None and now - last < self._state.reminder_s:
                return False
            self._written[kind] = now
        if record.levelno > logging.WARNING and record.name.startswith(CLIENT_LOGGER):
            # the client's view of one request; the worker says what is an error for it
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.getMessage()}: {record.exc_info[1]!r}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def _is_repeat(record: logging.LogRecord) -> bool:
    name = record.name
    return (
        name == CLIENT_LOGGER
        or name.startswith(CLIENT_LOGGER + ".")
        or getattr(record, "repeats", False) is True
    )


def install(state: BrokerState, metrics: Metrics, clock: Callable[[], float]) -> RepeatFilter:
    """Put the filter on every handler of the root logger (where every line is written)."""
    repeat_filter = RepeatFilter(state, metrics, clock)
    for handler in logging.getLogger().handlers:
        handler.addFilter(repeat_filter)
    return repeat_filter


def uninstall(repeat_filter: RepeatFilter) -> None:
    for handler in logging.getLogger().handlers:
        handler.removeFilter(repeat_filter)
