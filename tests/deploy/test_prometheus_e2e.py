"""A real Prometheus scrapes callgate, then every dashboard query and alert expression runs on it.

Two scrape targets:
- the health server of a `Metrics` fed by the real core `Processor` and a real `KeyStore`, the
  shell's updates made by hand as `worker.runtime.worker` makes them: fast, and independent of
  Kafka;
- a real worker (`python -m worker run`, i.e. `callgate run`) in its own process, consuming
  traffic produced continuously to the session's embedded broker.

Each panel query must parse and return data; each alert expression must parse, and every rule
of deploy/prometheus/alerts.yaml must evaluate without error inside Prometheus.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.deploy.prometheus_helpers import (
    ALERTS,
    ROOT,
    PrometheusAPI,
    PrometheusProcess,
    alert_rules,
    check_against,
    free_port,
    panel_queries,
    prometheus_binary,
    scrape_config,
)
from worker.check import FileRecord
from worker.compose import build_key_store, build_metrics, build_processor
from worker.core.idempotency import resolve
from worker.core.processor import Route
from worker.health import HealthServer
from worker.model import Phase
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings, load_settings

pytestmark = pytest.mark.integration

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}},
    "required": ["city"],
    "additionalProperties": False,
}
INPUT = "model-output"
#: the partitions of the idempotency topics the real worker is given (it owns them all)
IDEMPOTENCY_PARTITIONS = 1
#: the partitions of the pending-approval topic the real worker makes (it owns them all)
APPROVAL_PARTITIONS = 1
#: the real worker's input partitions: more than the traffic's streams reach, so some are idle
INPUT_PARTITIONS = 9


#: the candidate contracts of shadow mode: a city's name of three letters at most (the
#: traffic's Oslo, Rome and Lima would be refused: flips for the shadow panels)
CANDIDATE = {**SCHEMA, "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 3}}}


def contracts(directory: Path, schema: dict[str, object]) -> Path:
    (directory / "weather").mkdir(parents=True)
    (directory / "weather" / "get_weather.v1.schema.json").write_bytes(orjson.dumps(schema))
    return directory


@pytest.fixture
def schemas_dir(tmp_path: Path) -> Path:
    return contracts(tmp_path / "schemas", SCHEMA)


@pytest.fixture
def candidate_dir(tmp_path: Path) -> Path:
    return contracts(tmp_path / "candidate", CANDIDATE)


def traffic(run: str) -> list[tuple[bytes, bytes]]:
    """One round of every kind of call the panels show, as (key, value) records."""

    def env(stream: str, **fields: object) -> tuple[bytes, bytes]:
        return stream.encode(), orjson.dumps({"stream_id": stream, **fields})

    def call(name: str, tool: str, *deltas: str, **extra: object) -> list[tuple[bytes, bytes]]:
        sid = f"{run}:{name}"
        return [
            env(
                sid,
                call_id=f"{sid}:c",
                seq=i,
                kind="tool_call",
                delta=delta,
                final=i == len(deltas) - 1,
                **({"tool": tool, **extra} if i == 0 else {}),
            )
            for i, delta in enumerate(deltas)
        ]

    truncated = f"{run}:truncated"
    ok = call("ok", "get_weather", '{"city":', '"Oslo"}')
    # the same key for the same request twice: the key's owner accepts the first only
    keyed = [
        *call("keyed", "get_weather", '{"city": "Lima"}', idempotency_key=f"{run}:k"),
        *call("again", "get_weather", '{"city": "Lima"}', idempotency_key=f"{run}:k"),
    ]
    return [
        ok[0],
        ok[0],  # a producer's retry: a duplicate chunk
        ok[1],
        *call("violation", "get_weather", '{"town":', '"Oslo"}'),
        *call("fenced", "get_weather", '```json\n{"city": "Rome"}\n```'),
        *call("broken", "get_weather", '{"city": "Paris"'),
        *call("unknown", "get_forecast", '{"days": 3}'),
        *keyed,
        env(truncated, call_id=f"{truncated}:c", seq=0, kind="tool_call", tool="get_weather",
            delta='{"city": "Ber', final=False),
        env(truncated, kind="end", finish_reason="length"),
        (f"{run}:poison".encode(), b"this is not an envelope"),
    ]  # fmt: skip


def run_every_query(prometheus: PrometheusProcess) -> None:
    prometheus.wait_for_scrapes("callgate", timeout_s=30)
    sizes = check_against(prometheus.base_url, deadline_s=40, rate_interval="30s")
    assert all(sizes[q.source] > 0 for q in panel_queries())
    # every alert rule evaluated inside Prometheus, without an evaluation error
    api = PrometheusAPI(prometheus.base_url)
    deadline = time.monotonic() + 20
    while True:
        rules = [r for g in api.get("/api/v1/rules")["groups"] for r in g["rules"]]
        evaluated = [r for r in rules if not r["lastEvaluation"].startswith("0001-")]
        if len(evaluated) == len(alert_rules()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # a bounded poll of Prometheus' rule evaluation
    assert {r["name"] for r in evaluated} == {r["alert"] for r in alert_rules()}
    assert all(r["health"] == "ok" for r in evaluated), [r.get("lastError") for r in evaluated]


# -- target 1: Metrics fed by the real core ------------------------------------------------------


class ChainFeeder:
    """Feeds `traffic()` rounds through a Processor and a key store, updating Metrics as the
    worker does (`worker.runtime.judging.Judge.round` and `_decide_keys`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.processor = build_processor(settings, candidate=settings.shadow.schemas)
        self.keys = build_key_store(settings)
        self.metrics = build_metrics(settings, self.processor)
        self.stop = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="chain-feeder", daemon=True)

    def _run(self) -> None:
        try:
            self._feed()
        except BaseException as exc:  # reported by the test, never lost in the thread
            self.error = exc

    def _feed(self) -> None:
        metrics, processor, offset, dropped = self.metrics, self.processor, 0, (0, 0)
        max_feedback = self.settings.limits.max_feedback_bytes
        metrics.rebalance()
        metrics.set_assigned_partitions(1)
        while not self.stop.is_set():
            records = []
            for key, value in traffic(f"r{self.rounds}"):
                timestamp = 1_700_000_000_000 + offset
                records.append(FileRecord(INPUT, 0, offset, timestamp, key, value, ()))
                offset += 1
            metrics.add_records(len(records))
            for emission in processor.feed(INPUT, 0, records):
                metrics.observe(emission.verdict, emission.call.tool)
                if emission.shadow is not None:
                    metrics.shadow(emission.shadow)
                if emission.route is Route.IDEMPOTENCY:
                    resolution = resolve(self.keys, emission.value, offset, max_feedback)
                    metrics.idempotency_decision(resolution.decision)
                    phase = Phase.IDEMPOTENCY if resolution.code is not None else None
                    metrics.decided(resolution.outcome, resolution.tool, phase, resolution.code)
            full = self.rounds % 10 == 0
            metrics.checkpoint(len(processor.checkpoint(INPUT, 0, full=full)), full=full)
            assembler = processor.assembler
            metrics.set_open_calls(assembler.open_calls)
            metrics.set_buffered_bytes(assembler.buffered_bytes)
            duplicate, late = assembler.duplicate_chunks, assembler.late_chunks
            metrics.add_dropped_chunks(duplicate - dropped[0], late - dropped[1])
            dropped = (duplicate, late)
            metrics.set_idempotency_keys(len(self.keys))
            metrics.set_lag(INPUT, 0, 3)
            self.rounds += 1
            self.stop.wait(0.05)  # pacing, not synchronisation


