"""A worker (`callgate run`, its own process) whose Apache Kafka broker is stopped and started
again: what `/readyz` answers, and what the log says, while the broker is away and once it is
back. The broker is the test's own (`ApacheKafka` on free loopback ports), stopped and started
by its pid: the session's brokers are never touched."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from tests.datafiles import SCHEMAS
from tests.support.apache_kafka import ApacheKafka, ApacheKafkaError, fetch_libs
from tests.support.processes import free_port
from tests.support.workers import ASSIGNED, WorkerProcess, until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: the bound /readyz holds fetches and acknowledgements to (`metrics.ready_within_ms`)
READY_WITHIN_S = 3.0
#: how long the broker stays away: longer than the bound, the session and a request timeout
OUTAGE_S = 40.0
START_TIMEOUT_S = 90.0
WAIT_S = 120.0
#: readiness is asked every 50 ms and decided between rounds: a busy machine may add seconds
SLACK_S = 10.0
#: log lines the whole outage may take (each a change of state, or a first of its kind)
MOST_LINES = 30
CALLS = 50


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[ApacheKafka]:
    """An Apache Kafka broker of this test's own: it stops and starts it."""
    try:
        kafka = ApacheKafka(fetch_libs(timeout_s=60), tmp_path / "kafka")
        kafka.start(timeout_s=START_TIMEOUT_S)
    except ApacheKafkaError as exc:
        pytest.fail(f"Apache Kafka unavailable: {exc}")
    try:
        yield kafka
    finally:
        kafka.stop()


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


async def make_topics(bootstrap: str, run: str) -> dict[str, str]:
    topics = {name: f"{name}-{run}" for name in ("in", "accepted", "rejected", "incomplete")}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, 2 if role == "in" else 1, 1) for role, name in topics.items()]
        )
    finally:
        await admin.close()
    return topics


async def produce(bootstrap: str, topic: str, run: str, calls: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(calls):
            stream = f"{run}:{i}"
            value = orjson.dumps(
                {
                    "stream_id": stream,
                    "call_id": f"{stream}:c",
                    "seq": 0,
                    "kind": "tool_call",
                    "tool": "get_weather",
                    "delta": '{"city": "Oslo", "units": "celsius"}',
                    "final": True,
                }
            )
            await producer.send(topic, value, key=stream.encode())
        await producer.flush()
    finally:
        await producer.stop()


def scraped(port: int, name: str) -> float:
    """The sum of a metric's samples on the worker's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
        text = reply.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def message(line: str) -> str:
    """A log line without its time stamp."""
    return line.split(" ", 2)[-1]


@pytest.mark.timeout(600)
async def test_the_broker_stopped_and_started(own_kafka: ApacheKafka, tmp_path: Path) -> None:
    """While the broker is away /readyz answers 503 within the bound, saying why; the log says
    `Kafka unreachable` once and each kind of the client's errors at most once (the rest
    counted in a metric), with no traceback; once it is back, /readyz answers 200, the log
    says `Kafka reachable again` once, and the calls sent meanwhile get their events."""
    run = uuid.uuid4().hex[:8]
    bootstrap = own_kafka.bootstrap_servers
    topics = await make_topics(bootstrap, run)
    port = free_port("127.0.0.1")
    config = {
        "kafka": {
            "bootstrap_servers": [bootstrap],
            "group_id": f"outage-{run}",
            "session_timeout_ms": 6000,
        },
        "topics": {
            "input": topics["in"],
            "accepted": topics["accepted"],
            "rejected": topics["rejected"],
            "incomplete": topics["incomplete"],
        },
        "schemas": {"dir": str(SCHEMAS)},
        "plugins": [],
        "metrics": {
            "host": "127.0.0.1",
            "port": port,
            "ready_within_ms": int(READY_WITHIN_S * 1000),
        },
        "idempotency": {"partitions": 1},
        "shutdown_grace_s": 5,
        "log_level": "INFO",
    }
    worker = WorkerProcess("worker", config, tmp_path).start()
    alive = {"alive": lambda: worker.alive, "context": worker.tail}
    try:
        await worker.wait_log(ASSIGNED, timeout_s=WAIT_S)
        await produce(bootstrap, topics["in"], f"{run}-a", CALLS)
        await until(
            lambda: scraped(port, "callgate_calls_total") >= CALLS,
            "events",
            timeout_s=WAIT_S,
            **alive,
        )
        await until(lambda: readyz(port)[0] == 200, "ready", timeout_s=WAIT_S, **alive)
        before = len(worker.text().splitlines())

        await asyncio.to_thread(own_kafka.stop)
        stopped = time.monotonic()
        await until(lambda: readyz(port)[0] == 503, "unready", timeout_s=WAIT_S, **alive)
        unready_after_s = time.monotonic() - stopped
        status, reason = readyz(port)
        await worker.wait_log("Kafka unreachable: ", timeout_s=WAIT_S)
        # the outage lasts OUTAGE_S (what is tested), not a wait for an event
        await asyncio.sleep(max(0.0, stopped + OUTAGE_S - time.monotonic()))
        during = worker.text().splitlines()[before:]
        counted = scraped(port, "callgate_kafka_client_log_records_total")

        await asyncio.to_thread(own_kafka.start, START_TIMEOUT_S)
        started = time.monotonic()
        await until(lambda: readyz(port)[0] == 200, "ready again", timeout_s=WAIT_S, **alive)
        ready_after_s = time.monotonic() - started
        await worker.wait_log("Kafka reachable again after ", timeout_s=WAIT_S)
        await produce(bootstrap, topics["in"], f"{run}-b", CALLS)
        await until(
            lambda: scraped(port, "callgate_calls_total") >= 2 * CALLS,
            "events",
            timeout_s=WAIT_S,
            **alive,
        )
        assert await worker.stop(15) == 0, worker.tail()
    finally:
        worker.cleanup()
    print(
        f"\n[broker outage] unready {unready_after_s:.1f} s after the stop ({reason.strip()}); "
        f"{len(during)} log lines in {OUTAGE_S:.0f} s, {counted:.0f} client warnings and errors "
        f"counted; ready {ready_after_s:.1f} s after the start"
    )
    assert status == 503
    assert unready_after_s <= READY_WITHIN_S + SLACK_S
    assert "acknowledged" in reason or "no fetch answered" in reason, reason
    text = worker.text()
    assert "Traceback" not in text
    assert text.count("Kafka unreachable: ") == 1
    assert text.count("Kafka reachable again after ") == 1
    repeated = [
        m for m in {message(line) for line in during} if [message(x) for x in during].count(m) > 1
    ]
    assert not repeated, "\n".join(during)
    assert len(during) <= MOST_LINES, "\n".join(during)
    assert counted > len(during)
