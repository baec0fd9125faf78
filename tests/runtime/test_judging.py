"""Shadow mode in the worker's rounds, on the in-memory Kafka (`tests.runtime.fakes`).

With candidate contracts that refuse every call the traffic makes, under either guarantee: each
call's event is the current contracts' (accepted), the shadow topic holds one flip per call,
the shadow series count them, and the input is committed past them. A shadow topic that refuses
its records for good loses only those: no substitute, no event counted dropped, the input
committed all the same.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from aiokafka.errors import RecordTooLargeError

from tests.runtime.fakes import FakeBroker, FakeKafka
from tests.runtime.test_worker import (
    GROUP,
    assert_input_committed,
    make_settings,
    new_broker,
    outcome_events,
    produce,
    run_until_idle,
    traffic,
)
from tests.support.candidates import units_only
from worker.compose import build_key_store, build_metrics, build_processor
from worker.errors import BrokerError
from worker.runtime.worker import Worker

pytestmark = pytest.mark.asyncio

SHADOW = "shadow"


def fahrenheit_only(tmp_path: Path) -> Path:
    """A candidate that refuses every call of the traffic (all in celsius)."""
    return units_only(tmp_path, "fahrenheit")


def shadowed_worker(broker: FakeBroker, candidate: Path, guarantee: str) -> Worker:
    settings = make_settings(
        shadow={"schemas": candidate, "topic": SHADOW},
        delivery={"guarantee": guarantee, "transactional_id_prefix": GROUP},
    )
    processor = build_processor(settings, candidate=settings.shadow.schemas)
    return Worker(
        settings,
        processor,
        lambda: build_key_store(settings),
        build_metrics(settings, processor),
        kafka=FakeKafka(broker, GROUP),  # type: ignore[arg-type]
    )


def flips_counted(worker: Worker) -> float:
    return sum(
        sample.value
        for family in worker.metrics.registry.collect()
        if family.name == "callgate_shadow_calls"
        for sample in family.samples
        if sample.labels["kind"] == "accepted_to_rejected"
    )


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_flips_go_to_the_shadow_topic_and_no_verdict_changes(
    tmp_path: Path, guarantee: str
) -> None:
    broker = new_broker()
    broker.create_topic(SHADOW, 2)
    streams, calls = traffic(8)
    produce(broker, streams)
    worker = shadowed_worker(broker, fahrenheit_only(tmp_path), guarantee)
    await worker.start()
    await run_until_idle(worker, broker)
    events = outcome_events(broker)
    assert set(events) == calls
    assert {seen[0]["outcome"] for seen in events.values()} == {"accepted"}
    flips = [orjson.loads(record.value or b"") for record in broker.records(SHADOW)]
    assert sorted(flip["call_id"] for flip in flips) == sorted(calls)
    assert {flip["kind"] for flip in flips} == {"accepted_to_rejected"}
    assert flips_counted(worker) == len(calls)
    assert_input_committed(broker)
    await worker.close()


async def test_a_shadow_topic_that_refuses_for_good_loses_only_the_flips(tmp_path: Path) -> None:
    broker = new_broker()
    broker.create_topic(SHADOW, 2)
    broker.fail_topic(SHADOW, RecordTooLargeError())
    streams, calls = traffic(5)
    produce(broker, streams)
    worker = shadowed_worker(broker, fahrenheit_only(tmp_path), "at_least_once")
    await worker.start()
    await run_until_idle(worker, broker)
    events = outcome_events(broker)
    assert set(events) == calls
    assert {seen[0]["outcome"] for seen in events.values()} == {"accepted"}
    assert (worker.stats.substituted, worker.stats.dropped) == (0, 0)
    assert broker.records(SHADOW) == []
    assert flips_counted(worker) == len(calls)
    assert_input_committed(broker)
    await worker.close()


async def test_a_missing_shadow_topic_stops_the_start(tmp_path: Path) -> None:
    broker = new_broker()
    worker = shadowed_worker(broker, fahrenheit_only(tmp_path), "at_least_once")
    with pytest.raises(BrokerError, match=f"topics do not exist: {SHADOW} \\(output\\)"):
        await worker.start()
