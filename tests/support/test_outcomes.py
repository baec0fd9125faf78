"""The process tests' outcome tail: a call whose event it moved past without reading it is found
by reading again from the start, and told apart from one it has not reached yet."""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from callgate_demo.broker import EmbeddedBroker
from tests.support.outcomes import OutcomeTail

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

WAIT_S = 20.0


async def write(producer: AIOKafkaProducer, topic: str, *calls: str) -> None:
    for call in calls:
        await (await producer.send(topic, orjson.dumps({"call_id": call}), partition=0))


async def until_read(tail: OutcomeTail, calls: set[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not calls <= tail.calls:
        assert time.monotonic() < deadline, f"the tail read {tail.calls}, not {calls}"
        await asyncio.sleep(0.05)


async def test_a_tail_finds_the_events_it_moved_past_and_counts_only_those(
    kafka_broker: EmbeddedBroker,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"outcomes-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        async with OutcomeTail(bootstrap, {topic: 1}) as tail:
            await write(producer, topic, "a", "b")
            await until_read(tail, {"a", "b"})
            # as tansu does: the tail is moved past two events it never reads (paused while
            # they are written, or it could read them before it is moved)
            assert tail._consumer is not None
            partition = TopicPartition(topic, 0)
            tail._consumer.pause(partition)
            await write(producer, topic, "c", "d")
            tail._consumer.seek(partition, 4)
            tail._consumer.resume(partition)
            await write(producer, topic, "e")
            await until_read(tail, {"e"})
            assert tail.calls == {"a", "b", "e"}
            # one event the tail has not reached yet (its reading paused): found, not skipped
            tail._consumer.pause(partition)
            await write(producer, topic, "f")
            await tail.catch_up()
            assert tail.calls == {"a", "b", "c", "d", "e", "f"}
            assert tail.skipped == {"c", "d"}
    finally:
        await producer.stop()
