"""Benchmark 2: end to end on the embedded broker, `callgate run` against the stack's pass-through.

One tansu broker (callgate_demo.broker, a free loopback port, only its pid stopped). Per
repeat, fresh topics get the same pre-loaded input: canonical envelopes of small get_weather
calls (20 % invalid), 10 fragments each, many streams interleaved. Then, one after the other,
two consumer processes drain it from offset 0:

- pass-through (`benchmarks.passthrough`): forwards every record, batched produce, commit per
  batch: the ceiling of this client library on this broker;
- `python -m worker run`: the worker, one outcome event per call.

Rate = input records / (the last output's broker timestamp - the first output's), so that the
group join (seconds on tansu) and process start are outside both windows. Done = the group's
committed offset reached the end of the input (polled, so the benchmark does not compete for
CPU). The figure is callgate's rate as a share of the pass-through's.

Latency: a fresh worker, calls produced paced at half of callgate's measured rate; per call,
from the acknowledgement of its last chunk to its outcome event read by a tail consumer: p50, p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from benchmarks import workload
from benchmarks.common import ROOT, SEED_SCHEMAS, median
from callgate_demo.broker import EmbeddedBroker
from worker.runtime.admin import create_topics

FRAGMENTS = 10
PYTHON = sys.executable


def _worker_env(bootstrap: str, group: str, source: str, target: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "CALLGATE_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "CALLGATE_KAFKA__GROUP_ID": group,
            "CALLGATE_TOPICS__INPUT": source,
            "CALLGATE_TOPICS__ACCEPTED": target,
            "CALLGATE_TOPICS__REJECTED": target,
            "CALLGATE_TOPICS__INCOMPLETE": target,
            "CALLGATE_SCHEMAS__DIR": str(SEED_SCHEMAS),
            "CALLGATE_SCHEMAS__ENGINE": "jsonschema-rs",
            "CALLGATE_METRICS__PORT": "0",
            "CALLGATE_LOG_LEVEL": "WARNING",
        }
    )
    return env


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            command,
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


async def _produce(bootstrap: str, topic: str, records: list[workload.InboundRecord]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks="all")
    await producer.start()
    try:
        step = 5000
        for start in range(0, len(records), step):
            sends = [
                await producer.send(topic, r.value, key=r.key)
                for r in records[start : start + step]
            ]
            await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def _committed(consumer: AIOKafkaConsumer, topic: str) -> int:
    return (await consumer.committed(TopicPartition(topic, 0))) or 0


async def _wait_committed(
    bootstrap: str,
    group: str,
    *,
    topic: str,
    target: int,
    process: subprocess.Popen[bytes],
    timeout_s: float,
) -> bool:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and process.poll() is None:
            if await _committed(consumer, topic) >= target:
                return True
            await asyncio.sleep(0.5)
        return False
    finally:
        await consumer.stop()


async def _output_window(
    bootstrap: str, topic: str, expected: int, timeout_s: float = 60
) -> tuple[int, float]:
    """(records read, seconds between the first and the last record's broker timestamp)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    first = last = None
    count = 0
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + timeout_s
        while count < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for records in batch.values():
                for record in records:
                    count += 1
                    first = record.timestamp if first is None else min(first, record.timestamp)
                    last = record.timestamp if last is None else max(last, record.timestamp)
    finally:
        await consumer.stop()
    if first is None or last is None:
        return count, float("nan")
    return count, (last - first) / 1000


async def _drain(
    bootstrap: str,
    kind: str,
    records: list[workload.InboundRecord],
    calls: int,
    logs: Path,
) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    source, target, group = f"bench.in.{run}", f"bench.out.{run}", f"bench-{kind}-{run}"
    await create_topics(bootstrap, [source, target])
    await _produce(bootstrap, source, records)
    if kind == "passthrough":
        command = [PYTHON, "-m", "benchmarks.passthrough", bootstrap, group, source, target]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        expected_out = len(records)
    else:
        command = [PYTHON, "-m", "worker", "run"]
        env = _worker_env(bootstrap, group, source, target)
        expected_out = calls
    process = _start(command, env, logs / f"{kind}-{run}.log")
    try:
        done = await _wait_committed(
            bootstrap, group, topic=source, target=len(records), process=process, timeout_s=300
        )
    finally:
        _stop(process)
    if not done:
        raise RuntimeError(f"{kind} did not drain {source}; see {logs}/{kind}-{run}.log")
    count, seconds = await _output_window(bootstrap, target, expected_out)
    return {
        "records_in": len(records),
        "records_out": count,
        "window_s": round(seconds, 3),
        "records_per_s": round(len(records) / seconds) if seconds > 0 else None,
    }


async def _latency(
    bootstrap: str, rate: float, seconds: float, logs: Path, prefix: str
) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    source, target, group = f"bench.lat.in.{run}", f"bench.lat.out.{run}", f"bench-lat-{run}"
    await create_topics(bootstrap, [source, target])
    process = _start(
        [PYTHON, "-m", "worker", "run"],
        _worker_env(bootstrap, group, source, target),
        logs / f"latency-{run}.log",
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks="all")
    # the tail asks the broker not to hold a fetch for long, so that it adds little of its own
    tail = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10
    )
    await producer.start()
    await tail.start()
    acked: dict[str, float] = {}
    seen: dict[str, float] = {}
    try:
        tp = TopicPartition(target, 0)
        tail.assign([tp])
        await tail.seek_to_beginning(tp)

        async def follow() -> None:
            while True:
                batch = await tail.getmany(timeout_ms=50)
                now = time.monotonic()
                for out in batch.values():
                    for record in out:
                        seen.setdefault(orjson.loads(record.value)["call_id"], now)

        follower = asyncio.create_task(follow())
        # warm-up: one call, until the worker has joined and answered it
        warm = workload.records(
            workload.calls(workload.SMALL, 1, 0.0, prefix=f"{prefix}w"), FRAGMENTS
        )
        for r in warm:
            await (await producer.send(source, r.value, key=r.key))
        deadline = time.monotonic() + 60
        while f"{prefix}w0" not in seen and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        calls = max(1, int(rate * seconds / FRAGMENTS))
        work = workload.calls(workload.SMALL, calls, 0.2, prefix=prefix)
        records = workload.records(work, FRAGMENTS)
        last_chunk = {}
        for r in records:
            envelope = orjson.loads(r.value)
            if envelope["final"]:
                last_chunk[r.offset] = envelope["call_id"]
        tick = 0.01
        per_tick = max(1, round(rate * tick))
        started = time.monotonic()
        for n in range(0, len(records), per_tick):
            group_records = records[n : n + per_tick]
            sends = [(r, await producer.send(source, r.value, key=r.key)) for r in group_records]
            for r, future in sends:
                await future
                call_id = last_chunk.get(r.offset)
                if call_id is not None:
                    acked[call_id] = time.monotonic()
            wake = started + (n + per_tick) / rate
            delay = wake - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        sent_s = time.monotonic() - started
        deadline = time.monotonic() + 30
        while len(set(acked) - set(seen)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    finally:
        await producer.stop()
        await tail.stop()
        _stop(process)
    latencies = sorted((seen[c] - t) * 1000 for c, t in acked.items() if c in seen)
    if not latencies:
        raise RuntimeError(f"no outcome seen; see {logs}")

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)

    return {
        "target_records_per_s": round(rate),
        "achieved_records_per_s": round(len(acked) * FRAGMENTS / sent_s) if sent_s > 0 else None,
        "calls": len(acked),
        "answered": len(latencies),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(latencies[-1], 2),
    }


