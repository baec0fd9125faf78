"""The pass-through limit of the stack: an aiokafka consumer that forwards every record it fetches.

Run as its own process (`python -m benchmarks.passthrough BOOTSTRAP GROUP INPUT OUTPUT`), like
`callgate run`: the same client library, the same consumer options (manual commits, earliest,
the same `max_poll_records`) and producer options (acks=all, the same linger), batched produce
(every send of a batch in flight at once), one commit per batch after the batch's acks. It does
no work per record beyond the copy, so its rate is the ceiling any worker on this stack can reach.
Stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from worker.runtime.kafka_options import consumer_options, producer_options
from worker.settings import load_settings


async def forward(bootstrap: str, group: str, source: str, target: str) -> None:
    settings = load_settings(kafka={"bootstrap_servers": [bootstrap], "group_id": group})
    consumer = AIOKafkaConsumer(source, **consumer_options(settings))
    producer = AIOKafkaProducer(**producer_options(settings))
    await producer.start()
    await consumer.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    timeout_ms = settings.kafka.fetch_timeout_ms
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=timeout_ms)
            if not batch:
                continue
            sends = [
                await producer.send(target, record.value, key=record.key)
                for records in batch.values()
                for record in records
            ]
            await asyncio.gather(*sends)
            await consumer.commit()
    finally:
        await consumer.stop()
        await producer.stop()


def main(argv: list[str]) -> int:
    bootstrap, group, source, target = argv
    asyncio.run(forward(bootstrap, group, source, target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
