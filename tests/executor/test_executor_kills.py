"""1,000 payments through an executor process killed with kill -9 ten times, on Apache Kafka
(exactly_once), with exact retries and conflicting requests among them.

The executor (`tests.support.shop_executor`) writes each payment to SQLite, unique on its
idempotency key, and is safe to retry. The calls come in ten waves of 100 new payments, each
wave (after the first) with 10 exact retries (same key and arguments, new call) and 5
conflicting requests (same key, another amount) of payments whose results are in. In each wave
the executor is killed once, after a random number of that wave's results, and started again.

Then: every payment is in the database exactly once, as its first request asked; every call
has exactly one result on the results topic (read_committed); each original's result is its
payment's; each retry's is the recorded one (`replayed`, the original's output and event);
each conflict is refused and ran nothing. Each wave also carries 5 `wire` calls whose approval's
fingerprint was forged, each record written twice (a duplicate, before or after a kill): each
gets one result, `refused` (`approval_fingerprint_mismatch`), and `wire` never runs.
"""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from callgate_demo.shop import Payments
from tests.support.apache_kafka import ApacheKafka
from tests.support.executor import CONTRACTS, Judge, ResultTail, blocked_lookup
from tests.support.outcomes import read_records
from tests.support.workers import WorkerProcess
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

WAVES = 10
PER_WAVE = 100
RETRIES_PER_WAVE = 10
CONFLICTS_PER_WAVE = 5
FORGED_PER_WAVE = 5
PARTITIONS = 3
#: bounds only a hang reaches
START_S = 120.0
APP = "-m", "tests.support.shop_executor"
WAVE_S = 240.0


def _config(bootstrap: str, run: str) -> dict[str, Any]:
    return {
        "kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": 6000},
        "topics": {"accepted": f"validated-{run}"},
        "schemas": {"dir": str(CONTRACTS)},
        "delivery": {"guarantee": "exactly_once"},
        "executor": {
            "group_id": f"shop-{run}",
            "results": f"results-{run}",
            "partitions": PARTITIONS,
        },
        "metrics": {"enabled": False},
    }


