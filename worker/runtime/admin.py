"""Kafka admin calls: `create_topics` makes the topics a run needs that do not exist yet.

`callgate run` expects its topics to exist (operators create them); the demo, the benchmarks and
the integration tests set up theirs with this. A topic that already exists is never changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError


async def create_topics(
    bootstrap_servers: str,
    names: Iterable[str],
    *,
    partitions: int = 1,
    timeout_s: float = 10.0,
) -> None:
    """Create the topics of `names` that do not exist yet, each with `partitions` partitions and
    replication factor 1; existing ones are left as they are (a concurrent creator is no error)."""
    wanted = sorted(set(names))
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers, request_timeout_ms=int(timeout_s * 1000)
    )
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [
                        NewTopic(name, num_partitions=partitions, replication_factor=1)
                        for name in missing
                    ]
                )
    finally:
        await admin.close()
