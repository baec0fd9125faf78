"""A bounded range of input topics, read once and read-only (`callgate replay --topic`).

The reader joins no group and commits nothing: a consumer without a group id, assigned the
partitions it reads, `read_committed` (an aborted transaction's records are skipped, as the
worker's group skips them under `exactly_once`). Each partition's range is two offsets:

- the start: `--from-offset` (raised to the first offset the log still holds, said on stderr),
  or the first record at or after `--since` (Kafka's own lookup by time, checked against the
  record it names: a cluster that cannot look up by time is refused), or the log's start;
- the end (excluded): `--to-offset`, or the first record at or after `--until`, but never past
  the partition's end when the read begins: the last stable offset the partition's first
  fetch response reports (its high watermark where the broker has no transactions). So the read
  is bounded even while producers go on appending. The end is taken from the fetch, not from a
  `ListOffsets` request, because tansu answers that one with an offset short of the log's end
  (the first offset of its last batch, as measured), which would cut the range short.

A partition is done once the consumer's position reaches its end (transaction markers take
offsets too, so a position may jump past the last record). A partition that makes no progress
for the request timeout while short of its end is a `BrokerError`, never a silent short read.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from worker.errors import BrokerError, ConfigError
from worker.runtime.kafka import READ_COMMITTED, Kafka
from worker.runtime.kafka_options import connection_options
from worker.settings import Settings


@dataclass(frozen=True, slots=True)
class Bound:
    """One end of a range: an offset (in every partition read), a time (milliseconds since the
    epoch, compared with the records' timestamps), or neither (the log's start, or its end)."""

    offset: int | None = None
    time_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Span:
    """What was read of one partition: offsets `start` up to `end`, `end` excluded."""

    topic: str
    partition: int
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] offsets {self.start}..{self.end}"


def read_range(
    settings: Settings,
    topics: Sequence[str],
    *,
    partitions: Sequence[int] = (),
    start: Bound = Bound(),
    end: Bound = Bound(),
    feed: Callable[[str, int, list[Any]], None],
) -> list[Span]:
    """Read the range to its end in an event loop of its own, each batch handed to `feed`;
    what was read of each partition."""

    async def read() -> list[Span]:
        spans: list[Span] = []
        async for topic, partition, records in read_history(
            settings, topics, partitions=partitions, start=start, end=end, spans=spans
        ):
            feed(topic, partition, records)
        return spans

    return asyncio.run(read())


async def read_history(
    settings: Settings,
    topics: Sequence[str],
    *,
    partitions: Sequence[int] = (),
    start: Bound = Bound(),
    end: Bound = Bound(),
    spans: list[Span] | None = None,
) -> AsyncIterator[tuple[str, int, list[Any]]]:
    """Every record of the range, as (topic, partition, records in offset order) batches.
    `spans`, when given, receives what was read of each partition once the read is done."""
    kafka = settings.kafka
    consumer = AIOKafkaConsumer(
        **connection_options(kafka),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        isolation_level=READ_COMMITTED,
        max_poll_records=kafka.fetch_max_records,
        request_timeout_ms=kafka.request_timeout_ms,
    )
    try:
        await consumer.start()
        reads = await _plan(settings, consumer, topics, partitions=partitions, start=start, end=end)
        async for batch in _read(consumer, reads, kafka.request_timeout_ms / 1000):
            yield batch
        if spans is not None:
            spans.extend(read.span() for read in reads)
    except KafkaError as exc:
        raise BrokerError(f"reading {', '.join(topics)} failed: {exc!r}") from exc
    finally:
        await consumer.stop()


@dataclass(slots=True)
class _Read:
    """One partition's read: where it starts, the range's own end if it has one, and the end
    once known (the range's, or the partition's end when the read began if that is sooner)."""

    tp: TopicPartition
    start: int
    limit: int | None
    end: int | None = None

    def span(self) -> Span:
        end = self.end if self.end is not None else self.start
        return Span(self.tp.topic, self.tp.partition, self.start, max(self.start, end))


async def _plan(
    settings: Settings,
    consumer: AIOKafkaConsumer,
    topics: Sequence[str],
    *,
    partitions: Sequence[int],
    start: Bound,
    end: Bound,
) -> list[_Read]:
    layouts = await Kafka(settings).describe(topics)
    chosen: list[TopicPartition] = []
    for topic in topics:
        if topic not in layouts:
            raise ConfigError(f"topic {topic!r} does not exist")
        present = list(range(layouts[topic].partitions))
        if not present:
            raise BrokerError(f"topic {topic!r} has no partition with a leader yet")
        missing = sorted(set(partitions) - set(present))
        if missing:
            raise ConfigError(f"topic {topic!r} has partitions {present}, not {missing}")
        chosen.extend(
            TopicPartition(topic, p) for p in present if not partitions or p in partitions
        )
    consumer.assign(chosen)
    first = await consumer.beginning_offsets(chosen)
    starts = await _offsets(consumer, chosen, start)
    limits = await _offsets(consumer, chosen, end)
    quiet_s = settings.kafka.request_timeout_ms / 1000
    for bound, found, option in ((start, starts, "--since"), (end, limits, "--until")):
        if bound.time_ms is not None:
            for tp, offset in found.items():
                if offset is not None:
                    await _check_lookup(
                        consumer, tp, offset, time_ms=bound.time_ms, option=option, quiet_s=quiet_s
                    )
    consumer.resume(*chosen)
    reads = []
    for tp in chosen:
        begin = starts[tp] if start != Bound() else first[tp]
        if begin is None:  # no record at or after --since: nothing to read
            reads.append(_Read(tp, first[tp], 0))
            continue
        if begin < first[tp]:
            print(
                f"callgate replay: {tp.topic}[{tp.partition}] holds no records before offset "
                f"{first[tp]} (deleted); reading from there",
                file=sys.stderr,
            )
            begin = first[tp]
        reads.append(_Read(tp, begin, limits[tp]))
    return reads


async def _offsets(
    consumer: AIOKafkaConsumer, chosen: list[TopicPartition], bound: Bound
) -> dict[TopicPartition, int | None]:
    """Each partition's offset for `bound`: as given, looked up by time (None: no record at or
    after it), or None for no bound."""
    if bound.offset is not None:
        return dict.fromkeys(chosen, bound.offset)
    if bound.time_ms is None:
        return dict.fromkeys(chosen)
    found = await consumer.offsets_for_times(dict.fromkeys(chosen, bound.time_ms))
    return {tp: (found[tp].offset if found.get(tp) is not None else None) for tp in chosen}


async def _check_lookup(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    offset: int,
    *,
    time_ms: int,
    option: str,
    quiet_s: float,
) -> None:
    """The record the cluster named for a time must be at or after it: a cluster that cannot
    look offsets up by time (tansu answers offset 0 whatever the time) is refused, never
    taken at its word."""
    record = await _record_at(consumer, tp, offset, quiet_s)
    if record is not None and record.timestamp < time_ms:
        raise BrokerError(
            f"asked for the first record of {tp.topic}[{tp.partition}] at or after {option} "
            f"({time_ms} ms), the cluster named offset {offset}, written at {record.timestamp}"
            " ms, before it: it cannot look offsets up by time; give offsets instead "
            "(--from-offset, --to-offset)"
        )


async def _record_at(
    consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int, quiet_s: float
) -> Any | None:
    """The first record of `tp` at or after `offset`; None when the partition ends before."""
    consumer.pause(*consumer.assignment())
    consumer.resume(tp)
    consumer.seek(tp, offset)
    deadline = time.monotonic() + quiet_s
    while time.monotonic() < deadline:
        records = (await consumer.getmany(tp, timeout_ms=200, max_records=1)).get(tp)
        if records:
            return records[0]
        end = _end_now(consumer, tp, None)
        if end is not None and await consumer.position(tp) >= end:
            return None
    raise BrokerError(f"no record of {tp.topic}[{tp.partition}] at {offset} in {quiet_s:.0f} s")


async def _read(
    consumer: AIOKafkaConsumer, reads: list[_Read], quiet_s: float
) -> AsyncIterator[tuple[str, int, list[Any]]]:
    active: dict[TopicPartition, _Read] = {}
    for read in reads:
        if read.limit is not None and read.limit <= read.start:
            read.end = read.start  # an empty range
            consumer.pause(read.tp)
        else:
            consumer.seek(read.tp, read.start)
            active[read.tp] = read
    positions = dict.fromkeys(active, -1)
    last_progress = time.monotonic()
    while active:
        try:
            batches = await consumer.getmany(*active, timeout_ms=200)
        except OffsetOutOfRangeError as exc:  # a start past the log's end: nothing there
            named: dict[TopicPartition, int] = exc.args[0] if exc.args else {}
            past = [tp for tp in named if tp in active]
            if not past:
                raise
            for tp in past:
                read = active.pop(tp)
                print(
                    f"callgate replay: {tp.topic}[{tp.partition}] ends before offset "
                    f"{read.start}: nothing to read there",
                    file=sys.stderr,
                )
                read.end = read.start
                consumer.pause(tp)
            continue
        for tp, read in active.items():
            if read.end is None:
                read.end = _end_now(consumer, tp, read.limit)
        for tp, records in batches.items():
            read = active[tp]
            assert read.end is not None, "a fetch response that brought records set the end"
            kept = [record for record in records if record.offset < read.end]
            if kept:
                yield tp.topic, tp.partition, kept
        for tp, read in list(active.items()):
            position = await consumer.position(tp)
            if position != positions[tp]:  # records, or markers only: progress either way
                positions[tp] = position
                last_progress = time.monotonic()
            if read.end is not None and position >= read.end:
                del active[tp]
                consumer.pause(tp)
        if active and time.monotonic() - last_progress > quiet_s:
            waiting = ", ".join(
                f"{tp.topic}[{tp.partition}] at {positions[tp]} of {read.end}"
                for tp, read in active.items()
            )
            raise BrokerError(
                f"no progress for {quiet_s:.0f} s short of the range's end: {waiting}"
            )


def _end_now(consumer: AIOKafkaConsumer, tp: TopicPartition, limit: int | None) -> int | None:
    """The partition's end as its latest fetch response reports it (None before the first),
    never past the range's own end."""
    stable: int | None = consumer.last_stable_offset(tp)
    end: int | None = stable if stable is not None and stable >= 0 else consumer.highwater(tp)
    if end is None:
        return None
    return end if limit is None else min(limit, end)
