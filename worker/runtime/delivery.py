"""The delivery protocol: what is written, acknowledged and committed, in which order, and why.

The worker judges input in *rounds*: one fetched batch of its assigned partitions, and what that
batch makes (`worker.runtime.judging`), written at once. Per input partition the state of its
open calls (and vendor streams) is kept in a compacted changelog topic, co-partitioned with the
input (`worker.runtime.checkpoints`). A checkpoint reflects an input offset: every record before
it was fed, none after. Checkpoints are taken, and offsets committed, on an interval
(`kafka.commit_interval_ms`, as Kafka Streams' `commit.interval.ms`), beside the rounds: no
round waits for an acknowledgement, a checkpoint or a commit. What is written is of four kinds
(`Kind`): outcome events and idempotency requests (`OUTPUT`), key-store changes
(`KEY_CHANGE`), checkpoint frames (`CHECKPOINT`) and the tombstones that delete the frames a
newer generation replaces (`TOMBSTONE`).

`Delivery` is what a guarantee does with the rounds; there are two, each stating its steps in
its own docstring:

- `at_least_once` (`worker.runtime.at_least_once.AtLeastOnce`; the default, and the only mode on
  a broker without transactions): the rounds' records are written, then a checkpoint of what
  they were judged from, then the input offsets it reflects are committed, each step once the
  one before is acknowledged;
- `exactly_once` (`worker.runtime.exactly_once.ExactlyOnce`; needs transactions): each owned
  partition writes into a Kafka transaction of its own, which holds the records of its rounds
  since the last commit, a checkpoint and the next input offset, and commits all of it or
  nothing.

Why no crash point loses a call or yields a second, different verdict:

- a partition is restored from its last checkpoint and the records after it are fed again. The
  reassembler decides by the records alone (record time, no wall clock), so the same calls close
  the same way: an event written again equals the first but for the measured phase timings
  (same `event_id`, same verdict, same fields); under `exactly_once` only a committed round's
  events are visible, so a `read_committed` reader sees each once;
- a partition resumes right after the offset its checkpoint reflects, whatever the committed
  offset says: a call is never judged from a fragment.
- an idempotency decision made again after a crash finds its own key-store change (written with
  the decision) and writes the same event (`Decision.REPLAY`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from aiokafka.errors import KafkaError

from worker.core.processor import Emission
from worker.errors import InfrastructureError, StateError
from worker.metrics import Metrics
from worker.runtime.checkpoints import ChangelogRecord
from worker.runtime.ledger import Partition
from worker.runtime.outbox import Record
from worker.runtime.topic_watch import TopicWatch
from worker.settings import Settings

if TYPE_CHECKING:  # they use this module's types
    from worker.runtime.fetcher import Fetcher, Membership
    from worker.runtime.kafka import Kafka
    from worker.runtime.partitions import State

log = logging.getLogger("callgate.worker")

__all__ = [
    "NOTHING_LOST",
    "Context",
    "Delivery",
    "Judged",
    "Kind",
    "Lost",
    "Origin",
    "Outcomes",
    "Partition",
    "Stats",
]


class Kind(Enum):
    """What an outbox record is, for what its acknowledgement moves."""

    #: an outcome event, or an idempotency request to its key's owner
    OUTPUT = "output"
    #: a change of an idempotency key store (its compacted changelog)
    KEY_CHANGE = "key-change"
    #: a part of a checkpoint frame (an input partition's changelog)
    CHECKPOINT = "checkpoint"
    #: the deletion of a frame a newer generation replaced
    TOMBSTONE = "tombstone"
    #: a flip written to the shadow topic (shadow mode): never substituted, dropped if refused
    SHADOW = "shadow"


@dataclass(slots=True)
class Origin:
    """Where an outbox record comes from: its kind and input partition, and what a substitute
    is made from when a topic refuses it for good."""

    kind: Kind
    partition: Partition
    emission: Emission | None = None
    #: the last record of a checkpoint frame: its size and kind, counted once acknowledged
    frame_bytes: int = 0
    full_frame: bool = False


@dataclass(slots=True)
class Judged:
    """A judged round: what it made, per input partition it came from."""

    id: int
    #: records made (handed to the delivery with `Delivery.add`)
    records: dict[Partition, int] = field(default_factory=dict)
    #: the next input offset of each partition the round read
    offsets: dict[Partition, int] = field(default_factory=dict)


@dataclass(slots=True)
class Stats:
    """Counts since start, for logs and tests."""

    records: int = 0
    emitted: int = 0
    acknowledged: int = 0
    #: outcome events acknowledged (what a reader of the outcome topics can count)
    events: int = 0
    substituted: int = 0
    dropped: int = 0
    commits: int = 0
    commit_errors: int = 0
    rebalances: int = 0
    pauses: int = 0
    checkpoints: int = 0
    checkpoint_bytes: int = 0
    rewinds: int = 0


@dataclass(frozen=True, slots=True)
class Lost:
    """Partitions a delivery can no longer write for as they are: each is restored from its
    committed state and fetched from there (`rewind`), or given up until the group assigns it
    again (`fenced`: a newer owner has it)."""

    rewind: tuple[Partition, ...] = ()
    fenced: tuple[Partition, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.rewind or self.fenced)

    def __add__(self, other: Lost) -> Lost:
        return Lost(self.rewind + other.rewind, self.fenced + other.fenced)


NOTHING_LOST = Lost()


class Delivery(Protocol):
    """What a guarantee does with the worker's rounds. The worker holds its round lock around
    every call but `start` and `close`, so a rebalance never runs in the middle of one."""

    async def start(self) -> None:
        """Connect what the guarantee writes with."""
        ...

    def writable(self, where: Partition) -> bool:
        """Whether a round may judge the partition's records now."""
        ...

    def add(self, record: Record) -> None:
        """A record the round being judged made."""
        ...

    def submit(self, judged: Judged) -> None:
        """The round is judged: every record it made was added."""
        ...

    async def advance(self, *, force: bool = False) -> Lost:
        """Between rounds: write what was added, and when the commit interval is over (or
        `force`), checkpoint and commit what may be, beside the rounds (`force`: now, and wait
        for it)."""
        ...

    @property
    def pending_records(self) -> int:
        """Records handed over and not acknowledged yet (exactly once: not committed);
        fetching pauses above a bound."""
        ...

    @property
    def pending_bytes(self) -> int:
        """The bytes (keys and values) of `pending_records`."""
        ...

    @property
    def pauses_while_failing(self) -> bool:
        """Whether fetching pauses while a topic's writes fail."""
        ...

    async def open(self, partitions: Iterable[Partition]) -> None:
        """Before the partitions' state is restored. Raises `BrokerError` when they cannot be
        written for."""
        ...

    async def rewind(self, partitions: Iterable[Partition]) -> None:
        """Drop what was written for the partitions and is not committed: they are restored
        from their committed state and judged again from there."""
        ...

    async def release(self, partitions: Iterable[Partition]) -> None:
        """The group takes the partitions away: finish what is in flight for them (bounded),
        then let them go."""
        ...

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Drop what is queued or owed for the partitions (they are gone, or fenced)."""
        ...

    async def drain(self, deadline: float) -> None:
        """Stopping: write and commit what is in flight, until done or the deadline."""
        ...

    async def close(self, timeout_s: float) -> None:
        """Stop the clients (what is not committed by now is judged again by the next owner)."""
        ...

    def idle(self) -> bool:
        """Nothing handed over waits for an acknowledgement or a commit."""
        ...

    async def settled(self) -> None:
        """Until what runs beside the rounds for what was handed over so far (a commit) is
        done."""
        ...

    def waiting(self) -> str:
        """How rounds wait while a topic's writes fail, for readiness."""
        ...


