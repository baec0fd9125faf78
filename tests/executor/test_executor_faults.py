"""The executor on tansu, fed calls whose own code or content fails in every way the test
catalogue knows: a handler raising each exception of `tests.support.faults` (a `CancelledError`
and a `KeyboardInterrupt` of its own among them), an argument model raising each, records
emitted around `CALLGATE_LIMITS__MAX_EVENT_BYTES` or to the executor's own topics, and a result
callback that raises. Each call gets exactly one result, as the README's table says, only what
may be written is written, and the executor keeps running: no call stops it or stalls its
partition."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel, model_validator

from callgate_executor import Call, Executor, contract
from tests.support.executor import CONTRACTS, Judge, ResultTail
from tests.support.faults import RAISABLE, expected_failure
from tests.support.outcomes import read_records
from worker.published.model import ToolResult
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 3
WAIT_S = 90.0
#: the smallest bound the settings allow
SMALL = 65_536
#: emitted records' value sizes, around the bound (no key)
EMIT_SIZES = (SMALL - 1000, SMALL, SMALL + 1, 2 * SMALL)


class Lookup(BaseModel):
    sku: str

    @model_validator(mode="after")
    def _fails_on_v(self) -> Lookup:
        if self.sku.startswith("v-"):
            raise RAISABLE[int(self.sku[2:])]
        return self


def _settings(bootstrap: str, run: str) -> Settings:
    return Settings.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": 6000},
            "topics": {"accepted": f"validated-{run}"},
            "schemas": {"dir": str(CONTRACTS)},
            "limits": {"max_bytes": 16_384, "max_event_bytes": SMALL},
            "executor": {
                "group_id": f"executor-{run}",
                "results": f"results-{run}",
                "partitions": PARTITIONS,
            },
            "shutdown_grace_s": 0.5,
        }
    )


@pytest.mark.asyncio
async def test_no_calls_fault_stops_the_executor(kafka_broker: Any) -> None:
    bootstrap = str(kafka_broker.bootstrap_servers)
    run = uuid.uuid4().hex[:8]
    settings = _settings(bootstrap, run)
    ledger = f"ledger-{run}"
    await Kafka(settings).ensure_topics(
        [
            TopicSpec(settings.topics.accepted, PARTITIONS, compacted=False),
            TopicSpec(ledger, 1, compacted=False),
        ]
    )

    async def lookup(call: Call[Lookup]) -> dict[str, Any]:
        kind, _, n = call.arguments.sku.partition("-")
        if kind == "r":
            await asyncio.sleep(0)
            raise RAISABLE[int(n)]
        if kind == "e":
            call.emit(ledger, bytes(int(n)))
        if kind == "own":
            call.emit(settings.executor.executions, b"garbage")
        return {"sku": call.arguments.sku}

    delivered: list[ToolResult] = []

    def on_result(result: ToolResult) -> None:
        delivered.append(result)
        raise KeyError("the application's callback fails on every result")

    skus = [
        *(f"r-{i}" for i in range(len(RAISABLE))),
        *(f"v-{i}" for i in range(len(RAISABLE))),
        *(f"e-{size}" for size in EMIT_SIZES),
        "own-0",
        "ok",
    ]
    judge = Judge()
    calls = {f"{run}-{sku}": sku for sku in skus}
    executor = Executor(settings, on_result=on_result)
    executor.tool("lookup", arguments=Lookup, retry_safe=True, timeout_s=5)(lookup)
    tail = ResultTail(bootstrap, settings.executor.results, read_committed=False)
    await executor.start()
    task = asyncio.create_task(executor.run())
    try:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for call_id, sku in calls.items():
                event = judge.accepted("lookup", {"sku": sku}, call_id=call_id)
                await producer.send_and_wait(settings.topics.accepted, event, key=call_id.encode())
        finally:
            await producer.stop()
        await tail.start(PARTITIONS)
        await tail.wait_for(calls, timeout_s=WAIT_S, alive=lambda: not task.done())
        assert not task.done()
    finally:
        executor.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, WAIT_S)
        await executor.close()
        await tail.stop()
    assert task.exception() is None

    for call_id, sku in calls.items():
        result = tail.only(call_id)
        kind, _, n = sku.partition("-")
        status, error = result["status"], result["error"]
        if kind == "r":
            expected = expected_failure(RAISABLE[int(n)], "body")
            assert (status, error) == ("failed", expected.model_dump()), sku
        elif kind == "v":
            assert (status, error["type"]) == ("refused", "argument_type"), sku
        elif kind == "own":
            assert (status, error) == ("failed", contract.EMIT_REFUSED.model_dump())
        elif kind == "e" and int(n) > SMALL:
            assert (status, error) == ("failed", contract.OUTPUT_TOO_LARGE.model_dump())
        else:
            assert status == "succeeded", (sku, result)
    assert len(delivered) == len(calls)
    written = await read_records(bootstrap, {ledger: 1}, read_committed=False)
    assert sorted(len(r.value) for r in written) == [s for s in EMIT_SIZES if s <= SMALL]
