"""A member the group expelled during a handler never records its run, on tansu
(at_least_once) and Apache Kafka (exactly_once).

Two executor processes (`tests.support.shop_executor`) in one group with one requests
partition; a `lookup` (not safe to retry) whose handler blocks its process's event loop past the
session, so the group hears nothing of that member and gives the partition to the other. The
other finds the call `started` and answers it `interrupted`; the expelled member, its handler
done at last, stops without writing its run's result. The call has that one result (before:
under at_least_once the expelled member wrote `succeeded` beside it, and its `done` record
replaced the key's).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.executor import CONTRACTS, Judge, ResultTail, produce
from tests.support.outcomes import read_records
from tests.support.workers import WorkerProcess, until
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SESSION_MS = 6000
#: the handler blocks its loop for over twice the session
HOG_S = 15.0
WAIT_S = 120.0
APP = "-m", "tests.support.shop_executor"


@pytest.fixture(params=["tansu", "apache"])
def target(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """A session broker's bootstrap servers, and whether it runs exactly_once."""
    if request.param == "tansu":
        return str(request.getfixturevalue("kafka_broker").bootstrap_servers), False
    return str(request.getfixturevalue("apache_kafka").bootstrap_servers), True


@pytest.mark.asyncio
async def test_an_expelled_member_never_records_its_run(
    target: tuple[str, bool], tmp_path: Path
) -> None:
    bootstrap, exactly_once = target
    run = uuid.uuid4().hex[:8]
    config: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": SESSION_MS},
        "topics": {"accepted": f"validated-{run}"},
        "schemas": {"dir": str(CONTRACTS)},
        "delivery": {"guarantee": "exactly_once" if exactly_once else "at_least_once"},
        "executor": {"group_id": f"executor-{run}", "results": f"results-{run}", "partitions": 1},
        "metrics": {"enabled": False},
        "shutdown_grace_s": 0.5,
    }
    validated = config["topics"]["accepted"]
    await Kafka(Settings.model_validate(config)).ensure_topics(
        [TopicSpec(validated, 1, compacted=False)]
    )
    env = {"SHOP_DB": str(tmp_path / "payments.db"), "SHOP_HOG_S": str(HOG_S)}
    processes = [
        WorkerProcess(f"executor-{i}", config, tmp_path, argv=APP, env=env) for i in range(2)
    ]
    call_id = f"{run}-hog"
    tail = ResultTail(bootstrap, f"results-{run}", read_committed=exactly_once)
    try:
        for process in processes:
            process.start()
            await process.wait_log("executor assigned", timeout_s=WAIT_S)
        event = Judge().accepted("lookup", {"sku": "hog"}, call_id=call_id)
        await produce(bootstrap, validated, [(call_id, event)])
        await tail.start(1)
        await tail.wait_for([call_id], timeout_s=WAIT_S)
        (hog,) = [p for p in processes if p.count("hogging")]
        await hog.wait_log("hogged", timeout_s=WAIT_S)
        # what the expelled member does once its loop runs again: it stops, writing nothing
        await until(lambda: not hog.alive, "the expelled member stopped", timeout_s=WAIT_S)
        (other,) = [p for p in processes if p is not hog]
        assert other.alive, other.tail()
        assert await other.stop(30) == 0, other.tail()
        await tail.drain(timeout_s=WAIT_S)
    finally:
        await tail.stop()
        for process in processes:
            process.cleanup()
    result = tail.only(call_id)
    assert (result["status"], result["error"]["type"]) == ("interrupted", "interrupted")
    records = await read_records(bootstrap, {f"results-{run}": 1}, read_committed=exactly_once)
    assert len(records) == 1
    assert sum(p.count("hogging") for p in processes) == 1
    assert hog.returncode == 1, hog.tail()