@dataclass(frozen=True, slots=True)
class Context:
    """What a delivery works with, built once (`worker.runtime.parts`)."""

    settings: Settings
    kafka: Kafka
    fetcher: Fetcher
    state: State
    topics: TopicWatch
    metrics: Metrics
    stats: Stats
    #: an outcome record refused for good -> what to write instead (`Judge.substitute`)
    substitute: Callable[[Record, KafkaError], Record | None]
    #: stop the worker, and have it raise this (state that cannot be kept)
    stop_fatally: Callable[[InfrastructureError], None]
    clock: Callable[[], float]
    #: the id of a round that is not a judged batch (a checkpoint's, under at_least_once)
    next_round: Callable[[], int]
    membership: Membership
    #: the accepted, rejected and incomplete topics
    outcome_topics: frozenset[str]


class Outcomes:
    """What both guarantees do with how records fared (the outbox's `Sink`).

    An acknowledged record is counted (an outcome event, a checkpoint frame and its bytes). A
    record refused for good: an outcome record is replaced by its `substitute` (None: there is
    none, and it is dropped); a checkpoint frame or a key-store change stops the worker, as the
    state it cannot keep would be lost; a tombstone is let go (the frame it deletes stays, and
    a restore reads it and drops it). A failing write has the topics checked.
    """

    def __init__(self, context: Context) -> None:
        self._context = context
        self._topic_watch = context.topics
        self._metrics = context.metrics
        self._stats = context.stats

    def add(self, record: Record) -> None:
        raise NotImplementedError

    def add_frames(self, round_id: int, where: Partition, frames: list[ChangelogRecord]) -> None:
        """A checkpoint's frame records, in order; the last one counts the frame's size."""
        changelog = self._context.state.changelog(where[0])
        size = sum(len(value or b"") for _, value, _ in frames)
        full = bool(frames) and dict(frames[0][2]).get("frame-kind") == b"full"
        last = len(frames) - 1
        for index, (key, value, headers) in enumerate(frames):
            origin = Origin(Kind.CHECKPOINT, where)
            if index == last:
                origin.frame_bytes, origin.full_frame = size, full
            self.add(Record(round_id, changelog, key, value, headers, where[1], origin))

    def acknowledged(self, record: Record) -> None:
        origin: Origin = record.origin
        if origin.kind in (Kind.OUTPUT, Kind.KEY_CHANGE, Kind.SHADOW):
            self._stats.acknowledged += 1
            if origin.kind is Kind.OUTPUT and record.topic in self._context.outcome_topics:
                self._stats.events += 1
        elif origin.kind is Kind.CHECKPOINT and origin.frame_bytes:
            self._stats.checkpoints += 1
            self._stats.checkpoint_bytes += origin.frame_bytes
            self._metrics.checkpoint(origin.frame_bytes, full=origin.full_frame)

    def refused(self, record: Record, error: KafkaError) -> Record | None:
        kind = record.origin.kind
        if kind in (Kind.CHECKPOINT, Kind.KEY_CHANGE):
            self._context.stop_fatally(
                StateError(
                    f"{record.topic} refuses writes for good ({error!r}): the worker stops, "
                    "as state it cannot keep would be lost"
                )
            )
            return None
        if kind is Kind.TOMBSTONE:
            return None
        if kind is Kind.SHADOW:  # a diagnostic: the call's own event is written apart
            log.warning("%s refused a shadow record for good: %r", record.topic, error)
            return None
        return self._context.substitute(record, error)

    def topic_failing(self, topic: str, error: KafkaError) -> None:
        self._metrics.produce_error()
        self._topic_watch.write_failing(topic, error)

    def topic_recovered(self, topic: str) -> None:
        self._topic_watch.write_recovered(topic)
