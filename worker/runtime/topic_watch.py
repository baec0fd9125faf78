"""What the worker knows of the topics it writes to: which are failing, which are gone.

Two sources. The outbox reports each topic's writes failing and recovering. A check, run beside
the rounds (a request to the cluster, which no round waits for), sees that the topics written
to still exist: a broker may acknowledge writes to a deleted topic and drop them, so a write
that succeeds says nothing of its topic. A check starts at most once per interval while one is
wanted (checkpoints wait for one: `verified_at`), and at the next chance when a write fails
(`suspect`).

A check's outcome is taken in as soon as it is done (`verified_at` moves then, whoever waits
for it); `finished()` hands what the checks done since it was last called found, as a `Found`,
to the worker, which acts on it (`Assignment.act_on`): a state topic gone stops it, an
outcome topic gone rewinds every partition, and nothing is judged until the topic is back. A
state topic is taken for gone only once every check for `STATE_GONE_AFTER_S` missed it: the
node a check asks may not have caught up with the cluster yet (a topic made a moment ago, as
the state topics are at start, is not known to every broker at once), and stopping is for
good. Until then nothing is verified, so no checkpoint is sent and nothing is committed. Time
is the caller's clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from aiokafka.errors import KafkaError

from worker.runtime.broker_log import REPEATS

log = logging.getLogger("callgate.worker")

#: why a topic fails when the check found it gone
MISSING = "does not exist"
#: How long every check must miss a state topic before it is taken for deleted.
STATE_GONE_AFTER_S = 10.0


@dataclass(frozen=True, slots=True)
class Found:
    """What a finished check found, that the worker acts on (`Assignment.act_on`): the state
    topics deleted (it stops), and the topics written to found missing since the last check
    (it rewinds once, and judges nothing until they are back: `missing`)."""

    state_gone: tuple[str, ...] = ()
    newly_missing: tuple[str, ...] = ()


class TopicWatch:
    """The failing topics, and the check that the topics written to exist."""

    def __init__(
        self,
        missing_topics: Callable[[list[str]], Awaitable[list[str]]],
        clock: Callable[[], float],
        interval_s: float,
        written: Sequence[str],
    ) -> None:
        self._missing_topics = missing_topics
        self._clock = clock
        self._interval_s = interval_s
        self._written = list(written)
        #: the compacted topics of the group's state, as they are made sure of
        self.state_topics: list[str] = []
        #: topic -> why its writes fail (`MISSING` for one the check found gone)
        self.failing: dict[str, str] = {}
        #: when the topics written to were last seen to exist (checkpoints wait for it)
        self.verified_at = float("-inf")
        self._check: asyncio.Future[list[str]] | None = None
        #: what the checks done since `finished()` was last called found
        self._found: Found | None = None
        self._started = float("-inf")
        self._last = float("-inf")
        #: state topic -> when the first of the checks that have missed it since started
        self._state_unseen_since: dict[str, float] = {}

    def watch_state(self, topics: Iterable[str]) -> None:
        """Check these state topics too, from the next check on."""
        self.state_topics = sorted({*self.state_topics, *topics})

    @property
    def missing(self) -> bool:
        """Whether a topic written to was found gone and is not back."""
        return MISSING in self.failing.values()

    def write_failing(self, topic: str, error: KafkaError) -> None:
        if topic not in self.failing:
            self.suspect()
        if self.failing.get(topic) != MISSING:
            self.failing[topic] = repr(error)

    def write_recovered(self, topic: str) -> None:
        self.failing.pop(topic, None)

    def suspect(self) -> None:
        """A write failed: its topic may be gone. The next check is due at once."""
        self._last = float("-inf")

    def check_when_due(self) -> None:
        """Start a check unless one runs or the last started within the interval."""
        if self._check is None and self._clock() - self._last >= self._interval_s:
            self._last = self._started = self._clock()
            check = asyncio.ensure_future(
                self._missing_topics([*self._written, *self.state_topics])
            )
            check.add_done_callback(self._checked)
            self._check = check

    async def wait(self, timeout_s: float) -> None:
        """Until the running check is done, or `timeout_s`."""
        if self._check is not None:
            await asyncio.wait((self._check,), timeout=timeout_s)
        else:
            await asyncio.sleep(timeout_s)

    def finished(self) -> Found | None:
        """What the checks done since the last call found (None: none is done, or every one
        failed)."""
        found, self._found = self._found, None
        return found

    def _checked(self, check: asyncio.Future[list[str]]) -> None:
        if check is not self._check:
            return
        self._check = None
        if check.cancelled():
            return
        try:
            missing = check.result()
        except KafkaError as exc:
            log.warning("cannot check that the output topics exist: %r", exc, extra=REPEATS)
            return
        found = self._found_in(missing)
        earlier = self._found
        if earlier is not None:  # not taken yet: both are news
            found = Found(
                tuple(sorted({*earlier.state_gone, *found.state_gone})),
                tuple(sorted({*earlier.newly_missing, *found.newly_missing})),
            )
        self._found = found

    def _found_in(self, missing: list[str]) -> Found:
        gone = self._state_gone(missing)
        if gone:
            return Found(state_gone=gone)
        if self._state_unseen_since:
            return Found()  # a state topic not seen, not for long yet: nothing is verified
        for topic in self._written:
            if topic not in missing and self.failing.get(topic) == MISSING:
                log.info("topic %s exists again", topic)
                del self.failing[topic]
        if not missing:
            self.verified_at = self._started
            return Found()
        newly = tuple(topic for topic in missing if self.failing.get(topic) != MISSING)
        for topic in newly:
            log.error("topic %s does not exist: rewinding to the last checkpoints", topic)
            self.failing[topic] = MISSING
        return Found(newly_missing=newly)

    def _state_gone(self, missing: list[str]) -> tuple[str, ...]:
        """The state topics every check has missed for `STATE_GONE_AFTER_S`."""
        unseen_since = self._state_unseen_since
        self._state_unseen_since = {
            topic: unseen_since.get(topic, self._started)
            for topic in self.state_topics
            if topic in missing
        }
        return tuple(
            topic
            for topic, since in self._state_unseen_since.items()
            if self._started - since >= STATE_GONE_AFTER_S
        )

    def cancel(self) -> None:
        if self._check is not None:
            self._check.cancel()
