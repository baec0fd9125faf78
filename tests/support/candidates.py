"""Traffic for the tests of candidate contracts (`callgate replay --topic`, shadow mode), on a
real broker: weather calls in celsius, fahrenheit and kelvin among the process tests' mix, what
each call must come to, the candidate that tightens `units` to celsius (so exactly the
fahrenheit calls flip), and a producer that writes each record with a record time of its own.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
from collections import Counter
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.datafiles import SCHEMAS
from tests.support.traffic import Expect, Message, end, envelopes, interleave, key_pairs, mixed
from worker._native import partition_for_key

PARTITIONS = 3
SEED = int(os.environ.get("TEST_SEED", "20250612"))
#: record time of the traffic's first part, and of its second (an hour later)
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
T1 = T0 + 3_600_000


def units_only(tmp_path: Path, *units: str) -> Path:
    """The shipped contracts (plugins included) with get_weather's units narrowed to `units`."""
    target = tmp_path / "candidate"
    shutil.copytree(SCHEMAS, target)
    for version in (1, 2):
        path = target / "weather" / f"get_weather.v{version}.schema.json"
        schema = orjson.loads(path.read_bytes())
        schema["properties"]["units"]["enum"] = list(units)
        path.write_bytes(orjson.dumps(schema))
    return target


def celsius_only(tmp_path: Path) -> Path:
    """The candidate of these tests: the traffic's fahrenheit calls flip."""
    return units_only(tmp_path, "celsius")


class Part:
    """Some whole streams of traffic, and what each of their calls must come to."""

    def __init__(self, run: str, seed: int, *, calls: int = 240, keyed: int = 8) -> None:
        rng = random.Random(seed)
        base = mixed(f"{run}:m", calls, seed=seed)
        keys = key_pairs(f"{run}:k", keyed, PARTITIONS, seed=seed)
        self.expected: dict[str, Expect] = {**base.expected, **keys.expected}
        self.fahrenheit: set[str] = set()
        streams: list[list[Message]] = []
        for s in range(40):
            stream = f"{run}:w{s}"
            records: list[Message] = []
            for c in range(rng.randint(1, 4)):
                call = f"{stream}:c{c}"
                units = rng.choice(["celsius", "fahrenheit", "kelvin"])
                args = orjson.dumps({"city": f"city{s}-{c}", "units": units}).decode()
                version = rng.choice(["1", "2", None])
                records += envelopes(
                    stream, call, "get_weather", args, parts=rng.randint(1, 4), version=version
                )
                if units == "kelvin":
                    self.expected[call] = Expect("rejected", "schema_violation")
                else:
                    self.expected[call] = Expect("accepted")
                if units == "fahrenheit":
                    self.fahrenheit.add(call)
            records.append(end(stream))
            streams.append(records)
        self.messages = base.messages + keys.messages + interleave(streams, 20, rng)

    def unchanged(self, *, keys_decided: bool = True) -> Counter[str]:
        """What the calls other than the fahrenheit ones come to under both contract sets: of
        a key's two calls one is accepted and one refused once the key's owner decided
        (`callgate replay`); before (the worker's shadow mode), both are accepted."""
        counts: Counter[str] = Counter()
        for call, expect in self.expected.items():
            if call in self.fahrenheit:
                continue
            if expect.outcome == "keyed":
                counts[f"keyed:{expect.key}"] += 1
                continue
            counts[f"{expect.outcome}_unchanged"] += 1
        keyed = [name for name in counts if name.startswith("keyed:")]
        for name in keyed:
            assert counts.pop(name) == 2
            counts["accepted_unchanged"] += 1
            counts["rejected_unchanged" if keys_decided else "accepted_unchanged"] += 1
        return counts


async def create(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def send_all(
    producer: AIOKafkaProducer,
    topic: str,
    messages: list[Message],
    base_ms: int,
    partitions: int = PARTITIONS,
    *,
    step_ms: int = 1,
) -> None:
    """Each record to its key's partition, the i-th at `base_ms + i * step_ms` of record time,
    all of them acknowledged."""
    sent = [
        await producer.send(
            topic,
            message.value,
            key=message.key,
            headers=list(message.headers) or None,
            partition=partition_for_key(message.key, partitions),
            timestamp_ms=base_ms + index * step_ms,
        )
        for index, message in enumerate(messages)
    ]
    await asyncio.gather(*sent)


async def produce(
    bootstrap: str,
    topic: str,
    messages: list[Message],
    base_ms: int,
    partitions: int = PARTITIONS,
    *,
    step_ms: int = 1,
) -> None:
    """`messages` acknowledged, the i-th at `base_ms + i * step_ms` of record time."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        await send_all(producer, topic, messages, base_ms, partitions, step_ms=step_ms)
    finally:
        await producer.stop()
