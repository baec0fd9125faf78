"""`CALLGATE_LOG__FORMAT=json` on a real worker: `callgate run` (a real process) on tansu, traced
to a real OpenTelemetry Collector, its stderr read line by line.

Every line the worker writes, from its start to its exit, is one JSON object with time, level,
logger and message. The line about a malformed record (the gate logs why it could not be read)
carries that call's ids as its outcome event states them, where the record was read, and the
ids of the gate's span that judged it: the trace of the record's `traceparent`, and the span
the event's header names.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.datafiles import SCHEMAS
from tests.runtime.test_tracing_collector import outcome_records, traceparent_of, weather
from tests.support.candidates import create
from tests.support.otel_collector import OtelCollector
from tests.support.workers import POLL_S, WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(180)]

TRACE = f"{uuid.uuid4().int:032x}"
TRACEPARENT = f"00-{TRACE}-{'ab' * 8}-01".encode()


def lines(worker: WorkerProcess) -> list[dict[str, Any]]:
    """The worker's whole lines so far, each parsed (a line that is not JSON fails here)."""
    text = worker.text()
    whole = text[: text.rfind("\n") + 1].splitlines()
    parsed = []
    for line in whole:
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise AssertionError(f"a line of {worker.name} is not JSON: {line!r}") from None
        assert isinstance(value, dict), line
        parsed.append(value)
    return parsed


async def wait_line(worker: WorkerProcess, prefix: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = [line for line in lines(worker) if line["message"].startswith(prefix)]
        if found:
            return found[0]
        assert worker.alive, worker.tail()
        assert time.monotonic() < deadline, f"no line {prefix!r}\n{worker.tail()}"
        await asyncio.sleep(POLL_S)


async def test_a_json_log_is_one_object_a_line_and_a_calls_line_carries_its_ids_and_span(
    bootstrap: str, otel_collector: OtelCollector, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    topics = {name: f"{name}-{run}" for name in ("input", "accepted", "rejected", "incomplete")}
    for name in topics.values():
        await create(bootstrap, name)
    config = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": f"g-{run}"},
        "topics": topics,
        "schemas": {"dir": str(SCHEMAS)},
        "idempotency": {"partitions": 2},
        "metrics": {"port": 0, "host": "127.0.0.1"},
        "tracing": {"enabled": True, "endpoint": otel_collector.otlp_http},
        "log": {"format": "json"},
    }
    worker = WorkerProcess("json-logs", config, tmp_path).start()
    try:
        await wait_line(worker, "assigned", timeout_s=60)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            headers = [("traceparent", TRACEPARENT)]
            for value in weather("s-ok", "ok", "celsius"):
                await producer.send_and_wait(topics["input"], value, key=b"s-ok", headers=headers)
            bad = await producer.send_and_wait(
                topics["input"], b'{"stream_id": "s-bad", "kind": ', key=b"s-bad", headers=headers
            )
        finally:
            await producer.stop()
        outcome_topics = [topics[k] for k in ("accepted", "rejected", "incomplete")]
        records = await outcome_records(bootstrap, outcome_topics, 2)
        malformed = await wait_line(worker, "malformed record", timeout_s=30)
        assert await worker.stop(timeout_s=30) == 0, worker.tail()
    finally:
        worker.cleanup()
    (record,) = [
        r for r in records.values() if orjson.loads(r.value).get("error_code") == "malformed_record"
    ]
    event = orjson.loads(record.value)
    assert malformed["level"] == "WARNING"
    assert malformed["logger"] == "callgate.gate"
    assert {k: malformed[k] for k in ("call_id", "stream_id", "event_id")} == {
        k: event[k] for k in ("call_id", "stream_id", "event_id")
    }
    assert (malformed["topic"], malformed["partition"], malformed["offset"]) == (
        topics["input"],
        bad.partition,
        bad.offset,
    )
    assert (malformed["trace_id"], malformed["span_id"]) == traceparent_of(record), (
        "the line names the gate span that judged the call"
    )
    assert malformed["trace_id"] == TRACE
    every = lines(worker)
    assert len(every) > 3
    for line in every:
        assert {"time", "level", "logger", "message"} <= set(line), line
        assert line["level"] in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
    assert [line for line in every if line["message"].startswith("assigned")]
