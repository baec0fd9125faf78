"""Traces of the calls in the worker's rounds (`worker.runtime.tracing`), on the in-memory Kafka,
with the OpenTelemetry SDK recording into its own in-memory exporter (the real collector is in
tests/runtime/test_tracing_collector.py).

Each call gets `process <input topic>` (CONSUMER, the messaging attributes, the record's
`traceparent` as parent and link) and its child `execute_tool <tool>` (the verdict); the
outcome record's `traceparent` header names the child. A keyed call's request carries it to its
key's owner, whose span continues it; a substitute keeps it; an unsampled trace is propagated
and not recorded. With tracing off nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest
from aiokafka.errors import RecordTooLargeError
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, StatusCode

from tests.datafiles import REPO
from tests.runtime.fakes import FakeBroker, FakeKafka, FakeRecord
from tests.runtime.test_worker import (
    ACCEPTED,
    GROUP,
    INCOMPLETE,
    INPUT,
    PARTITIONS,
    REJECTED,
    envelope,
    make_settings,
    new_broker,
    payment_call,
    run_until_idle,
)
from worker.compose import build_key_store, build_processor, build_registry, tool_labels
from worker.metrics import Metrics
from worker.runtime.topics import requests_topic
from worker.runtime.tracing import CallTracing
from worker.runtime.worker import Worker

OUTCOMES = (ACCEPTED, REJECTED, INCOMPLETE)


def traceparent(trace: int, span: int, flags: int = 1) -> bytes:
    return f"00-{trace:032x}-{span:016x}-{flags:02x}".encode()


class Traced:
    """A worker whose calls are traced into an in-memory exporter."""

    def __init__(self, broker: FakeBroker, *, ratio: float = 1.0) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        settings = make_settings()
        registry = build_registry(settings)
        self.worker = Worker(
            settings,
            build_processor(settings, registry),
            lambda: build_key_store(settings),
            Metrics(tool_labels(registry)),
            kafka=FakeKafka(broker, GROUP),  # type: ignore[arg-type]
            tracing=CallTracing(provider, group=GROUP, client_id="callgate"),
        )
        self.broker = broker

    async def run(self) -> None:
        await self.worker.start()
        await run_until_idle(self.worker, self.broker)
        await self.worker.close()

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


def append(broker: FakeBroker, stream: str, values: list[bytes], header: bytes | None) -> int:
    """A stream's records on its partition, each with `traceparent` when given; the last one's
    offset (the record that closes the call)."""
    partition = sum(stream.encode()) % PARTITIONS
    headers = [("traceparent", header)] if header is not None else []
    offset = -1
    for value in values:
        offset = broker.append(
            INPUT, partition, key=stream.encode(), value=value, headers=headers, timestamp=1000
        )
    return offset


def weather(stream: str, call: str, units: str) -> list[bytes]:
    text = orjson.dumps({"city": "Oslo", "units": units}).decode()
    return [
        envelope(stream, call, 0, text[:9], tool="get_weather", tool_version="1"),
        envelope(stream, call, 1, text[9:], final=True),
    ]


def outputs(broker: FakeBroker, topics: tuple[str, ...] = OUTCOMES) -> dict[str, FakeRecord]:
    """Each call's outcome record (exactly one each), by call id."""
    found: dict[str, FakeRecord] = {}
    for topic in topics:
        for record in broker.records(topic):
            assert record.value is not None
            call_id = orjson.loads(record.value)["call_id"]
            assert call_id not in found, f"{call_id} written twice"
            found[call_id] = record
    return found


def header_of(record: FakeRecord) -> str:
    (value,) = [v for k, v in record.headers if k == "traceparent"]
    return value.decode()


