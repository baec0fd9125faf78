"""Helpers for the integration tests: unique names, envelope builders, producing, reading outcomes,
and running `callgate run` as a real subprocess."""

from __future__ import annotations

import asyncio
import contextlib
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

from callgate_demo.demo import assign_from_start
from tests.datafiles import REPO
from worker.runtime.admin import create_topics

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
        names = sorted(set(topics))
        if not all(consumer.partitions_for_topic(topic) for topic in names):
            await consumer._client.force_metadata_update()
        await assign_from_start(consumer, names)
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
            "CALLGATE_METRICS__PORT": "0",  # health is always served: a free port each
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


class OutcomeTail:
    """Follows outcome topics from the start in the background, for tests that watch progress."""

    def __init__(self, bootstrap: str, topics: Iterable[str]) -> None:
        self._bootstrap = bootstrap
        self._topics = sorted(set(topics))
        self.outcomes = Outcomes()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> OutcomeTail:
        consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, enable_auto_commit=False)
        await consumer.start()
        await assign_from_start(consumer, self._topics)
        self._consumer = consumer
        self._task = asyncio.create_task(self._follow())
        return self

    async def _follow(self) -> None:
        assert self._consumer is not None
        while True:
            batch = await self._consumer.getmany(timeout_ms=100)
            for records in batch.values():
                for r in records:
                    self.outcomes.add(r.topic, r.key, r.value, dict(r.headers))

    @property
    def calls(self) -> int:
        return len(self.outcomes.by_call)

    async def wait_calls(self, count: int, timeout_s: float, alive: Any = None) -> bool:
        """Until `count` distinct calls have an event; False at the deadline (or if `alive()`
        turns false, e.g. the worker process died)."""
        deadline = time.monotonic() + timeout_s
        while self.calls < count:
            if time.monotonic() > deadline or (alive is not None and not alive()):
                return False
            await asyncio.sleep(0.02)
        return True

    async def settle(self, quiet_s: float = 1.0) -> None:
        """Until no new event arrived for `quiet_s`."""
        seen = -1
        while seen != len(self.outcomes.events):
            seen = len(self.outcomes.events)
            await asyncio.sleep(quiet_s)

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()


def load_of_calls(
    run: str, streams: int, calls_per_stream: int
) -> tuple[list[Record], dict[str, tuple[str, str | None]]]:
    """Many streams of several sequential calls each, all streams interleaved record by record,
    so hundreds of calls are open at any offset. Mostly valid calls; every 7th violates the
    schema; every 11th stream is cut by max_tokens in its last call."""
    per_stream: list[list[Record]] = []
    expected: dict[str, tuple[str, str | None]] = {}
    for s in range(streams):
        stream = f"{run}:s{s}"
        records: list[Record] = []
        for c in range(calls_per_stream):
            call_id = f"{run}:s{s}:c{c}"
            number = s * calls_per_stream + c
            truncated = s % 11 == 5 and c == calls_per_stream - 1
            if truncated:
                records += envelope_call(
                    stream, call_id, "get_weather", '{"city": "Ha', final=False
                )
                expected[call_id] = ("incomplete", "max_tokens")
            elif number % 7 == 3:
                records += envelope_call(stream, call_id, "get_weather", '{"city": ""}')
                expected[call_id] = ("rejected", "schema_violation")
            else:
                records += envelope_call(stream, call_id, "get_weather", f'{{"city": "c{number}"}}')
                expected[call_id] = ("accepted", None)
        records.append(end_of_stream(stream, "length" if s % 11 == 5 else "tool_calls"))
        per_stream.append(records)
    return interleave(per_stream), expected


def is_fragment_event(event: Mapping[str, Any]) -> bool:
    """An event judged from the tail of a call whose beginning lay before the committed offset:
    a replay fed without its first chunk (see `worker.runtime.delivery.ReplayGuard`)."""
    return (
        event["outcome"] == "incomplete"
        and event.get("reason") == "sequence_gap"
        and event["metrics"]["chunks"] == 0
    )


def check_outcomes(
    outcomes: Outcomes, expected: Mapping[str, tuple[str, str | None]]
) -> dict[str, int]:
    """Every expected call has at least one event, the expected one; all its events (replays and
    fragments alike) carry one event_id; nothing unexpected. Fragment events (a replay that
    re-judged only the tail of an already-judged call) are counted apart. Returns figures for
    the report."""
    missing = [call for call in expected if call not in outcomes.by_call]
    assert not missing, f"{len(missing)} calls lost, e.g. {missing[:5]}"
    unexpected = [call for call in outcomes.by_call if call not in expected]
    assert not unexpected, f"events for unknown calls, e.g. {unexpected[:5]}"
    duplicates = fragments = 0
    for call, events in outcomes.by_call.items():
        judged = [e for e in events if not is_fragment_event(e)]
        fragments += len(events) - len(judged)
        assert judged, f"{call}: only fragment events {events}"
        ids = {e["event_id"] for e in events}  # fragments included: they name the same call
        assert len(ids) == 1, f"{call}: replays carry different event_ids {events}"
        got = {(e["outcome"], e.get("error_code") or e.get("reason")) for e in judged}
        assert got == {expected[call]}, f"{call}: {got} != {expected[call]}"
        duplicates += len(judged) - 1
    return {
        "calls": len(expected),
        "events": len(outcomes.events),
        "duplicates": duplicates,
        "calls_with_duplicates": sum(1 for e in outcomes.by_call.values() if len(e) > 1),
        "fragment_events": fragments,
    }


async def produce_paced(
    bootstrap: str, topic: str, records: list[Record], *, per_second: float
) -> None:
    """Live traffic: the records at about `per_second`, in slices every 50 ms."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    try:
        per_tick = max(1, int(per_second / 20))
        start = time.monotonic()
        for tick, first in enumerate(range(0, len(records), per_tick)):
            futures = [
                await producer.send(topic, value, key=key, headers=headers or None)
                for key, value, headers in records[first : first + per_tick]
            ]
            await asyncio.gather(*futures)
            await asyncio.sleep(max(0.0, start + (tick + 1) * 0.05 - time.monotonic()))
    finally:
        await producer.stop()


async def wait_for_log(log: Path, text: str, count: int, timeout_s: float, alive: Any) -> bool:
    """Until `text` occurs `count` times in the worker's log (False at the deadline or death)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        if log.exists() and log.read_text(errors="replace").count(text) >= count:
            return True
        await asyncio.sleep(0.05)
    return False


ASSIGNED = "callgate.runner: assigned"
