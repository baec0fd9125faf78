"""Consume-only: how fast this client reads the input, and nothing else (the read ceiling).

`python -m benchmarks.consume BOOTSTRAP GROUP INPUT TOTAL`, its own process like the others,
with the worker's consumer options. It fetches until it has read TOTAL records, commits
nothing and writes nothing, then prints one JSON line: the records read, those of the first
non-empty fetch, and the wall-clock seconds from that fetch to the one that reached TOTAL.
"""

from __future__ import annotations

import asyncio
import sys
import time

import orjson
from aiokafka import AIOKafkaConsumer

from worker.runtime.kafka_options import consumer_options
from worker.settings import load_settings


async def consume(bootstrap: str, group: str, source: str, total: int) -> dict[str, float]:
    settings = load_settings(kafka={"bootstrap_servers": [bootstrap], "group_id": group})
    kafka = settings.kafka
    # the worker places each partition itself (no automatic reset); this baseline has no
    # checkpoints and reads a new group from the start
    options = {**consumer_options(settings), "auto_offset_reset": "earliest"}
    consumer = AIOKafkaConsumer(source, **options)
    await consumer.start()
    read = first_batch = 0
    started = ended = 0.0
    try:
        while read < total:
            batch = await consumer.getmany(
                timeout_ms=kafka.fetch_timeout_ms, max_records=kafka.fetch_max_records
            )
            count = sum(len(records) for records in batch.values())
            if not count:
                continue
            if not read:
                started, first_batch = time.time(), count
            read += count
            ended = time.time()
    finally:
        await consumer.stop()
    return {"records": read, "first_batch": first_batch, "window_s": ended - started}


def main(argv: list[str]) -> int:
    bootstrap, group, source, total = argv
    result = asyncio.run(consume(bootstrap, group, source, int(total)))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
