"""Traces end to end: `callgate run` (a real process) on a real broker (tansu and Apache Kafka)
exports its spans over OTLP/HTTP to a real OpenTelemetry Collector, whose file exporter the test
reads back.

An agent (the test, with the OpenTelemetry SDK) sends each call's records inside a PRODUCER span
of its own and puts that span's `traceparent` on them; its spans go to the same collector. Read
from the collector's file, each call's trace is whole: the agent's span, the worker's
`process <input topic>` as its child (and linked to it), the gate's `execute_tool <tool>` as the
child of that, with the verdict the outcome event states; a keyed call's owner span as the
child of the gate. The outcome record's `traceparent` header names the gate's span (the owner's
for a keyed call), so an executor continues the same trace. A call without a traceparent starts
a trace of its own. Fails (never skips) with CI=true when the collector cannot be built or run.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tests.datafiles import SCHEMAS
from tests.runtime.test_worker import envelope, payment_call
from tests.support.candidates import create
from tests.support.otel_collector import OtelCollector, Span
from tests.support.workers import WorkerProcess
from worker.runtime.topics import requests_topic

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(240)]

WAIT_S = 90.0


def weather(stream: str, call: str, units: str) -> list[bytes]:
    text = orjson.dumps({"city": "Oslo", "units": units}).decode()
    return [
        envelope(stream, call, 0, text[:9], tool="get_weather", tool_version="1"),
        envelope(stream, call, 1, text[9:], final=True),
    ]


CALLS: dict[str, list[bytes]] = {
    "ok": weather("s-ok", "ok", "celsius"),
    "bad": weather("s-bad", "bad", "kelvin"),
    "keyed": payment_call("s-keyed", "keyed", f"key-{uuid.uuid4().hex}", 100),
    "bare": weather("s-bare", "bare", "celsius"),
}
UNTRACED = {"bare"}


class Agent:
    """The producing side: each call's records sent inside a PRODUCER span of the agent's own
    (exported to the collector), its `traceparent` on every record of the call."""

    def __init__(self, collector: OtelCollector, service: str) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        exporter = OTLPSpanExporter(endpoint=f"{collector.otlp_http}/v1/traces", timeout=10)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("agent")
        #: call id -> (trace id, span id) of its producer span, in hex
        self.spans: dict[str, tuple[str, str]] = {}
        #: call id -> (partition, offset) of the record that closes it
        self.last: dict[str, tuple[int, int]] = {}

    async def send(self, bootstrap: str, topic: str) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for call_id, values in CALLS.items():
                stream = f"s-{call_id}".encode()
                if call_id in UNTRACED:
                    headers: list[tuple[str, bytes]] = []
                    await self._send(
                        producer, topic, call_id, key=stream, values=values, headers=headers
                    )
                    continue
                with self.tracer.start_as_current_span(
                    f"send {topic}", kind=SpanKind.PRODUCER
                ) as span:
                    carrier: dict[str, str] = {}
                    TraceContextTextMapPropagator().inject(carrier)
                    headers = [("traceparent", carrier["traceparent"].encode())]
                    await self._send(
                        producer, topic, call_id, key=stream, values=values, headers=headers
                    )
                ctx = span.get_span_context()
                self.spans[call_id] = (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
        finally:
            await producer.stop()
        assert self.provider.force_flush(10_000), "the agent's spans were not exported"
        self.provider.shutdown()

    async def _send(
        self,
        producer: AIOKafkaProducer,
        topic: str,
        call_id: str,
        *,
        key: bytes,
        values: list[bytes],
        headers: list[tuple[str, bytes]],
    ) -> None:
        for value in values:
            sent = await producer.send_and_wait(topic, value, key=key, headers=headers)
            self.last[call_id] = (sent.partition, sent.offset)


async def outcome_records(bootstrap: str, topics: list[str], count: int) -> dict[str, Any]:
    """Each call's outcome record by call id, read from the topics' start until `count` calls
    have one (a second record of a call fails)."""
    consumer = AIOKafkaConsumer(
        *topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    found: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + WAIT_S
        while len(found) < count:
            assert time.monotonic() < deadline, f"events for {sorted(found)} only"
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                for record in batch:
                    call_id = orjson.loads(record.value)["call_id"]
                    assert call_id not in found, f"{call_id} has two events"
                    found[call_id] = record
    finally:
        await consumer.stop()
    return found


def traceparent_of(record: Any) -> tuple[str, str]:
    """(trace id, span id) in the record's `traceparent` header."""
    (value,) = [v for k, v in record.headers if k == "traceparent"]
    _, trace_id, span_id, _ = value.decode().split("-")
    return trace_id, span_id


