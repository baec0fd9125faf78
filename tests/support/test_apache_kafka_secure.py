"""The secured Apache Kafka harness is what it says: SASL_SSL with SCRAM-SHA-512 over TLS whose
certificates the test made, and ACLs that KRaft's StandardAuthorizer enforces.

A client that is granted Read on a topic and a group, and Write on another, can consume and
produce exactly there and nowhere else (each refusal is the authorizer's, named by its error);
a client without TLS, with a wrong password or trusting another CA cannot connect at all. And
`callgate topics acls` prints commands that run as printed (`kafka-acls.sh` is
`org.apache.kafka.tools.AclCommand`) and grant what they say.
"""

from __future__ import annotations

import asyncio
import shlex
import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
)

from tests.support.apache_kafka import ApacheKafka
from worker.runtime.provision import acl_commands
from worker.settings import Settings

#: the session's secured broker may start in the first of these tests (tests/conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(300)]

WAIT_S = 20.0


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def make_topics(broker: ApacheKafka, *names: str) -> None:
    admin = AIOKafkaAdminClient(**broker.client_options())
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, 1, 1) for name in names])
    finally:
        await admin.close()
    errors = {name: code for name, code, *_ in response.topic_errors if code}
    assert not errors, errors


@asynccontextmanager
async def producer(options: dict[str, Any]) -> AsyncIterator[AIOKafkaProducer]:
    client = AIOKafkaProducer(**options, request_timeout_ms=5000, acks="all")
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


async def consume_one(options: dict[str, Any], topic: str, group: str | None) -> bytes:
    """The first record of `topic`, read as `group` (committing it) or without a group."""
    consumer = AIOKafkaConsumer(
        **options,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        request_timeout_ms=5000,
    )
    await consumer.start()
    try:
        if group is None:
            consumer.assign([TopicPartition(topic, 0)])
        else:
            consumer.subscribe([topic])
        record = await asyncio.wait_for(consumer.getone(), WAIT_S)
        if group is not None:
            await consumer.commit()
        assert record.value is not None
        return bytes(record.value)
    finally:
        await consumer.stop()


async def topic_error(options: dict[str, Any], topic: str) -> int:
    """The error code the cluster's metadata gives this client for `topic` (0: described)."""
    admin = AIOKafkaAdminClient(**options, request_timeout_ms=5000)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    code: int = described["error_code"]
    return code


async def test_a_client_reads_and_writes_exactly_what_its_acls_allow(
    secure_kafka: ApacheKafka,
) -> None:
    source, sink, secret = unique("in"), unique("out"), unique("secret")
    group, stranger_group = unique("group"), unique("group")
    await make_topics(secure_kafka, source, sink, secret)
    async with producer(secure_kafka.client_options()) as admin:
        await admin.send_and_wait(source, b"for the gate")
        await admin.send_and_wait(secret, b"not for the gate")
    secure_kafka.acls("--add", "--allow-principal", "User:gate", "--operation", "Read",
                      "--topic", source, "--group", group)  # fmt: skip
    secure_kafka.acls(
        "--add", "--allow-principal", "User:gate", "--operation", "Write", "--topic", sink
    )
    gate = secure_kafka.client_options("gate")

    assert await consume_one(gate, source, group) == b"for the gate"
    async with producer(gate) as client:
        await client.send_and_wait(sink, b"written by the gate")
        with pytest.raises(TopicAuthorizationFailedError):
            await client.send_and_wait(secret, b"refused")
        with pytest.raises(TopicAuthorizationFailedError):
            await client.send_and_wait(source, b"refused: Read is not Write")
    # a topic the gate has no ACL on is not even described to it
    assert await topic_error(gate, secret) == TopicAuthorizationFailedError.errno
    assert await topic_error(gate, sink) == 0  # Write implies Describe ...
    with pytest.raises(TopicAuthorizationFailedError):
        await consume_one(gate, sink, None)  # ... but is not Read
    with pytest.raises(GroupAuthorizationFailedError):
        await consume_one(gate, source, stranger_group)
    # another user has no ACL at all: nothing
    other = secure_kafka.client_options("other")
    for topic in (source, sink, secret):
        assert await topic_error(other, topic) == TopicAuthorizationFailedError.errno
    # what the gate wrote is there, read by the admin
    assert await consume_one(secure_kafka.client_options(), sink, None) == b"written by the gate"


