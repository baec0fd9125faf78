"""The executor on real brokers: tansu (at_least_once) and Apache Kafka (exactly_once).

One run covers the execute contract and the failure semantics on the gate's own events: a call
runs once; an equal repeat under its key gets the recorded result (`replayed`); a different
request under it is a conflict; an unkeyed call is keyed by its event id; a call delivered
twice gets one result, under either guarantee, and so does a refused one; a handler that
raises, passes its deadline or returns output its contract refuses fails its call; a call that
needs an approval and has none, or one whose approval's fingerprint was forged, is refused; a
handler's emitted record is written with its result. Then an executor stopped while two
handlers run (one safe to retry, one not), and a new one that restores the executions topic:
the first runs again (attempt 2), the second is `interrupted`, and an equal repeat of an
earlier call still gets its recorded result. On tansu: an approved `mcp_approval_request` is
never run, and a call with no contract of its version is refused.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from callgate_executor import Call, Executor
from tests.support.executor import CONTRACTS, Judge, ResultTail, blocked_lookup
from tests.support.outcomes import read_records
from tests.support.workers import until
from worker.metrics import EXECUTOR_OUTCOMES
from worker.published.model import Accepted, parse_event
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 3
WAIT_S = 60.0


class Pay(BaseModel):
    amount_minor: int
    currency: str
    recipient: str
    idempotency_key: str


class Lookup(BaseModel):
    sku: str


class Wire(BaseModel):
    amount_minor: int
    idempotency_key: str


class Shop:
    """The handlers, and what they did: runs per idempotency key (or sku), attempts seen."""

    def __init__(self, ledger: str) -> None:
        self.ledger = ledger
        self.runs: Counter[str] = Counter()
        self.attempts: dict[str, list[int]] = {}
        self.block = asyncio.Event()  # set: the blocking calls block no more
        self.entered = asyncio.Event()

    async def pay(self, call: Call[Pay]) -> dict[str, Any]:
        key = call.arguments.idempotency_key
        self.runs[key] += 1
        self.attempts.setdefault(key, []).append(call.attempt)
        assert call.idempotency_key == key
        if call.arguments.recipient == "block" and not self.block.is_set():
            self.entered.set()
            await asyncio.Event().wait()
        if call.arguments.recipient == "bad":
            return {"payment_id": "not a number", "status": "paid"}
        call.emit(self.ledger, key.encode(), key=key.encode())
        return {"payment_id": self.runs.total(), "status": "paid"}

    async def lookup(self, call: Call[Lookup]) -> dict[str, Any]:
        sku = call.arguments.sku
        self.runs[sku] += 1
        if sku == "raise":
            raise RuntimeError("the warehouse is on fire")
        if sku == "slow":
            await asyncio.Event().wait()
        if sku == "block" and not self.block.is_set():
            self.entered.set()
            await asyncio.Event().wait()
        return {"sku": sku, "stock": len(sku)}

    async def wire(self, call: Call[Wire]) -> dict[str, Any]:
        self.runs["wire"] += 1
        return {}

    def executor(self, settings: Settings) -> Executor:
        executor = Executor(settings)
        executor.tool("pay", arguments=Pay, retry_safe=True)(self.pay)
        executor.tool("lookup", arguments=Lookup, retry_safe=False, timeout_s=5)(self.lookup)
        executor.tool("wire", arguments=Wire, retry_safe=False)(self.wire)
        return executor


def _settings(bootstrap: str, run: str, guarantee: str) -> Settings:
    return Settings.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": 6000},
            "topics": {"accepted": f"validated-{run}"},
            "schemas": {"dir": str(CONTRACTS)},
            "delivery": {"guarantee": guarantee},
            "executor": {
                "group_id": f"executor-{run}",
                "results": f"results-{run}",
                "partitions": PARTITIONS,
            },
            "shutdown_grace_s": 0.5,
        }
    )


async def _produce(bootstrap: str, topic: str, events: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for event in events:
            call_id = event.split(b'"call_id":"', 1)[1].split(b'"', 1)[0]
            await producer.send_and_wait(topic, event, key=call_id)
    finally:
        await producer.stop()


async def _running(executor: Executor) -> asyncio.Task[None]:
    await executor.start()
    return asyncio.create_task(executor.run())


async def _stopped(executor: Executor, task: asyncio.Task[None]) -> None:
    executor.request_stop()
    await asyncio.wait_for(task, WAIT_S)
    await executor.close()


@pytest.fixture(params=["tansu", "apache"])
def target(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """A session broker's bootstrap servers, and whether it runs exactly_once (Apache Kafka;
    tansu has no transactions)."""
    if request.param == "tansu":
        return str(request.getfixturevalue("kafka_broker").bootstrap_servers), False
    return str(request.getfixturevalue("apache_kafka").bootstrap_servers), True


@pytest.mark.asyncio
async def test_the_execute_contract_on_a_real_broker(target: tuple[str, bool]) -> None:
    broker, exactly_once = target
    run = uuid.uuid4().hex[:8]
    tail = ResultTail(broker, f"results-{run}", read_committed=exactly_once)
    try:
        await _the_contract(broker, exactly_once, run, tail)
    finally:
        await tail.stop()


async def _the_contract(broker: str, exactly_once: bool, run: str, tail: ResultTail) -> None:
    guarantee = "exactly_once" if exactly_once else "at_least_once"
    settings = _settings(broker, run, guarantee)
    ledger = f"ledger-{run}"
    await Kafka(settings).ensure_topics(
        [
            TopicSpec(settings.topics.accepted, PARTITIONS, compacted=False),
            TopicSpec(ledger, 1, compacted=False),
        ]
    )
    judge = Judge()
    pay = judge.pay("k1", 100, call_id=f"{run}-pay")
    events = {
        "pay": pay,
        "again": judge.pay("k1", 100, call_id=f"{run}-again"),
        "conflict": judge.pay("k1", 999, call_id=f"{run}-conflict"),
        "bad": judge.pay("k2", 100, call_id=f"{run}-bad", recipient="bad"),
        "lookup": judge.accepted("lookup", {"sku": "ok"}, call_id=f"{run}-lookup"),
        "lookup-2": judge.accepted("lookup", {"sku": "ok"}, call_id=f"{run}-lookup-2"),
        "raise": judge.accepted("lookup", {"sku": "raise"}, call_id=f"{run}-raise"),
        "slow": judge.accepted("lookup", {"sku": "slow"}, call_id=f"{run}-slow"),
        "wire": judge.accepted(
            "wire", {"amount_minor": 5, "idempotency_key": "w1"}, call_id=f"{run}-wire"
        ),
        "forged": judge.approved(
            "wire",
            {"amount_minor": 6, "idempotency_key": "w2"},
            call_id=f"{run}-forged",
            fingerprint="0" * 32,
        ),
    }
    shop = Shop(ledger)
    executor = shop.executor(settings)
    task = await _running(executor)
    try:
        await tail.start(PARTITIONS)
        # the first call first: the others under its key are repeats of it
        await _produce(broker, settings.topics.accepted, [pay])
        await tail.wait_for([f"{run}-pay"], timeout_s=WAIT_S)
        await _produce(
            broker, settings.topics.accepted, [v for k, v in events.items() if k != "pay"]
        )
        # delivered twice: a call that ran, and two refused ones
        twice = [pay, events["wire"], events["forged"]]
        await _produce(broker, settings.topics.accepted, twice)
        await tail.wait_for([f"{run}-{name}" for name in events], timeout_s=WAIT_S)
        await until(
            lambda: executor.stats["redelivered"] == len(twice),
            "the second deliveries decided",
            timeout_s=WAIT_S,
        )
    finally:
        await _stopped(executor, task)
    await tail.drain(timeout_s=WAIT_S)

    # one result each, under at_least_once too: the member that wrote it knows it did
    first = [tail.only(f"{run}-pay")]
    assert first[0]["status"] == "succeeded"
    assert first[0]["replayed"] is False
    assert first[0]["attempts"] == 1
    assert shop.runs["k1"] == 1
    again = tail.only(f"{run}-again")
    assert again["replayed"] is True
    assert (again["status"], again["output"]) == ("succeeded", first[0]["output"])
    assert again["executed_event_id"] == first[0]["event_id"]
    conflict = tail.only(f"{run}-conflict")
    assert (conflict["status"], conflict["error"]["type"]) == ("conflict", "idempotency_conflict")
    assert conflict["executed_event_id"] is None
    bad = tail.only(f"{run}-bad")
    assert (bad["status"], bad["error"]["type"]) == ("failed", "output_schema_violation")
    # an unkeyed call is its own execution: two equal lookups both run
    assert tail.only(f"{run}-lookup")["output"] == {"sku": "ok", "stock": 2}
    assert tail.only(f"{run}-lookup-2")["replayed"] is False
    assert shop.runs["ok"] == 2
    raised = tail.only(f"{run}-raise")
    assert (raised["status"], raised["error"]) == (
        "failed",
        {"type": "RuntimeError", "message": "the tool failed"},
    )
    slow = tail.only(f"{run}-slow")
    assert (slow["status"], slow["error"]["type"]) == ("timed_out", "deadline")
    wire = tail.only(f"{run}-wire")
    assert (wire["status"], wire["error"]["type"]) == ("refused", "approval_missing")
    forged = tail.only(f"{run}-forged")
    assert (forged["status"], forged["error"]["type"]) == (
        "refused",
        "approval_fingerprint_mismatch",
    )
    assert shop.runs["wire"] == 0
    # what came of each call, per tool, as the executor's metrics count it
    counted = {
        (tool, outcome): executor.metrics.registry.get_sample_value(
            "callgate_executor_calls_total", {"tool": tool, "outcome": outcome}
        )
        for tool in ("pay", "lookup", "wire")
        for outcome in EXECUTOR_OUTCOMES
    }
    assert {labels: count for labels, count in counted.items() if count} == {
        ("pay", "succeeded"): 1,
        ("pay", "failed"): 1,  # output its contract refuses
        ("pay", "replayed"): 1,
        ("pay", "conflict"): 1,
        ("pay", "redelivered"): 1,
        ("lookup", "succeeded"): 2,
        ("lookup", "failed"): 1,
        ("lookup", "timed_out"): 1,
        ("wire", "refused"): 2,
        ("wire", "redelivered"): 2,
    }
    emitted = await read_records(broker, {ledger: 1}, read_committed=exactly_once)
    assert [r.value for r in emitted] == [b"k1"]

    # -- stopped during two handlers; a new executor restores and goes on ---------------------
    # the two calls on two partitions of the requests topic: both in their handlers at once
    pay_block = judge.pay("k3", 7, call_id=f"{run}-pay-block", recipient="block")
    blocked = {
        "pay-block": pay_block,
        "lookup-block": blocked_lookup(judge, pay_block, f"{run}-lookup-block", PARTITIONS),
    }
    executor = shop.executor(settings)
    task = await _running(executor)
    try:
        await _produce(broker, settings.topics.accepted, list(blocked.values()))
        await asyncio.wait_for(shop.entered.wait(), WAIT_S)
        await until(
            lambda: shop.runs["k3"] == 1 and shop.runs["block"] == 1,
            "both blocking handlers running",
            timeout_s=WAIT_S,
        )
    finally:
        await _stopped(executor, task)  # the grace passes: both handlers are cancelled
    lookup_block = _accepted(blocked["lookup-block"]).call_id
    assert not ({f"{run}-pay-block", lookup_block} & tail.by_call.keys())
    shop.block.set()
    repeat = judge.pay("k1", 100, call_id=f"{run}-after-restart")
    executor = shop.executor(settings)
    task = await _running(executor)
    try:
        await _produce(broker, settings.topics.accepted, [repeat])
        names = [f"{run}-pay-block", lookup_block, f"{run}-after-restart"]
        await tail.wait_for(names, timeout_s=WAIT_S)
    finally:
        await _stopped(executor, task)
    retried = tail.only(f"{run}-pay-block")
    assert (retried["status"], retried["attempts"]) == ("succeeded", 2)
    assert shop.attempts["k3"] == [1, 2]
    interrupted = tail.only(lookup_block)
    assert (interrupted["status"], interrupted["error"]["type"]) == ("interrupted", "interrupted")
    assert shop.runs["block"] == 1  # never run again
    after = tail.only(f"{run}-after-restart")
    assert (after["replayed"], after["output"]) == (True, first[0]["output"])
    assert shop.runs["k1"] == 1


def _accepted(value: bytes) -> Accepted:
    event = parse_event(value)
    assert isinstance(event, Accepted)
    return event


@pytest.mark.asyncio
async def test_what_the_client_does_not_run_or_no_contract_holds_never_runs_on_tansu(
    kafka_broker: Any,
) -> None:
    """On the validated topic: an approved `mcp_approval_request` for a tool the executor has a
    handler for (OpenAI's MCP server runs it, not the client) is passed over, with no result,
    counted `passed_over`; a call of a schema version no contract of the executor's holds, with
    a handler for any version, is refused `no_contract`; a plain call beside them runs."""
    broker = str(kafka_broker.bootstrap_servers)
    run = uuid.uuid4().hex[:8]
    settings = _settings(broker, run, "at_least_once")
    await Kafka(settings).ensure_topics(
        [TopicSpec(settings.topics.accepted, PARTITIONS, compacted=False)]
    )
    judge = Judge()
    approved = orjson.loads(
        judge.approved("wire", {"amount_minor": 5, "idempotency_key": "m1"}, call_id=f"{run}-mcp")
    )
    approved["call_kind"] = "mcp_approval_request"
    unversioned = orjson.loads(judge.accepted("lookup", {"sku": "v2"}, call_id=f"{run}-v2"))
    unversioned["schema"]["version"] = "2"
    events = [
        orjson.dumps(approved),
        orjson.dumps(unversioned),
        judge.accepted("lookup", {"sku": "ok"}, call_id=f"{run}-ok"),
    ]
    tail = ResultTail(broker, f"results-{run}", read_committed=False)
    shop = Shop(f"ledger-{run}")
    executor = shop.executor(settings)
    task = await _running(executor)
    try:
        await tail.start(PARTITIONS)
        await _produce(broker, settings.topics.accepted, events)
        await tail.wait_for([f"{run}-v2", f"{run}-ok"], timeout_s=WAIT_S)
        await until(
            lambda: executor.stats["passed_over"] == 1,
            "the approval request passed over",
            timeout_s=WAIT_S,
        )
    finally:
        await _stopped(executor, task)
        await tail.drain(timeout_s=WAIT_S)
        await tail.stop()
    assert shop.runs["wire"] == 0
    assert f"{run}-mcp" not in tail.by_call
    refused = tail.only(f"{run}-v2")
    assert (refused["status"], refused["error"]["type"]) == ("refused", "no_contract")
    assert shop.runs["v2"] == 0
    assert tail.only(f"{run}-ok")["status"] == "succeeded"
    assert (
        executor.metrics.registry.get_sample_value(
            "callgate_executor_calls_total", {"tool": "wire", "outcome": "passed_over"}
        )
        == 1
    )
