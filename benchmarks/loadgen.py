"""The latency runs' paced load generator, in a process of its own.

`python -m benchmarks.loadgen BOOTSTRAP TOPIC REPORT LOAD` (LOAD: a `Load` as JSON) makes its
calls with `benchmarks.workload` (the same call ids as any process that makes them from the same
`Load`), then sends them paced: each tick's records as one batch per partition (acks=all,
no linger), sleeping to the schedule between ticks. Once every batch is acknowledged it writes
REPORT (JSON): per call, when its last chunk was sent and when it was acknowledged, how far the
generator fell behind its schedule at worst, the rate it achieved, and the seconds it took; and
the ticks it was latest at (`WORST_TICKS`), each with how long its own sends took (building its
batches and waiting for the producer to take them: aiokafka takes a partition's batch once the
one before it was sent, and sends a broker one request at a time, the next once the last is
answered). A late tick whose sends took about as long as it was late
was held up handing batches over; one whose sends were quick was late already when it began.

The times are `time.monotonic()`: CLOCK_MONOTONIC is one clock for the whole system on Linux,
so the process that tails the outcome events compares its own readings of it with these.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from benchmarks import workload
from benchmarks.workload import Record
from worker._native import partition_for_key

#: a tick's records by partition, each with the id of the call whose last chunk it is (or None)
Tick = dict[int, list[tuple[Record, str | None]]]
#: how many of the ticks it was latest at the report describes (the latest first)
WORST_TICKS = 5


@dataclass(frozen=True, slots=True)
class Load:
    """What a generator sends: `calls` small calls (`invalid_share` of them invalid), ids
    starting with `prefix`, `fragments` chunks each, keyed to `partitions` partitions, at
    `rate` records a second in ticks of `tick_s`."""

    calls: int
    prefix: str
    rate: float
    partitions: int
    fragments: int
    invalid_share: float
    tick_s: float

    def records(self) -> list[Record]:
        work = workload.calls(workload.SMALL, self.calls, self.invalid_share, prefix=self.prefix)
        return workload.records(work, self.fragments)

    def scheduled_s(self) -> float:
        """How long the schedule lasts: the seconds of a generator that keeps it."""
        return self.calls * self.fragments / self.rate

    def command(self, bootstrap: str, topic: str, report: Path) -> list[str]:
        """How this interpreter runs a generator of this load (from the repository's root)."""
        load_json = orjson.dumps(asdict(self)).decode()
        return [
            sys.executable,
            "-m",
            "benchmarks.loadgen",
            bootstrap,
            topic,
            str(report),
            load_json,
        ]


def partitioned(records: list[Record], partitions: int) -> dict[int, list[Record]]:
    """Each record in its stream's partition (Kafka's default partitioner on the key)."""
    out: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    for record in records:
        assert record.key is not None
        out[partition_for_key(record.key, partitions)].append(record)
    return out


def records_per_tick(load: Load) -> int:
    return max(1, round(load.rate * load.tick_s))


def _call_ended(record: Record) -> str | None:
    """The id of the call whose last chunk `record` is, or None."""
    envelope = orjson.loads(record.value or b"")
    return envelope["call_id"] if envelope["final"] else None


def ticks(load: Load) -> list[Tick]:
    """The load's records tick by tick, made before the clock starts."""
    records = load.records()
    per_tick = records_per_tick(load)
    out = []
    for start in range(0, len(records), per_tick):
        by_partition = partitioned(records[start : start + per_tick], load.partitions)
        out.append(
            {
                partition: [(record, _call_ended(record)) for record in chunk]
                for partition, chunk in by_partition.items()
                if chunk
            }
        )
    return out


async def generate(bootstrap: str, topic: str, load: Load) -> dict[str, Any]:
    """Sends `load` to `topic` on its schedule; the report of how it went."""
    schedule = ticks(load)
    per_tick = records_per_tick(load)
    sent: dict[str, float] = {}
    acked: dict[str, float] = {}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks="all")
    await producer.start()
    try:
        await producer.partitions_for(topic)  # the topic's metadata, before the clock starts
        # the schedule (millions of objects at half rate) lives to the end: frozen, it is left
        # out of the collector's full passes, which would otherwise stall ticks
        gc.collect()
        gc.freeze()

        async def submit(batch: Any, partition: int, finals: list[str]) -> asyncio.Future[Any]:
            now = time.monotonic()
            for call_id in finals:
                sent[call_id] = now
            future: asyncio.Future[Any] = await producer.send_batch(
                batch, topic, partition=partition
            )

            def on_ack(_: asyncio.Future[Any]) -> None:
                at = time.monotonic()
                for call_id in finals:
                    acked[call_id] = at

            future.add_done_callback(on_ack)
            return future

        started = time.monotonic()
        behind = 0.0  # how far the generator fell behind its schedule at worst
        late: list[tuple[float, float, int]] = []  # (behind, waited for the producer, tick)
        pending: list[asyncio.Future[Any]] = []
        for number, tick in enumerate(schedule, start=1):
            tick_began = time.monotonic()
            for partition, entries in tick.items():
                batch = producer.create_batch()
                finals: list[str] = []
                for record, ends in entries:
                    while (
                        batch.append(key=record.key, value=record.value, timestamp=None, headers=[])
                        is None
                    ):  # the builder is full: send it, the record goes into the next one
                        pending.append(await submit(batch, partition, finals))
                        batch, finals = producer.create_batch(), []
                    if ends is not None:
                        finals.append(ends)
                pending.append(await submit(batch, partition, finals))
            now = time.monotonic()
            delay = started + number * per_tick / load.rate - now
            behind = max(behind, -delay)
            if delay < 0:
                late.append((-delay, now - tick_began, number))
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.gather(*pending)
        seconds = time.monotonic() - started
    finally:
        await producer.stop()
    records = sum(len(entries) for tick in schedule for entries in tick.values())
    return {
        "records": records,
        "calls": len(acked),
        "sent": sent,
        "acked": acked,
        "behind_s": behind,
        "achieved_records_per_s": records / seconds,
        "seconds": seconds,
        "ticks": len(schedule),
        "late_ticks": len(late),
        "worst_ticks": [
            {"tick": number, "behind_s": lateness, "sending_s": sending}
            for lateness, sending, number in sorted(late, reverse=True)[:WORST_TICKS]
        ],
    }


def main(argv: list[str]) -> int:
    bootstrap, topic, report_file, load_json = argv
    load = Load(**orjson.loads(load_json))
    report = asyncio.run(generate(bootstrap, topic, load))
    Path(report_file).write_bytes(orjson.dumps(report))
    print(
        f"sent {report['records']} records of {report['calls']} calls in {report['seconds']:.1f} s"
        f" ({report['achieved_records_per_s']:.0f}/s of {load.rate:.0f}/s), at worst"
        f" {report['behind_s'] * 1000:.1f} ms behind schedule",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