async def test_without_tls_the_right_password_or_the_ca_nobody_connects(
    secure_kafka: ApacheKafka,
) -> None:
    topic = unique("t")
    await make_topics(secure_kafka, topic)
    gate = secure_kafka.client_options("gate")
    attempts: dict[str, dict[str, Any]] = {
        "plaintext": {"bootstrap_servers": secure_kafka.bootstrap_servers},
        "wrong password": {**gate, "sasl_plain_password": "guess"},
        "another CA": {**gate, "ssl_context": ssl.create_default_context()},
        "SCRAM-SHA-256": {**gate, "sasl_mechanism": "SCRAM-SHA-256"},
    }
    for what, options in attempts.items():
        with pytest.raises(KafkaConnectionError):
            await write_once(options, topic)
        assert what  # (the loop names each attempt in a failure's traceback)


async def write_once(options: dict[str, Any], topic: str) -> None:
    """Connect and write one record, each step bounded; the client is stopped either way."""
    client = AIOKafkaProducer(**options, request_timeout_ms=3000, metadata_max_age_ms=3000)
    try:
        await asyncio.wait_for(client.start(), 15)
        await asyncio.wait_for(client.send_and_wait(topic, b"x"), 15)
    finally:
        await client.stop()


async def test_callgate_topics_acls_run_as_printed_and_grant_what_they_say(
    secure_kafka: ApacheKafka, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    settings = Settings.model_validate(
        {
            "kafka": {"bootstrap_servers": secure_kafka.bootstrap_servers, "group_id": f"g-{run}"},
            "topics": {"input": f"in-{run}", "accepted": f"ok-{run}"},
            "delivery": {"guarantee": "exactly_once"},
        }
    )
    config = str(secure_kafka.client_properties())
    commands = [
        line for line in acl_commands(settings, "User:gate", command_config=config)
        if not line.startswith("#")
    ]  # fmt: skip
    for command in commands:
        program, *args = shlex.split(command)
        assert program == "kafka-acls.sh"
        assert args[:4] == ["--bootstrap-server", secure_kafka.bootstrap_servers,
                            "--command-config", config]  # fmt: skip
        secure_kafka.tool("org.apache.kafka.tools.AclCommand", *args)
    listed = secure_kafka.acls("--list", "--principal", "User:gate")
    for operation, resource in (
        ("READ", f"in-{run}"),
        ("WRITE", f"ok-{run}"),
        ("ALTER", f"g-{run}-in-{run}-changelog"),
        ("READ", f"g-{run}"),
        ("WRITE", f"g-{run}-"),
    ):
        assert operation in listed
        assert f"name={resource}," in listed, (resource, listed)
    await make_topics(secure_kafka, f"in-{run}", f"ok-{run}")
    async with producer(secure_kafka.client_options()) as admin:
        await admin.send_and_wait(f"in-{run}", b"model output")
    gate = secure_kafka.client_options("gate")
    assert await consume_one(gate, f"in-{run}", f"g-{run}") == b"model output"
    async with producer(gate) as client:
        await client.send_and_wait(f"ok-{run}", b"an outcome")
        with pytest.raises(TopicAuthorizationFailedError):
            await client.send_and_wait(f"in-{run}", b"the gate never writes its input")
    # the group's own topics: the worker may create them
    admin = AIOKafkaAdminClient(**gate, request_timeout_ms=5000)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(f"g-{run}-idempotency-requests", 1, 1)])
    finally:
        await admin.close()
    assert [code for _, code, *_ in response.topic_errors] == [0]
