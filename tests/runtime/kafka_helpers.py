"""Helpers for the integration tests: unique names, envelope builders, producing, reading outcomes,
and running `callgate run` as a real subprocess."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from worker.runtime.broker import create_topics

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = Path(__file__).resolve().parent / "schemas"

Record = tuple[bytes, bytes, list[tuple[str, bytes]]]


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def envelope_call(
    stream: str,
    call_id: str,
    tool: str,
    arguments: str,
    *,
    parts: int = 3,
    final: bool = True,
    kind: str = "tool_call",
    idempotency_key: str | None = None,
) -> list[Record]:
    """One call as canonical envelopes, its argument text cut into `parts` chunks."""
    size = max(1, -(-len(arguments) // parts))
    pieces = [arguments[i : i + size] for i in range(0, len(arguments), size)] or [""]
    records: list[Record] = []
    for seq, delta in enumerate(pieces):
        env: dict[str, Any] = {
            "stream_id": stream,
            "call_id": call_id,
            "seq": seq,
            "kind": kind,
            "delta": delta,
            "final": final and seq == len(pieces) - 1,
        }
        if seq == 0:
            env["tool"] = tool
            if idempotency_key:
                env["idempotency_key"] = idempotency_key
        records.append((stream.encode(), orjson.dumps(env), []))
    return records


def end_of_stream(stream: str, reason: str = "tool_calls") -> Record:
    return (
        stream.encode(),
        orjson.dumps({"stream_id": stream, "kind": "end", "finish_reason": reason}),
        [],
    )


def interleave(streams: Iterable[list[Record]]) -> list[Record]:
    """Round-robin across streams; each stream's own order is kept."""
    rows = itertools.zip_longest(*streams)
    return [record for row in rows for record in row if record is not None]


async def create(bootstrap: str, topics: Mapping[str, int]) -> None:
    for name, partitions in topics.items():
        await create_topics(bootstrap, [name], partitions=partitions)


async def produce(bootstrap: str, topic: str, records: list[Record]) -> list[tuple[int, int]]:
    """Send every record, wait for all acknowledgements; (partition, offset) of each."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, headers=headers or None)
            for key, value, headers in records
        ]
        metadata = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return [(m.partition, m.offset) for m in metadata]


@dataclass
class Outcomes:
    """Outcome events read back, by call id."""

    events: list[dict[str, Any]] = field(default_factory=list)
    by_call: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, topic: str, key: bytes | None, value: bytes, headers: dict[str, bytes]) -> None:
        event = orjson.loads(value)
        event["_topic"] = topic
        event["_key"] = key
        event["_headers"] = headers
        self.events.append(event)
        self.by_call.setdefault(event["call_id"], []).append(event)


async def read_outcomes(
    bootstrap: str,
    topics: Iterable[str],
    *,
    until_calls: Iterable[str],
    timeout_s: float,
    settle_s: float = 0.5,
) -> Outcomes:
    """Read the topics from the start until every call in `until_calls` has an event (or the
    deadline), then `settle_s` more so that late duplicates are seen too."""
    wanted = set(until_calls)
    outcomes = Outcomes()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = []
        for topic in sorted(set(topics)):
            found = consumer.partitions_for_topic(topic)
            if not found:
                await consumer._client.force_metadata_update()
                found = consumer.partitions_for_topic(topic) or {0}
            partitions.extend(TopicPartition(topic, p) for p in sorted(found))
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout_s
        settle_until: float | None = None
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for r in records:
                    outcomes.add(r.topic, r.key, r.value, dict(r.headers))
            if settle_until is None and wanted <= outcomes.by_call.keys():
                settle_until = time.monotonic() + settle_s
            if settle_until is not None and time.monotonic() >= settle_until:
                break
    finally:
        await consumer.stop()
    return outcomes


async def committed(
    bootstrap: str, group: str, topic: str, partitions: int
) -> dict[int, int | None]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        await consumer.stop()


def worker_env(
    bootstrap: str, group: str, input_topic: str, output_topic: str, **extra: str
) -> dict[str, str]:
    """The environment of a `callgate run` subprocess: settings only through CALLGATE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "CALLGATE_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "CALLGATE_KAFKA__GROUP_ID": group,
            "CALLGATE_KAFKA__SESSION_TIMEOUT_MS": "2000",
            "CALLGATE_KAFKA__FETCH_MAX_RECORDS": "200",
            "CALLGATE_TOPICS__INPUT": input_topic,
            "CALLGATE_TOPICS__ACCEPTED": output_topic,
            "CALLGATE_TOPICS__REJECTED": output_topic,
            "CALLGATE_TOPICS__INCOMPLETE": output_topic,
            "CALLGATE_SCHEMAS__DIR": str(SCHEMAS),
            "CALLGATE_PLUGINS": "",
            "CALLGATE_METRICS__ENABLED": "false",
            "CALLGATE_SHUTDOWN_GRACE_S": "8",
            "CALLGATE_LOG_LEVEL": "INFO",
        }
    )
    env.update({f"CALLGATE_{k}": v for k, v in extra.items()})
    return env


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fp:
        return subprocess.Popen(
            [sys.executable, "-m", "worker", "run"],
            env=env,
            cwd=REPO,
            stdout=fp,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