def test_every_query_on_metrics_fed_by_the_chain(
    schemas_dir: Path, candidate_dir: Path, tmp_path: Path
) -> None:
    prometheus_binary()
    feeder = ChainFeeder(
        load_settings(schemas={"dir": schemas_dir}, plugins=[], shadow={"schemas": candidate_dir})
    )
    health = HealthServer(feeder.metrics.registry, lambda: (True, "test"))
    port = health.start("127.0.0.1", 0)
    feeder.thread.start()
    config = scrape_config([f"127.0.0.1:{port}"], rule_files=[ALERTS])
    try:
        with PrometheusProcess(config, tmp_path) as prometheus:
            run_every_query(prometheus)
            api = PrometheusAPI(prometheus.base_url)
            outcomes = {
                r["metric"]["outcome"]
                for r in api.query("sum by (outcome) (callgate_calls_total) > 0")
            }
            assert outcomes == {"accepted", "rejected", "incomplete"}
            decisions = {
                r["metric"]["decision"]
                for r in api.query("sum by (decision) (callgate_idempotency_decisions_total) > 0")
            }
            assert decisions == {"first", "duplicate"}
            assert api.query('callgate_poison_records_total{code="malformed_record"} > 0')
            assert api.query("callgate_duplicate_chunks_total > 0")
            assert api.query('callgate_shadow_calls_total{kind="accepted_to_rejected"} > 0')
            assert api.query('callgate_checkpoints_total{kind="full"} > 0')
            assert api.query('callgate_checkpoints_total{kind="delta"} > 0')
            # the chain itself fires nothing: no internal error, no stalled checkpoint...; the
            # poison record of every round is all there is to see
            firing = {r["metric"]["alertname"] for r in api.query('ALERTS{alertstate="firing"}')}
            assert firing <= {"CallgatePoisonRecords"}
    finally:
        feeder.stop.set()
        feeder.thread.join(10)
        health.stop()
    assert feeder.error is None, feeder.error
    assert feeder.rounds > 0


# -- target 2: a real worker on the embedded broker ----------------------------------------------