async def _run(calls: int, repeats: int, latency_s: float, logs: Path) -> dict[str, Any]:
    rounds = []
    with EmbeddedBroker(log_file=logs / "tansu.log") as broker:
        bootstrap = broker.bootstrap_servers
        for n in range(repeats):
            records = workload.records(
                workload.calls(workload.SMALL, calls, 0.2, prefix=f"r{n}"), FRAGMENTS
            )
            passthrough = await _drain(bootstrap, "passthrough", records, calls, logs)
            callgate = await _drain(bootstrap, "callgate", records, calls, logs)
            rounds.append(
                {
                    "passthrough": passthrough,
                    "callgate": callgate,
                    "share_of_passthrough": round(
                        callgate["records_per_s"] / passthrough["records_per_s"], 3
                    ),
                }
            )
        best = median([r["callgate"]["records_per_s"] for r in rounds])
        latency = await _latency(bootstrap, best / 2, latency_s, logs, prefix="lat")
    return {
        "rounds": rounds,
        "passthrough_records_per_s": round(
            median([r["passthrough"]["records_per_s"] for r in rounds])
        ),
        "callgate_records_per_s": round(best),
        "share_of_passthrough": round(median([r["share_of_passthrough"] for r in rounds]), 3),
        "target_share": 0.6,
        "latency_at_half_rate": latency,
    }


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, Any]:
    calls = 300 if quick else 10_000
    latency_s = 2.0 if quick else 15.0
    logs = Path(tempfile.mkdtemp(prefix="callgate-bench-e2e-"))
    body = asyncio.run(_run(calls, repeats, latency_s, logs))
    body["meets_target"] = body["share_of_passthrough"] >= body["target_share"]
    return {
        "description": __doc__.split("\n\n")[0],
        "calls_per_round": calls,
        "fragments_per_call": FRAGMENTS,
        "records_per_round": calls * FRAGMENTS,
        "repeats": repeats,
        "statistic": "median of rounds; share = callgate records/s / pass-through records/s",
        "logs": str(logs),
        **body,
    }
