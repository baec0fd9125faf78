"""`callgate run` on the secured Apache Kafka (SASL_SSL, SCRAM-SHA-512, ACLs enforced), as the
principal `gate`, in both delivery modes: with exactly the grants `callgate topics acls` prints
(run as printed) every call gets its event; with one of them missing the worker stops at start
with one line naming the operations and the resource, and exits 1 (it never loops)."""

from __future__ import annotations

import asyncio
import shlex
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.datafiles import SCHEMAS
from tests.support.apache_kafka import ApacheKafka
from tests.support.workers import WorkerProcess
from worker.runtime.provision import acl_commands
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

PRINCIPAL = "User:gate"
CALLS = 20
WAIT_S = 120.0
#: a worker refused a grant stops within this (only a loop, or a hang, reaches it)
EXIT_S = 90.0
#: one `kafka-acls.sh` (a JVM start) on a busy machine
TOOL_S = 180.0


def worker_config(kafka: ApacheKafka, run: str, guarantee: str) -> dict[str, Any]:
    assert kafka.security is not None
    assert kafka.certificates is not None
    return {
        "kafka": {
            "bootstrap_servers": [kafka.bootstrap_servers],
            "group_id": f"g-{run}",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": kafka.security.mechanism,
            "sasl_username": "gate",
            "sasl_password": kafka.security.users["gate"],
            "ssl_cafile": str(kafka.certificates.ca),
            "session_timeout_ms": 6000,
        },
        "topics": {
            "input": f"in-{run}",
            "accepted": f"ok-{run}",
            "rejected": f"no-{run}",
            "incomplete": f"partial-{run}",
        },
        "delivery": {"guarantee": guarantee},
        "schemas": {"dir": str(SCHEMAS)},
        "plugins": [],
        "metrics": {"enabled": False, "host": "127.0.0.1", "port": 0},
        "idempotency": {"partitions": 1},
        "shutdown_grace_s": 5,
        "log_level": "INFO",
    }


async def make_topics(kafka: ApacheKafka, config: dict[str, Any]) -> None:
    """The input (2 partitions) and the outcome topics, made by the admin."""
    topics = config["topics"]
    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topics["input"], 2, 1)]
            + [NewTopic(topics[o], 1, 1) for o in ("accepted", "rejected", "incomplete")]
        )
    finally:
        await admin.close()


async def produce_calls(kafka: ApacheKafka, topic: str, run: str) -> set[str]:
    producer = AIOKafkaProducer(**kafka.client_options())
    await producer.start()
    calls = set()
    try:
        for i in range(CALLS):
            stream = f"{run}:{i}"
            calls.add(f"{stream}:c")
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
    return calls


