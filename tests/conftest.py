"""Shared fixtures: one embedded Kafka-protocol broker (tansu) for the whole test session.

Every integration test shares this broker (a group join costs seconds on tansu, a broker start
about 0.1 s): tests keep apart by using their own topic names and group ids. When CI=true a
broker that cannot start fails the tests that need it; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.errors import BrokerStartError
from worker.runtime.broker import EmbeddedBroker

BROKER_START_TIMEOUT_S = 15.0


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"embedded broker unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"embedded broker unavailable: {reason}")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """The session's tansu broker on a free loopback port; stopped (that pid only) at the end."""
    log_file: Path = tmp_path_factory.mktemp("tansu") / "tansu.log"
    broker = EmbeddedBroker(log_file=log_file)
    try:
        broker.start(timeout_s=BROKER_START_TIMEOUT_S)
    except BrokerStartError as exc:
        _unavailable(str(exc))
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def bootstrap(kafka_broker: EmbeddedBroker) -> str:
    """host:port of the session broker."""
    return kafka_broker.bootstrap_servers
