"""The executor on tansu holds a call to its own contract, the one its event's schema id and
version name: its principal must be on that contract's allow list (the gate's rule), whatever
the gate that accepted it judged it by, and it is run by that contract's handler, whatever tool
its event names.

The gate here judges `pay` without an allow list; the executor's copy of the contracts allows
`pay` to `ops` alone (a contract changed between the two, or a writer of the validated topic
other than the gate). Calls by `ops`, by `eve` and by nobody: only `ops`'s runs, the others are
refused `unauthorized`, under one key each principal (its key is its own: the refusal leaves it
free). A `wire` call (which requires an approval and has none) relabelled as `shop.lookup`'s
schema, and a lookup relabelled with tool `wire`, are each given `lookup`'s handler: `wire`'s
never runs.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from callgate_executor import Call, Executor
from tests.support.executor import CONTRACTS, Judge, ResultTail, produce
from tests.support.shop_executor import Lookup, Pay, Wire
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PARTITIONS = 2
WAIT_S = 60.0


def _contracts(into: Path) -> Path:
    """The executor tests' contracts, `pay` allowed to `ops` alone."""
    copied = into / "contracts"
    shutil.copytree(CONTRACTS, copied)
    pay = copied / "shop" / "pay.v1.schema.json"
    schema = orjson.loads(pay.read_bytes())
    schema["x-callgate"]["allowed_principals"] = ["ops"]
    pay.write_bytes(orjson.dumps(schema))
    return copied


def _relabelled(event: bytes, **fields: Any) -> bytes:
    value = orjson.loads(event)
    value.update(fields)
    return orjson.dumps(value)


@pytest.mark.asyncio
async def test_the_executor_holds_a_call_to_its_schemas_contract(
    kafka_broker: Any, tmp_path: Path
) -> None:
    bootstrap = str(kafka_broker.bootstrap_servers)
    run = uuid.uuid4().hex[:8]
    settings = Settings.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": 6000},
            "topics": {"accepted": f"validated-{run}"},
            "schemas": {"dir": str(_contracts(tmp_path))},
            "executor": {
                "group_id": f"executor-{run}",
                "results": f"results-{run}",
                "partitions": PARTITIONS,
            },
            "shutdown_grace_s": 0.5,
        }
    )
    await Kafka(settings).ensure_topics(
        [TopicSpec(settings.topics.accepted, PARTITIONS, compacted=False)]
    )
    judge = Judge()  # the gate: `pay` without an allow list
    wire = judge.accepted("wire", {"amount_minor": 5, "idempotency_key": "w"}, call_id=f"{run}-w")
    lookup = judge.accepted("lookup", {"sku": "s"}, call_id=f"{run}-l")
    events = {
        "ops": judge.pay("k", 100, call_id=f"{run}-ops", principal="ops"),
        "eve": judge.pay("k", 100, call_id=f"{run}-eve", principal="eve"),
        "nobody": judge.pay("k", 100, call_id=f"{run}-nobody"),
        "wire-as-lookup": _relabelled(
            wire, schema={"id": "shop.lookup", "version": "1"}, requires_approval=False
        ),
        "lookup-as-wire": _relabelled(lookup, tool="wire"),
    }
    ran: list[str] = []

    async def pay(call: Call[Pay]) -> dict[str, Any]:
        ran.append(f"pay by {call.event.principal}")
        return {"payment_id": 1, "status": "paid"}

    async def look(call: Call[Lookup]) -> dict[str, Any]:
        ran.append("lookup")
        return {"sku": call.arguments.sku}

    async def transfer(call: Call[Wire]) -> dict[str, Any]:
        ran.append("wire")
        return {}

    executor = Executor(settings)
    executor.tool("pay", arguments=Pay, retry_safe=True)(pay)
    executor.tool("shop.lookup", arguments=Lookup, retry_safe=False)(look)
    executor.tool("wire", arguments=Wire, retry_safe=False)(transfer)
    tail = ResultTail(bootstrap, settings.executor.results, read_committed=False)
    await executor.start()
    task = asyncio.create_task(executor.run())
    try:
        await tail.start(PARTITIONS)
        keyed = [(orjson.loads(e)["call_id"], e) for e in events.values()]
        await produce(bootstrap, settings.topics.accepted, keyed)
        ids = [f"{run}-ops", f"{run}-eve", f"{run}-nobody", f"{run}-w", f"{run}-l"]
        await tail.wait_for(ids, timeout_s=WAIT_S, alive=lambda: not task.done())
    finally:
        executor.request_stop()
        await asyncio.wait_for(task, WAIT_S)
        await executor.close()
        await tail.drain(timeout_s=WAIT_S)
        await tail.stop()

    ops = tail.only(f"{run}-ops")
    assert (ops["status"], ops["replayed"]) == ("succeeded", False)
    for who in ("eve", "nobody"):
        refused = tail.only(f"{run}-{who}")
        assert (refused["status"], refused["error"]) == (
            "refused",
            {
                "type": "unauthorized",
                "message": "this call is not permitted: its principal may not call this tool",
            },
        )
    relabelled_wire = tail.only(f"{run}-w")
    assert (relabelled_wire["status"], relabelled_wire["error"]["type"]) == (
        "refused",
        "argument_type",
    )
    assert tail.only(f"{run}-l")["status"] == "succeeded"
    assert sorted(ran) == ["lookup", "pay by ops"]
