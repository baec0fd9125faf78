"""`callgate topics create|check` as an operator runs them, on a real Apache Kafka broker.

`create` on an empty cluster makes every topic the settings need, read back from the broker
with the partitions, replicas, cleanup.policy and max.message.bytes the plan asks; `check`
then passes, and a worker started on them creates nothing. Each way a topic can fail to serve
(missing, too few partitions, compacted where keys repeat, not compacted where it holds state,
a max.message.bytes too small, keys not co-partitioned with their requests) is named by `check`
with status 1, and `create` does not paper over it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.datafiles import REPO, SCHEMAS
from tests.support.apache_kafka import ApacheKafka
from tests.support.workers import WorkerProcess, env_of, until
from worker.runtime.kafka import Kafka
from worker.runtime.provision import Role, plan
from worker.runtime.topics import changelog_topic, keys_topic, requests_topic
from worker.settings import Settings

pytestmark = pytest.mark.integration


def config_for(bootstrap: str) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    return {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": f"g-{run}"},
        "topics": {
            "input": f"in-{run}",
            "accepted": f"ok-{run}",
            "rejected": f"no-{run}",
            "incomplete": f"part-{run}",
            "pending_approval": f"pending-{run}",
        },
        "idempotency": {"partitions": 3},
    }


def topics(config: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    return subprocess.run(
        [sys.executable, "-m", "worker", "topics", *args],
        env={**clean, **env_of(config)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def make_topics(bootstrap: str, *new: NewTopic) -> None:
    """Topics made as an operator might have made them, right or wrong."""

    async def make() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics(list(new))
        finally:
            await admin.close()

    asyncio.run(make())


def test_create_makes_every_topic_as_planned_and_check_passes(apache_kafka: ApacheKafka) -> None:
    config = config_for(apache_kafka.bootstrap_servers)
    settings = Settings.model_validate(config)
    before = topics(config, "check")
    assert before.returncode == 1, before.stdout + before.stderr
    # 1 input, 3 outcomes, 1 changelog, 2 idempotency, 2 approval
    assert before.stdout.count("- missing: ") == 9

    made = topics(config, "create", "--input-partitions", "4")
    assert made.returncode == 0, made.stdout + made.stderr
    assert made.stdout.count("created ") == 9
    assert f"all 9 topics serve group {settings.kafka.group_id}" in made.stdout

    async def read_back() -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
        kafka = Kafka(settings)
        try:
            layouts = await kafka.describe(p.name for p in plan(settings, {}))
            configs = await kafka.topic_configs(sorted(layouts))
        finally:
            await kafka.close()
        return layouts, configs

    layouts, configs = asyncio.run(read_back())
    for wanted in plan(settings, {settings.topics.input: 4}):
        layout = layouts[wanted.name]
        assert layout.partitions == (wanted.partitions or 4), wanted.name
        assert layout.replication == settings.topics.replication_factor
        policy = configs[wanted.name]["cleanup.policy"]
        assert policy == ("compact" if wanted.compacted else "delete"), wanted.name
        if wanted.max_message_bytes is not None:
            assert configs[wanted.name]["max.message.bytes"] == str(wanted.max_message_bytes)

    again = topics(config, "check")
    assert again.returncode == 0, again.stdout
    assert again.stdout.count("\nok ") + again.stdout.startswith("ok ") == 9
    # a second create makes nothing and still passes
    twice = topics(config, "create")
    assert twice.returncode == 0, twice.stdout + twice.stderr
    assert "created " not in twice.stdout


def test_the_topics_a_worker_makes_itself_are_made_as_create_makes_them(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """A group whose operator made only its input and outcome topics: the first worker makes
    the changelog and the idempotency and approval topics, each with the `max.message.bytes`
    its largest batch needs (an event bound of 4 MB: past the cluster's 1 MB default), and
    `check` then finds every topic serving."""
    config = {
        **config_for(apache_kafka.bootstrap_servers),
        "limits": {"max_event_bytes": 4_000_000},
        "schemas": {"dir": str(SCHEMAS)},
        "metrics": {"port": 0, "host": "127.0.0.1"},
    }
    settings = Settings.model_validate(config)
    planned = plan(settings, {settings.topics.input: 2})
    make_topics(
        apache_kafka.bootstrap_servers,
        *(
            NewTopic(
                p.name,
                p.partitions or 2,
                1,
                topic_configs={"max.message.bytes": str(p.max_message_bytes)}
                if p.max_message_bytes
                else {},
            )
            for p in planned
            if p.role in (Role.INPUT, Role.OUTCOME)
        ),
    )
    worker = WorkerProcess("maker", config, tmp_path).start()
    try:
        asyncio.run(
            until(
                lambda: worker.count("assigned") > 0,
                "the worker's assignment",
                timeout_s=90,
                alive=lambda: worker.alive,
                context=worker.tail,
            )
        )
        assert worker.count("created topic ") == 5, worker.tail()
    finally:
        worker.terminate()
        worker.cleanup()

    async def read_back() -> dict[str, dict[str, str]]:
        kafka = Kafka(settings)
        try:
            return await kafka.topic_configs([p.name for p in planned if p.created_by_worker])
        finally:
            await kafka.close()

    configs = asyncio.run(read_back())
    for wanted in planned:
        if wanted.created_by_worker:
            assert configs[wanted.name]["max.message.bytes"] == str(wanted.max_message_bytes), (
                wanted.name
            )
    checked = topics(config, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"all 9 topics serve group {settings.kafka.group_id}" in checked.stdout


def test_check_names_each_way_a_topic_cannot_serve(apache_kafka: ApacheKafka) -> None:
    config = config_for(apache_kafka.bootstrap_servers)
    group, names = config["kafka"]["group_id"], config["topics"]
    compact = {"cleanup.policy": "compact"}

    make_topics(
        apache_kafka.bootstrap_servers,
        NewTopic(names["input"], 4, 1),
        NewTopic(names["accepted"], 2, 1, topic_configs=compact),
        NewTopic(names["rejected"], 2, 1, topic_configs={"max.message.bytes": "2048"}),
        # incomplete: missing
        NewTopic(changelog_topic(group, names["input"]), 2, 1, topic_configs=compact),
        NewTopic(requests_topic(group), 3, 1),
        NewTopic(keys_topic(group), 3, 1, topic_configs={"cleanup.policy": "delete"}),
    )
    found = topics(config, "check")
    assert found.returncode == 1
    report = found.stdout
    expected = {
        names["accepted"]: "compaction keeps one record per key",
        names["rejected"]: "max.message.bytes=2048; the worker may write batches of",
        names["incomplete"]: "missing: `callgate topics create` makes it",
        changelog_topic(group, names["input"]): "2 partitions; needs 4 (one per input partition)",
        keys_topic(group): "has cleanup.policy=delete (retention.ms=",
    }
    for topic, words in expected.items():
        block = report.split(f"PROBLEM  {topic}  ", 1)
        assert len(block) == 2, (topic, report)
        assert words in block[1].split("\nok ")[0].split("\nPROBLEM ")[0], (topic, report)
    assert f"ok       {requests_topic(group)}" in report
    assert "7 of 9 topics cannot serve" in report  # the approval topics missing too
    # create makes the missing one and leaves the others as they are: still failing
    fixed_one = topics(config, "create")
    assert fixed_one.returncode == 1
    assert f"created  {names['incomplete']}" in fixed_one.stdout
    assert "4 of 9 topics cannot serve" in fixed_one.stdout


def test_keys_must_have_as_many_partitions_as_their_requests(apache_kafka: ApacheKafka) -> None:
    config = config_for(apache_kafka.bootstrap_servers)
    group = config["kafka"]["group_id"]

    make_topics(
        apache_kafka.bootstrap_servers,
        NewTopic(requests_topic(group), 5, 1),
        NewTopic(keys_topic(group), 3, 1, topic_configs={"cleanup.policy": "compact"}),
    )
    created = topics(config, "create")
    assert created.returncode == 1
    assert "fewer than the idempotency requests' 5" in created.stdout


def test_acls_without_a_principal_is_a_settings_error() -> None:
    result = topics(config_for("127.0.0.1:1"), "acls")
    assert result.returncode == 2
    assert "--principal" in result.stderr


def test_an_unreachable_cluster_is_status_1_and_one_line() -> None:
    config = config_for("127.0.0.1:1")
    config["kafka"]["request_timeout_ms"] = 2000
    result = topics(config, "check")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("callgate topics: cannot work with the cluster")
    assert "Traceback" not in result.stderr
