"""The worker in this process against real brokers: the embedded one (tansu) and Apache Kafka.

The same scenarios run on both where the broker can: every call judged once, a worker stopped
with calls open and another one resuming them from the changelog, and (Apache Kafka only, the
embedded broker has no transactions) exactly-once rounds read with `read_committed`. Apache
Kafka only as well: an outcome topic deleted while the worker writes to it, and created again
(tansu acknowledges writes to a deleted topic, so its writes never fail there).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic, RecordsToDelete
from aiokafka.errors import KafkaError

from tests.datafiles import SCHEMAS
from tests.support.apache_kafka import ApacheKafka
from tests.support.outcomes import Seen, read_all, read_records, reference, without_timings
from tests.support.traffic import IDLE_TIMEOUT_S, Feeder, mixed, step_for
from tests.support.workers import until
from worker.compose import build_key_store, build_processor, build_registry, tool_labels
from worker.errors import StateError
from worker.metrics import Metrics
from worker.runtime.fetcher import Fetcher
from worker.runtime.kafka import Kafka
from worker.runtime.outbox import FENCED, Record
from worker.runtime.provision import Subscription
from worker.runtime.topics import changelog_topic
from worker.runtime.transactions import Transactions
from worker.runtime.worker import Worker
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(600)]

#: How long a wait for an event of the worker (or the broker) may take: only a hang reaches it,
#: however busy the machine is (the failure says what was waited for, and how long)
HANG_S = 120.0

PARTITIONS = 3


class Run:
    """One test's topics and group on a broker."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        tag = uuid.uuid4().hex[:8]
        self.group = f"g-{tag}"
        self.input = f"in-{tag}"
        self.outputs = {name: f"{name}-{tag}" for name in ("ok", "no", "partial")}

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
            },
            "schemas": {"dir": SCHEMAS},
            "idempotency": {"partitions": 2},
            "shutdown_grace_s": 10.0,
        }
        for key, value in overrides.items():
            base[key] = {**base.get(key, {}), **value}
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

    async def produce(
        self, records: list[tuple[bytes, bytes]], timestamp_ms: int, topic: str | None = None
    ) -> None:
        """To the input topic, or `topic`."""
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            futures = [
                await producer.send(topic or self.input, value, key=key, timestamp_ms=timestamp_ms)
                for key, value in records
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    async def input_offsets(self) -> dict[int, tuple[int, int]]:
        """Per input partition: the group's committed offset (0 for none) and the log's end."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            tps = [TopicPartition(self.input, p) for p in range(PARTITIONS)]
            ends = await consumer.end_offsets(tps)
            return {tp.partition: (await consumer.committed(tp) or 0, ends[tp]) for tp in tps}
        finally:
            await consumer.stop()

    async def input_committed(self) -> bool:
        """Whether the group committed every input partition to its end."""
        offsets = await self.input_offsets()
        return all(committed >= end for committed, end in offsets.values())

    async def events(self, *, read_committed: bool = False) -> list[dict[str, Any]]:
        """Every event on the outcome topics now (their topics are new: offsets from 0)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed" if read_committed else "read_uncommitted",
        )
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t in self.outputs.values() for p in range(PARTITIONS)]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            events: list[dict[str, Any]] = []
            deadline = asyncio.get_running_loop().time() + HANG_S
            # transaction markers take offsets too: read until every position reaches its end
            todo = [tp for tp in tps if ends[tp] > 0]
            while todo:
                assert asyncio.get_running_loop().time() < deadline, "outcomes not readable"
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    events.extend(orjson.loads(r.value) for r in records)
                todo = [tp for tp in todo if await consumer.position(tp) < ends[tp]]
            return events
        finally:
            await consumer.stop()


def worker_for(settings: Settings) -> Worker:
    registry = build_registry(settings)
    return Worker(
        settings,
        build_processor(settings, registry),
        lambda: build_key_store(settings),
        Metrics(tool_labels(registry)),
    )


@pytest_asyncio.fixture
async def run(broker: str) -> AsyncIterator[Run]:
    run = Run(broker)
    await run.create()
    yield run


def call_records(count: int, *, first_half_only: bool = False) -> list[tuple[bytes, bytes]]:
    records = []
    for i in range(count):
        text = orjson.dumps({"city": f"city{i}", "units": "celsius"}).decode()
        stream = f"s{i}"
        records.append(
            (
                stream.encode(),
                orjson.dumps(
                    {
                        "stream_id": stream,
                        "call_id": f"c{i}",
                        "seq": 0,
                        "kind": "tool_call",
                        "tool": "get_weather",
                        "tool_version": "1",
                        "delta": text[:6],
                    }
                ),
            )
        )
        if not first_half_only:
            records.append(second_half(i, text))
    return records


def second_half(i: int, text: str | None = None) -> tuple[bytes, bytes]:
    text = text or orjson.dumps({"city": f"city{i}", "units": "celsius"}).decode()
    body = {"stream_id": f"s{i}", "call_id": f"c{i}", "seq": 1, "kind": "tool_call"}
    return f"s{i}".encode(), orjson.dumps(body | {"delta": text[6:], "final": True})