def named(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def by_call(spans: list[ReadableSpan]) -> dict[str, tuple[ReadableSpan, ReadableSpan]]:
    """Each call's (process span, gate span), the gate found by its call id and parent."""
    by_id = {s.get_span_context().span_id: s for s in spans}  # type: ignore[union-attr]
    pairs: dict[str, tuple[ReadableSpan, ReadableSpan]] = {}
    for gate in spans:
        if gate.kind is not SpanKind.INTERNAL:
            continue
        assert gate.parent is not None
        process = by_id[gate.parent.span_id]
        call_id = gate.attributes["gen_ai.tool.call.id"]  # type: ignore[index]
        assert isinstance(call_id, str)
        assert call_id not in pairs
        pairs[call_id] = (process, gate)
    return pairs


@pytest.mark.asyncio
async def test_each_call_continues_its_records_trace_and_its_event_names_the_gate_span() -> None:
    broker = new_broker()
    parents = {
        "ok": (0xA1, 0xB1),
        "bad": (0xA2, 0xB2),
    }
    given = {
        "ok": traceparent(*parents["ok"]),
        "bad": traceparent(*parents["bad"]),
        "junk": b"00-not-a-trace",
    }
    units = {"bad": "kelvin"}
    last = {
        call: append(
            broker,
            f"s-{call}",
            weather(f"s-{call}", call, units.get(call, "celsius")),
            given.get(call),
        )
        for call in ("ok", "bad", "bare", "junk")
    }
    traced = Traced(broker)
    await traced.run()
    spans = traced.spans()
    pairs = by_call(spans)
    assert set(pairs) == set(last)
    assert len(spans) == 2 * len(last), "two spans a call, nothing else"
    records = outputs(broker)
    for call_id, (process, gate) in pairs.items():
        record = records[call_id]
        partition = record_partition(call_id)
        assert process.name == f"process {INPUT}"
        assert process.kind is SpanKind.CONSUMER
        assert dict(process.attributes or {}) == {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": INPUT,
            "messaging.destination.partition.id": str(partition),
            "messaging.kafka.offset": last[call_id],
            "messaging.consumer.group.name": GROUP,
            "messaging.client.id": "callgate",
        }
        assert gate.name == "execute_tool get_weather"
        attributes = dict(gate.attributes or {})
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert attributes["gen_ai.tool.name"] == "get_weather"
        event = orjson.loads(record.value or b"")
        assert attributes["callgate.event_id"] == event["event_id"]
        assert attributes["callgate.outcome"] == event["outcome"]
        assert attributes["callgate.schema.id"] == event["schema"]["id"]
        assert attributes["callgate.schema.version"] == event["schema"]["version"]
        phases = {k.removeprefix("callgate.phase_us."): v for k, v in attributes.items()
                  if k.startswith("callgate.phase_us.")}  # fmt: skip
        assert phases == event["metrics"]["phases_us"]
        # the gate ran inside the process span, which ended after it
        assert process.start_time <= gate.start_time <= gate.end_time <= process.end_time  # type: ignore[operator]
        assert header_of(record) == named(gate), "the event names the gate's span"
        sent = given.get(call_id)
        assert event.get("traceparent") == (sent.decode() if sent else None), "as it came"
    for call_id, (trace_id, span_id) in parents.items():
        process, gate = pairs[call_id]
        assert process.context.trace_id == trace_id  # type: ignore[union-attr]
        assert process.parent is not None
        assert process.parent.span_id == span_id
        assert process.parent.is_remote
        assert [(link.context.trace_id, link.context.span_id) for link in process.links] == [
            (trace_id, span_id)
        ]
    for call_id in ("bare", "junk"):  # no valid context: a trace of its own, nothing linked
        process, _ = pairs[call_id]
        assert process.parent is None
        assert process.links == ()
        assert process.context.trace_id not in {t for t, _ in parents.values()}  # type: ignore[union-attr]
    _, accepted = pairs["ok"]
    assert accepted.status.status_code is StatusCode.UNSET
    assert "error.type" not in (accepted.attributes or {})
    _, rejected = pairs["bad"]
    assert rejected.status.status_code is StatusCode.ERROR
    attributes = dict(rejected.attributes or {})
    event = orjson.loads(records["bad"].value or b"")
    assert (
        (attributes["callgate.phase"], attributes["callgate.error_code"])
        == (
            event["phase"],
            event["error_code"],
        )
        == ("schema_validation", "schema_violation")
    )
    assert attributes["error.type"] == "schema_violation"
    assert attributes["callgate.retryable"] is True


def record_partition(call_id: str) -> int:
    return sum(f"s-{call_id}".encode()) % PARTITIONS


@pytest.mark.asyncio
async def test_a_record_that_cannot_be_read_continues_the_trace_of_its_header() -> None:
    broker = new_broker()
    unreadable = b'{"stream_id": "s-junk", "kind": '
    offset = append(broker, "s-junk", [unreadable], traceparent(0x91, 0x92))
    traced = Traced(broker)
    await traced.run()
    (record,) = broker.records(REJECTED)
    event = orjson.loads(record.value or b"")
    assert event["error_code"] == "malformed_record"
    process, gate = by_call(traced.spans())[event["call_id"]]
    assert process.context.trace_id == 0x91  # type: ignore[union-attr]
    assert process.parent is not None
    assert process.parent.span_id == 0x92
    assert [link.context.span_id for link in process.links] == [0x92]
    assert (process.attributes or {})["messaging.kafka.offset"] == offset
    assert gate.name == "execute_tool", "no tool could be read"
    assert (gate.attributes or {})["callgate.error_code"] == "malformed_record"
    assert header_of(record) == named(gate)


@pytest.mark.asyncio
async def test_a_keyed_call_is_continued_by_its_keys_owner() -> None:
    broker = new_broker()
    append(broker, "p0", payment_call("p0", "first", "k1", 100), traceparent(0xC1, 0xD1))
    append(broker, "p1", payment_call("p1", "again", "k1", 100), traceparent(0xC2, 0xD2))
    traced = Traced(broker)
    await traced.run()
    spans = traced.spans()
    pairs = by_call(spans)
    assert set(pairs) == {"first", "again"}
    requests = broker.records(requests_topic(GROUP))
    assert len(requests) == 2
    gates = {named(gate): call for call, (_, gate) in pairs.items()}
    request_of = {gates[header_of(r)]: r for r in requests}
    assert set(request_of) == {"first", "again"}, "each request names its call's gate span"
    owners = [s for s in spans if s.name == f"process {requests_topic(GROUP)}"]
    assert len(owners) == 2
    records = outputs(broker)
    for owner in owners:
        call_id = (owner.attributes or {})["gen_ai.tool.call.id"]
        assert isinstance(call_id, str)
        _, gate = pairs[call_id]
        assert owner.kind is SpanKind.CONSUMER
        assert owner.parent is not None
        assert (owner.parent.trace_id, owner.parent.span_id) == (
            gate.context.trace_id,  # type: ignore[union-attr]
            gate.context.span_id,  # type: ignore[union-attr]
        )
        assert header_of(records[call_id]) == named(owner), "the event names the owner's span"
        attributes = owner.attributes or {}
        assert attributes["messaging.kafka.offset"] == request_of[call_id].offset
        event = orjson.loads(records[call_id].value or b"")
        assert attributes["callgate.outcome"] == event["outcome"]
    decisions = sorted(str((o.attributes or {})["callgate.idempotency.decision"]) for o in owners)
    assert decisions == ["duplicate", "first"]
    (duplicate,) = [o for o in owners if (o.attributes or {}).get("error.type") == "duplicate"]
    assert duplicate.status.status_code is StatusCode.ERROR


@pytest.mark.asyncio
async def test_a_substitute_keeps_the_trace_of_the_call_it_replaces() -> None:
    broker = new_broker()
    append(broker, "s-1", weather("s-1", "c1", "celsius"), traceparent(0xE1, 0xF1))
    broker.fail_topic(ACCEPTED, RecordTooLargeError())
    traced = Traced(broker)
    await traced.run()
    (record,) = broker.records(REJECTED)
    event = orjson.loads(record.value or b"")
    assert event["error_code"] == "output_refused"
    (_, gate), = by_call(traced.spans()).values()  # fmt: skip
    assert header_of(record) == named(gate)


@pytest.mark.asyncio
async def test_an_unsampled_trace_is_propagated_and_not_recorded() -> None:
    broker = new_broker()
    append(broker, "s-1", weather("s-1", "c1", "celsius"), traceparent(0x71, 0x72, flags=0))
    append(broker, "s-2", weather("s-2", "c2", "celsius"), None)
    traced = Traced(broker, ratio=0.0)
    await traced.run()
    assert traced.spans() == []
    records = outputs(broker)
    continued = header_of(records["c1"]).split("-")
    assert continued[1] == f"{0x71:032x}", "the same trace"
    assert int(continued[3], 16) & 1 == 0, "not sampled"
    assert continued[2] != f"{0x72:016x}", "a span of its own"
    started = header_of(records["c2"]).split("-")
    assert int(started[3], 16) & 1 == 0


def python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` run by a fresh interpreter in the repository, no `CALLGATE_*` set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_tracing_off_imports_nothing_of_opentelemetry() -> None:
    done = python(
        "import sys\n"
        "from worker.compose import build_tracing\n"
        "from worker.runtime.serve import serve\n"
        "from worker.settings import load_settings\n"
        "assert build_tracing(load_settings()) is None\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    assert done.returncode == 0, done.stderr


def test_tracing_on_without_the_otel_extra_is_refused_by_name() -> None:
    done = python(
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if the extra were not installed\n"
        "from worker.compose import build_tracing\n"
        "from worker.errors import ConfigError\n"
        "from worker.settings import load_settings\n"
        "try:\n"
        "    build_tracing(load_settings(tracing={'enabled': True}))\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'callgate[otel]'" in done.stdout
    assert "opentelemetry" in done.stdout
