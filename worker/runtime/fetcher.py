"""The group consumer: what is fetched next, where each partition resumes, what is paused.

The only module that talks to the worker's consumer. A fetch never outlives a stop (the consumer
waits out a rebalance in progress whatever the fetch timeout, and a stop must not wait for the
group). A partition is placed where its restored state ends (`place`); a position the log no
longer has is moved to the log's start and the loss said (`skip_deleted`): the consumer has no
automatic reset, so nothing is skipped in silence. Offsets are committed through `commit`,
never past the log's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, NoOffsetForPartitionError, OffsetOutOfRangeError

from worker.errors import BrokerError
from worker.metrics import Metrics
from worker.runtime.delivery import Partition

log = logging.getLogger("callgate.worker")

#: A fetched batch: each partition's records, in order.
Batch = Mapping[TopicPartition, list[Any]]


class Fetcher:
    """The worker's consumer (an `AIOKafkaConsumer`, or a fake of its parts used here)."""

    def __init__(self, consumer: Any, metrics: Metrics, *, fetch_timeout_ms: int, max_records: int):
        self.consumer = consumer
        self._metrics = metrics
        self._timeout_ms = fetch_timeout_ms
        self._max_records = max_records
        self._stopped: asyncio.Future[Any] | None = None

    async def fetch(self, stop: asyncio.Event) -> Batch:
        """The next batch; nothing once `stop` is set. Raises `OffsetOutOfRangeError` (see
        `skip_deleted`); any other error of the fetch is logged, and the batch is empty."""
        fetch = asyncio.ensure_future(
            self.consumer.getmany(timeout_ms=self._timeout_ms, max_records=self._max_records)
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
        except OffsetOutOfRangeError:
            raise
        except KafkaError as exc:
            log.warning("fetch failed: %r", exc)
            return {}
        return batch

    def observe_lag(self, batch: Batch) -> None:
        """Each fetched partition's lag behind its log's end, for the metrics."""
        for tp, records in batch.items():
            if records:
                highwater = self.consumer.highwater(tp)
                if highwater is not None:
                    lag = max(0, highwater - records[-1].offset - 1)
                    self._metrics.set_lag(tp.topic, tp.partition, lag)

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
        try:
            for (topic, partition), checkpointed in resume.items():
                tp = TopicPartition(topic, partition)
                offset = checkpointed if checkpointed is not None else await consumer.committed(tp)
                if offset is None:
                    await consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, offset)
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
        await asyncio.wait_for(consumer.commit(request), timeout_s)
        return True

    async def close(self, timeout_s: float) -> None:
        if self._stopped is not None:
            self._stopped.cancel()
        try:
            await asyncio.wait_for(self.consumer.stop(), timeout=max(0.1, timeout_s))
        except (TimeoutError, KafkaError) as exc:
            log.warning("closing the consumer: %r", exc)
