"""The demo: the embedded broker, sample traffic, the worker in-process, a summary.

Without configured bootstrap servers it starts tansu on a free loopback port (and stops it at the
end); with them, it uses that cluster and only counts the events of its own run. It creates the
topics, produces the sample traffic of `traffic.py`, runs the same `Worker` as `callgate run`
(`worker.runtime.worker`, in this process) and an executor on its validated topic
(`executing.py`: payments and refunds into SQLite, weather), decides the calls pending approval
through `callgate approve` / `callgate deny` (`approving.py`: one refund approved, one denied),
shows a live progress line, and ends with a table of outcomes by phase and code and what the
executor made of the accepted calls. A call pending approval is counted once: its row moves
from `pending_approval` to the outcome its decision gave it.

The worker ages calls by record time, so the traffic is stamped: every record at the demo's
start, then one empty stream's `end` per partition stamped past the idle timeout, which ages the
one abandoned call into its `timeout` (and closes nothing else).
`assign_from_start` (reading topics from their start, without a group) is shared with the
integration tests, which read outcome topics the same way.

The contracts are the package's own (`contracts/`, the repository's `schemas/` shipped in the
wheel), so the demo runs from an installed wheel anywhere; `CALLGATE_SCHEMAS__DIR` set names
others.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from callgate_demo.approving import Approver
from callgate_demo.broker import EmbeddedBroker
from callgate_demo.executing import DemoExecutor, executor_summary
from callgate_demo.traffic import SampleRecord, sample_traffic
from callgate_executor.contract import is_call
from worker.compose import build_key_store, build_processor, build_registry, tool_labels
from worker.core.approval import PENDING_OUTCOME
from worker.errors import ConfigError
from worker.health import HealthServer
from worker.metrics import Metrics
from worker.published.model import Accepted, parse_event
from worker.runtime.kafka import Kafka
from worker.runtime.kafka_options import connection_options
from worker.runtime.topics import TopicSpec
from worker.runtime.worker import Worker
from worker.settings import Settings

#: The demo's idle timeout at most, so its one abandoned call closes within seconds.
DEMO_IDLE_TIMEOUT_S = 3.0
DEMO_PARTITIONS = 3


def run_demo(settings: Settings, *, repeat: int = 1, out: TextIO = sys.stdout) -> int:
    """Run the whole demo; 0 when every outcome event arrived, 1 otherwise."""
    if settings.topics.input_pattern:
        raise ConfigError(
            "CALLGATE_TOPICS__INPUT is a regex; the demo needs a topic name to produce to"
        )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    broker: EmbeddedBroker | None = None
    if not settings.kafka.bootstrap_servers:
        broker = EmbeddedBroker()
        broker.start()
        print(f"embedded broker (tansu) on {broker.bootstrap_servers}", file=out)
    try:
        return asyncio.run(_demo(_demo_settings(settings, broker), repeat, out))
    finally:
        if broker is not None:
            broker.stop()
            print("embedded broker stopped", file=out)


def packaged_contracts() -> Path:
    """The contracts the demo's traffic is written for, as the package ships them."""
    contracts = resources.files("callgate_demo") / "contracts"
    if not isinstance(contracts, Path) or not contracts.is_dir():
        raise ConfigError(f"the demo's contracts are not installed ({contracts})")
    return contracts


def _demo_settings(settings: Settings, broker: EmbeddedBroker | None) -> Settings:
    schemas = settings.schemas
    if "dir" not in schemas.model_fields_set:
        schemas = schemas.model_copy(update={"dir": packaged_contracts()})
    kafka = settings.kafka
    if broker is not None:
        # a short session makes the embedded broker's group join take about a second
        kafka = kafka.model_copy(
            update={"bootstrap_servers": [broker.bootstrap_servers], "session_timeout_ms": 3000}
        )
    kafka = kafka.model_copy(update={"group_id": f"{kafka.group_id}-demo-{uuid.uuid4().hex[:8]}"})
    assembly = settings.assembly.model_copy(
        update={"idle_timeout_s": min(settings.assembly.idle_timeout_s, DEMO_IDLE_TIMEOUT_S)}
    )
    return settings.model_copy(update={"kafka": kafka, "assembly": assembly, "schemas": schemas})


