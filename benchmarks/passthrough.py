"""The pass-through: the fastest correct aiokafka forwarder, the ceiling of a worker on this stack.

`python -m benchmarks.passthrough BOOTSTRAP GROUP INPUT OUTPUT [--transactional]`, run as its own
process like `callgate run`, with the worker's own consumer and producer options
(`worker.runtime.kafka_options`: manual commits, earliest, 2,000 records per fetch, acks=all, the
same linger). Every fetched record is copied to the same partition of OUTPUT:

- per partition, the records go into `create_batch` builders, each submitted with `send_batch`
  (a full builder is submitted and a new one started): no future per record;
- the next fetch does not wait for those acknowledgements: it overlaps them;
- input offsets are committed only past records whose batches were acknowledged, in fetch
  order, at most every `commit_interval_ms` (the worker's setting) and at the end;
- above `max_in_flight_records` unacknowledged records it waits for the oldest round first (the
  worker pauses fetching there).

A failed batch stops it with an error (it never commits past a record not written). It does no
work per record beyond the copy. Stops on SIGTERM after committing what was acknowledged.

`--transactional`, the exactly-once baseline: one transactional producer (`enable_idempotence`,
a transactional id of the group's), the consumer reading `read_committed`; the copies go into
the open transaction as they are fetched, and every `commit_interval_ms` the input offsets of
what was fetched are added to it (`send_offsets_to_transaction`) and it commits beside the
fetches (what they fetch meanwhile is copied into the next transaction once it begins). One
producer for every partition: the least a transactional forwarder pays (callgate has one per
partition, so that a partition's next owner fences its former one).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from worker.runtime.kafka_options import consumer_options, producer_options
from worker.settings import load_settings


@dataclass(slots=True)
class Round:
    """One fetch's produce futures, its record count and the offsets it moves the input to."""

    futures: list[asyncio.Future[object]] = field(default_factory=list)
    records: int = 0
    offsets: dict[TopicPartition, int] = field(default_factory=dict)

    def done(self) -> bool:
        return all(future.done() for future in self.futures)


async def _send(
    producer: AIOKafkaProducer, target: str, partition: int, records: list[object]
) -> list[asyncio.Future[object]]:
    futures = []
    batch = producer.create_batch()
    for record in records:
        key, value = record.key, record.value  # type: ignore[attr-defined]
        headers = list(record.headers)  # type: ignore[attr-defined]  (the builder takes a list)
        if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
            futures.append(await producer.send_batch(batch, target, partition=partition))
            batch = producer.create_batch()
            batch.append(key=key, value=value, timestamp=None, headers=headers)
    futures.append(await producer.send_batch(batch, target, partition=partition))
    return futures


def _settle(pending: deque[Round], acknowledged: dict[TopicPartition, int]) -> int:
    """Move the rounds acknowledged in full, oldest first, into `acknowledged`; raise on a
    failed batch. Returns the records still unacknowledged."""
    while pending and pending[0].done():
        round_ = pending.popleft()
        for future in round_.futures:
            future.result()  # a failed batch raises here: nothing past it is committed
        acknowledged.update(round_.offsets)
    return sum(round_.records for round_ in pending)


async def forward(bootstrap: str, group: str, source: str, target: str) -> None:
    settings = load_settings(kafka={"bootstrap_servers": [bootstrap], "group_id": group})
    kafka = settings.kafka
    # the worker places each partition itself (no automatic reset); this baseline has no
    # checkpoints and reads a new group from the start
    options = {**consumer_options(settings), "auto_offset_reset": "earliest"}
    consumer = AIOKafkaConsumer(source, **options)
    producer = AIOKafkaProducer(**producer_options(settings))
    await producer.start()
    await consumer.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    pending: deque[Round] = deque()
    acknowledged: dict[TopicPartition, int] = {}
    last_commit = 0.0
    interval = kafka.commit_interval_ms / 1000
    try:
        while not stop.is_set():
            batch = await consumer.getmany(
                timeout_ms=kafka.fetch_timeout_ms, max_records=kafka.fetch_max_records
            )
            round_ = Round()
            for tp, records in batch.items():
                if records:
                    round_.futures += await _send(producer, target, tp.partition, records)
                    round_.records += len(records)
                    round_.offsets[tp] = records[-1].offset + 1
            if round_.records:
                pending.append(round_)
            unacknowledged = _settle(pending, acknowledged)
            while unacknowledged > kafka.max_in_flight_records:
                await asyncio.wait(pending[0].futures)
                unacknowledged = _settle(pending, acknowledged)
            now = time.monotonic()
            if acknowledged and now - last_commit >= interval:
                await consumer.commit(acknowledged)
                acknowledged, last_commit = {}, now
        for round_ in pending:
            await asyncio.wait(round_.futures)
        _settle(pending, acknowledged)
        if acknowledged:
            await consumer.commit(acknowledged)
    finally:
        await consumer.stop()
        await producer.stop()


async def forward_transactionally(bootstrap: str, group: str, source: str, target: str) -> None:
    settings = load_settings(kafka={"bootstrap_servers": [bootstrap], "group_id": group})
    kafka = settings.kafka
    options = {
        **consumer_options(settings),
        "auto_offset_reset": "earliest",
        "isolation_level": "read_committed",
    }
    consumer = AIOKafkaConsumer(source, **options)
    producer = AIOKafkaProducer(
        **{
            **producer_options(settings),
            "enable_idempotence": True,
            "transactional_id": f"{group}-passthrough",
        }
    )
    await producer.start()
    await consumer.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    interval = kafka.commit_interval_ms / 1000
    # the open transaction's copies and input offsets; what is fetched while it commits
    futures: list[asyncio.Future[object]] = []
    offsets: dict[TopicPartition, int] = {}
    waiting: list[tuple[TopicPartition, list[object]]] = []
    committing: asyncio.Task[None] | None = None
    last_commit = time.monotonic()

    async def commit(sent: list[asyncio.Future[object]], read: dict[TopicPartition, int]) -> None:
        await asyncio.gather(*sent)  # a failed batch raises here: nothing past it commits
        await producer.send_offsets_to_transaction(read, group)
        await producer.commit_transaction()
        await producer.begin_transaction()

    async def copy(tp: TopicPartition, records: list[object]) -> None:
        futures.extend(await _send(producer, target, tp.partition, records))
        offsets[tp] = records[-1].offset + 1  # type: ignore[attr-defined]

    await producer.begin_transaction()
    try:
        while not stop.is_set() or committing is not None or offsets or waiting:
            if committing is not None and committing.done():
                committing.result()
                committing = None
                for tp, records in waiting:
                    await copy(tp, records)
                waiting = []
            if not stop.is_set():
                batch = await consumer.getmany(
                    timeout_ms=kafka.fetch_timeout_ms, max_records=kafka.fetch_max_records
                )
                for tp, records in batch.items():
                    if records and committing is None:
                        await copy(tp, records)
                    elif records:
                        waiting.append((tp, records))
            elif committing is not None:
                await asyncio.wait([committing])
                continue
            due = stop.is_set() or time.monotonic() - last_commit >= interval
            if committing is None and offsets and due:
                committing = asyncio.ensure_future(commit(futures, offsets))
                futures, offsets, last_commit = [], {}, time.monotonic()
    finally:
        await consumer.stop()
        await producer.stop()


def main(argv: list[str]) -> int:
    transactional = "--transactional" in argv
    bootstrap, group, source, target = [arg for arg in argv if arg != "--transactional"]
    run = forward_transactionally if transactional else forward
    asyncio.run(run(bootstrap, group, source, target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
