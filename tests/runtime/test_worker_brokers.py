"""The worker in this process against real brokers: the embedded one (tansu) and Apache Kafka.

The same scenarios run on both where the broker can: every call judged once, a worker stopped
with calls open and another one resuming them from the changelog, and (Apache Kafka only, the
embedded broker has no transactions) exactly-once rounds read with `read_committed`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from callgate_demo.broker import EmbeddedBroker
from tests.datafiles import SCHEMAS
from tests.support.apache_kafka import ApacheKafka
from worker.compose import build_key_store, build_processor, build_registry, tool_labels
from worker.metrics import Metrics
from worker.runtime.kafka import Kafka
from worker.runtime.outbox import FENCED, Record
from worker.runtime.topics import changelog_topic
from worker.runtime.transactions import Transactions
from worker.runtime.worker import Worker
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(180)]

PARTITIONS = 3


@pytest.fixture(params=["tansu", "apache"])
def broker(request: pytest.FixtureRequest) -> str:
    """bootstrap servers of the session's tansu or Apache Kafka broker."""
    if request.param == "tansu":
        tansu: EmbeddedBroker = request.getfixturevalue("kafka_broker")
        return tansu.bootstrap_servers
    kafka: ApacheKafka = request.getfixturevalue("apache_kafka")
    return kafka.bootstrap_servers