async def _demo(settings: Settings, repeat: int, out: TextIO) -> int:
    topics = settings.topics
    input_topic = topics.input_topics[0]
    outputs = sorted({topics.accepted, topics.rejected, topics.incomplete})
    await Kafka(settings).ensure_topics(
        [
            *(
                TopicSpec(name, DEMO_PARTITIONS, compacted=False)
                for name in (input_topic, *outputs)
            ),
            TopicSpec(topics.pending_approval, settings.approval.partitions, compacted=False),
        ]
    )

    run = f"demo-{uuid.uuid4().hex[:6]}"
    records = [rec for i in range(repeat) for rec in sample_traffic(f"{run}-{i}")]
    scenarios = len({(rec.scenario) for rec in records})
    await _produce(settings, input_topic, records, run, settings.assembly.idle_timeout_s)
    print(
        f"produced {len(records)} records ({scenarios} scenarios x {repeat}) to {input_topic!r}",
        file=out,
    )

    registry = build_registry(settings)
    processor = build_processor(settings, registry)
    metrics = Metrics(tool_labels(registry), engine=settings.schemas.engine)
    runner = Worker(settings, processor, lambda: build_key_store(settings), metrics)
    health = HealthServer(metrics.registry, runner.readiness)
    metrics_url = _start_health(health, settings)
    if metrics_url:
        print(f"metrics: {metrics_url}/metrics  (also /healthz, /readyz)", file=out)

    approver = Approver(settings, out)
    reader = _OutcomeReader(settings, [*outputs, topics.pending_approval], run, approver.see)
    await reader.start()
    await runner.start()
    worker = asyncio.create_task(runner.run())
    scratch = tempfile.TemporaryDirectory(prefix="callgate-demo-")
    executor = DemoExecutor(settings, Path(scratch.name) / "payments.db", run, DEMO_PARTITIONS)
    await executor.start()
    deadline = time.monotonic() + 60 + settings.assembly.idle_timeout_s
    done = False
    progress = _Progress(out)
    try:
        while time.monotonic() < deadline and not worker.done():
            await reader.poll()
            done = (
                runner.stats.records >= len(records) + DEMO_PARTITIONS
                and processor.assembler.open_calls == 0
                and runner.idle()
                and reader.unique >= reader.expected(runner)
                and len(executor.results) >= reader.calls_to_run
                and reader.by_outcome[PENDING_OUTCOME] == 0
                and approver.settled
            )
            progress.show(len(records), runner, reader, executor)
            if done:
                break
    finally:
        if out.isatty():
            print(file=out)
        await approver.close()
        runner.request_stop()
        await worker
        await executor.stop()
        payments = len(executor.payments.all())
        refunds = len(executor.payments.refunds())
        scratch.cleanup()
        await runner.close()
        await reader.stop()
        health.stop()
    print(_summary(reader.tally, reader.events - reader.decided, reader.unique), file=out)
    print(executor_summary(executor.tally(), reader.tally, payments, refunds), file=out)
    if metrics_url:
        print(f"metrics were served at {metrics_url}/metrics while the demo ran", file=out)
    if not done:
        print("demo: not every outcome event arrived before the deadline", file=out)
        return 1
    return 0


def _start_health(health: HealthServer, settings: Settings) -> str | None:
    host = settings.metrics.host
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    try:
        port = health.start(host, settings.metrics.port)
    except Exception:  # the configured port is taken (another worker): any free port will do
        port = health.start(host, 0)
    return f"http://{shown}:{port}"