async def test_each_calls_trace_reaches_the_collector_whole_and_its_event_continues_it(
    broker: str, otel_collector: OtelCollector, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    topics = {name: f"{name}-{run}" for name in ("input", "accepted", "rejected", "incomplete")}
    for name in topics.values():
        await create(broker, name)
    service = f"callgate-{run}"
    group = f"g-{run}"
    config = {
        "kafka": {"bootstrap_servers": broker, "group_id": group},
        "topics": topics,
        "schemas": {"dir": str(SCHEMAS)},
        "idempotency": {"partitions": 2},
        "metrics": {"port": 0, "host": "127.0.0.1"},
        "tracing": {"enabled": True, "endpoint": otel_collector.otlp_http, "service_name": service},
    }
    worker = WorkerProcess("traced", config, tmp_path).start()
    try:
        await worker.wait_log("callgate.worker: assigned", timeout_s=60)
        agent = Agent(otel_collector, f"agent-{run}")
        await agent.send(broker, topics["input"])
        outcome_topics = [topics[k] for k in ("accepted", "rejected", "incomplete")]
        records = await outcome_records(broker, outcome_topics, len(CALLS))
        assert set(records) == set(CALLS)

        def whole(spans: list[Span]) -> bool:
            ours = [s for s in spans if s.resource.get("service.name") == service]
            agents = [s for s in spans if s.resource.get("service.name") == f"agent-{run}"]
            # two spans a call, and the keyed call's owner span; every agent span
            return len(ours) == 2 * len(CALLS) + 1 and len(agents) == len(agent.spans)

        spans = otel_collector.wait_for_spans(whole, WAIT_S, "every call's spans")
        assert await worker.stop(timeout_s=30) == 0, worker.tail()
    finally:
        worker.cleanup()
    ours = [s for s in spans if s.resource.get("service.name") == service]
    assert {s.scope for s in ours} == {"callgate"}
    by_id = {s.span_id: s for s in ours}
    gates = {s.attributes["gen_ai.tool.call.id"]: s for s in ours if s.kind == "SPAN_KIND_INTERNAL"}
    assert set(gates) == set(CALLS)
    for call_id, gate in gates.items():
        record = records[call_id]
        event = orjson.loads(record.value)
        process = by_id[gate.parent_span_id]
        partition, offset = agent.last[call_id]
        assert process.name == f"process {topics['input']}"
        assert process.kind == "SPAN_KIND_CONSUMER"
        assert process.trace_id == gate.trace_id
        assert process.attributes == {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": topics["input"],
            "messaging.destination.partition.id": str(partition),
            "messaging.kafka.offset": offset,
            "messaging.consumer.group.name": group,
            "messaging.client.id": "callgate",
        }
        tool = event["tool"]
        assert gate.name == f"execute_tool {tool}"
        assert gate.attributes["gen_ai.operation.name"] == "execute_tool"
        assert gate.attributes["gen_ai.tool.name"] == tool
        assert gate.attributes["callgate.event_id"] == event["event_id"]
        assert gate.attributes["callgate.schema.id"] == event["schema"]["id"]
        assert gate.attributes["callgate.schema.version"] == event["schema"]["version"]
        timings = {
            key.removeprefix("callgate.phase_us."): value
            for key, value in gate.attributes.items()
            if key.startswith("callgate.phase_us.")
        }
        assert set(timings) == set(event["metrics"]["phases_us"])
        if call_id in UNTRACED:  # a trace of its own
            assert process.parent_span_id == ""
            assert process.links == ()
        else:  # the agent's trace continues: its producer span is the parent, and linked
            trace_id, span_id = agent.spans[call_id]
            assert (process.trace_id, process.parent_span_id) == (trace_id, span_id)
            assert process.links == ((trace_id, span_id),)
            assert event["traceparent"].split("-")[1:3] == [trace_id, span_id]
        if call_id == "keyed":  # decided by its key's owner, whose span continues the gate's
            (owner,) = [s for s in ours if s.name == f"process {requests_topic(group)}"]
            assert owner.parent_span_id == gate.span_id
            assert owner.attributes["callgate.idempotency.decision"] == "first"
            assert owner.attributes["gen_ai.tool.call.id"] == call_id
            named = owner
        else:
            named = gate
        assert traceparent_of(record) == (named.trace_id, named.span_id), (
            "the event's header names the span an executor continues"
        )
        assert gate.attributes["callgate.outcome"] == event["outcome"]
    ok, bad = gates["ok"], gates["bad"]
    assert ok.status == "STATUS_CODE_UNSET"
    assert bad.status == "STATUS_CODE_ERROR"
    assert (bad.attributes["callgate.phase"], bad.attributes["callgate.error_code"]) == (
        "schema_validation",
        "schema_violation",
    )
    assert orjson.loads(records["bad"].value)["error_code"] == "schema_violation"
    assert bad.attributes["error.type"] == "schema_violation"
