"""The executor's cancellation of a run is final, on tansu: a handler that swallows every
cancellation and goes on awaiting neither holds the executor's stop (nor so a rebalance) for
longer than two graces, nor gets anything of its run recorded when it ends at last; the key's
next owner finds the call `started` and answers it `interrupted` (the handler is not safe to
retry), its only result."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from callgate_executor import Call, Executor
from tests.support.executor import CONTRACTS, Judge, ResultTail, produce
from tests.support.shop_executor import Lookup
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PARTITIONS = 3
GRACE_S = 0.5
WAIT_S = 60.0


class Stubborn:
    """A `lookup` handler that ignores every cancellation until `release` is set."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.returned = asyncio.Event()
        self.cancellations = 0
        self.runs = 0

    async def lookup(self, call: Call[Lookup]) -> dict[str, Any]:
        self.runs += 1
        self.entered.set()
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancellations += 1
        self.returned.set()
        return {"sku": call.arguments.sku}


def _settings(bootstrap: str, run: str) -> Settings:
    return Settings.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": 6000},
            "topics": {"accepted": f"validated-{run}"},
            "schemas": {"dir": str(CONTRACTS)},
            "executor": {
                "group_id": f"executor-{run}",
                "results": f"results-{run}",
                "partitions": PARTITIONS,
            },
            "shutdown_grace_s": GRACE_S,
        }
    )


def _executor(settings: Settings, handler: Stubborn) -> Executor:
    executor = Executor(settings)
    executor.tool("lookup", arguments=Lookup, retry_safe=False, timeout_s=600)(handler.lookup)
    return executor


@pytest.mark.asyncio
async def test_a_handler_ignoring_its_cancellation_is_left_behind_and_never_recorded(
    kafka_broker: Any,
) -> None:
    bootstrap = str(kafka_broker.bootstrap_servers)
    run = uuid.uuid4().hex[:8]
    settings = _settings(bootstrap, run)
    await Kafka(settings).ensure_topics(
        [TopicSpec(settings.topics.accepted, PARTITIONS, compacted=False)]
    )
    call_id = f"{run}-stubborn"
    event = Judge().accepted("lookup", {"sku": "stubborn"}, call_id=call_id)
    stubborn = Stubborn()
    first = _executor(settings, stubborn)
    tail = ResultTail(bootstrap, settings.executor.results, read_committed=False)
    await first.start()
    task = asyncio.create_task(first.run())
    try:
        await produce(bootstrap, settings.topics.accepted, [(call_id, event)])
        await asyncio.wait_for(stubborn.entered.wait(), WAIT_S)
    finally:
        first.request_stop()
        await asyncio.wait_for(task, WAIT_S)
        began = time.monotonic()
        closing = asyncio.create_task(first.close())
        closed, _ = await asyncio.wait([closing], timeout=10 * GRACE_S)
        if not closed:  # it waits for the handler for ever (so would a rebalance's revoke)
            stubborn.release.set()
            await closing
    assert closed, "close() waited for a handler that ignores its cancellation"
    assert time.monotonic() - began < 4 * GRACE_S
    assert stubborn.cancellations == 1
    assert not stubborn.returned.is_set()

    second = _executor(settings, Stubborn())
    await second.start()
    task = asyncio.create_task(second.run())
    try:
        await tail.start(PARTITIONS)
        await tail.wait_for([call_id], timeout_s=WAIT_S, alive=lambda: not task.done())
        # the first run ends at last: nothing of it is written
        stubborn.release.set()
        await asyncio.wait_for(stubborn.returned.wait(), WAIT_S)
    finally:
        second.request_stop()
        await asyncio.wait_for(task, WAIT_S)
        await second.close()
    await tail.drain(timeout_s=WAIT_S)
    await tail.stop()
    result = tail.only(call_id)
    assert (result["status"], result["error"]["type"]) == ("interrupted", "interrupted")
    assert stubborn.runs == 1
    assert second.stats["executed"] == 0
