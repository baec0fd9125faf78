"""The group consumer: what is fetched next, where each partition resumes, what is paused.

The only module that talks to the worker's consumer. The consumer (aiokafka's) fetches a
partition again only once everything it holds of that partition was taken, and has one fetch in
flight per broker; one that holds only partitions with nothing new waits there up to
`fetch_max_wait_ms`. So what it holds is read ahead as soon as it is there (within a bound:
`fetch`), and the next fetch is in flight while a round is judged. A fetch never outlives a
stop (the consumer waits out a rebalance in progress whatever the fetch timeout, and a stop
must not wait for the group).

A partition is placed where its restored state ends (`place`); a position the log no longer has
is moved to the log's start and the loss said (`skip_deleted`): the consumer has no automatic
reset, so nothing is skipped in silence. Offsets are committed through `commit`, never past the
log's end.

A commit is never cancelled: every one runs to its end as a task of its own, and its outcome is
read, whoever stopped waiting for it (`kafka.Requests`): a commit cut off by its timeout, a
revoke's or a stop's deadline, then refused because the group expelled the member meanwhile,
left "Task exception was never retrieved" and its traceback. A commit no longer waited for says
how it ended in one line (refused after a lost membership is expected: the partitions' next
owner judges those records again); one still running when the consumer has stopped is
cancelled then, its request failed by the closed connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    TopicAuthorizationFailedError,
)

from worker.errors import BrokerError
from worker.metrics import Metrics
from worker.runtime.broker_log import REPEATS
from worker.runtime.delivery import Partition
from worker.runtime.kafka import Listener, Requests
from worker.runtime.provision import Subscription

log = logging.getLogger("callgate.worker")

#: What a fetch raises when the worker's principal lacks a grant (the group's, or a topic's).
AUTHORIZATION_ERRORS: tuple[type[KafkaError], ...] = (
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
)

#: How long the lag report waits for a partition's position (one being placed has none yet).
POSITION_WAIT_S = 0.05

#: A fetched batch: each partition's records, in order.
Batch = Mapping[TopicPartition, list[Any]]


class Fetcher:
    """The worker's consumer (an `AIOKafkaConsumer`, or a fake of its parts used here)."""

    def __init__(
        self,
        consumer: Any,
        metrics: Metrics,
        *,
        fetch_timeout_ms: int,
        max_records: int,
        read_committed: bool = False,
        wall: Callable[[], float] = time.time,
    ):
        self.consumer = consumer
        self._read_committed = read_committed
        #: the consumer's fetch answers are stamped with the wall clock
        self._wall = wall
        #: when each partition was last placed or resumed (its fetches start then)
        self._fetching_since: dict[TopicPartition, float] = {}
        #: when the worker's loop last ran again after a stall (`stalled`)
        self._stall_ended = float("-inf")
        self._metrics = metrics
        self._timeout_ms = fetch_timeout_ms
        self._max_records = max_records
        self._stopped: asyncio.Future[Any] | None = None
        #: the offset commits (`commit`): each is read to its end, none cancelled
        self._commits = Requests("a commit", log)
        #: records read ahead of the rounds, per partition: lists of records, in order, and
        #: how many of the first list were taken already
        self._ahead: dict[TopicPartition, deque[list[Any]]] = {}
        self._taken: dict[TopicPartition, int] = {}
        self.ahead_records = 0
        #: how many times each partition was placed again or dropped: a batch taken before
        #: that is not the partition's any more (`current`)
        self._moves: dict[TopicPartition, int] = {}
        self._batch_moves: dict[TopicPartition, int] = {}

    def subscribe(self, subscription: Subscription, listener: Listener) -> None:
        """Join the group on `subscription`; `listener` hears of each rebalance."""
        if subscription.pattern is not None:
            self.consumer.subscribe(pattern=subscription.pattern, listener=listener)
        else:
            self.consumer.subscribe(topics=list(subscription.topics), listener=listener)

    async def fetch(self, stop: asyncio.Event, room: int) -> Batch:
        """The next round's batch (at most `fetch_max_records`): what was read ahead, else
        what the consumer fetches within the fetch timeout. Then what the consumer holds of
        the partitions with nothing read ahead is read ahead, up to `room` records in all (so
        what is read ahead of a partition is at most one fetch of it). Nothing once `stop` is
        set. Raises `OffsetOutOfRangeError` (see `skip_deleted`) and `AUTHORIZATION_ERRORS`;
        any other error of the fetch is logged, and the batch is empty."""
        if not self.ahead_records:
            self._keep(await self._get(stop, self._timeout_ms, max(room, self._max_records)))
        batch = self._take(self._max_records)
        self._batch_moves = {tp: self._moves.get(tp, 0) for tp in batch}
        if stop.is_set():
            return {}
        drained = [tp for tp in self.consumer.assignment() if tp not in self._ahead]
        if room > self.ahead_records and drained:
            self._keep(await self._get(stop, 0, room - self.ahead_records, drained))
        else:  # the producer, the consumer's fetches and the commits run meanwhile
            await asyncio.sleep(0)
        return batch

    def _keep(self, fetched: Batch) -> None:
        for tp, records in fetched.items():
            if records:
                self._ahead.setdefault(tp, deque()).append(records)
                self.ahead_records += len(records)

    def _take(self, most: int) -> dict[TopicPartition, list[Any]]:
        """Up to `most` records read ahead, oldest first per partition; the partition taken
        from first turns with each round, so none waits behind another."""
        batch: dict[TopicPartition, list[Any]] = {}
        for tp in list(self._ahead):
            if most <= 0:
                break
            lists = self._ahead.pop(tp)
            taken: list[Any] = []
            while lists and len(taken) < most:
                start = self._taken.pop(tp, 0)
                records = lists[0]
                end = min(len(records), start + most - len(taken))
                taken.extend(records[start:end] if start or end < len(records) else records)
                if end < len(records):
                    self._taken[tp] = end
                else:
                    lists.popleft()
            batch[tp] = taken
            most -= len(taken)
            self.ahead_records -= len(taken)
            if lists:
                self._ahead[tp] = lists  # behind the others: taken from first next time
        return batch

    def current(self, batch: Batch) -> Batch:
        """The partitions of the last batch fetched that were not placed again or dropped
        since (a rewind or a rebalance ran meanwhile: their records are not where their
        partitions are now)."""
        moves = self._moves
        return {
            tp: records
            for tp, records in batch.items()
            if self._batch_moves.get(tp) == moves.get(tp, 0)
        }

    def put_back(self, batch: Batch) -> None:
        """A batch not judged is fetched again: each partition from its first record."""
        self.drop((tp.topic, tp.partition) for tp in batch)
        for tp, records in batch.items():
            if records:
                self.consumer.seek(tp, records[0].offset)

    def drop(self, partitions: Iterable[Partition]) -> None:
        """Forget what was read ahead of the partitions (they move, or are fetched again from
        another place)."""
        for topic, partition in partitions:
            tp = TopicPartition(topic, partition)
            self._moves[tp] = self._moves.get(tp, 0) + 1
            lists = self._ahead.pop(tp, None)
            if lists:
                self.ahead_records -= sum(len(records) for records in lists)
                self.ahead_records += self._taken.pop(tp, 0)

    async def _get(
        self,
        stop: asyncio.Event,
        timeout_ms: int,
        most: int,
        partitions: list[TopicPartition] | None = None,
    ) -> Batch:
        """What the consumer holds (or fetches within `timeout_ms`), at most `most` records,
        of `partitions` (all by default); nothing once `stop` is set."""
        fetch = asyncio.ensure_future(
            self.consumer.getmany(*(partitions or ()), timeout_ms=timeout_ms, max_records=most)
        )
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait((fetch, self._stopped), return_when=asyncio.FIRST_COMPLETED)
        if not fetch.done():
            fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError, KafkaError):
                await fetch
            return {}
        try:
            batch: Batch = fetch.result()
        except NoOffsetForPartitionError as exc:
            # a partition being assigned, not placed yet: its restore places it (a fetch runs
            # beside the rebalance listener)
            log.debug("fetch: %r", exc)
            return {}
        except (OffsetOutOfRangeError, *AUTHORIZATION_ERRORS):
            raise  # the caller acts on these: no retry cures a missing grant
        except KafkaError as exc:
            log.warning("fetch failed: %r", exc, extra=REPEATS)
            return {}
        return batch

    async def report_lag(self, owned: Iterable[Partition]) -> None:
        """Each owned partition's lag, idle ones (0) included: the records between the next one
        to judge (the first read ahead, else the consumer's position) and the log's end as the
        last fetch answer gave it (under read_committed, the last stable offset: what may be
        read). A partition no fetch has answered for yet has no lag yet."""
        consumer = self.consumer
        held = consumer.assignment()
        for topic, partition in owned:
            tp = TopicPartition(topic, partition)
            if tp not in held:  # revoked meanwhile: its series goes with its state
                continue
            end = consumer.highwater(tp)
            if end is None:
                continue
            if self._read_committed:
                stable = consumer.last_stable_offset(tp)
                if stable is not None and stable >= 0:
                    end = stable
            ahead = self._ahead.get(tp)
            if ahead:
                at = ahead[0][self._taken.get(tp, 0)].offset
            else:
                try:  # immediate once the partition is placed; bounded while it is not
                    at = await asyncio.wait_for(consumer.position(tp), POSITION_WAIT_S)
                except (TimeoutError, KafkaError):
                    continue
            self._metrics.set_lag(topic, partition, max(0, end - at))

    async def skip_deleted(
        self, out_of_range: Mapping[TopicPartition, int], assigned: Iterable[Partition]
    ) -> None:
        """Fetch positions the log no longer has: the records there were deleted before they
        were judged (retention shorter than the lag, records deleted by hand), or the log is
        shorter than it was (the topic was recreated). Fetching goes on from the log's start,
        and the loss is said: the calls in the deleted records get no verdict, or one from
        what is left of them. Only a partition still `assigned` and still at that position is
        moved (the fetch ran beside the rebalance listener: it may have been restored
        elsewhere since, or revoked)."""
        consumer = self.consumer
        owned = set(assigned)
        self.drop((tp.topic, tp.partition) for tp in out_of_range)
        try:
            positions = {}
            for tp, at in out_of_range.items():
                if (tp.topic, tp.partition) in owned and await consumer.position(tp) == at:
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
                self._metrics.input_records_deleted(start - at)
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

    async def place(self, resume: Mapping[Partition, int | None]) -> None:
        """Each partition fetched from its offset; None: from its committed offset, else from
        its start. Raises `BrokerError`."""
        consumer = self.consumer
        self.drop(resume)
        offsets = {TopicPartition(*where): offset for where, offset in resume.items()}
        try:
            # one request each, all in flight at once: one after the other, a restart's 15
            # partitions took 15 round trips before the first fetch
            unplaced = [tp for tp, offset in offsets.items() if offset is None]
            committed = await asyncio.gather(*(consumer.committed(tp) for tp in unplaced))
            offsets.update(zip(unplaced, committed, strict=True))
            for tp, offset in offsets.items():
                if offset is not None:
                    consumer.seek(tp, offset)
            from_start = [tp for tp, offset in offsets.items() if offset is None]
            if from_start:
                await consumer.seek_to_beginning(*from_start)
        except KafkaError as exc:
            raise BrokerError(
                f"cannot read the committed offsets of {len(resume)} partitions: {exc!r}"
            ) from exc

    def pause(self, partitions: Iterable[Partition]) -> None:
        tps = [TopicPartition(*where) for where in partitions]
        if tps:
            self.consumer.pause(*tps)

    def resume(self, partitions: Iterable[Partition]) -> None:
        tps = [TopicPartition(*where) for where in partitions]
        if tps:
            self.consumer.resume(*tps)
            now = self._wall()
            for tp in tps:
                self._fetching_since[tp] = now

    def stalled(self) -> None:
        """The worker's loop runs again after a stall: the answers that came meanwhile are read
        only now, so a fetch counts as unanswered from here at the earliest."""
        self._stall_ended = self._wall()

    def unanswered(self, owned: Iterable[Partition], within_s: float) -> list[Partition]:
        """The owned partitions being fetched (held, not paused, nothing read ahead) whose last
        fetch answer, or their resumption or the end of a stall if later, is older than
        `within_s`: the broker (their leader) does not answer. An answer with no records counts:
        an idle partition's fetches are answered every `fetch_max_wait_ms`."""
        consumer = self.consumer
        held, paused = consumer.assignment(), consumer.paused()
        now = self._wall()
        late = []
        for topic, partition in owned:
            tp = TopicPartition(topic, partition)
            if tp not in held or tp in paused or tp in self._ahead:
                continue
            answered_ms = consumer.last_poll_timestamp(tp)
            answered = (answered_ms or 0) / 1000
            last = max(self._fetching_since.get(tp, now), answered, self._stall_ended)
            if now - last > within_s:
                late.append((topic, partition))
        return sorted(late)

    def holds(self) -> set[Partition]:
        """The partitions the consumer holds now (the group's assignment as it knows it)."""
        return {(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    async def commit(self, offsets: Mapping[Partition, int], timeout_s: float) -> bool:
        """Commit the offsets (each partition's next offset to read); False when there was
        nothing to commit. An offset past its partition's log end is left out: the broker's
        log is shorter than what was read (a memory-only broker restarted, it lost data), and
        committing it would skip whatever the log holds now. The client retries a commit for
        as long as the coordinator is unavailable: bounded by `timeout_s` (`TimeoutError`), as
        a revoke and a stop wait for it. Raises `KafkaError` otherwise."""
        consumer = self.consumer
        request: dict[TopicPartition, int] = {}
        for (topic, partition), offset in offsets.items():
            tp = TopicPartition(topic, partition)
            highwater = consumer.highwater(tp)
            if highwater is not None and offset > highwater:
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
            return False
        await self._commits.wait(consumer.commit(request), timeout_s)
        return True

    async def close(self, timeout_s: float) -> None:
        """Stop the consumer, then end the commits still running, all within `timeout_s`."""
        if self._stopped is not None:
            self._stopped.cancel()
        await self._commits.close(self.consumer.stop(), timeout_s, "the consumer")


#: how much earlier than the member sees it the coordinator may have heard from it: a sync's or
#: a heartbeat's round trip and the loop's turn
CONTACT_SLACK_S = 0.25


class Membership:
    """What the worker knows of its place in the consumer group.

    A member that stalls past its session (a process paused, a loop blocked) is expelled by the
    group coordinator without hearing of it until its next heartbeat: from the moment it runs
    again it may hold partitions that another member owns now. Whatever it writes for them then
    is refused once the new owner has fenced it, but what it opens (a producer of a partition's
    transactional id) fences the new owner in turn. So a stall long enough for the group to
    have expelled the member counts as membership lost, until the group assigns partitions
    again or a session has passed without that (the heartbeats then say the member stayed: an
    expelled one hears it within a heartbeat and rejoins).

    The coordinator expels a member it has not heard from for a session. It hears from it at
    the assignment (the join and sync it answered) and at each heartbeat after it; the client
    heartbeats only once the assignment callback has returned, the first a heartbeat interval
    later (`settled`), then every interval. So when a stall began, the coordinator may last have
    heard from the member at its assignment, if no heartbeat was due since, else up to a
    heartbeat interval before; each up to `CONTACT_SLACK_S` earlier than the member saw it. A
    stall is long enough when it and that unheard time together pass the session. (The
    worker's rounds follow each other within a fetch timeout, its pulse beats a few times a
    second and its heartbeats run between them: a longer gap means the loop stalled.)"""

    def __init__(self, session_s: float, heartbeat_s: float, clock: Callable[[], float]) -> None:
        self._session_s = session_s
        self._heartbeat_s = heartbeat_s
        self._clock = clock
        self._assigned_at = float("-inf")
        #: when the first heartbeat after the assignment is due (None: its callback runs)
        self._heartbeats_from: float | None = None
        self._lost_at: float | None = None

    def assigned(self) -> None:
        """The group assigned partitions (its callback begins): the member has its place."""
        self._assigned_at = self._clock()
        self._heartbeats_from = None
        self._lost_at = None

    def settled(self) -> None:
        """The assignment callback returned: the client heartbeats from a heartbeat interval on."""
        self._heartbeats_from = self._clock() + self._heartbeat_s

    def ran(self, since: float) -> None:
        """The loop ran at `since` and now, not between: long enough for the group to have
        expelled the member, the membership is lost. An assignment during it ran the loop (its
        callback), so the stall began no earlier."""
        now = self._clock()
        began = max(since, self._assigned_at)
        unheard = self._unheard_at(began)
        if now - began + unheard > self._session_s:
            if self._lost_at is None:
                log.warning(
                    "stalled %.1f s, long enough to be expelled from the group (its "
                    "coordinator may last have heard from it %.1f s before, and expels after a "
                    "%.1f s session): taking the group membership for lost until the group "
                    "assigns partitions again",
                    now - began,
                    unheard,
                    self._session_s,
                )
            self._lost_at = now

    def _unheard_at(self, moment: float) -> float:
        """How long before `moment` the coordinator may last have heard from the member."""
        first_heartbeat = self._heartbeats_from
        assigned = self._assigned_at != float("-inf")
        if assigned and (first_heartbeat is None or moment < first_heartbeat):
            return moment - self._assigned_at + CONTACT_SLACK_S
        return self._heartbeat_s + CONTACT_SLACK_S

    @property
    def lost(self) -> bool:
        lost_at = self._lost_at
        return lost_at is not None and self._clock() - lost_at < self._session_s
