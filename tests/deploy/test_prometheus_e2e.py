"""A real Prometheus scrapes callgate, then every dashboard query and alert expression runs on it.

Two scrape targets:
- the health server of a `Metrics` fed by the real core `Processor` (the shell's updates done by
  hand): fast, and independent of Kafka;
- a real worker (`python -m worker run`, i.e. `callgate run`) in its own process,
  consuming traffic produced continuously to the session's embedded broker.

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
from worker.core.processor import InboundRecord, Processor
from worker.health import HealthServer
from worker.metrics import Metrics
from worker.model import Code
from worker.runtime.admin import create_topics
from worker.settings import load_settings

pytestmark = pytest.mark.integration

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture
def schemas_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "schemas"
    (directory / "weather").mkdir(parents=True)
    (directory / "weather" / "get_weather.v1.schema.json").write_bytes(orjson.dumps(SCHEMA))
    return directory


def traffic(run: str) -> list[tuple[bytes, bytes]]:
    """One round of every kind of call the panels show, as (key, value) records."""

    def env(stream: str, **fields: object) -> tuple[bytes, bytes]:
        return stream.encode(), orjson.dumps({"stream_id": stream, **fields})

    def call(name: str, tool: str, *deltas: str) -> list[tuple[bytes, bytes]]:
        sid = f"{run}:{name}"
        return [
            env(
                sid,
                call_id=f"{sid}:c",
                seq=i,
                kind="tool_call",
                delta=delta,
                final=i == len(deltas) - 1,
                **({"tool": tool} if i == 0 else {}),
            )
            for i, delta in enumerate(deltas)
        ]

    truncated = f"{run}:truncated"
    return [
        *call("ok", "get_weather", '{"city":', '"Oslo"}'),
        *call("violation", "get_weather", '{"town":', '"Oslo"}'),
        *call("fenced", "get_weather", '```json\n{"city": "Rome"}\n```'),
        *call("broken", "get_weather", '{"city": "Paris"'),
        *call("unknown", "get_forecast", '{"days": 3}'),
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
        time.sleep(0.5)
    assert {r["name"] for r in evaluated} == {r["alert"] for r in alert_rules()}
    assert all(r["health"] == "ok" for r in evaluated), [r.get("lastError") for r in evaluated]


# -- target 1: Metrics fed by the real core ------------------------------------------------------


class ChainFeeder:
    """Feeds `traffic()` rounds through a Processor and updates Metrics as the shell does."""

    def __init__(self, processor: Processor, metrics: Metrics) -> None:
        self.processor, self.metrics = processor, metrics
        self.stop = threading.Event()
        self.rounds = 0
        self.thread = threading.Thread(target=self._run, name="chain-feeder", daemon=True)

    def _run(self) -> None:
        metrics, offset = self.metrics, 0
        metrics.rebalance()
        metrics.set_assigned_partitions(1)
        while not self.stop.is_set():
            emissions = []
            records = traffic(f"r{self.rounds}")
            for key, value in records:
                record = InboundRecord("model-output", 0, offset, key, value)
                emissions.extend(self.processor.feed(record, time.monotonic()))
                offset += 1
            metrics.add_chunks(len(records))
            for emission in emissions:
                metrics.observe(emission.verdict, emission.call.tool)
                if emission.verdict.code in (Code.MALFORMED_RECORD, Code.UNKNOWN_FORMAT):
                    metrics.poison_record(emission.verdict.code)
            metrics.set_open_calls(self.processor.open_calls)
            metrics.set_buffered_bytes(self.processor.buffered_bytes)
            metrics.set_lag("model-output", 0, 3)
            self.rounds += 1
            self.stop.wait(0.05)  # pacing, not synchronisation


def test_every_query_on_metrics_fed_by_the_chain(schemas_dir: Path, tmp_path: Path) -> None:
    prometheus_binary()
    settings = load_settings(schemas={"dir": schemas_dir}, plugins=[])
    processor = Processor.from_settings(settings)
    metrics = Metrics(processor.tool_names, engine=settings.schemas.engine)
    health = HealthServer(metrics.registry, lambda: (True, "test"))
    port = health.start("127.0.0.1", 0)
    feeder = ChainFeeder(processor, metrics)
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
    finally:
        feeder.stop.set()
        feeder.thread.join(10)
        health.stop()
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
        time.sleep(0.2)
    raise AssertionError(f"worker not ready within {timeout_s} s ({last}):\n{log.read_text()}")


@pytest.fixture
def worker_process(
    bootstrap: str, schemas_dir: Path, tmp_path: Path
) -> Iterator[tuple[int, Producer]]:
    run = uuid.uuid4().hex[:8]
    topics = {name: f"e2e-{run}-{name}" for name in ("in", "accepted", "rejected", "incomplete")}
    asyncio.run(create_topics(bootstrap, [topics["in"]], partitions=2))
    asyncio.run(create_topics(bootstrap, [t for k, t in topics.items() if k != "in"]))
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
            "CALLGATE_SCHEMAS__DIR": str(schemas_dir),
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
        yield port, producer
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


def test_every_query_on_a_running_worker(
    worker_process: tuple[int, Producer], tmp_path: Path
) -> None:
    prometheus_binary()
    port, producer = worker_process
    config = scrape_config([f"127.0.0.1:{port}"], rule_files=[ALERTS])
    with PrometheusProcess(config, tmp_path / "prometheus") as prometheus:
        run_every_query(prometheus)
        api = PrometheusAPI(prometheus.base_url)
        assert api.query("sum(callgate_chunks_total) > 0")
        assert api.query('sum(callgate_calls_total{outcome="accepted"}) > 0')
        assert api.query("sum(callgate_assigned_partitions) == 2")
    assert producer.rounds > 0