async def events_for(
    kafka: ApacheKafka, config: dict[str, Any], calls: set[str], worker: WorkerProcess
) -> set[str]:
    """The calls with an event on the outcome topics, read by the admin until every call has
    one (bounded; a worker that exits fails it at once)."""
    topics = config["topics"]
    committed = config["delivery"]["guarantee"] == "exactly_once"
    consumer = AIOKafkaConsumer(
        **kafka.client_options(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed" if committed else "read_uncommitted",
    )
    await consumer.start()
    seen: set[str] = set()
    try:
        consumer.assign(
            [TopicPartition(topics[o], 0) for o in ("accepted", "rejected", "incomplete")]
        )
        deadline = time.monotonic() + WAIT_S
        while not calls <= seen:
            assert worker.alive, worker.tail(60)
            assert time.monotonic() < deadline, f"{len(calls - seen)} calls without an event"
            for records in (await consumer.getmany(timeout_ms=500)).values():
                seen.update(orjson.loads(r.value)["call_id"] for r in records)
    finally:
        await consumer.stop()
    return seen


def grant_commands(kafka: ApacheKafka, config: dict[str, Any]) -> list[list[str]]:
    """`callgate topics acls` for the worker's settings and principal: each command's
    arguments, as printed (comments left out)."""
    settings = Settings.model_validate(config)
    admin_config = str(kafka.client_properties())
    commands = []
    for line in acl_commands(settings, PRINCIPAL, command_config=admin_config):
        if line.startswith("#"):
            continue
        program, *args = shlex.split(line)
        assert program == "kafka-acls.sh"
        commands.append(args)
    return commands


async def acl_tool(kafka: ApacheKafka, *argument_lists: list[str]) -> None:
    """`kafka-acls.sh` with each argument list, two at a time (each is a JVM)."""
    running = asyncio.Semaphore(2)

    async def one(args: list[str]) -> None:
        async with running:
            await asyncio.to_thread(
                kafka.tool, "org.apache.kafka.tools.AclCommand", *args, timeout_s=TOOL_S
            )

    await asyncio.gather(*(one(args) for args in argument_lists))


def removal(add: list[str]) -> list[str]:
    return [("--remove" if word == "--add" else word) for word in add] + ["--force"]


def resource_of(args: list[str]) -> tuple[str, str]:
    for kind in ("topic", "group", "transactional-id"):
        if f"--{kind}" in args:
            return kind, args[args.index(f"--{kind}") + 1]
    raise AssertionError(args)


def operations_of(args: list[str]) -> list[str]:
    return [args[i + 1] for i, word in enumerate(args) if word == "--operation"]


#: per delivery mode, the grants withheld one at a time (by resource kind and name role)
WITHHELD = {
    "at_least_once": ["in-", "g-{run}-in-{run}-changelog", "ok-", "group"],
    "exactly_once": ["transactional-id", "g-{run}-idempotency-keys"],
}


def picks(commands: list[list[str]], run: str, guarantee: str) -> list[list[str]]:
    chosen = []
    for wanted in WITHHELD[guarantee]:
        name = wanted.format(run=run)
        for args in commands:
            kind, resource = resource_of(args)
            if name in (kind, resource) or (name.endswith("-") and resource == name + run):
                chosen.append(args)
                break
        else:
            raise AssertionError(f"no grant {name} in {commands}")
    return chosen


@pytest.mark.timeout(900)
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_the_printed_grants_are_exactly_what_the_worker_needs(
    secure_kafka: ApacheKafka, tmp_path: Path, guarantee: str
) -> None:
    run = f"{guarantee[:3]}{uuid.uuid4().hex[:6]}"
    config = worker_config(secure_kafka, run, guarantee)
    await make_topics(secure_kafka, config)
    commands = grant_commands(secure_kafka, config)
    withheld = picks(commands, run, guarantee)
    # every grant but the first withheld one
    await acl_tool(secure_kafka, *(args for args in commands if args is not withheld[0]))
    refusals = []
    for index, missing in enumerate(withheld):
        if index:  # the one withheld before is granted, this one taken away
            await acl_tool(secure_kafka, withheld[index - 1], removal(missing))
        worker = WorkerProcess(f"without-{index}", config, tmp_path).start()
        try:
            status = await worker.wait_exit(EXIT_S)
            assert status == 1, f"{status}: {worker.tail(60)}"
        finally:
            worker.cleanup()
        kind, resource = resource_of(missing)
        text = worker.text()
        assert "Traceback" not in text, worker.tail(80)
        refused = [line for line in text.splitlines() if "not authorized" in line]
        assert len(refused) == 1, worker.tail(80)
        (line,) = refused
        needed = f"needs {', '.join(operations_of(missing))} on {kind} "
        assert needed in line, line
        assert resource in line, line
        refusals.append(line.split(" ERROR ", 1)[-1])
    await acl_tool(secure_kafka, withheld[-1])
    # with exactly the printed grants: every call gets its event
    calls = await produce_calls(secure_kafka, config["topics"]["input"], run)
    worker = WorkerProcess("granted", config, tmp_path).start()
    try:
        seen = await events_for(secure_kafka, config, calls, worker)
        assert await worker.stop(20) == 0, worker.tail(60)
    finally:
        worker.cleanup()
    assert calls <= seen
    text = worker.text()
    assert "Traceback" not in text
    assert " ERROR " not in text, worker.tail(60)
    print(
        f"\n[{guarantee} on SASL_SSL + ACLs] {len(calls)} calls judged; refused:",
        *refusals,
        sep="\n  ",
    )