class Run:
    """One test's topics and group on a broker."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        tag = uuid.uuid4().hex[:8]
        self.group = f"g-{tag}"
        self.input = f"in-{tag}"
        self.outputs = {name: f"{name}-{tag}" for name in ("ok", "no", "partial")}

    def settings(self, **overrides: Any) -> Settings:
        base: dict[str, Any] = {
            "kafka": {
                "bootstrap_servers": [self.bootstrap],
                "group_id": self.group,
                "session_timeout_ms": 6000,
                "commit_interval_ms": 0,
            },
            "topics": {
                "input": self.input,
                "accepted": self.outputs["ok"],
                "rejected": self.outputs["no"],
                "incomplete": self.outputs["partial"],
            },
            "schemas": {"dir": SCHEMAS},
            "idempotency": {"partitions": 2},
            "shutdown_grace_s": 10.0,
        }
        for key, value in overrides.items():
            base[key] = {**base.get(key, {}), **value}
        return Settings.model_validate(base)

    async def create(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [
                    NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)
                    for name in (self.input, *self.outputs.values())
                ]
            )
        finally:
            await admin.close()

    async def produce(self, records: list[tuple[bytes, bytes]], timestamp_ms: int) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            futures = [
                await producer.send(self.input, value, key=key, timestamp_ms=timestamp_ms)
                for key, value in records
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    async def input_committed(self) -> bool:
        """Whether the group committed every input partition to its end."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            tps = [TopicPartition(self.input, p) for p in range(PARTITIONS)]
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                if (await consumer.committed(tp) or 0) < ends[tp]:
                    return False
            return True
        finally:
            await consumer.stop()

    async def events(self, *, read_committed: bool = False) -> list[dict[str, Any]]:
        """Every event on the outcome topics now (their topics are new: offsets from 0)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed" if read_committed else "read_uncommitted",
        )
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t in self.outputs.values() for p in range(PARTITIONS)]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            events: list[dict[str, Any]] = []
            deadline = asyncio.get_running_loop().time() + 30
            # transaction markers take offsets too: read until every position reaches its end
            todo = [tp for tp in tps if ends[tp] > 0]
            while todo:
                assert asyncio.get_running_loop().time() < deadline, "outcomes not readable"
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    events.extend(orjson.loads(r.value) for r in records)
                todo = [tp for tp in todo if await consumer.position(tp) < ends[tp]]
            return events
        finally:
            await consumer.stop()


def worker_for(settings: Settings) -> Worker:
    registry = build_registry(settings)
    return Worker(
        settings,
        build_processor(settings, registry),
        lambda: build_key_store(settings),
        Metrics(tool_labels(registry)),
    )


@pytest_asyncio.fixture
async def run(broker: str) -> AsyncIterator[Run]:
    run = Run(broker)
    await run.create()
    yield run


def call_records(count: int, *, first_half_only: bool = False) -> list[tuple[bytes, bytes]]:
    records = []
    for i in range(count):
        text = orjson.dumps({"city": f"city{i}", "units": "celsius"}).decode()
        stream = f"s{i}"
        records.append(
            (
                stream.encode(),
                orjson.dumps(
                    {
                        "stream_id": stream,
                        "call_id": f"c{i}",
                        "seq": 0,
                        "kind": "tool_call",
                        "tool": "get_weather",
                        "tool_version": "1",
                        "delta": text[:6],
                    }
                ),
            )
        )
        if not first_half_only:
            records.append(second_half(i, text))
    return records


def second_half(i: int, text: str | None = None) -> tuple[bytes, bytes]:
    text = text or orjson.dumps({"city": f"city{i}", "units": "celsius"}).decode()
    body = {"stream_id": f"s{i}", "call_id": f"c{i}", "seq": 1, "kind": "tool_call"}
    return f"s{i}".encode(), orjson.dumps(body | {"delta": text[6:], "final": True})


async def run_until(worker: Worker, done: Any, *, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await done():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the worker did not get there in time")
        await worker.step()


def by_call(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        grouped.setdefault(event["call_id"], []).append(event)
    return grouped


def same_but_timings(a: dict[str, Any], b: dict[str, Any]) -> bool:
    strip = lambda e: e | {"metrics": {k: v for k, v in e["metrics"].items() if k != "phases_us"}}  # noqa: E731
    return bool(strip(a) == strip(b))


async def test_every_call_is_judged_once_and_checkpointed(run: Run) -> None:
    await run.produce(call_records(30), timestamp_ms=1_000)
    worker = worker_for(run.settings())
    await worker.start()
    try:

        async def all_judged() -> bool:
            return worker.stats.events >= 30 and worker.ledger.idle()

        await run_until(worker, all_judged)
    finally:
        await worker.close()
    grouped = by_call(await run.events())
    assert set(grouped) == {f"c{i}" for i in range(30)}
    assert all(len(seen) == 1 and seen[0]["outcome"] == "accepted" for seen in grouped.values())
    assert worker.stats.checkpoints > 0
    assert worker.stats.commits > 0


async def test_a_stopped_worker_s_open_calls_are_finished_by_the_next(run: Run) -> None:
    await run.produce(call_records(12, first_half_only=True), timestamp_ms=1_000)
    first = worker_for(run.settings())
    await first.start()
    try:

        async def all_open() -> bool:
            return first.processor.assembler.open_calls == 12 and first.ledger.idle()

        await run_until(first, all_open)
    finally:
        await first.close()
    await run.produce([second_half(i) for i in range(12)], timestamp_ms=2_000)
    second = worker_for(run.settings())
    await second.start()
    try:

        async def all_judged() -> bool:
            return second.stats.events >= 12 and second.ledger.idle()

        await run_until(second, all_judged)
    finally:
        await second.close()
    grouped = by_call(await run.events())
    assert set(grouped) == {f"c{i}" for i in range(12)}
    for seen in grouped.values():
        assert len(seen) == 1
        (event,) = seen
        assert event["outcome"] == "accepted", event
        assert event["metrics"]["chunks"] == 2, "judged whole, from the restored first chunk"
    changelog = changelog_topic(run.group, run.input)
    assert changelog.endswith("-changelog")


async def test_exactly_once_rounds_are_read_once_with_read_committed(
    apache_kafka: ApacheKafka,
) -> None:
    run = Run(apache_kafka.bootstrap_servers)
    await run.create()
    await run.produce(call_records(20), timestamp_ms=1_000)
    worker = worker_for(
        run.settings(delivery={"guarantee": "exactly_once", "transactional_id_prefix": run.group})
    )
    await worker.start()
    try:

        async def all_committed() -> bool:
            return await run.input_committed()

        await run_until(worker, all_committed)
    finally:
        await worker.close()
    grouped = by_call(await run.events(read_committed=True))
    assert set(grouped) == {f"c{i}" for i in range(20)}
    assert all(len(seen) == 1 for seen in grouped.values())


class _Acknowledgements:
    """A `Sink` that counts what was acknowledged and fails the test on anything else."""

    def __init__(self) -> None:
        self.count = 0

    def acknowledged(self, record: Record) -> None:
        self.count += 1

    def refused(self, record: Record, error: KafkaError) -> Record | None:
        raise AssertionError(f"refused: {error!r}")

    def topic_failing(self, topic: str, error: KafkaError) -> None:
        raise AssertionError(f"{topic} failing: {error!r}")

    def topic_recovered(self, topic: str) -> None:
        pass


#: A fenced round's records: (topic, partition or None for the key's) of each.
FENCED_ROUNDS = {
    "offsets only": [],
    "one write": [("ok", 0)],
    # the last topic is new to the producer: its metadata is fetched between the sends, and
    # the refusal of the first ones arrives meanwhile
    "writes, then a topic not written before": [("ok", 0), ("ok", 1), ("ok", 2), ("no", None)],
    # several batches to one partition: each waits for the one before it to drain, which the
    # broker refuses meanwhile
    "batches queued behind each other": [("ok", 0)] * 100,
}


@pytest.mark.parametrize("round_records", sorted(FENCED_ROUNDS))
async def test_a_fenced_partition_s_round_fails_as_fenced_however_far_it_went(
    apache_kafka: ApacheKafka, round_records: str
) -> None:
    """What exactly_once relies on: once a newer producer of a partition's transactional id has
    started, the older one's next round fails with one of `FENCED`, whether the broker refuses
    its first write, a later one, or its offsets (aiokafka reports the error once, then refuses
    the transaction's later calls with errors that do not say why). Reopening the partition
    on any other error would fence its new owner in turn."""
    run = Run(apache_kafka.bootstrap_servers)
    await run.create()
    settings = run.settings(
        delivery={"guarantee": "exactly_once", "transactional_id_prefix": run.group}
    )
    kafka = Kafka(settings)
    sink = _Acknowledgements()
    transactions = Transactions(
        kafka.transactional_producer, sink, time.monotonic, group=run.group, timeout_s=10.0
    )
    where = (run.input, 0)
    await transactions.open(where)
    newer = kafka.transactional_producer(*where)
    try:
        outbox = transactions.outbox(where)
        assert outbox is not None
        outbox.add(Record(0, run.outputs["ok"], b"k", b"first round", []))
        await transactions.commit(where, 1)
        assert sink.count == 1
        await newer.start()  # the partition's new owner: the broker fences the older producer
        for topic, partition in FENCED_ROUNDS[round_records]:
            late = b"late" * 256
            record = Record(1, run.outputs[topic], b"key", late, [], partition=partition)
            outbox.add(record)
        with pytest.raises(FENCED):
            await transactions.commit(where, 2)
    finally:
        await transactions.close_all(5.0)
        await newer.stop()
