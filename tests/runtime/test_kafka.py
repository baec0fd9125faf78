"""`Kafka` on a real Apache Kafka: internal topics are created (or grown) as the worker needs
them, an existing one that would lose state is refused with a `ConfigError` that says why, and
the state reader reads a topic just made and names one that is gone. What topics exist is asked
naming them, on both brokers, and never creates one.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidTopicError

from tests.datafiles import SCHEMAS
from tests.support.apache_kafka import ApacheKafka
from tests.support.outcomes import read_records
from worker.errors import ConfigError, StateError
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(60)]


def kafka_for(bootstrap: str) -> Kafka:
    return Kafka(
        Settings.model_validate(
            {
                "kafka": {"bootstrap_servers": [bootstrap], "request_timeout_ms": 2000},
                "schemas": {"dir": SCHEMAS},
            }
        )
    )


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def create(bootstrap: str, name: str, partitions: int, configs: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
    finally:
        await admin.close()


async def described(bootstrap: str, name: str) -> tuple[int, dict[str, Any]]:
    """The topic's partition count and configs."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (topic,) = await admin.describe_topics([name])
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
    finally:
        await admin.close()
    ((*_, entries),) = response.resources
    return len(topic["partitions"]), {entry[0]: entry[1] for entry in entries}


async def test_missing_internal_topics_are_created_as_needed(apache_kafka: ApacheKafka) -> None:
    bootstrap = apache_kafka.bootstrap_servers
    state, requests = unique("changelog"), unique("requests")
    await kafka_for(bootstrap).ensure_topics(
        [TopicSpec(state, 3, compacted=True), TopicSpec(requests, 2, compacted=False)]
    )
    partitions, configs = await described(bootstrap, state)
    assert (partitions, configs["cleanup.policy"]) == (3, "compact")
    partitions, configs = await described(bootstrap, requests)
    assert (partitions, configs["cleanup.policy"]) == (2, "delete")
    # a second start finds them as they must be
    await kafka_for(bootstrap).ensure_topics(
        [TopicSpec(state, 3, compacted=True), TopicSpec(requests, 2, compacted=False)]
    )