def judged(worker: Worker, events: int) -> Callable[[], Awaitable[bool]]:
    """Whether the worker wrote `events` events and has nothing in flight."""

    async def done() -> bool:
        return worker.stats.events >= events and worker.idle()

    return done


async def run_until(worker: Worker, done: Any, *, timeout_s: float = HANG_S) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await done():
        if loop.time() - started > timeout_s:
            raise AssertionError(
                f"the worker did not get there within {timeout_s:.0f} s: {worker.readiness()}, "
                f"{worker.stats}"
            )
        await worker.step()


async def stop(worker: Worker, running: asyncio.Task[None]) -> None:
    """Stop a worker whose `run()` is the task `running`, and close it (bounded)."""
    worker.request_stop()
    try:
        await asyncio.wait_for(running, HANG_S)
    finally:
        await worker.close()


def by_call(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        grouped.setdefault(event["call_id"], []).append(event)
    return grouped


def same_but_timings(a: dict[str, Any], b: dict[str, Any]) -> bool:
    strip = lambda e: e | {"metrics": {k: v for k, v in e["metrics"].items() if k != "phases_us"}}  # noqa: E731
    return bool(strip(a) == strip(b))


async def test_every_call_is_judged_once_and_checkpointed(run: Run) -> None:
    await run.produce(call_records(30), timestamp_ms=1_000)
    worker = worker_for(run.settings())
    await worker.start()
    try:
        await run_until(worker, judged(worker, 30))
    finally:
        await worker.close()
    grouped = by_call(await run.events())
    assert set(grouped) == {f"c{i}" for i in range(30)}
    assert all(len(seen) == 1 and seen[0]["outcome"] == "accepted" for seen in grouped.values())
    assert worker.stats.checkpoints > 0
    assert worker.stats.commits > 0


def doomed(seq: int, delta: str, *, final: bool = False) -> tuple[bytes, bytes]:
    """A chunk of a get_weather v2 call whose units become `kelvin` (its enum refuses it)."""
    body: dict[str, Any] = {"stream_id": "doomed", "call_id": "c0", "seq": seq}
    if seq == 0:
        body |= {"tool": "get_weather", "tool_version": "2"}
    return b"doomed", orjson.dumps(body | {"kind": "tool_call", "delta": delta, "final": final})


async def test_a_doomed_call_is_rejected_before_its_stream_ends_and_only_once(run: Run) -> None:
    """The stream's first two chunks alone get the call its event; its tail, produced after
    the worker stopped, is dropped by the worker that resumes from the checkpoint."""
    await run.produce([doomed(0, '{"city":"Oslo",'), doomed(1, '"units":"kel')], timestamp_ms=1_000)
    worker = worker_for(run.settings())
    await worker.start()
    try:
        await run_until(worker, judged(worker, 1))
    finally:
        await worker.close()
    (event,) = await run.events()
    assert (event["outcome"], event["early"], event["early_offset"]) == ("rejected", True, 1)
    assert [(v["path"], v["keyword"]) for v in event["violations"]] == [("/units", "enum")]
    await run.produce([doomed(2, 'vin"'), doomed(3, "}", final=True)], timestamp_ms=1_001)
    successor = worker_for(run.settings())
    await successor.start()

    async def tail_read() -> bool:
        return successor.idle() and await run.input_committed()

    try:
        await run_until(successor, tail_read)
    finally:
        await successor.close()
    assert await run.events() == [event]
    assert successor.processor.assembler.early_dropped_chunks == 2


@pytest.mark.parametrize("given_as", ["a name", "two names", "a pattern"])
async def test_a_stopped_worker_s_open_calls_are_finished_by_the_next(
    run: Run, given_as: str
) -> None:
    """Its checkpoints carry its open calls to the next worker, each input topic's in its own
    changelog. An input given as a pattern: the topics it matches are known only once the group
    assigns them, so their changelogs are made then (none exists at start)."""
    other = f"{run.input}-2"
    inputs = [run.input, other] if given_as == "two names" else [run.input]
    given = {
        "a name": run.input,
        "two names": ",".join(inputs),
        "a pattern": f"^{re.escape(run.input)}$",
    }[given_as]
    settings = run.settings(topics={"input": given})
    if given_as == "two names":
        await admin_call(run.bootstrap, create=other)
    # calls 0-5 in the first input, 6-11 in the last
    first_halves = call_records(12, first_half_only=True)
    await run.produce(first_halves[:6], timestamp_ms=1_000, topic=inputs[0])
    await run.produce(first_halves[6:], timestamp_ms=1_000, topic=inputs[-1])
    first = worker_for(settings)
    await first.start()
    try:

        async def all_open() -> bool:
            return first.processor.assembler.open_calls == 12 and first.idle()

        await run_until(first, all_open)
    finally:
        await first.close()
    assert first.stats.checkpoints > 0
    changelogs = [changelog_topic(run.group, topic) for topic in inputs]
    counts = await Kafka(settings).partition_counts(changelogs)
    assert counts == dict.fromkeys(changelogs, PARTITIONS)
    await run.produce([second_half(i) for i in range(6)], timestamp_ms=2_000, topic=inputs[0])
    await run.produce([second_half(i) for i in range(6, 12)], timestamp_ms=2_000, topic=inputs[-1])
    second = worker_for(settings)
    await second.start()
    try:
        await run_until(second, judged(second, 12))
    finally:
        await second.close()
    grouped = by_call(await run.events())
    assert set(grouped) == {f"c{i}" for i in range(12)}
    for seen in grouped.values():
        # judged whole, from the restored first chunk
        assert [(e["outcome"], e["metrics"]["chunks"]) for e in seen] == [("accepted", 2)], seen


async def test_a_pattern_that_matches_the_outcome_and_internal_topics_reads_only_inputs(
    run: Run,
) -> None:
    """The outcome topics and the group's own topics are never input, whatever the pattern
    matches: read back, each event would be judged again and make another, for ever."""
    everything = "|".join(re.escape(t) for t in (run.input, *run.outputs.values()))
    pattern = f"^(?:{everything})$|^{re.escape(run.group)}-.*$"
    settings = run.settings(topics={"input": pattern})
    await run.produce(call_records(6), timestamp_ms=1_000)
    worker = worker_for(settings)
    await worker.start()
    try:
        await run_until(worker, judged(worker, 6))
        deadline = asyncio.get_running_loop().time() + 3
        while asyncio.get_running_loop().time() < deadline:  # what an echo would take
            await worker.step()
        assigned = {topic for topic, _ in worker.assignment}
    finally:
        await worker.close()
    # and the topics whose partitions the group owns: the requests, the pending approvals
    owned = {f"{run.group}-idempotency-requests", settings.topics.pending_approval}
    assert assigned == {run.input, *owned}
    assert (worker.stats.records, worker.stats.events) == (12, 6)
    grouped = by_call(await run.events())
    assert sorted(grouped) == sorted(f"c{i}" for i in range(6))
    assert all(len(seen) == 1 for seen in grouped.values())


async def test_inputs_found_and_grown_while_the_worker_runs_are_checkpointed_and_resumed(
    apache_kafka: ApacheKafka,
) -> None:
    """A topic the input pattern matches created after the worker started, and a partition
    added to an input: each is consumed once the worker's metadata shows it, its changelog is
    made (or given the partition) then, and its open calls survive a restart."""
    run = Run(apache_kafka.bootstrap_servers)
    await run.create()
    late = f"{run.input}-late"
    settings = run.settings(
        topics={"input": f"^{re.escape(run.input)}(-late)?$"},
        kafka={"metadata_max_age_ms": 1000},
    )
    # (topic, partition) -> the calls whose first halves go there, each by its own stream
    places = {(run.input, p): range(p * 4, p * 4 + 4) for p in range(PARTITIONS)}
    places[(run.input, PARTITIONS)] = range(100, 104)  # the partition added
    places[(late, 0)] = range(200, 204)
    places[(late, 1)] = range(204, 208)
    calls = [i for numbers in places.values() for i in numbers]

    async def produce(halves: dict[tuple[str, int], list[tuple[bytes, bytes]]]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=run.bootstrap, acks="all")
        await producer.start()
        try:
            for (topic, partition), records in halves.items():

                async def known(topic: str = topic, partition: int = partition) -> bool:
                    # a partition just added shows once the producer reads the cluster again
                    await producer.client.force_metadata_update()
                    return partition in await producer.partitions_for(topic)

                await until(known, f"{topic}[{partition}] in the metadata", timeout_s=HANG_S)
                for key, value in records:
                    await producer.send_and_wait(topic, value, key=key, partition=partition)
        finally:
            await producer.stop()

    def first_halves(numbers: range) -> list[tuple[bytes, bytes]]:
        records = call_records(max(numbers) + 1, first_half_only=True)
        return [records[i] for i in numbers]

    first = worker_for(settings)
    await first.start()
    try:
        await produce({(run.input, p): first_halves(places[(run.input, p)]) for p in range(3)})

        def open_calls(count: int) -> Any:
            async def ready() -> bool:
                return first.processor.assembler.open_calls == count and first.idle()

            return ready

        await run_until(first, open_calls(12))
        admin = AIOKafkaAdminClient(bootstrap_servers=run.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(late, num_partitions=2, replication_factor=1)])
            await admin.create_partitions({run.input: NewPartitions(PARTITIONS + 1)})
        finally:
            await admin.close()
        await produce(
            {
                where: first_halves(numbers)
                for where, numbers in places.items()
                if where[0] == late or where[1] == PARTITIONS
            }
        )
        await run_until(first, open_calls(len(calls)))
    finally:
        await first.close()
    changelog = changelog_topic(run.group, run.input)
    counts = await Kafka(settings).partition_counts([changelog, changelog_topic(run.group, late)])
    assert counts == {changelog: PARTITIONS + 1, changelog_topic(run.group, late): 2}
    await produce({where: [second_half(i) for i in numbers] for where, numbers in places.items()})
    second = worker_for(settings)
    await second.start()
    try:
        await run_until(second, judged(second, len(calls)))
    finally:
        await second.close()
    grouped = by_call(await run.events())
    assert set(grouped) == {f"c{i}" for i in calls}
    for seen in grouped.values():
        assert [(e["outcome"], e["metrics"]["chunks"]) for e in seen] == [("accepted", 2)], seen