@pytest.mark.asyncio
async def test_a_thousand_payments_through_ten_kills(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    bootstrap = apache_kafka.bootstrap_servers
    run = uuid.uuid4().hex[:8]
    config = _config(bootstrap, run)
    validated = config["topics"]["accepted"]
    await Kafka(Settings.model_validate(config)).ensure_topics(
        [TopicSpec(validated, PARTITIONS, compacted=False)]
    )
    rng = random.Random(26)
    judge = Judge()
    database = tmp_path / "payments.db"
    env = {"SHOP_DB": str(database), "SHOP_LATENCY_MS": "10"}
    originals: dict[str, dict[str, Any]] = {}  # call id -> the payment it asks for
    retries: dict[str, str] = {}  # call id -> the original call id it repeats
    conflicts: dict[str, str] = {}
    forged: list[str] = []
    tail = ResultTail(bootstrap, f"results-{run}", read_committed=True)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    processes: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        process = WorkerProcess(
            f"executor-{len(processes)}",
            config,
            tmp_path,
            argv=APP,
            env=env,
        ).start()
        processes.append(process)
        return process

    started = time.monotonic()
    await producer.start()
    try:
        executor = start()
        await executor.wait_log("executor assigned", timeout_s=START_S)
        await tail.start(PARTITIONS)
        for wave in range(WAVES):
            done_before = [c for c in originals if c in tail.by_call]
            events: list[tuple[str, bytes]] = []
            for i in range(PER_WAVE):
                call_id = f"{run}-pay-{wave}-{i}"
                payment = {"key": f"{run}-key-{wave}-{i}", "amount": rng.randint(1, 10**6)}
                originals[call_id] = payment
                events.append(
                    (call_id, judge.pay(payment["key"], payment["amount"], call_id=call_id))
                )
            for i, original in enumerate(
                rng.sample(done_before, RETRIES_PER_WAVE) if done_before else []
            ):
                call_id = f"{run}-retry-{wave}-{i}"
                retries[call_id] = original
                p = originals[original]
                events.append((call_id, judge.pay(p["key"], p["amount"], call_id=call_id)))
            for i, original in enumerate(
                rng.sample(done_before, CONFLICTS_PER_WAVE) if done_before else []
            ):
                call_id = f"{run}-conflict-{wave}-{i}"
                conflicts[call_id] = original
                p = originals[original]
                events.append((call_id, judge.pay(p["key"], p["amount"] + 1, call_id=call_id)))
            for i in range(FORGED_PER_WAVE):
                call_id = f"{run}-forged-{wave}-{i}"
                forged.append(call_id)
                arguments = {"amount_minor": i + 1, "idempotency_key": f"{run}-w-{wave}-{i}"}
                value = judge.approved("wire", arguments, call_id=call_id, fingerprint="0" * 32)
                events += [(call_id, value), (call_id, value)]  # the record twice
            rng.shuffle(events)
            sends = [await producer.send(validated, value, key=c.encode()) for c, value in events]
            for send in sends:
                await send
            # kill -9 once this wave's work is under way, then start a new executor
            wave_calls = [c for c, _ in events]
            kill_after = rng.randint(5, PER_WAVE // 2)
            await tail.wait_until(
                lambda calls=wave_calls, n=kill_after: sum(c in tail.by_call for c in calls) >= n,
                f"{kill_after} results of wave {wave}",
                timeout_s=WAVE_S,
                alive=lambda: processes[-1].alive,
            )
            executor.kill()
            executor = start()
            await tail.wait_for(wave_calls, timeout_s=WAVE_S, alive=lambda: processes[-1].alive)
        elapsed = time.monotonic() - started
        assert await executor.stop(30) == 0, executor.tail()
    finally:
        await producer.stop()
        await tail.stop()
        for process in processes:
            process.cleanup()

    # -- every call: exactly one result, as the contract says ---------------------------------
    records = await read_records(bootstrap, {f"results-{run}": PARTITIONS}, read_committed=True)
    by_call: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        result = orjson.loads(record.value)
        by_call.setdefault(result["call_id"], []).append(result)
    calls = {*originals, *retries, *conflicts, *forged}
    assert by_call.keys() == calls
    several = {c: r for c, r in by_call.items() if len(r) != 1}
    assert not several, f"calls with more than one result: {list(several.items())[:3]}"

    payments = {p.idempotency_key: p for p in Payments(database).all()}
    assert len(Payments(database).all()) == len(payments) == WAVES * PER_WAVE
    attempts = []
    for call_id, asked in originals.items():
        (result,) = by_call[call_id]
        payment = payments[asked["key"]]
        assert payment.amount_minor == asked["amount"], (call_id, payment)
        assert (result["status"], result["replayed"]) == ("succeeded", False), result
        assert result["output"] == {"payment_id": payment.id, "status": "paid"}
        assert result["executed_event_id"] == result["event_id"]
        attempts.append(result["attempts"])
    for call_id, original in retries.items():
        (result,) = by_call[call_id]
        (first,) = by_call[original]
        assert result["replayed"] is True
        assert (result["status"], result["output"]) == ("succeeded", first["output"])
        assert result["executed_event_id"] == first["event_id"]
    for call_id in conflicts:
        (result,) = by_call[call_id]
        assert (result["status"], result["executed_event_id"]) == ("conflict", None), result
    for call_id in forged:
        (result,) = by_call[call_id]
        assert (result["status"], result["error"]["type"]) == (
            "refused",
            "approval_fingerprint_mismatch",
        ), result
    assert sum(p.count("wired ") for p in processes) == 0
    kills = sum(1 for p in processes if p.gone and p.returncode == -9)
    assert kills == WAVES
    runs = sum(p.count("paid ") for p in processes)
    found = sum(p.count(" existing") for p in processes)
    rerun = sum(1 for a in attempts if a > 1)
    print(
        f"\n{len(calls)} calls ({len(originals)} payments, {len(retries)} retries, "
        f"{len(conflicts)} conflicts, {len(forged)} forged approvals sent twice), "
        f"{kills} kill -9, {len(processes)} executor processes, "
        f"{runs} handler runs logged ({found} found their payment in the database already), "
        f"{rerun} payments run again after a kill, {elapsed:.1f} s"
    )


@pytest.mark.asyncio
async def test_kill_9_during_handlers(apache_kafka: ApacheKafka, tmp_path: Path) -> None:
    """kill -9 while two handlers run: the one safe to retry runs again under its key's next
    executor (attempt 2) and pays once; the other is `interrupted` and never runs again."""
    bootstrap = apache_kafka.bootstrap_servers
    run = uuid.uuid4().hex[:8]
    config = _config(bootstrap, run)
    validated = config["topics"]["accepted"]
    await Kafka(Settings.model_validate(config)).ensure_topics(
        [TopicSpec(validated, PARTITIONS, compacted=False)]
    )
    judge = Judge()
    pay = judge.pay(f"{run}-blocked", 42, call_id=f"{run}-pay", recipient="block")
    # on another partition of the requests topic than the payment: both block at once
    lookup = blocked_lookup(judge, pay, f"{run}-lookup", PARTITIONS)
    lookup_id = _call_id(lookup)
    database = tmp_path / "payments.db"
    env = {"SHOP_DB": str(database)}
    processes = [
        WorkerProcess(f"executor-{i}", config, tmp_path, argv=APP, env=env) for i in range(2)
    ]
    tail = ResultTail(bootstrap, f"results-{run}", read_committed=True)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        first = processes[0].start()
        for count, (call_id, event) in enumerate(((f"{run}-pay", pay), (lookup_id, lookup))):
            await producer.send_and_wait(validated, event, key=call_id.encode())
            await first.wait_log("blocking in", count=count + 1, timeout_s=START_S)
        first.kill()
        second = processes[1].start()
        await tail.start(PARTITIONS)
        await tail.wait_for(
            [f"{run}-pay", lookup_id], timeout_s=START_S, alive=lambda: second.alive
        )
        assert await second.stop(30) == 0, second.tail()
    finally:
        await producer.stop()
        await tail.stop()
        for process in processes:
            process.cleanup()
    paid = tail.only(f"{run}-pay")
    assert (paid["status"], paid["attempts"], paid["replayed"]) == ("succeeded", 2, False)
    (payment,) = Payments(database).all()
    assert paid["output"] == {"payment_id": payment.id, "status": "paid"}
    interrupted = tail.only(lookup_id)
    assert (interrupted["status"], interrupted["error"]["type"]) == ("interrupted", "interrupted")
    assert "blocking in" not in processes[1].text()


def _call_id(event: bytes) -> str:
    return str(orjson.loads(event)["call_id"])
