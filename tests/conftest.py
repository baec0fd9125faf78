"""Shared fixtures: the session's brokers, one embedded Kafka-protocol broker (tansu) and, for
the tests that need the real thing, one Apache Kafka broker (KRaft, jars from tools/kafka/fetch).

Every integration test shares these brokers (a group join costs seconds on tansu, a broker start
about 0.1 s): tests keep apart by using their own topic names and group ids. When CI=true a
broker that cannot start fails the tests that need it; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import hypothesis
import pytest

from callgate_demo.broker import BrokerStartError, EmbeddedBroker
from tests.support import published
from tests.support.apache_kafka import ApacheKafka, ApacheKafkaError, Scram, fetch_libs
from tests.support.otel_collector import CollectorError, OtelCollector, collector_binary
from tests.support.tools import KUSTOMIZE, ToolError, built

# hypothesis is imported above, at collection, even for a run of tests that do not use it:
# otherwise its pytest plugin imports it at the session's end, from a stack deep enough for
# Python 3.11.7's parser to fail ("AST constructor recursion depth mismatch").

# No generated test is timed: a per-example deadline and the "too slow" health checks are
# wall-clock bounds, which fail when the machine is shared (a test bounds itself by pytest's
# timeout and by waiting on events). A test that sets its own settings keeps this default.
hypothesis.settings.register_profile(
    "untimed", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)
hypothesis.settings.load_profile("untimed")

# every published record a test makes in this process is held to its schema as it is made
published.install()

BROKER_START_TIMEOUT_S = 15.0
# both within pytest's per-test timeout, which counts the set-up of the first test that asks:
# a cold fetch from Maven Central took 8 to 15 s here, a start (format included) about 4 s
APACHE_KAFKA_FETCH_TIMEOUT_S = 60.0
APACHE_KAFKA_START_TIMEOUT_S = 45.0
#: a cold build from the Go module proxy (`make test` builds it first: then it is only found);
#: the tests that ask for one raise their own timeout to match
GO_BUILD_TIMEOUT_S = 1500.0


def _unavailable(reason: str, service: str = "embedded broker") -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{service} unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"{service} unavailable: {reason}")


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


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """The session's Apache Kafka broker on free loopback ports; stopped (that pid only) at the end.

    It assembles the jars first (tools/kafka/fetch) when a fresh checkout has none yet.
    """
    try:
        libs = fetch_libs(timeout_s=APACHE_KAFKA_FETCH_TIMEOUT_S)
        broker = ApacheKafka(libs, tmp_path_factory.mktemp("apache-kafka"))
        broker.start(timeout_s=APACHE_KAFKA_START_TIMEOUT_S)
    except ApacheKafkaError as exc:
        _unavailable(str(exc), "Apache Kafka broker")
    try:
        yield broker
    finally:
        broker.stop()


#: TLS and SCRAM make the secured broker's start slower (its tests allow for it)
SECURE_KAFKA_START_TIMEOUT_S = 120.0
#: the secured broker's users (`admin` is its super user); the tests grant the others ACLs
SECURE_USERS = {"admin": "admin-secret", "gate": "gate-secret", "other": "other-secret"}


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """The session's secured Apache Kafka broker: SASL_SSL (SCRAM-SHA-512, certificates made
    by the harness) as its only client listener, and ACLs (StandardAuthorizer) enforced."""
    try:
        libs = fetch_libs(timeout_s=APACHE_KAFKA_FETCH_TIMEOUT_S)
        broker = ApacheKafka(
            libs, tmp_path_factory.mktemp("secure-kafka"), security=Scram(SECURE_USERS)
        )
        broker.start(timeout_s=SECURE_KAFKA_START_TIMEOUT_S)
    except ApacheKafkaError as exc:
        _unavailable(str(exc), "secured Apache Kafka broker")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(params=["tansu", "apache"])
def broker(request: pytest.FixtureRequest) -> str:
    """bootstrap servers of the session's tansu or Apache Kafka broker."""
    if request.param == "tansu":
        tansu: EmbeddedBroker = request.getfixturevalue("kafka_broker")
        return tansu.bootstrap_servers
    kafka: ApacheKafka = request.getfixturevalue("apache_kafka")
    return kafka.bootstrap_servers


@pytest.fixture(scope="session")
def kustomize() -> Path:
    """The kustomize binary (`tools/kustomize/install` builds it from the Go module proxy)."""
    try:
        return built(KUSTOMIZE, timeout_s=GO_BUILD_TIMEOUT_S)
    except ToolError as exc:
        _unavailable(str(exc), "kustomize")
        raise


COLLECTOR_START_TIMEOUT_S = 30.0


@pytest.fixture(scope="session")
def otel_collector_binary() -> Path:
    """The OpenTelemetry Collector (`tools/otelcol/build` builds it from the Go modules)."""
    try:
        return collector_binary(timeout_s=GO_BUILD_TIMEOUT_S)
    except CollectorError as exc:
        _unavailable(str(exc), "OpenTelemetry Collector")
        raise


@pytest.fixture
def otel_collector(otel_collector_binary: Path, tmp_path: Path) -> Iterator[OtelCollector]:
    """A collector of the test's own on free loopback ports; its spans in its own file."""
    collector = OtelCollector(otel_collector_binary, tmp_path / "otelcol")
    try:
        collector.start(timeout_s=COLLECTOR_START_TIMEOUT_S)
    except CollectorError as exc:
        _unavailable(str(exc), "OpenTelemetry Collector")
    try:
        yield collector
    finally:
        collector.stop()


#: the fixtures that start a process shared by the whole session (or the test's own collector):
#: `make test` runs the tests without the integration marker on every core at once, so a test
#: asking for one of these unmarked would start a broker per core and time its faults on a
#: loaded machine
SERVICE_FIXTURES = frozenset(
    {"kafka_broker", "bootstrap", "apache_kafka", "secure_kafka", "broker", "otel_collector"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = [
        item.nodeid
        for item in items
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("integration") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests that start a broker or a collector must be marked integration: "
            + ", ".join(unmarked[:10])
        )
