"""A topic the executor writes to that does not exist, on tansu (at_least_once) and Apache Kafka
(exactly_once): a record a handler emitted to a topic never made, or the results topic deleted
before the partition's producer knew it. The executor stops (`run` raises `BrokerError`) with a
message naming the topic, well within the client's request timeout (before: it waited for the
topic's metadata for good on tansu), and writes nothing of the call. (tansu acknowledges writes
to a deleted topic its producer knows: not checked here.)"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from pydantic import BaseModel

from callgate_executor import Call, Executor
from tests.support.executor import Judge, broker_settings, produce
from tests.support.outcomes import read_records
from worker.errors import BrokerError
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 1
#: the client's request timeout (its own wait for a topic's metadata): the stop comes well before
REQUEST_TIMEOUT_MS = 60_000
STOPPED_WITHIN_S = 20.0
WAIT_S = 90.0


class Lookup(BaseModel):
    sku: str


@pytest.fixture(
    params=[("tansu", "emitted"), ("apache", "emitted"), ("apache", "results")],
    ids=["tansu-emitted", "apache-emitted", "apache-results"],
)
def target(request: pytest.FixtureRequest) -> tuple[str, bool, str]:
    """A session broker's bootstrap servers, whether it runs exactly_once, and which topic is
    missing (under exactly_once a partition's producer starts at its assignment: after the
    results topic was deleted)."""
    broker, missing = request.param
    if broker == "tansu":
        return str(request.getfixturevalue("kafka_broker").bootstrap_servers), False, missing
    return str(request.getfixturevalue("apache_kafka").bootstrap_servers), True, missing


@pytest.mark.asyncio
async def test_a_missing_topic_stops_the_executor_naming_it(
    target: tuple[str, bool, str],
) -> None:
    bootstrap, exactly_once, missing = target
    run = uuid.uuid4().hex[:8]
    settings = broker_settings(
        bootstrap,
        run,
        exactly_once=exactly_once,
        partitions=PARTITIONS,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )
    kafka = Kafka(settings)
    await kafka.ensure_topics([TopicSpec(settings.topics.accepted, PARTITIONS, compacted=False)])
    never_made = f"ledger-{run}"
    ran: list[str] = []

    async def lookup(call: Call[Lookup]) -> dict[str, Any]:
        ran.append(call.arguments.sku)
        if missing == "emitted":
            call.emit(never_made, b"entry", key=b"k")
        return {"sku": call.arguments.sku, "stock": 1}

    executor = Executor(settings)
    executor.tool("lookup", arguments=Lookup, retry_safe=False)(lookup)
    await executor.start()
    results = settings.executor.results
    gone = never_made if missing == "emitted" else results
    if missing == "results":
        async with kafka.admin() as admin:
            await admin.delete_topics([results])
    task = asyncio.create_task(executor.run())
    try:
        call_id = f"{run}-lookup"
        event = Judge().accepted("lookup", {"sku": "s"}, call_id=call_id)
        await produce(bootstrap, settings.topics.accepted, [(call_id, event)])
        await asyncio.wait_for(_until(lambda: bool(ran)), WAIT_S)
        began = time.monotonic()
        done, _ = await asyncio.wait([task], timeout=WAIT_S)
        assert done == {task}, "the executor stalled"
        stopped_after_s = time.monotonic() - began
    finally:
        executor.request_stop()
        await asyncio.wait([task], timeout=WAIT_S)
        await executor.close()
    with pytest.raises(BrokerError) as raised:
        task.result()
    assert f"topic {gone} does not exist" in str(raised.value), raised.value
    assert stopped_after_s < STOPPED_WITHIN_S, (stopped_after_s, raised.value)
    if missing == "emitted":  # nothing of the call was written: its result waits for the topic
        written = await read_records(bootstrap, {results: PARTITIONS}, read_committed=True)
        assert written == []


async def _until(done: Any) -> None:
    while not done():
        await asyncio.sleep(0.05)
