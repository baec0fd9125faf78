"""Shadow mode on real brokers (tansu and Apache Kafka): `callgate run` with candidate contracts.

One worker process judges the candidates' traffic (tests/support/candidates.py) with
`CALLGATE_SHADOW__SCHEMAS` set to the shipped contracts with `units` tightened to celsius and
`CALLGATE_SHADOW__TOPIC` set. Every call's event is what the current contracts decide (the
fahrenheit calls stay accepted); the shadow topic holds exactly one record per fahrenheit call,
`accepted_to_rejected`, and nothing else; the worker's `/metrics` count every call by kind,
the flips exactly those calls. A candidate equal to the current contracts writes nothing to the
shadow topic and counts no flip.
"""

from __future__ import annotations

import re
import shutil
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from tests.datafiles import SCHEMAS
from tests.support.candidates import PARTITIONS, SEED, T0, Part, celsius_only, create, produce
from tests.support.traffic import IDLE_TIMEOUT_S, step_for
from tests.support.workers import WorkerProcess
from worker.core.flips import FLIPS

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(240)]

METRICS = re.compile(r"health and metrics on http://[^:]+:(\d+)/")


class Follower:
    """Reads topics from their start while the worker runs; `caught_up` once every position
    reaches the end the latest fetch reports (a reader's own end, tansu's ListOffsets being
    short of the log's)."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self.tps = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
        self.records: list[Any] = []

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.assign(self.tps)
        for tp in self.tps:
            self.consumer.seek(tp, 0)

    async def poll(self) -> None:
        for batch in (await self.consumer.getmany(timeout_ms=200)).values():
            self.records.extend(batch)

    async def caught_up(self) -> bool:
        for tp in self.tps:
            end = self.consumer.highwater(tp)
            if end is None or await self.consumer.position(tp) < end:
                return False
        return True

    def of(self, topic: str) -> list[Any]:
        return [record for record in self.records if record.topic == topic]


def scrape(port: int) -> dict[str, float]:
    """`callgate_shadow_calls_total` by kind, summed over tools and versions."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "callgate_shadow_calls_total":
                counts[sample.labels["kind"]] += sample.value
    return dict(counts)


def flips_counted(counts: dict[str, float]) -> int:
    """The calls the worker counted as flipped: one shadow record each."""
    return round(sum(n for kind, n in counts.items() if kind in FLIPS))


async def run_shadowed(
    bootstrap: str, candidate: Path, tmp_path: Path
) -> tuple[Part, dict[str, Any], list[Any], dict[str, float]]:
    """The traffic judged by one shadowed worker: the traffic, each call's outcome event, the
    shadow topic's records, the shadow counts by kind."""
    run = uuid.uuid4().hex[:8]
    part = Part(run, SEED)
    topics = {
        name: f"{name}-{run}" for name in ("input", "accepted", "rejected", "incomplete", "shadow")
    }
    for name in topics.values():
        await create(bootstrap, name)
    config = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": f"g-{run}"},
        "topics": {key: value for key, value in topics.items() if key != "shadow"},
        "schemas": {"dir": str(SCHEMAS)},
        "shadow": {"schemas": str(candidate), "topic": topics["shadow"]},
        "assembly": {"idle_timeout_s": IDLE_TIMEOUT_S},
        "idempotency": {"partitions": 2},
        "metrics": {"port": 0, "host": "127.0.0.1"},
    }
    worker = WorkerProcess("shadowed", config, tmp_path).start()
    follower = Follower(bootstrap, [t for k, t in topics.items() if k != "input"])
    try:
        await worker.wait_log("callgate.worker: assigned", timeout_s=60)
        await produce(
            bootstrap, topics["input"], part.messages, T0, step_ms=step_for(part.messages)
        )
        await follower.start()
        port = int(METRICS.findall(worker.text())[-1])
        events: dict[str, Any] = {}
        deadline = time.monotonic() + 120
        # every call's event, and every shadow record the worker counted (written beside the
        # events, it may be readable a moment after them: a reader caught up with the shadow
        # topic's end as its last fetch saw it can be short of them)
        while (
            len(events) < len(part.expected)
            or len(follower.of(topics["shadow"])) < flips_counted(scrape(port))
            or not await follower.caught_up()
        ):
            assert worker.alive, worker.tail()
            assert time.monotonic() < deadline, (
                f"{len(events)} of {len(part.expected)} calls have events, "
                f"{len(follower.of(topics['shadow']))} shadow records of "
                f"{flips_counted(scrape(port))} counted\n{worker.tail()}"
            )
            await follower.poll()
            outcomes = (topics[k] for k in ("accepted", "rejected", "incomplete"))
            wanted = set(outcomes)
            events = {
                orjson.loads(r.value)["call_id"]: orjson.loads(r.value)
                for r in follower.records
                if r.topic in wanted
            }
        counts = scrape(port)
        assert await worker.stop(timeout_s=30) == 0, worker.tail()
    finally:
        worker.cleanup()
        await follower.consumer.stop()
    return part, events, follower.of(topics["shadow"]), counts


async def test_a_tightened_enum_is_shadowed_without_changing_a_verdict(
    broker: str, tmp_path: Path
) -> None:
    part, events, shadowed, counts = await run_shadowed(broker, celsius_only(tmp_path), tmp_path)
    assert set(events) == set(part.expected)
    for call in part.fahrenheit:  # the current contracts decide: still accepted
        assert events[call]["outcome"] == "accepted", events[call]
    assert {record.key.decode() for record in shadowed} == part.fahrenheit
    assert len(shadowed) == len(part.fahrenheit), "one record per flipped call"
    for record in shadowed:
        flip = orjson.loads(record.value)
        assert flip["kind"] == "accepted_to_rejected"
        assert dict(record.headers)["kind"] == b"accepted_to_rejected"
        assert flip["event_id"] == events[flip["call_id"]]["event_id"]
        assert [(v["path"], v["keyword"]) for v in flip["candidate"]["violations"]] == [
            ("/units", "enum")
        ]
        assert b"city" not in record.value  # no argument value, nor a name of one
    flipped = {kind: n for kind, n in counts.items() if kind in FLIPS and n}
    assert flipped == {"accepted_to_rejected": len(part.fahrenheit)}
    unchanged = {kind: n for kind, n in counts.items() if kind not in FLIPS and n}
    assert unchanged == part.unchanged(keys_decided=False)


async def test_a_candidate_equal_to_the_current_contracts_flips_nothing(
    broker: str, tmp_path: Path
) -> None:
    same = tmp_path / "same"
    shutil.copytree(SCHEMAS, same)
    part, events, shadowed, counts = await run_shadowed(broker, same, tmp_path)
    assert set(events) == set(part.expected)
    assert shadowed == []
    assert not any(n for kind, n in counts.items() if kind in FLIPS)
    assert sum(counts.values()) == len(part.expected)