#: cleanup.policy and retention.ms of an existing state topic -> whether it keeps the state
STATE_TOPIC_CONFIGS = {
    "compact": ({"cleanup.policy": "compact"}, True),
    "compact,delete kept for ever": (
        {"cleanup.policy": "compact,delete", "retention.ms": "-1"},
        True,
    ),
    "delete": ({"cleanup.policy": "delete"}, False),
    "compact,delete for a week": (
        {"cleanup.policy": "compact,delete", "retention.ms": "604800000"},
        False,
    ),
    "delete,compact for a day": (
        {"cleanup.policy": "delete,compact", "retention.ms": "86400000"},
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(STATE_TOPIC_CONFIGS))
async def test_an_existing_state_topic_that_deletes_by_age_is_refused(
    apache_kafka: ApacheKafka, case: str
) -> None:
    """Checkpoints and idempotency keys live in compacted topics: one that also deletes by age
    would lose a partition's state (a key forgotten early is accepted twice)."""
    bootstrap = apache_kafka.bootstrap_servers
    configs, keeps_state = STATE_TOPIC_CONFIGS[case]
    name = unique("state")
    await create(bootstrap, name, 1, configs)
    ensure = kafka_for(bootstrap).ensure_topics([TopicSpec(name, 1, compacted=True)])
    if keeps_state:
        await ensure
        return
    with pytest.raises(ConfigError) as refused:
        await ensure
    assert f"topic {name} has cleanup.policy={configs['cleanup.policy']}" in str(refused.value)
    assert "deletion by age would lose" in str(refused.value)


async def test_an_existing_topic_with_too_few_partitions_is_refused(
    apache_kafka: ApacheKafka,
) -> None:
    bootstrap = apache_kafka.bootstrap_servers
    name = unique("changelog")
    await create(bootstrap, name, 2, {"cleanup.policy": "compact"})
    with pytest.raises(ConfigError, match=f"topic {name} has 2 partitions; it needs 3"):
        await kafka_for(bootstrap).ensure_topics([TopicSpec(name, 3, compacted=True)])


async def test_a_topic_that_grows_gets_the_partitions_it_lacks(apache_kafka: ApacheKafka) -> None:
    """A changelog follows its input: partitions added to the input are added to it (the
    checkpoints of partition N go to its partition N); a topic that does not grow is refused."""
    bootstrap = apache_kafka.bootstrap_servers
    name = unique("changelog")
    await create(bootstrap, name, 2, {"cleanup.policy": "compact"})
    await kafka_for(bootstrap).ensure_topics([TopicSpec(name, 5, compacted=True, grows=True)])
    partitions, configs = await described(bootstrap, name)
    assert (partitions, configs["cleanup.policy"]) == (5, "compact")
    # another worker that saw the input at 5, or at 4, finds it as it must be
    await kafka_for(bootstrap).ensure_topics([TopicSpec(name, 5, compacted=True, grows=True)])
    await kafka_for(bootstrap).ensure_topics([TopicSpec(name, 4, compacted=True, grows=True)])
    assert (await described(bootstrap, name))[0] == 5


async def test_a_state_topic_is_read_as_soon_as_it_is_made_and_one_gone_is_named(
    apache_kafka: ApacheKafka,
) -> None:
    """The worker reads a changelog right after making it (its first assignment): the read
    must not find it missing. One that is gone is named, within the request timeout."""
    bootstrap = apache_kafka.bootstrap_servers
    kafka = kafka_for(bootstrap)
    made, gone = unique("changelog"), unique("changelog")
    await kafka.ensure_topics([TopicSpec(made, 3, compacted=True, grows=True)])
    assert await kafka.read_to_end([(made, 0), (made, 2)]) == {(made, 0): [], (made, 2): []}
    with pytest.raises(StateError, match=f"internal topics deleted: {gone};"):
        await asyncio.wait_for(kafka.read_to_end([(made, 1), (gone, 0)]), timeout=20)


@pytest.mark.parametrize("shared_connection", [False, True])
async def test_what_exists_is_asked_by_name_and_asking_creates_nothing(
    broker: str, shared_connection: bool
) -> None:
    """The topic check runs every 100 ms, so it names the topics it asks about (a full listing
    costs in proportion to the cluster's topics), and it must not make a deleted topic exist
    again: tansu, like a broker with `auto.create.topics.enable`, creates a topic a metadata
    request names unless the request says not to."""
    kafka = kafka_for(broker)
    made, never = unique("made"), unique("never-made")
    await create(broker, made, 3, {})
    if shared_connection:
        await kafka.start()
    try:
        for _ in range(50):  # a topic just made may have no leaders for a moment
            if await kafka.partition_counts([made, never]) == {made: 3}:
                break
            await asyncio.sleep(0.1)
        for _ in range(3):
            assert await kafka.missing_topics([made, never]) == [never]
            assert await kafka.partition_counts([made, never]) == {made: 3}
        assert await kafka.missing_topics([]) == []
        with pytest.raises(InvalidTopicError):
            await kafka.missing_topics(["not a topic name!"])
    finally:
        await kafka.close()


#: records of the last batch: more than the state reader takes per fetch (`max_poll_records`)
LAST_BATCH = 12_000


async def one_batch(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """`values` written to partition 0 as one record batch."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=1024 * 1024)
    await producer.start()
    try:
        batch = producer.create_batch()
        for value in values:
            assert batch.append(key=None, value=value, timestamp=None) is not None
        await (await producer.send_batch(batch, topic, partition=0))
    finally:
        await producer.stop()


@pytest.mark.timeout(120)
async def test_every_record_is_read_to_the_end_on_tansu(bootstrap: str) -> None:
    """tansu (0.6) answers a partition's end (ListOffsets) one past the first record of its
    last batch: a reader that stops there, once a fetch took part of that batch, loses the
    rest. Both readers (the state restore, the tests' `read_records`) read every record."""
    topic = unique("batches")
    await create(bootstrap, topic, 1, {})
    await one_batch(bootstrap, topic, [b"a%d" % i for i in range(10)])
    await one_batch(bootstrap, topic, [b"b%d" % i for i in range(LAST_BATCH)])
    tp = TopicPartition(topic, 0)
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await probe.start()
    try:
        answered = (await probe.end_offsets([tp]))[tp]
    finally:
        await probe.stop()
    total = 10 + LAST_BATCH
    assert answered <= total  # tansu 0.6: 11, what the readers must not stop at
    read = await kafka_for(bootstrap).read_to_end([(topic, 0)])
    assert [r.offset for r in read[(topic, 0)]] == list(range(total))
    records = await read_records(bootstrap, {topic: 1})
    assert [r.offset for r in records] == list(range(total))