async def _produce(
    settings: Settings, topic: str, records: list[SampleRecord], run: str, idle_timeout_s: float
) -> None:
    """The records at one time, then one `end` of an empty stream per partition, stamped past
    the idle timeout: record time moves on in every partition, so the abandoned call ages."""
    producer = AIOKafkaProducer(**connection_options(settings.kafka), linger_ms=5)
    await producer.start()
    start_ms = int(time.time() * 1000)
    later_ms = start_ms + int(idle_timeout_s * 1000) + 1000
    try:
        futures = [
            await producer.send(
                topic, rec.value, key=rec.key, headers=list(rec.headers), timestamp_ms=start_ms
            )
            for rec in records
        ]
        for partition in range(DEMO_PARTITIONS):
            stream = f"{run}-clock-{partition}"
            tick = orjson.dumps({"stream_id": stream, "kind": "end", "finish_reason": "stop"})
            futures.append(
                await producer.send(
                    topic, tick, key=stream.encode(), partition=partition, timestamp_ms=later_ms
                )
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def assign_from_start(consumer: AIOKafkaConsumer, topics: Iterable[str]) -> None:
    """Assign every partition of `topics` to the started `consumer`, each at its first offset."""
    partitions = [
        TopicPartition(topic, p)
        for topic in topics
        for p in sorted(consumer.partitions_for_topic(topic) or {0})
    ]
    consumer.assign(partitions)
    await consumer.seek_to_beginning(*partitions)


class _OutcomeReader:
    """Reads the outcome topics (and the pending-approval topic) from the start and tallies this
    run's events; each `pending_approval` event is passed to `on_pending`."""

    def __init__(
        self,
        settings: Settings,
        topics: list[str],
        run: str,
        on_pending: Callable[[dict[str, Any]], None],
    ) -> None:
        self._settings = settings
        self._topics = topics
        self._run = run
        self._on_pending = on_pending
        self._consumer: AIOKafkaConsumer | None = None
        self.events = 0
        self.unique = 0
        #: events of calls pending approval that came to their decision's outcome
        self.decided = 0
        #: each call's row of the tally, by event id
        self._seen: dict[str, tuple[str, str, str]] = {}
        self.tally: Counter[tuple[str, str, str]] = Counter()
        self.by_outcome: Counter[str] = Counter()
        #: accepted calls an executor runs (an accepted MCP tool result is not one)
        self.calls_to_run = 0

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            **connection_options(self._settings.kafka), enable_auto_commit=False
        )
        await consumer.start()
        await assign_from_start(consumer, self._topics)
        self._consumer = consumer

    async def poll(self) -> None:
        assert self._consumer is not None
        batch = await self._consumer.getmany(timeout_ms=250)
        for records in batch.values():
            for record in records:
                self._count(record.value)

    def _count(self, value: bytes | None) -> None:
        try:
            event: dict[str, Any] = orjson.loads(value or b"")
        except orjson.JSONDecodeError:
            return
        if not str(event.get("stream_id", "")).startswith(self._run):
            return
        self.events += 1
        event_id = str(event.get("event_id"))
        outcome = str(event.get("outcome"))
        earlier = self._seen.get(event_id)
        if earlier is not None:
            if earlier[0] != PENDING_OUTCOME or outcome == PENDING_OUTCOME:
                return  # a replay
            # a call pending approval, decided: its row moves to the outcome it came to
            self.tally[earlier] -= 1
            if not self.tally[earlier]:
                del self.tally[earlier]
            self.by_outcome[PENDING_OUTCOME] -= 1
            self.decided += 1
        else:
            self.unique += 1
        detail = event.get("error_code") or event.get("reason") or ""
        if outcome == "accepted" and event.get("repairs"):
            detail = "repaired: " + ",".join(str(r.get("kind")) for r in event["repairs"])
        row = (outcome, str(event.get("phase") or ""), str(detail))
        self._seen[event_id] = row
        self.tally[row] += 1
        self.by_outcome[outcome] += 1
        if outcome == PENDING_OUTCOME:
            self._on_pending(event)
        if outcome == "accepted":
            accepted = parse_event(event)
            assert isinstance(accepted, Accepted)
            self.calls_to_run += is_call(accepted)

    def expected(self, worker: Worker) -> int:
        """How many calls the worker has sent events for so far (keyed calls count once their
        owner decided)."""
        return worker.stats.events

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()


class _Progress:
    """One live line on a terminal; elsewhere (a log, a pipe) a new line only when it changes."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._tty = out.isatty()
        self._last = ""

    def show(
        self, total: int, runner: Worker, reader: _OutcomeReader, executor: DemoExecutor
    ) -> None:
        stats, counts = runner.stats, reader.by_outcome
        open_calls = runner.processor.assembler.open_calls
        line = (
            f"records {min(stats.records, total)}/{total} · events {reader.unique} · "
            f"accepted {counts['accepted']} · rejected {counts['rejected']} · "
            f"incomplete {counts['incomplete']} · open calls {open_calls} · "
            f"results {len(executor.results)}"
        )
        if self._tty:
            print("\r" + line, end="", file=self._out, flush=True)
        elif line != self._last:
            print(line, file=self._out, flush=True)
        self._last = line


def _summary(tally: Counter[tuple[str, str, str]], events: int, unique: int) -> str:
    order = {"accepted": 0, "rejected": 1, "incomplete": 2}
    rows = sorted(tally.items(), key=lambda item: (order.get(item[0][0], 9), item[0][1:]))
    header = ("outcome", "phase", "code / reason", "calls")
    table = [header, *((o, p or "-", d or "-", str(n)) for (o, p, d), n in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = [
        "  ".join(
            cell.ljust(w) if i < 3 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"{unique} calls judged ({events} events read, {events - unique} replays)")
    return "\n".join(lines)
