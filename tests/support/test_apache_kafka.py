"""The session's Apache Kafka broker is real and has what the delivery tests need.

Topic configs read back, produce and consume, offset metadata kept, transactions with the
consumer's offsets inside them and `read_committed` isolation, and a write to a deleted topic
refused: the places where the embedded tansu broker falls short.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata

from tests.support.apache_kafka import ApacheKafka, ApacheKafkaError, fetch_libs

pytestmark = pytest.mark.integration

WAIT_S = 20.0
START_TIMEOUT_S = 45.0
REQUEST_TIMEOUT_MS = 5000


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


@asynccontextmanager
async def admin_client(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def create(bootstrap: str, *topics: NewTopic) -> None:
    """Create the topics; any per-topic error fails the test with its code."""
    async with admin_client(bootstrap) as admin:
        response = await admin.create_topics(list(topics))
    errors = {name: code for name, code, *_ in response.topic_errors if code != 0}
    assert not errors, f"create_topics errors: {errors}"


async def read(
    consumer: AIOKafkaConsumer, until: set[bytes], timeout_s: float = WAIT_S
) -> list[ConsumerRecord[bytes, bytes]]:
    """Fetch until every value in `until` has been seen, within `timeout_s` (bounded poll)."""
    seen: list[ConsumerRecord[bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while not until <= {record.value for record in seen}:
        assert time.monotonic() < deadline, f"saw only {[r.value for r in seen]} of {until}"
        batch = await consumer.getmany(timeout_ms=200)
        seen.extend(record for records in batch.values() for record in records)
    return seen


def test_the_broker_is_a_live_apache_kafka_child(apache_kafka: ApacheKafka) -> None:
    assert apache_kafka.bootstrap_servers.startswith("127.0.0.1:")
    assert apache_kafka.pid is not None
    os.kill(apache_kafka.pid, 0)  # alive (signal 0 only checks)
    assert "Kafka Server started" in apache_kafka.log_file.read_text(errors="replace")


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_second_broker_starts_and_stops_alone(apache_kafka: ApacheKafka, tmp_path: Path) -> None:
    # the session broker proves the jars work; this one checks the lifecycle on its own ports
    with ApacheKafka(fetch_libs(timeout_s=60), tmp_path) as broker:
        broker.start(timeout_s=START_TIMEOUT_S)
        assert broker.port not in (apache_kafka.port, apache_kafka.controller_port)
        assert _listening(broker.port)
        assert _listening(broker.controller_port)
        pid = broker.pid
        assert pid is not None
        with pytest.raises(ApacheKafkaError, match="already started"):
            broker.start(timeout_s=START_TIMEOUT_S)
    assert broker.pid is None
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(pid, 0)
    assert not _listening(broker.port)
    assert _listening(apache_kafka.port), "stopping one broker never touches another"


def test_a_broker_that_cannot_start_says_why(apache_kafka: ApacheKafka, tmp_path: Path) -> None:
    # no jars: java cannot load the storage tool, and the error carries the log's last lines
    empty = tmp_path / "no-libs"
    empty.mkdir()
    broker = ApacheKafka(empty, tmp_path / "work")
    with pytest.raises(ApacheKafkaError, match="formatting the storage failed") as raised:
        broker.start(timeout_s=START_TIMEOUT_S)
    assert "kafka.tools.StorageTool" in str(raised.value)
    assert broker.pid is None


@pytest.mark.asyncio
async def test_topics_are_created_with_their_configs(apache_kafka: ApacheKafka) -> None:
    bootstrap = apache_kafka.bootstrap_servers
    plain, compacted = unique("plain"), unique("compacted")
    await create(
        bootstrap,
        NewTopic(plain, num_partitions=3, replication_factor=1),
        NewTopic(
            compacted,
            num_partitions=1,
            replication_factor=1,
            topic_configs={"cleanup.policy": "compact"},
        ),
    )
    async with admin_client(bootstrap) as admin:
        assert {plain, compacted} <= set(await admin.list_topics())
        described = await admin.describe_topics([plain])
        responses = await admin.describe_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, compacted),
                ConfigResource(ConfigResourceType.TOPIC, plain),
            ]
        )
    assert len(described[0]["partitions"]) == 3
    policies = {
        name: {entry[0]: entry[1] for entry in entries}["cleanup.policy"]
        for response in responses
        for _code, _message, _type, name, entries in response.resources
    }
    assert policies == {compacted: "compact", plain: "delete"}


@pytest.mark.asyncio
async def test_records_are_produced_and_consumed(apache_kafka: ApacheKafka) -> None:
    bootstrap = apache_kafka.bootstrap_servers
    topic = unique("records")
    await create(bootstrap, NewTopic(topic, num_partitions=2, replication_factor=1))
    values = {f"value-{i}".encode() for i in range(20)}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        sent = await asyncio.gather(
            *[await producer.send(topic, value, key=value[-1:]) for value in sorted(values)]
        )
    finally:
        await producer.stop()
    assert {meta.partition for meta in sent} <= {0, 1}
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        seen = await read(consumer, until=values)
    finally:
        await consumer.stop()
    assert sorted(record.value for record in seen) == sorted(values)


@pytest.mark.asyncio
async def test_a_follower_reads_every_record_several_producers_append_at_once(
    apache_kafka: ApacheKafka,
) -> None:
    """What callgate's reads of a partition that several producers write (the outcome topics
    the tests follow, the idempotency requests every worker writes, an input with several
    producers) rely on, and tansu breaks: a consumer following the partitions while the
    batches arrive reads every acknowledged record, none skipped (README, "Two commands")."""
    bootstrap = apache_kafka.bootstrap_servers
    topic = unique("appended-at-once")
    await create(bootstrap, NewTopic(topic, num_partitions=2, replication_factor=1))
    follower = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await follower.start()
    followed: set[bytes] = set()

    async def follow() -> None:
        while True:
            for records in (await follower.getmany(timeout_ms=100)).values():
                followed.update(record.value for record in records if record.value is not None)

    async def append(producer_id: int) -> set[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
        await producer.start()
        written: set[bytes] = set()
        try:
            for n in range(0, 600, 3):  # batches of 3, to both partitions
                for partition in (0, 1):
                    batch = producer.create_batch()
                    values = [f"{producer_id}:{partition}:{n + i}".encode() for i in range(3)]
                    for value in values:
                        batch.append(key=None, value=value, timestamp=None, headers=[])
                    await (await producer.send_batch(batch, topic, partition=partition))
                    written.update(values)
        finally:
            await producer.stop()
        return written

    try:
        follower.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        following = asyncio.create_task(follow())
        written = set().union(*await asyncio.gather(*(append(i) for i in range(6))))
        deadline = time.monotonic() + WAIT_S
        while not written <= followed and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
    finally:
        await follower.stop()
    assert len(written) == 6 * 2 * 600
    assert written <= followed, f"the follower skipped {len(written - followed)} records"


@pytest.mark.asyncio
async def test_records_from_1970_outlive_the_retention_passes(apache_kafka: ApacheKafka) -> None:
    """The tests write record times from 1970: the broker must not delete them by age while a
    test runs. A topic of its own with a 1 ms retention shows that a retention pass ran after
    the writes (its record is deleted); the record on a topic with the broker's defaults stays."""
    bootstrap = apache_kafka.bootstrap_servers
    kept, expiring = unique("kept"), unique("expiring")
    await create(
        bootstrap,
        NewTopic(kept, num_partitions=1, replication_factor=1),
        NewTopic(
            expiring, num_partitions=1, replication_factor=1, topic_configs={"retention.ms": "1"}
        ),
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for topic in (kept, expiring):
            await producer.send_and_wait(topic, b"from 1970", timestamp_ms=1_000)
    finally:
        await producer.stop()
    kept_tp, expiring_tp = TopicPartition(kept, 0), TopicPartition(expiring, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while (await consumer.beginning_offsets([expiring_tp]))[expiring_tp] == 0:
            assert time.monotonic() < deadline, "no retention pass deleted the 1 ms topic's record"
            await asyncio.sleep(0.2)
        starts = await consumer.beginning_offsets([kept_tp])
    finally:
        await consumer.stop()
    assert starts[kept_tp] == 0, "a record from 1970 was deleted by age"


@pytest.mark.asyncio
async def test_a_group_commit_keeps_its_metadata(apache_kafka: ApacheKafka) -> None:
    bootstrap = apache_kafka.bootstrap_servers
    topic, group = unique("meta"), unique("group")
    await create(bootstrap, NewTopic(topic, num_partitions=1, replication_factor=1))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait(topic, f"m-{i}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    tp = TopicPartition(topic, 0)
    try:
        await read(consumer, until={b"m-0", b"m-1", b"m-2"})  # joined, assigned, fetched
        assert consumer.assignment() == {tp}
        await consumer.commit({tp: OffsetAndMetadata(3, "snapshot=v1;calls=2")})
        assert await consumer.committed(tp) == 3
    finally:
        await consumer.stop()
    async with admin_client(bootstrap) as admin:
        offsets = await admin.list_consumer_group_offsets(group)
    assert offsets[tp] == OffsetAndMetadata(3, "snapshot=v1;calls=2")


@pytest.mark.asyncio
async def test_transactions_commit_offsets_and_hide_aborted_records(
    apache_kafka: ApacheKafka,
) -> None:
    bootstrap = apache_kafka.bootstrap_servers
    source, sink, group = unique("tx-in"), unique("tx-out"), unique("tx-group")
    await create(
        bootstrap,
        NewTopic(source, num_partitions=1, replication_factor=1),
        NewTopic(sink, num_partitions=1, replication_factor=1),
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=unique("tx-producer"),
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )
    await producer.start()
    source_tp = TopicPartition(source, 0)
    try:
        async with producer.transaction():
            await producer.send_and_wait(sink, b"committed-1")
            await producer.send_offsets_to_transaction(
                {source_tp: OffsetAndMetadata(7, "tx-meta")}, group
            )
        await producer.begin_transaction()
        await producer.send_and_wait(sink, b"aborted-1")  # in the log before the abort
        await producer.send_and_wait(sink, b"aborted-2")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(sink, b"committed-2")
    finally:
        await producer.stop()

    async with admin_client(bootstrap) as admin:
        offsets = await admin.list_consumer_group_offsets(group)
    assert offsets[source_tp] == OffsetAndMetadata(7, "tx-meta")

    every = {b"committed-1", b"aborted-1", b"aborted-2", b"committed-2"}
    committed_only = {b"committed-1", b"committed-2"}
    seen: dict[str, list[bytes]] = {}
    for isolation, until in (("read_uncommitted", every), ("read_committed", committed_only)):
        consumer = AIOKafkaConsumer(
            sink,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level=isolation,
        )
        await consumer.start()
        try:
            seen[isolation] = [record.value for record in await read(consumer, until=until)]
        finally:
            await consumer.stop()
    # the aborted records are there, and read_committed never shows them, even past them
    assert seen["read_uncommitted"] == [b"committed-1", b"aborted-1", b"aborted-2", b"committed-2"]
    assert seen["read_committed"] == [b"committed-1", b"committed-2"]


@pytest.mark.asyncio
async def test_a_write_to_a_deleted_topic_fails(apache_kafka: ApacheKafka) -> None:
    bootstrap = apache_kafka.bootstrap_servers
    topic = unique("deleted")
    await create(bootstrap, NewTopic(topic, num_partitions=1, replication_factor=1))
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"before")  # the producer knows the topic
        async with admin_client(bootstrap) as admin:
            response = await admin.delete_topics([topic])
            assert [code for _name, code, *_ in response.topic_error_codes] == [0]
            deadline = time.monotonic() + WAIT_S
            while topic in await admin.list_topics():  # the broker has applied the deletion
                assert time.monotonic() < deadline, f"{topic} still listed after deletion"
        with pytest.raises(KafkaError):  # NotLeaderForPartition once retries run out
            await asyncio.wait_for(producer.send_and_wait(topic, b"after"), WAIT_S)
    finally:
        await producer.stop()
