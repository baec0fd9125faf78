"""Approval end to end, on the embedded broker (tansu) and on Apache Kafka: a worker in this
process holds a refund (its contract requires approval) on the pending-approval topic, and
`callgate approve|deny` run as a user runs them (a child process, its settings from a file).

- an approval with a tampered fingerprint is refused (a refusal record says why) and the call
  stays pending; the real approval then releases it to the validated topic, once; a second
  approval is refused;
- a worker stopped between the pending call and its approval: the next one restores it from the
  changelog and releases it once (at_least_once on both brokers, exactly_once on Apache Kafka);
- a denial and an expiry end their calls in a final rejection.

Every event read is held to the published schema (`tests.support.outcomes.as_seen`).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.datafiles import REPO, SCHEMAS
from tests.support import published
from tests.support.apache_kafka import ApacheKafka
from tests.support.outcomes import read_records
from worker.compose import build_key_store, build_processor, build_registry, tool_labels
from worker.core.approval import fingerprint
from worker.metrics import Metrics
from worker.model import SchemaRef
from worker.runtime.worker import Worker
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(900)]

#: only a hang reaches it, however busy the machine is
HANG_S = 180.0
PARTITIONS = 2
REFUND = SchemaRef("payments.refund_payment", "1")


class Run:
    """One test's topics and group on a broker, and a settings file for the CLI."""

    def __init__(self, bootstrap: str, directory: Path) -> None:
        self.bootstrap = bootstrap
        tag = uuid.uuid4().hex[:8]
        self.group = f"g-{tag}"
        self.input = f"in-{tag}"
        self.outputs = {name: f"{name}-{tag}" for name in ("ok", "no", "partial")}
        self.pending = f"pending-{tag}"
        self.file = directory / f"settings-{tag}.json"

    def settings(self, **overrides: Any) -> Settings:
        base: dict[str, Any] = {
            "kafka": {
                "bootstrap_servers": [self.bootstrap],
                "group_id": self.group,
                "session_timeout_ms": 6000,
                "commit_interval_ms": 0,
            },
            "topics": {
                "input": self.input,
                "accepted": self.outputs["ok"],
                "rejected": self.outputs["no"],
                "incomplete": self.outputs["partial"],
                "pending_approval": self.pending,
            },
            "schemas": {"dir": str(SCHEMAS)},
            "idempotency": {"partitions": PARTITIONS},
            "approval": {"partitions": PARTITIONS},
            "shutdown_grace_s": 10.0,
        }
        for key, value in overrides.items():
            base[key] = {**base.get(key, {}), **value}
        self.file.write_bytes(orjson.dumps(base))
        return Settings.model_validate(base)

    async def create(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [
                    NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)
                    for name in (self.input, *self.outputs.values())
                ]
            )
        finally:
            await admin.close()

    async def produce(self, records: list[tuple[bytes, bytes]], topic: str | None = None) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            for key, value in records:
                await producer.send_and_wait(topic or self.input, value, key=key)
        finally:
            await producer.stop()

    async def read(self, topic: str, *, read_committed: bool = False) -> list[Any]:
        return await read_records(
            self.bootstrap, {topic: PARTITIONS}, read_committed=read_committed
        )

    async def events(self, name: str, *, read_committed: bool = False) -> list[dict[str, Any]]:
        records = await self.read(self.outputs[name], read_committed=read_committed)
        return [published.check_event(r.value) for r in records]

    async def cli(self, *args: str) -> tuple[int, str, str]:
        """`callgate ARGS --settings FILE`, as a user runs it."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "worker",
            *args,
            "--settings",
            str(self.file),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), HANG_S)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()


@pytest_asyncio.fixture
async def run(broker: str, tmp_path: Path) -> AsyncIterator[Run]:
    run = Run(broker, tmp_path)
    await run.create()
    yield run


def refund(key: str, amount: int = 1250) -> dict[str, Any]:
    return {
        "payment_id": f"pay_{key}",
        "amount_minor": amount,
        "currency": "EUR",
        "reason": "duplicate charge",
        "idempotency_key": key,
    }


def refund_record(call: str, key: str, **fields: Any) -> tuple[bytes, bytes]:
    body = {
        "stream_id": f"s-{call}",
        "call_id": call,
        "kind": "tool_call",
        "tool": "refund_payment",
        "tool_version": "1",
        "delta": orjson.dumps(refund(key)).decode(),
        "final": True,
        "principal": "support-bot",
        **fields,
    }
    return f"s-{call}".encode(), orjson.dumps(body)


def worker_for(settings: Settings) -> Worker:
    registry = build_registry(settings)
    return Worker(
        settings,
        build_processor(settings, registry),
        lambda: build_key_store(settings),
        Metrics(tool_labels(registry)),
    )


async def until(worker: Worker, done: Any, what: str) -> None:
    """Steps of a worker not running on its own, until `done()`."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await done():
        assert loop.time() - started < HANG_S, f"no {what} within {HANG_S:.0f} s: {worker.stats}"
        await worker.step()


