"""Benchmark: the worker's topic check, asking for its topics by name against listing them all.

The worker checks that the topics it writes to exist every `topic_check_interval_ms` (100 ms by
default), on its event loop. `Kafka.missing_topics` asks the cluster for those topics by name
(one metadata request that creates nothing); the contender lists every topic of the cluster
(`AIOKafkaAdminClient.list_topics`, what the check did before) and looks for them in the list.
Both run on one fresh Apache Kafka broker, alternating, as the cluster grows (the topics made
for the run, 3 partitions each); the figures are the event loop's CPU time and the wall time
per check, and their ratio in the same run.
"""

from __future__ import annotations

import asyncio
import resource
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from benchmarks.common import median, paired_ratio
from benchmarks.e2e import broker
from worker.runtime.kafka import Kafka
from worker.settings import Settings

#: the topics one worker checks: three outcome topics, a changelog, the keys and requests
CHECKED = 6
PARTITIONS = 3
CONTENDERS = ("by name (the worker's check)", "listing every topic")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _per_check(check: Callable[[], Awaitable[list[str]]], calls: int) -> tuple[float, float]:
    """Wall and CPU milliseconds per check, over `calls` checks after a warm-up."""
    for _ in range(5):
        assert await check() == [], "every checked topic exists"
    wall, cpu = time.perf_counter(), _cpu_s()
    for _ in range(calls):
        await check()
    return (
        (time.perf_counter() - wall) / calls * 1000,
        (_cpu_s() - cpu) / calls * 1000,
    )


async def _grow_to(admin: AIOKafkaAdminClient, prefix: str, have: int, want: int) -> None:
    names = [f"{prefix}-{i}" for i in range(have, want)]
    for start in range(0, len(names), 100):
        await admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names[start : start + 100]])
    while len(await admin.list_topics()) < want:
        await asyncio.sleep(0.1)


async def _measure(
    bootstrap: str, sizes: Sequence[int], calls: int, repeats: int
) -> list[dict[str, Any]]:
    prefix = f"bench.topics.{uuid.uuid4().hex[:8]}"
    checked = [f"{prefix}-{i}" for i in range(CHECKED)]
    kafka = Kafka(Settings.model_validate({"kafka": {"bootstrap_servers": [bootstrap]}}))
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await kafka.start()
    await admin.start()

    async def listing() -> list[str]:
        return sorted(set(checked) - set(await admin.list_topics()))

    checks = {CONTENDERS[0]: lambda: kafka.missing_topics(checked), CONTENDERS[1]: listing}
    rows = []
    try:
        made = 0
        for size in sizes:
            await _grow_to(admin, prefix, made, size)
            made = size
            wall: dict[str, list[float]] = {name: [] for name in CONTENDERS}
            cpu: dict[str, list[float]] = {name: [] for name in CONTENDERS}
            for _ in range(repeats):
                for name in CONTENDERS:
                    w, c = await _per_check(checks[name], calls)
                    wall[name].append(w)
                    cpu[name].append(c)
            rows.append(
                {
                    "topics_in_cluster": len(await admin.list_topics()),
                    "checked_topics": CHECKED,
                    "checks_per_repeat": calls,
                    "contenders": {
                        name: {
                            "wall_ms_per_check": round(median(wall[name]), 3),
                            "cpu_ms_per_check": round(median(cpu[name]), 3),
                        }
                        for name in CONTENDERS
                    },
                    "cpu_listing_over_by_name": round(
                        paired_ratio(cpu[CONTENDERS[1]], cpu[CONTENDERS[0]]), 2
                    ),
                    "wall_listing_over_by_name": round(
                        paired_ratio(wall[CONTENDERS[1]], wall[CONTENDERS[0]]), 2
                    ),
                }
            )
    finally:
        await admin.close()
        await kafka.close()
    return rows


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, Any]:
    sizes = (20,) if quick else (60, 600, 2000)
    calls = 10 if quick else 200
    with (
        tempfile.TemporaryDirectory(prefix="callgate-topic-check-") as logs,
        broker("apache", Path(logs)) as bootstrap,
    ):
        rows = asyncio.run(_measure(bootstrap, sizes, calls, repeats))
    return {"broker": "apache", "repeats": repeats, "rows": rows}