async def test_exactly_once_rounds_are_read_once_with_read_committed(
    apache_kafka: ApacheKafka,
) -> None:
    run = Run(apache_kafka.bootstrap_servers)
    await run.create()
    await run.produce(call_records(20), timestamp_ms=1_000)
    worker = worker_for(
        run.settings(delivery={"guarantee": "exactly_once", "transactional_id_prefix": run.group})
    )
    await worker.start()
    try:

        async def all_committed() -> bool:
            return await run.input_committed()

        await run_until(worker, all_committed)
    finally:
        await worker.close()
    grouped = by_call(await run.events(read_committed=True))
    assert set(grouped) == {f"c{i}" for i in range(20)}
    assert all(len(seen) == 1 for seen in grouped.values())


#: the seed of the generated traffic (printed; TEST_SEED sets another)
SEED = int(os.environ.get("TEST_SEED", "20250611"))
#: what the worker logs for each input partition it restores from its checkpoint
RESTORED = re.compile(
    r"(?P<topic>.+)\[(?P<partition>\d+)\]: restored from \d+ checkpoint frames; "
    r"fetching from (?P<offset>\d+)"
)


def closing_offsets(
    settings: Settings, records: list[Any]
) -> tuple[dict[str, tuple[int, int]], int]:
    """Per call, the input partition and offset of the record that closes it (its last chunk,
    or the record whose time ends its idle timeout), judged one record at a time as any batching
    judges it; and how many calls are still open after the last record."""
    processor = build_processor(settings, build_registry(settings))
    closing: dict[str, tuple[int, int]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        for emission in processor.feed(record.topic, record.partition, [record]):
            closing[emission.call.call_id] = (record.partition, record.offset)
    return closing, processor.assembler.open_calls


def resume_points(records: list[logging.LogRecord], topic: str) -> dict[int, int]:
    """Per partition of `topic`, the offset the worker last resumed it from, as it logged it."""
    points: dict[int, int] = {}
    for record in records:
        found = RESTORED.fullmatch(record.getMessage())
        if record.name == "callgate.worker" and found and found["topic"] == topic:
            points[int(found["partition"])] = int(found["offset"])
    return points


async def admin_call(
    bootstrap: str, *, delete: str | None = None, create: str | None = None
) -> None:
    """Delete one topic (until the broker no longer lists it), or create one (PARTITIONS
    partitions); a topic error fails the test."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if delete is not None:
            deleted = await admin.delete_topics([delete])
            assert [code for _, code, *_ in deleted.topic_error_codes] == [0], deleted

            async def gone() -> bool:
                return delete not in await admin.list_topics()

            await until(gone, f"{delete} deleted", timeout_s=HANG_S)
        if create is not None:
            created = await admin.create_topics(
                [NewTopic(create, num_partitions=PARTITIONS, replication_factor=1)]
            )
            assert [code for _, code, *_ in created.topic_errors] == [0], created
    finally:
        await admin.close()


async def test_an_outcome_topic_deleted_while_its_writes_fail_is_judged_again_once_back(
    apache_kafka: ApacheKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """The accepted topic is deleted while live traffic is judged into it: Apache Kafka refuses
    the writes, the worker's topic check sees the topic gone and rewinds every partition to its
    last checkpoint (dropping the events that wait), and fetching waits. Once the topic is
    created again the worker judges the calls since the checkpoints again and commits resume
    (when the ledger counted a round's records in one sum, the round kept waiting for the events
    the rewind dropped: the worker never checkpointed or committed again).

    What each call comes to is exact, by where its closing record lies in its input partition:
    - before the checkpoint the worker resumed from: its event was acknowledged, and the topic
      seen to exist, before the checkpoint moved past it; an accepted event went with the
      deleted topic (no event), any other is there once;
    - from there to the records sent after the topic was back: judged (again) once it was
      back, so it has its event, on the right topic (the recreated one for an accepted call),
      and every copy equals the reference's (a copy written before the rewind, or one the
      producer still held, repeats it identically: at least once, never a different verdict);
    - sent after the topic was back: exactly one event, the reference's.
    And nothing is left over: the ledger idle, no lag, as many calls open as the reference has.
    (tansu acknowledges writes to a deleted topic: the writes never fail there, so this runs on
    Apache Kafka only.)"""
    caplog.set_level(logging.INFO, logger="callgate.worker")
    run = Run(apache_kafka.bootstrap_servers)
    await run.create()
    accepted = run.outputs["ok"]
    topic_of = {
        "accepted": accepted,
        "rejected": run.outputs["no"],
        "incomplete": run.outputs["partial"],
    }
    settings = run.settings(
        kafka={
            # a write to a deleted topic fails once the producer's retries time out
            "request_timeout_ms": 3000,
            "topic_check_interval_ms": 50,
            "fetch_max_records": 100,
        },
        assembly={"idle_timeout_s": IDLE_TIMEOUT_S},
    )
    print(f"seed={SEED}")
    traffic = mixed(run.input, 1500, seed=SEED)
    feeder = Feeder(
        run.bootstrap,
        run.input,
        PARTITIONS,
        traffic.messages,
        per_second=2000,
        step_ms=step_for(traffic.messages),
    )
    before, during = feeder.total // 4, feeder.total * 3 // 4
    feeder.limit(before)
    worker = worker_for(settings)
    metrics = worker.metrics.registry
    await worker.start()
    running = asyncio.create_task(worker.run())
    feeding = asyncio.create_task(feeder.run())

    def alive() -> bool:
        return not running.done() and not (feeding.done() and feeding.exception() is not None)

    def state() -> str:
        return (
            f"readiness {worker.readiness()}, {worker.delivery.pending_records} records "
            f"unacknowledged, {worker.stats}"
        )

    async def checkpointed_everywhere() -> bool:
        offsets = await run.input_offsets()
        return feeder.held and all(committed > 0 for committed, _ in offsets.values())

    async def finished() -> bool:
        return feeder.done and worker.idle() and await run.input_committed()

    try:
        # every partition has a checkpoint (and a commit) before the topic goes
        await until(
            checkpointed_everywhere,
            "a commit on every input partition",
            timeout_s=HANG_S,
            alive=alive,
            interval_s=0.1,
            context=state,
        )
        feeder.limit(during)

        async def committing_live_traffic() -> bool:
            offsets = await run.input_offsets()
            return sum(committed for committed, _ in offsets.values()) > before + 300

        # the topic goes while records arrive, are judged and written, and checkpoints move
        await until(
            committing_live_traffic,
            "commits of live traffic",
            timeout_s=HANG_S,
            alive=alive,
            interval_s=0.05,
            context=state,
        )
        await admin_call(run.bootstrap, delete=accepted)
        # the check sees the topic gone (after writes to it failed, or before any did) and
        # rewinds every partition
        await until(
            lambda: f"topic {accepted} does not exist: rewinding" in caplog.text,
            "the rewind once the topic is seen gone",
            timeout_s=HANG_S,
            alive=alive,
            context=state,
        )
        assert f"{accepted}: does not exist" in worker.readiness()[1]
        await admin_call(run.bootstrap, create=accepted)
        await until(
            lambda: worker.readiness()[0],
            "the topic seen back",
            timeout_s=HANG_S,
            alive=alive,
            context=state,
        )
        await until(
            lambda: feeder.held, "the traffic up to the gate", timeout_s=HANG_S, alive=alive
        )
        # what is in the input now was sent before the topic was back; the rest after it
        back = {partition: end for partition, (_, end) in (await run.input_offsets()).items()}
        feeder.limit(None)
        await until(
            finished,
            "every record judged, acknowledged and committed",
            timeout_s=HANG_S,
            alive=alive,
            interval_s=0.1,
            context=state,
        )
        assert worker.delivery.pending_records == 0
        open_calls = metrics.get_sample_value("callgate_open_calls")
        lags = [
            metrics.get_sample_value(
                "callgate_consumer_lag", {"topic": run.input, "partition": str(partition)}
            )
            for partition in range(PARTITIONS)
        ]
    finally:
        try:
            await stop(worker, running)
        finally:
            feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeding
    assert worker.idle()
    assert lags == [0.0] * PARTITIONS

    inputs = await read_records(run.bootstrap, {run.input: PARTITIONS})
    refs = reference(settings, inputs)
    closing, still_open = closing_offsets(settings, inputs)
    assert open_calls == still_open
    assert set(refs) == set(closing) == set(traffic.expected)
    resumed = resume_points(caplog.records, run.input)
    assert set(resumed) == set(range(PARTITIONS)), f"not every partition rewound: {resumed}"
    assert all(resumed[p] <= back[p] for p in range(PARTITIONS)), (resumed, back)
    events: dict[str, list[Seen]] = {}
    for seen in await read_all(run.bootstrap, dict.fromkeys(run.outputs.values(), PARTITIONS)):
        events.setdefault(seen.event["call_id"], []).append(seen)
    assert set(events) <= set(refs), (
        f"events of unknown calls: {sorted(set(events) - set(refs))[:5]}"
    )
    kinds = {"lost with the topic": 0, "checkpointed": 0, "judged again": 0, "sent after": 0}
    problems: list[str] = []
    for call, ref in sorted(refs.items()):
        expect = traffic.expected[call]
        outcome = ref.event["outcome"]
        if (outcome, ref.event.get("error_code") or ref.event.get("reason")) != (
            expect.outcome,
            expect.code,
        ):
            problems.append(f"{call}: the reference judged {ref.event}, expected {expect}")
        partition, offset = closing[call]
        topic = topic_of[outcome]
        got = events.get(call, [])
        if offset < resumed[partition]:
            kind = "lost with the topic" if topic == accepted else "checkpointed"
            right = len(got) == (0 if topic == accepted else 1)
        elif offset < back[partition]:
            kind, right = "judged again", len(got) >= 1
        else:
            kind, right = "sent after", len(got) == 1
        kinds[kind] += 1
        if not right:
            problems.append(f"{call} ({kind}, {partition}@{offset}): {len(got)} events")
        for seen in got:
            if seen.topic != topic or without_timings(seen.event) != without_timings(ref.event):
                problems.append(f"{call} ({kind}): {seen} differs from the reference {ref.event}")
    print(f"calls by where they close: {kinds}; resumed from {resumed}; back at {back}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:12])
    assert all(kinds.values()), f"every case occurs: {kinds}"


def whole_call(i: int) -> tuple[bytes, bytes]:
    """Call `c<i>` of stream `s<i>` in one record: accepted, closed by that record."""
    body = {
        "stream_id": f"s{i}",
        "call_id": f"c{i}",
        "seq": 0,
        "kind": "tool_call",
        "tool": "get_weather",
        "tool_version": "1",
        "delta": orjson.dumps({"city": f"city{i}", "units": "celsius"}).decode(),
        "final": True,
    }
    return f"s{i}".encode(), orjson.dumps(body)


async def test_a_write_failing_because_its_topic_was_deleted_has_the_topic_checked(
    apache_kafka: ApacheKafka,
) -> None:
    """Every round in flight owes events to the deleted topic: none is ever acknowledged, so
    none waits for the check that the outcome topics exist, and only the failing writes can
    start it. The worker must still see the topic gone, say so in `/readyz` and rewind (not
    retry a deleted topic's writes for ever, saying only that they fail); once the topic is
    back, the calls judged meanwhile are judged again, written and committed. (Apache Kafka
    only: tansu acknowledges writes to a deleted topic. The exactly_once case runs on the fake
    broker, `test_worker.py`: on Apache Kafka aiokafka cannot stop a transactional producer
    holding writes to a deleted topic, whose connections then outlive the test.)"""
    run = Run(apache_kafka.bootstrap_servers)
    await run.create()
    accepted = run.outputs["ok"]
    settings = run.settings(kafka={"request_timeout_ms": 2000, "topic_check_interval_ms": 50})
    worker = worker_for(settings)
    await worker.start()
    running = asyncio.create_task(worker.run())

    def state() -> str:
        return (
            f"readiness {worker.readiness()}, {worker.delivery.pending_records} unacknowledged, "
            f"{worker.stats}"
        )

    async def all_committed() -> bool:
        return worker.idle() and await run.input_committed()

    alive = lambda: not running.done()  # noqa: E731
    try:
        # checkpointed and committed before the topic goes: these events go with it
        await run.produce([whole_call(i) for i in range(20)], timestamp_ms=1_000)
        await until(all_committed, "the first calls committed", timeout_s=HANG_S, alive=alive)
        await admin_call(run.bootstrap, delete=accepted)
        # each of these rounds owes the deleted topic its events (one per record)
        await run.produce([whole_call(i) for i in range(20, 40)], timestamp_ms=2_000)
        await until(
            lambda: f"{accepted}: does not exist" in worker.readiness()[1],
            "the deleted topic seen gone",
            timeout_s=HANG_S,
            alive=alive,
            context=state,
        )
        await admin_call(run.bootstrap, create=accepted)
        await until(
            all_committed, "every call committed", timeout_s=HANG_S, alive=alive, context=state
        )
    finally:
        await stop(worker, running)
    grouped = by_call(await run.events())
    assert set(grouped) == {f"c{i}" for i in range(20, 40)}, "the first calls went with the topic"
    for seen in grouped.values():
        assert all(same_but_timings(event, seen[0]) for event in seen), seen
        assert seen[0]["outcome"] == "accepted"


async def test_input_deleted_before_it_was_judged_is_counted_and_skipped(
    apache_kafka: ApacheKafka,
) -> None:
    """Records deleted while the worker was away (retention shorter than the lag) leave its
    checkpoints pointing before the log's start. The worker must not skip them in silence: it
    counts exactly the records it lost, logs where, fetches from the start, and judges what is
    left as before. A call whose first record was deleted is never accepted from what is left.
    (Apache Kafka only: tansu cannot delete records.)"""
    run = Run(apache_kafka.bootstrap_servers)
    await run.create()
    settings = run.settings()

    async def judged_and_committed(worker: Worker, events: int) -> bool:
        return worker.stats.events >= events and worker.idle() and await run.input_committed()

    first = worker_for(settings)
    await first.start()
    running = asyncio.create_task(first.run())
    try:
        await run.produce([whole_call(i) for i in range(10)], timestamp_ms=1_000)
        await until(
            lambda: judged_and_committed(first, 10), "the first calls committed", timeout_s=HANG_S
        )
    finally:
        await stop(first, running)
    # while no worker runs: calls 10-19 begin, and their first records are deleted
    await run.produce(call_records(20, first_half_only=True)[10:], timestamp_ms=2_000)
    ends = {partition: end for partition, (_, end) in (await run.input_offsets()).items()}
    admin = AIOKafkaAdminClient(bootstrap_servers=run.bootstrap)
    await admin.start()
    try:
        await admin.delete_records(
            {TopicPartition(run.input, p): RecordsToDelete(end) for p, end in ends.items()}
        )
    finally:
        await admin.close()
    await run.produce([second_half(i) for i in range(10, 20)], timestamp_ms=3_000)
    await run.produce([whole_call(i) for i in range(20, 30)], timestamp_ms=4_000)

    second = worker_for(settings)
    await second.start()
    running = asyncio.create_task(second.run())
    try:
        await until(
            lambda: judged_and_committed(second, 20),
            "the calls after the deletion committed",
            timeout_s=HANG_S,
            alive=lambda: not running.done(),
        )
    finally:
        await stop(second, running)
    deleted = second.metrics.registry.get_sample_value("callgate_input_records_deleted_total")
    assert deleted == 10, "exactly the deleted first records are counted"
    grouped = by_call(await run.events())
    for i in [*range(10), *range(20, 30)]:
        assert [e["outcome"] for e in grouped.get(f"c{i}", [])] == ["accepted"], i
    for i in range(10, 20):  # what is left of them: a last record whose first is gone
        seen = [(e["outcome"], e["reason"]) for e in grouped.get(f"c{i}", [])]
        assert seen == [("incomplete", "sequence_gap")], (i, seen)


async def test_a_deleted_changelog_stops_the_worker(apache_kafka: ApacheKafka) -> None:
    """On Apache Kafka the checkpoints written to a deleted changelog fail; the failing writes
    start the topic check, which sees a state topic gone: the worker stops with a StateError
    naming it (its checkpoints cannot come back), rather than retry those writes for ever.
    (exactly_once: on the fake broker, `test_worker.py`, for the reason given in
    `test_a_write_failing_because_its_topic_was_deleted_has_the_topic_checked`.)"""
    run = Run(apache_kafka.bootstrap_servers)
    await run.create()
    settings = run.settings(kafka={"request_timeout_ms": 2000, "topic_check_interval_ms": 50})
    worker = worker_for(settings)
    await worker.start()
    running = asyncio.create_task(worker.run())
    changelog = changelog_topic(run.group, run.input)
    try:
        await run.produce(call_records(6, first_half_only=True), timestamp_ms=1_000)
        await until(lambda: worker.stats.checkpoints > 0, "a checkpoint written", timeout_s=HANG_S)
        await admin_call(run.bootstrap, delete=changelog)
        await run.produce([second_half(i) for i in range(6)], timestamp_ms=2_000)
        done, _ = await asyncio.wait((running,), timeout=HANG_S)
        assert done, f"the worker did not stop within {HANG_S:.0f} s: {worker.readiness()}"
        with pytest.raises(StateError, match=f"internal topics deleted: {changelog};"):
            running.result()
    finally:
        if not running.done():
            await stop(worker, running)
        await worker.close()


class _Acknowledgements:
    """A `Sink` that counts what was acknowledged and fails the test on anything else."""

    def __init__(self) -> None:
        self.count = 0

    def acknowledged(self, record: Record) -> None:
        self.count += 1

    def refused(self, record: Record, error: KafkaError) -> Record | None:
        raise AssertionError(f"refused: {error!r}")

    def topic_failing(self, topic: str, error: KafkaError) -> None:
        raise AssertionError(f"{topic} failing: {error!r}")

    def topic_recovered(self, topic: str) -> None:
        pass


#: A fenced round's records: (topic, partition or None for the key's) of each.
FENCED_ROUNDS = {
    "offsets only": [],
    "one write": [("ok", 0)],
    # the last topic is new to the producer: its metadata is fetched between the sends, and
    # the refusal of the first ones arrives meanwhile
    "writes, then a topic not written before": [("ok", 0), ("ok", 1), ("ok", 2), ("no", None)],
    # several batches to one partition: each waits for the one before it to drain, which the
    # broker refuses meanwhile
    "batches queued behind each other": [("ok", 0)] * 100,
}


@pytest.mark.parametrize("round_records", sorted(FENCED_ROUNDS))
async def test_a_fenced_partition_s_round_fails_as_fenced_however_far_it_went(
    apache_kafka: ApacheKafka, round_records: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What exactly_once relies on: once a newer producer of a partition's transactional id has
    started, the older one's next round fails with one of `FENCED`, whether the broker refuses
    its first write, a later one, or its offsets (aiokafka reports the error once, then refuses
    the transaction's later calls with errors that do not say why). Reopening the partition
    on any other error would fence its new owner in turn."""
    run = Run(apache_kafka.bootstrap_servers)
    await run.create()
    settings = run.settings(
        delivery={"guarantee": "exactly_once", "transactional_id_prefix": run.group}
    )
    kafka = Kafka(settings)
    sink = _Acknowledgements()
    transactions = Transactions(
        kafka.transactional_producer, sink, time.monotonic, group=run.group, timeout_s=10.0
    )
    where = (run.input, 0)
    await transactions.open(where)
    newer = kafka.transactional_producer(*where)
    try:
        outbox = transactions.outbox(where)
        assert outbox is not None
        outbox.add(Record(0, run.outputs["ok"], b"k", b"first round", []))
        await transactions.commit(where, 1)
        assert sink.count == 1
        await newer.start()  # the partition's new owner: the broker fences the older producer
        for topic, partition in FENCED_ROUNDS[round_records]:
            late = b"late" * 256
            record = Record(1, run.outputs[topic], b"key", late, [], partition=partition)
            outbox.add(record)
        with pytest.raises(FENCED):
            await transactions.commit(where, 2)
    finally:
        await transactions.close_all(5.0)
        await newer.stop()
    # the fenced producer's error was read where it was met: nothing of it is left unretrieved
    del transactions, outbox
    gc.collect()
    unretrieved = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert unretrieved == []


class _Unheard(ConsumerRebalanceListener):  # type: ignore[misc]
    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        pass

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        pass


def _member_meanwhile(run: Run, leave: threading.Event) -> None:
    """Another member of `run`'s group, on a loop of its own (so it heartbeats while the test's
    loop stalls), until `leave` is set."""

    async def member() -> None:
        consumer = AIOKafkaConsumer(
            run.input,
            bootstrap_servers=run.bootstrap,
            group_id=run.group,
            enable_auto_commit=False,
            session_timeout_ms=6000,
        )
        await consumer.start()
        try:
            await asyncio.get_running_loop().run_in_executor(None, leave.wait)
        finally:
            await consumer.stop()

    asyncio.run(member())


#: how a commit is refused once the group went on without the member
GROUP_REFUSAL = (
    r"CommitFailedError from (UnknownMemberId|IllegalGeneration|RebalanceInProgress)Error"
)


def _commit_requests() -> set[asyncio.Task[Any]]:
    """aiokafka's offset commit requests in flight (each a task it runs under a shield)."""
    return {
        task
        for task in asyncio.all_tasks()
        if getattr(task.get_coro(), "__name__", "") == "_do_commit_offsets"
    }


async def test_a_commit_cut_off_and_refused_once_the_member_was_expelled_is_read_not_left(
    broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A member whose loop stalled past its session is expelled; its next commit is cut off
    (as a revoke's or a stop's deadline cuts one) while aiokafka's request is in flight, and
    that request is then refused: the refusal is read and said in one line, never left as
    "Task exception was never retrieved"."""
    caplog.set_level(logging.INFO, logger="callgate.worker")
    run = Run(broker)
    await run.create()
    settings = run.settings()
    consumer = Kafka(settings).consumer()
    fetcher = Fetcher(consumer, Metrics(frozenset()), fetch_timeout_ms=100, max_records=10)
    leave = threading.Event()
    other = threading.Thread(target=_member_meanwhile, args=(run, leave))
    await consumer.start()
    try:
        fetcher.subscribe(Subscription((run.input,), None), _Unheard())
        await until(lambda: bool(consumer.assignment()), "partitions assigned", timeout_s=HANG_S)
        # another member joins, and the stall: no heartbeat leaves for longer than the session,
        # the group goes on without this member
        other.start()
        time.sleep(settings.kafka.session_timeout_ms / 1000 + 3)
        offsets = {(run.input, partition): 0 for partition in range(PARTITIONS)}
        cut = asyncio.ensure_future(fetcher.commit(offsets, HANG_S))
        while not _commit_requests():
            assert not cut.done(), cut
            await asyncio.sleep(0)
        (request,) = _commit_requests()
        cut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cut
        await asyncio.wait({request}, timeout=HANG_S)
        assert request.done(), "the commit request never ended"
        del request
    finally:
        await fetcher.close(5.0)
        leave.set()
        if other.is_alive():
            await asyncio.get_running_loop().run_in_executor(None, other.join, HANG_S)
    gc.collect()
    messages = [record.getMessage() for record in caplog.records]
    assert [m for m in messages if "never retrieved" in m] == []
    refused = [m for m in messages if "a commit no longer waited for was refused" in m]
    assert len(refused) == 1, messages
    assert re.search(GROUP_REFUSAL, refused[0]), refused
