"""`callgate replay --topic` on real brokers (tansu and Apache Kafka), as an operator runs it.

The traffic is the process tests' generated mix (envelopes of every kind interleaved, vendor
streams, calls cut short, calls that stall, keyed payments in pairs) and weather calls in
celsius, fahrenheit and kelvin, written to a topic of three partitions. The candidate is the
shipped contracts with `units` tightened to celsius: the replay must flip exactly the
fahrenheit calls the test wrote, accepted to rejected, and leave every other call as it was
(counted against what each call must come to); the shipped contracts as their own candidate
flip nothing. The range options read what they name and nothing else (a time, an offset, a
partition), the read joins no group, and on Apache Kafka an aborted transaction's records are
never judged (read_committed).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from tests.datafiles import REPO, SCHEMAS
from tests.support.apache_kafka import ApacheKafka
from tests.support.candidates import (
    PARTITIONS,
    SEED,
    T0,
    T1,
    Part,
    celsius_only,
    create,
    produce,
    send_all,
)
from worker._native import partition_for_key

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def run_replay(bootstrap: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`callgate replay` on the cluster, the shipped contracts as the baseline."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "worker",
            "replay",
            "--bootstrap",
            bootstrap,
            "--baseline",
            str(SCHEMAS),
            *(str(arg) for arg in args),
        ],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def replay(bootstrap: str, *args: str | Path, status: int = 0) -> dict[str, Any]:
    """`callgate replay --json` with every flip listed; its report."""
    result = run_replay(bootstrap, "--json", "--examples", "100000", *args)
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    document: dict[str, Any] = orjson.loads(result.stdout)
    return document


def flips(document: dict[str, Any]) -> dict[str, set[str]]:
    return {
        kind: {example["call_id"] for example in shown}
        for kind, shown in document["examples"].items()
    }


def unchanged(document: dict[str, Any]) -> Counter[str]:
    return Counter(
        {kind: n for kind, n in document["kinds"].items() if kind.endswith("unchanged") and n}
    )


def test_a_tightened_enum_flips_exactly_the_calls_it_now_refuses(
    broker: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    topic = f"history-{run}"
    part = Part(run, SEED)
    asyncio.run(create(broker, topic))
    asyncio.run(produce(broker, topic, part.messages, T0))
    assert part.fahrenheit, "the traffic has fahrenheit calls"

    document = replay(broker, "--schemas", celsius_only(tmp_path), "--topic", topic)
    assert document["calls"] == len(part.expected)
    assert flips(document) == {"accepted_to_rejected": part.fahrenheit}
    assert document["flips"] == len(part.fahrenheit)
    assert unchanged(document) == part.unchanged()
    for example in document["examples"]["accepted_to_rejected"]:
        (violation,) = example["candidate"]["violations"]
        assert (violation["path"], violation["keyword"]) == ("/units", "enum")
    assert document["source"] == "; ".join(
        f"{topic}[{p}] offsets 0..{count}"
        for p, count in sorted(
            Counter(partition_for_key(m.key, PARTITIONS) for m in part.messages).items()
        )
    )

    same = replay(broker, "--schemas", SCHEMAS, "--topic", topic, "--fail-on-flips", "0", status=0)
    assert same["calls"] == len(part.expected)
    assert same["flips"] == 0
    assert same["examples"] == {}
    replay(
        broker,
        "--schemas",
        celsius_only(tmp_path / "again"),
        "--topic",
        topic,
        "--fail-on-flips",
        str(len(part.fahrenheit) - 1),
        status=1,
    )


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


class Parts:
    """Two parts of traffic on two topics: `times` (three partitions, the second part an hour
    of record time after the first) and `offsets` (one partition, the second part after the
    first)."""

    def __init__(self, bootstrap: str) -> None:
        run = uuid.uuid4().hex[:8]
        self.first = Part(f"{run}a", SEED, calls=60, keyed=0)
        self.second = Part(f"{run}b", SEED + 1, calls=60, keyed=0)
        self.times, self.offsets = f"times-{run}", f"offsets-{run}"
        asyncio.run(create(bootstrap, self.times))
        asyncio.run(create(bootstrap, self.offsets, partitions=1))
        asyncio.run(produce(bootstrap, self.times, self.first.messages, T0))
        asyncio.run(produce(bootstrap, self.times, self.second.messages, T1))
        both = self.first.messages + self.second.messages
        asyncio.run(produce(bootstrap, self.offsets, both, T0, partitions=1))


def test_an_offset_range_reads_what_it_names_and_joins_no_group(
    broker: str, tmp_path: Path
) -> None:
    parts = Parts(broker)
    groups_before = asyncio.run(consumer_groups(broker))
    candidate = celsius_only(tmp_path)
    boundary = str(len(parts.first.messages))
    for args, part in [
        (["--from-offset", boundary], parts.second),
        (["--to-offset", boundary], parts.first),
        (["--from-offset", "0", "--to-offset", boundary], parts.first),
    ]:
        document = replay(broker, "--schemas", candidate, "--topic", parts.offsets, *args)
        assert document["calls"] == len(part.expected), args
        assert flips(document) == {"accepted_to_rejected": part.fahrenheit}, args
        assert unchanged(document) == part.unchanged(), args

    # one partition: the calls whose streams it holds
    document = replay(broker, "--schemas", candidate, "--topic", parts.times, "--partition", "1")
    on_one = {
        call
        for part in (parts.first, parts.second)
        for call in part.fahrenheit
        if partition_for_key(call.rsplit(":", 1)[0].encode(), PARTITIONS) == 1
    }
    assert flips(document) == ({"accepted_to_rejected": on_one} if on_one else {})
    assert document["source"].startswith(f"{parts.times}[1] offsets 0..")
    assert ";" not in document["source"]

    # an empty range, and a range past the end, judge nothing
    empty = replay(
        broker,
        "--schemas",
        candidate,
        "--topic",
        parts.offsets,
        "--from-offset",
        "5",
        "--to-offset",
        "5",
    )
    assert empty["calls"] == 0
    past = replay(
        broker, "--schemas", candidate, "--topic", parts.offsets, "--from-offset", "99999"
    )
    assert past["calls"] == 0
    assert asyncio.run(consumer_groups(broker)) == groups_before


def test_a_time_range_reads_the_records_written_in_it(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    bootstrap = apache_kafka.bootstrap_servers
    parts = Parts(bootstrap)
    candidate = celsius_only(tmp_path)
    for args, part in [
        (["--since", iso(T1)], parts.second),
        (["--until", iso(T1)], parts.first),
        (["--since", str(T0), "--until", str(T1)], parts.first),
        (["--since", str(T0 + len(parts.first.messages) // 2), "--until", iso(T1)], None),
    ]:
        document = replay(bootstrap, "--schemas", candidate, "--topic", parts.times, *args)
        if part is None:  # a range that starts inside the first part's streams: some of them
            assert 0 < document["calls"] <= len(parts.first.expected)
            continue
        assert document["calls"] == len(part.expected), args
        assert flips(document) == {"accepted_to_rejected": part.fahrenheit}, args
        assert unchanged(document) == part.unchanged(), args
    late = replay(
        bootstrap, "--schemas", candidate, "--topic", parts.times, "--since", iso(T1 + 3_600_000)
    )
    assert late["calls"] == 0


def test_a_cluster_that_cannot_look_up_offsets_by_time_is_refused(bootstrap: str) -> None:
    """tansu answers every lookup by time with offset 0: taken at its word, `--since` would
    read everything and `--until` nothing."""
    parts = Parts(bootstrap)
    for option, at in (("--since", T1), ("--until", T1)):
        result = run_replay(
            bootstrap, "--schemas", SCHEMAS, "--topic", parts.times, option, iso(at)
        )
        assert result.returncode == 2, result.stderr
        assert "cannot look offsets up by time" in result.stderr
        assert "Traceback" not in result.stderr


def test_a_topic_or_partition_that_does_not_exist_is_status_2(broker: str) -> None:
    run = uuid.uuid4().hex[:8]
    asyncio.run(create(broker, f"one-{run}", partitions=1))
    for args, message in (
        (["--topic", f"absent-{run}"], "does not exist"),
        (["--topic", f"one-{run}", "--partition", "4"], "has partitions [0], not [4]"),
    ):
        result = run_replay(broker, "--schemas", SCHEMAS, *args)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
        assert "Traceback" not in result.stderr


async def consumer_groups(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {group[0] for group in await admin.list_consumer_groups()}
    finally:
        await admin.close()


def test_an_aborted_transaction_is_never_judged(apache_kafka: ApacheKafka, tmp_path: Path) -> None:
    bootstrap = apache_kafka.bootstrap_servers
    run = uuid.uuid4().hex[:8]
    topic = f"txn-{run}"
    kept, aborted = (
        Part(f"{run}k", SEED, calls=60, keyed=0),
        Part(f"{run}x", SEED + 2, calls=60, keyed=0),
    )
    asyncio.run(create(bootstrap, topic))

    async def write() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"t-{run}")
        await producer.start()
        try:
            for part, commit in ((aborted, False), (kept, True)):
                await producer.begin_transaction()
                await send_all(producer, topic, part.messages, T0)  # in the log, then:
                if commit:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(write())
    document = replay(bootstrap, "--schemas", celsius_only(tmp_path), "--topic", topic)
    assert document["calls"] == len(kept.expected)
    assert flips(document) == {"accepted_to_rejected": kept.fahrenheit}
    assert unchanged(document) == kept.unchanged()