class Producer:
    """Produces a round of `traffic()` to `topic` every 0.2 s on its own thread and loop."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.stop = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by the test, never lost in the thread
            self.error = exc

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
        await producer.start()
        try:
            while not self.stop.is_set():
                for key, value in traffic(f"p{self.rounds}-{uuid.uuid4().hex[:6]}"):
                    await producer.send(self.topic, value, key=key)
                await producer.flush()
                self.rounds += 1
                await asyncio.sleep(0.2)  # pacing, not synchronisation
        finally:
            await producer.stop()


def wait_ready(port: int, worker: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise AssertionError(f"worker exited with {worker.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
                if reply.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = exc.read().decode(errors="replace").strip()
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.2)  # a bounded poll of the worker's readiness
    raise AssertionError(f"worker not ready within {timeout_s} s ({last}):\n{log.read_text()}")


async def create_topics(bootstrap: str, topics: dict[str, str]) -> None:
    settings = load_settings(kafka={"bootstrap_servers": [bootstrap]})
    await Kafka(settings).ensure_topics(
        [
            TopicSpec(name, INPUT_PARTITIONS if role == "in" else 1, compacted=False)
            for role, name in topics.items()
        ]
    )


@pytest.fixture
def worker_process(
    bootstrap: str, schemas_dir: Path, candidate_dir: Path, tmp_path: Path
) -> Iterator[tuple[int, Producer, str]]:
    run = uuid.uuid4().hex[:8]
    topics = {name: f"e2e-{run}-{name}" for name in ("in", "accepted", "rejected", "incomplete")}
    asyncio.run(create_topics(bootstrap, topics))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "CALLGATE_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "CALLGATE_KAFKA__GROUP_ID": f"e2e-{run}",
            "CALLGATE_KAFKA__SESSION_TIMEOUT_MS": "6000",
            "CALLGATE_TOPICS__INPUT": topics["in"],
            "CALLGATE_TOPICS__ACCEPTED": topics["accepted"],
            "CALLGATE_TOPICS__REJECTED": topics["rejected"],
            "CALLGATE_TOPICS__INCOMPLETE": topics["incomplete"],
            "CALLGATE_IDEMPOTENCY__PARTITIONS": str(IDEMPOTENCY_PARTITIONS),
            "CALLGATE_TOPICS__PENDING_APPROVAL": f"e2e-{run}-pending-approval",
            "CALLGATE_APPROVAL__PARTITIONS": str(APPROVAL_PARTITIONS),
            "CALLGATE_SCHEMAS__DIR": str(schemas_dir),
            "CALLGATE_SHADOW__SCHEMAS": str(candidate_dir),
            "CALLGATE_PLUGINS": "",
            "CALLGATE_METRICS__HOST": "127.0.0.1",
            "CALLGATE_METRICS__PORT": str(port),
            "CALLGATE_SHUTDOWN_GRACE_S": "5",
        }
    )
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "worker", "run"],  # `callgate run`
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    producer = Producer(bootstrap, topics["in"])
    try:
        producer.thread.start()
        wait_ready(port, worker, log, timeout_s=45)
        yield port, producer, topics["in"]
    finally:
        producer.stop.set()
        producer.thread.join(10)
        if worker.poll() is None:
            worker.terminate()  # SIGTERM: the graceful stop path
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(5)
    assert producer.error is None, producer.error
    assert worker.returncode == 0, f"worker exited with {worker.returncode}:\n{log.read_text()}"


def test_every_query_on_a_running_worker(
    worker_process: tuple[int, Producer, str], tmp_path: Path
) -> None:
    prometheus_binary()
    port, producer, input_topic = worker_process
    config = scrape_config([f"127.0.0.1:{port}"], rule_files=[ALERTS])
    with PrometheusProcess(config, tmp_path / "prometheus") as prometheus:
        run_every_query(prometheus)
        api = PrometheusAPI(prometheus.base_url)
        assert api.query("sum(callgate_records_total) > 0")
        assert api.query('sum(callgate_calls_total{outcome="accepted"}) > 0')
        assert api.query('sum(callgate_idempotency_decisions_total{decision="first"}) > 0')
        assert api.query("sum(callgate_checkpoints_total) > 0")
        assert api.query('sum(callgate_shadow_calls_total{kind="accepted_to_rejected"}) > 0')
        # the input's partitions, the idempotency requests' and the pending approvals' one
        owned = INPUT_PARTITIONS + IDEMPOTENCY_PARTITIONS + APPROVAL_PARTITIONS
        assert api.query(f"sum(callgate_assigned_partitions) == {owned}")
        # a lag series for every input partition, the idle ones (at 0) too
        lag = api.query(f'callgate_consumer_lag{{topic="{input_topic}"}}')
        assert sorted(int(r["metric"]["partition"]) for r in lag) == list(range(INPUT_PARTITIONS))
        assert any(float(r["value"][1]) == 0 for r in lag)
        # the worker process itself: CPU, memory, descriptors
        assert api.query("rate(process_cpu_seconds_total[30s]) > 0")
        assert api.query("process_resident_memory_bytes > 10e6")
        assert api.query("process_open_fds > 0 and process_open_fds < process_max_fds")
    assert producer.rounds > 0