async def wait(done: Any, what: str) -> None:
    """Until `done()`, with a worker running on its own."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await done():
        assert loop.time() - started < HANG_S, f"no {what} within {HANG_S:.0f} s"
        await asyncio.sleep(0.2)


async def held(worker: Worker, count: int) -> None:
    async def done() -> bool:
        return len(worker.approvals) == count and worker.idle()

    await until(worker, done, f"{count} calls held")


async def pending_events(run: Run, *, read_committed: bool = False) -> dict[str, dict[str, Any]]:
    """The pending events on the pending-approval topic, by call id."""
    found = {}
    for record in await run.read(run.pending, read_committed=read_committed):
        if dict(record.headers or ()).get("outcome") == b"pending_approval":
            event = published.check_event(record.value)
            found[event["call_id"]] = event
    return found


async def stop(worker: Worker, running: asyncio.Task[None]) -> None:
    worker.request_stop()
    try:
        await asyncio.wait_for(running, HANG_S)
    finally:
        await worker.close()


async def test_a_tampered_approval_is_refused_and_the_real_one_releases_the_call_once(
    run: Run,
) -> None:
    settings = run.settings()
    await run.produce([refund_record("r1", "refund-1")])
    worker = worker_for(settings)
    await worker.start()
    running: asyncio.Task[None] | None = None
    try:
        await held(worker, 1)
        pending = (await pending_events(run))["r1"]
        event_id = pending["event_id"]
        assert pending["approval"]["fingerprint"] == fingerprint(REFUND, refund("refund-1"))
        assert pending["principal"] == "support-bot"
        assert await run.events("ok") == []  # never executable while it waits
        running = asyncio.create_task(worker.run())
        # a decision naming other arguments (a larger amount) is refused
        tampered = {
            "event_id": event_id,
            "fingerprint": fingerprint(REFUND, refund("refund-1", amount=999_999)),
            "decision": "approve",
            "by": "mallory",
            "reason": None,
        }
        await run.produce([(event_id.encode(), orjson.dumps(tampered))], topic=run.pending)

        async def refused() -> bool:
            records = await run.read(run.pending)
            return any(b'"refused"' in (r.value or b"") for r in records)

        await wait(refused, "refusal of the tampered approval")
        refusals = [
            orjson.loads(r.value)
            for r in await run.read(run.pending)
            if b'"refused"' in (r.value or b"")
        ]
        assert [(r["by"], r["refused"]["code"]) for r in refusals] == [
            ("mallory", "fingerprint_mismatch")
        ]
        assert await run.events("ok") == []
        assert len(worker.approvals) == 1
        # the operator approves, as a user would: the arguments shown, the record written
        status, out, err = await run.cli("approve", event_id, "--by", "ana")
        assert status == 0, err
        assert '"amount_minor": 1250' in out
        assert f"fingerprint  {pending['approval']['fingerprint']}" in out
        assert "principal    support-bot" in out

        async def released() -> bool:
            return len(await run.events("ok")) >= 1 and worker.idle()

        await wait(released, "the approved call on the validated topic")
        # a second approval is refused, and the call stays released once
        status, out, err = await run.cli("approve", event_id, "--by", "ana")
        assert status == 0, err
        assert "earlier      approve by ana" in out

        async def refused_again() -> bool:
            records = await run.read(run.pending)
            return sum(b'"already_decided"' in (r.value or b"") for r in records) == 1

        await wait(refused_again, "refusal of the second approval")
    finally:
        if running is not None:
            await stop(worker, running)
        else:
            await worker.close()
    accepted = await run.events("ok")
    assert len(accepted) == 1
    (event,) = accepted
    assert (event["call_id"], event["event_id"], event["arguments"]) == (
        "r1",
        event_id,
        refund("refund-1"),
    )
    assert event["approval"]["decided_by"] == "ana"
    assert event["approval"]["fingerprint"] == pending["approval"]["fingerprint"]
    assert await run.events("no") == []


async def test_a_call_held_across_a_restart_is_released_once(run: Run) -> None:
    await across_a_restart(run, "at_least_once")


async def test_a_call_held_across_a_restart_is_released_once_exactly_once(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """exactly_once needs transactions: Apache Kafka only (the embedded broker has none)."""
    run = Run(apache_kafka.bootstrap_servers, tmp_path)
    await run.create()
    await across_a_restart(run, "exactly_once")


async def across_a_restart(run: Run, guarantee: str) -> None:
    settings = run.settings(delivery={"guarantee": guarantee})
    committed = guarantee == "exactly_once"
    await run.produce([refund_record("r1", "refund-1"), refund_record("r2", "refund-2")])
    first = worker_for(settings)
    await first.start()
    try:
        await held(first, 2)
    finally:
        await first.close()
    pending = await pending_events(run, read_committed=committed)
    assert set(pending) == {"r1", "r2"}
    # decided while no worker runs: the next one restores both calls from the changelog
    for call in ("r1", "r2"):
        status, _, err = await run.cli("approve", pending[call]["event_id"], "--by", "ana")
        assert status == 0, err
    second = worker_for(settings)
    await second.start()
    try:

        async def released() -> bool:
            if not second.idle():
                return False
            return len(await run.events("ok", read_committed=committed)) >= 2

        await until(second, released, "both calls released")
        for _ in range(3):  # a few more rounds: nothing more is released
            await second.step()
    finally:
        await second.close()
    accepted = await run.events("ok", read_committed=committed)
    assert sorted(e["call_id"] for e in accepted) == ["r1", "r2"]
    assert all(e["approval"]["decided_by"] == "ana" for e in accepted)


async def test_a_denied_call_and_an_expired_one_end_in_a_final_rejection(run: Run) -> None:
    settings = run.settings(approval={"expiry_s": 20.0})
    await run.produce([refund_record("deny-me", "refund-1")])
    worker = worker_for(settings)
    await worker.start()
    running: asyncio.Task[None] | None = None
    try:
        await held(worker, 1)
        denied_id = (await pending_events(run))["deny-me"]["event_id"]
        running = asyncio.create_task(worker.run())
        status, out, err = await run.cli("deny", denied_id, "--by", "ana", "--reason", "fraud")
        assert status == 0, err
        assert out.startswith(f"event        {denied_id}")
        # the other waits past its expiry: the worker's clock asks, the record time decides
        await run.produce([refund_record("wait-me", "refund-2")])

        async def both_ended() -> bool:
            return len(await run.events("no")) >= 2 and worker.idle()

        await wait(both_ended, "the denial and the expiry")
    finally:
        if running is not None:
            await stop(worker, running)
        else:
            await worker.close()
    ended = {e["call_id"]: e for e in await run.events("no")}
    assert {c: (e["phase"], e["error_code"], e["retryable"]) for c, e in ended.items()} == {
        "deny-me": ("approval", "approval_denied", False),
        "wait-me": ("approval", "approval_expired", False),
    }
    assert all("arguments" not in e for e in ended.values())
    assert b"fraud" not in orjson.dumps(list(ended.values()))
    assert await run.events("ok") == []
    decisions = [orjson.loads(r.value) for r in await run.read(run.pending)]
    expires = [d for d in decisions if d.get("decision") == "expire" and "refused" not in d]
    assert [d["by"] for d in expires] == ["callgate"]


async def test_the_cli_refuses_a_call_that_is_not_pending(run: Run) -> None:
    settings = run.settings()
    worker = worker_for(settings)
    await worker.start()  # makes the pending-approval topic
    await worker.close()
    status, _, err = await run.cli("approve", "0" * 32)
    assert status == 1
    assert "no call pending approval" in err
    status, _, err = await run.cli("approve", "not-an-id")
    assert status == 2
    assert "32 lowercase hex digits" in err
