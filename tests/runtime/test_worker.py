"""The worker's rounds, on an in-memory Kafka (`tests.runtime.fakes`): the delivery protocol
step by step, crashes at any point, rebalances, failing and refusing topics, key owners.

What must hold whatever happens: every call gets an event; every event of one call (a replay
after a crash may write it again) is the same but for its measured phase timings; no offset is
committed before its round's records and checkpoints are written; a duplicate idempotency key is
never accepted twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import GroupAuthorizationFailedError, RecordTooLargeError, RequestTimedOutError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS
from tests.runtime.fakes import FakeBroker, FakeConsumer, FakeKafka, Hold
from tests.support.outcomes import as_seen, check, reference
from tests.support.traffic import IDLE_TIMEOUT_S, mixed
from tests.test_metrics import scrape, series
from worker._native import partition_for_key
from worker.compose import build_key_store, build_processor, build_registry, tool_labels
from worker.errors import BrokerError, StateError
from worker.metrics import Metrics
from worker.runtime.exactly_once import ExactlyOnce
from worker.runtime.topics import approvals_topic, changelog_topic, keys_topic, requests_topic
from worker.runtime.worker import Worker
from worker.settings import Settings

pytestmark = pytest.mark.asyncio

INPUT, ACCEPTED, REJECTED, INCOMPLETE = "in", "ok", "no", "partial"
GROUP = "g"
PARTITIONS = 3


def make_settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "kafka": {
            "bootstrap_servers": ["fake:9092"],
            "group_id": GROUP,
            "commit_interval_ms": 0,
            "topic_check_interval_ms": 0,
        },
        "topics": {
            "input": INPUT,
            "accepted": ACCEPTED,
            "rejected": REJECTED,
            "incomplete": INCOMPLETE,
        },
        "schemas": {"dir": SCHEMAS},
        "idempotency": {"partitions": 2},
        "shutdown_grace_s": 2.0,
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value}
    return Settings.model_validate(base)


#: far longer than any round takes here, however busy the machine: only a round that waits for
#: good (for the cluster, or a hold never released) reaches it
ROUND_S = 30.0


def new_broker() -> FakeBroker:
    # the producers wait for a missing topic's metadata, as aiokafka's do: a round must not
    broker = FakeBroker(metadata_waits=True)
    broker.create_topic(INPUT, PARTITIONS)
    for topic in (ACCEPTED, REJECTED, INCOMPLETE):
        broker.create_topic(topic, 2)
    return broker


def new_worker(
    broker: FakeBroker,
    clock: Callable[[], float] | None = None,
    *,
    fake_kafka: FakeKafka | None = None,
    wall: Callable[[], float] | None = None,
    **overrides: Any,
) -> Worker:
    settings = make_settings(**overrides)
    registry = build_registry(settings)
    return Worker(
        settings,
        build_processor(settings, registry),
        lambda: build_key_store(settings),
        Metrics(tool_labels(registry)),
        kafka=fake_kafka or FakeKafka(broker, GROUP),  # type: ignore[arg-type]
        **({} if clock is None else {"clock": clock}),
        **({} if wall is None else {"wall": wall}),
    )


def consumer(worker: Worker) -> FakeConsumer:
    """The worker's (fake) group consumer: the test joins, revokes and reads positions there."""
    fake = worker.fetcher.consumer
    assert isinstance(fake, FakeConsumer)
    return fake


def envelope(stream: str, call: str, seq: int, delta: str, **fields: Any) -> bytes:
    return orjson.dumps(
        {"stream_id": stream, "call_id": call, "seq": seq, "kind": "tool_call", "delta": delta}
        | fields
    )


def weather_call(stream: str, call: str, city: str) -> list[bytes]:
    text = orjson.dumps({"city": city, "units": "celsius"}).decode()
    cut = len(text) // 2
    return [
        envelope(stream, call, 0, text[:cut], tool="get_weather", tool_version="1"),
        envelope(stream, call, 1, text[cut:], final=True),
    ]


def payment_call(stream: str, call: str, key: str, amount: int) -> list[bytes]:
    text = orjson.dumps(
        {
            "amount_minor": amount,
            "currency": "EUR",
            "recipient": "acct_1",
            "description": None,
            "idempotency_key": key,
        }
    ).decode()
    return [envelope(stream, call, 0, text, tool="create_payment", final=True)]


def produce(broker: FakeBroker, streams: dict[str, list[bytes]], *, clock_ms: int = 1000) -> None:
    """Each stream's records to the partition of its key, interleaved round-robin."""
    queues = {s: list(values) for s, values in streams.items()}
    while any(queues.values()):
        for stream, values in queues.items():
            if values:
                partition = sum(stream.encode()) % PARTITIONS
                broker.append(
                    INPUT, partition, key=stream.encode(), value=values.pop(0), timestamp=clock_ms
                )


def outcome_events(broker: FakeBroker) -> dict[str, list[dict[str, Any]]]:
    """Every event written to the outcome topics, by call id."""
    events: dict[str, list[dict[str, Any]]] = {}
    for topic in (ACCEPTED, REJECTED, INCOMPLETE):
        for record in broker.records(topic):
            assert record.value is not None
            event = orjson.loads(record.value)
            event["_topic"] = topic
            events.setdefault(event["call_id"], []).append(event)
    return events


def without_timings(event: dict[str, Any]) -> dict[str, Any]:
    event = dict(event)
    event["metrics"] = {k: v for k, v in event["metrics"].items() if k != "phases_us"}
    return event


def assert_one_verdict_per_call(broker: FakeBroker, expected_calls: set[str]) -> None:
    """No call lost; any repeated event of a call equals the first but for its timings."""
    events = outcome_events(broker)
    assert set(events) == expected_calls
    for call_id, seen in events.items():
        first = without_timings(seen[0])
        for again in seen[1:]:
            assert without_timings(again) == first, f"call {call_id} got a different event"


def assert_one_event_per_call(broker: FakeBroker, expected_calls: set[str]) -> None:
    """exactly_once: no call lost, and none written twice."""
    events = outcome_events(broker)
    assert set(events) == expected_calls
    twice = sorted(call_id for call_id, seen in events.items() if len(seen) > 1)
    assert not twice, f"an event landed twice: {twice}"


def assert_input_committed(broker: FakeBroker) -> None:
    """Every input partition is committed to its end: the worker moved on past everything."""
    for partition in range(PARTITIONS):
        end = len(broker.logs[INPUT][partition])
        assert broker.committed.get((GROUP, INPUT, partition), 0) == end, partition


async def run_until_idle(worker: Worker, broker: FakeBroker, *, rounds: int = 50) -> None:
    for _ in range(rounds):
        await asyncio.wait_for(worker.step(), ROUND_S)
        broker.deliver()
        if worker.idle() and not consumer(worker).behind():
            await worker.step()
            broker.deliver()
            await worker.step()
            await commit_settled(worker)
            return
    raise AssertionError("the worker did not settle")


async def rounds_until_seen_gone(worker: Worker, broker: FakeBroker, rounds: int) -> None:
    """Rounds until the worker's check sees a deleted output topic; at most `rounds`."""
    for _ in range(rounds):
        await asyncio.wait_for(worker.step(), ROUND_S)
        broker.time_out_metadata_waits()  # a request timeout passes each round
        if "does not exist" in worker.readiness()[1]:
            return
    raise AssertionError(f"the check never saw the topic gone: {worker.readiness()[1]}")


async def commit_settled(worker: Worker) -> None:
    """The offset commit running beside the rounds, if any, has finished."""
    await worker.delivery.settled()


def fenced(worker: Worker) -> dict[tuple[str, int], float]:
    """exactly_once: the partitions whose producer was fenced, and when."""
    delivery = worker.delivery
    assert isinstance(delivery, ExactlyOnce)
    return delivery.fenced


class Clock:
    """The worker's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def rounds_until(
    worker: Worker,
    done: Callable[[], bool],
    what: str,
    *,
    clock: Clock | None = None,
    step_s: float = 1.0,
    timeout_s: float = 60.0,
) -> int:
    """Rounds until `done()` (the clock `step_s` later after each, when given); how many. What
    runs beside the rounds (the topic check, exactly_once's commits) runs between them. Bounded
    by `timeout_s` of real time, which only a hang reaches."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    rounds = 0
    while not done():
        waited = loop.time() - started
        if waited > timeout_s:
            raise AssertionError(
                f"no {what} after {rounds} rounds ({waited:.1f} s): {worker.readiness()}, "
                f"{worker.stats}"
            )
        await asyncio.wait_for(worker.step(), ROUND_S)
        rounds += 1
        if clock is not None:
            clock.now += step_s
        await asyncio.sleep(0.001)
    return rounds


def generated(examples: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A property test over `data`: reproducible (derandomized), no deadline."""

    def decorate(test: Callable[..., Any]) -> Callable[..., Any]:
        return settings(
            max_examples=examples,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture],
        )(given(data=st.data())(test))

    return decorate


def age_open_calls(broker: FakeBroker) -> None:
    """A later record in every input partition: a call still open there times out."""
    for partition in range(PARTITIONS):
        end = orjson.dumps({"stream_id": f"clock{partition}", "kind": "end"})
        broker.append(INPUT, partition, key=b"clock", value=end, timestamp=1000 + 120_000)


def traffic(calls: int) -> tuple[dict[str, list[bytes]], set[str]]:
    streams = {f"s{i}": weather_call(f"s{i}", f"c{i}", f"city{i}") for i in range(calls)}
    return streams, {f"c{i}" for i in range(calls)}


# -- the protocol --------------------------------------------------------------------------------


async def test_every_call_gets_its_event_and_offsets_follow_checkpoints() -> None:
    broker = new_broker()
    streams, calls = traffic(12)
    produce(broker, streams)
    worker = new_worker(broker)
    await worker.start()
    await run_until_idle(worker, broker)
    assert_one_verdict_per_call(broker, calls)
    assert {e[0]["_topic"] for e in outcome_events(broker).values()} == {ACCEPTED}
    assert_input_committed(broker)
    for partition in range(PARTITIONS):
        if broker.logs[INPUT][partition]:
            assert broker.logs[changelog_topic(GROUP, INPUT)][partition], "a checkpoint each"
    await worker.close()


async def test_a_fresh_groups_internal_topics_and_changelogs_are_made_in_one_request() -> None:
    # one creation and one wait for the cluster to list them at start, not two in a row
    broker = new_broker()
    kafka = FakeKafka(broker, GROUP)
    worker = new_worker(broker, fake_kafka=kafka)
    await worker.start()
    assert kafka.ensured == [
        [
            requests_topic(GROUP),
            keys_topic(GROUP),
            "tool-calls.pending-approval",
            approvals_topic(GROUP),
            changelog_topic(GROUP, INPUT),
        ]
    ]
    for topic in kafka.ensured[0]:
        assert topic in broker.logs
    await worker.close()


async def test_nothing_is_committed_before_its_outputs_and_checkpoints_are_written() -> None:
    broker = new_broker()
    broker.auto_deliver = False
    streams, _ = traffic(6)
    produce(broker, streams)
    worker = new_worker(broker)
    await worker.start()
    await worker.step()
    await worker.step()
    assert broker.committed == {}, "outputs not acknowledged yet"
    broker.deliver()  # the outputs
    for _ in range(3):  # the output topics are seen to exist, then the checkpoints are sent
        await worker.step()
    assert broker.pending, "checkpoints sent"
    assert broker.committed == {}, "checkpoints sent, not acknowledged yet"
    broker.deliver()  # the checkpoints
    await worker.step()
    await commit_settled(worker)
    assert broker.committed, "written, then committed"


@generated(examples=40)
async def test_a_crash_anywhere_replays_the_same_verdicts(data: st.DataObject) -> None:
    """Run, crash after a generated number of rounds with a generated share of the sends
    acknowledged, start a new worker on the same broker; repeat; no call is lost and every
    repeated event equals the first (but for timings)."""
    broker = new_broker()
    broker.auto_deliver = False
    streams = {}
    calls: set[str] = set()
    for i in range(data.draw(st.integers(3, 12))):
        kind = data.draw(st.sampled_from(["weather", "weather", "payment", "abandoned"]))
        if kind == "payment":
            streams[f"p{i}"] = payment_call(f"p{i}", f"c{i}", f"key{i % 3}", 100 + i % 2)
        elif kind == "abandoned":
            streams[f"a{i}"] = weather_call(f"a{i}", f"c{i}", "x")[:1]
        else:
            streams[f"s{i}"] = weather_call(f"s{i}", f"c{i}", f"city{i}")
        calls.add(f"c{i}")
    produce(broker, streams)
    age_open_calls(broker)  # the abandoned calls time out
    for _ in range(data.draw(st.integers(0, 3))):
        worker = new_worker(broker)
        await worker.start()
        for _ in range(data.draw(st.integers(1, 4))):
            await worker.step()
            broker.deliver(data.draw(st.integers(0, len(broker.pending))))
        # crash: the worker is dropped; unacknowledged sends are lost with it
        broker.pending.clear()
    worker = new_worker(broker)
    broker.auto_deliver = True
    await worker.start()
    await run_until_idle(worker, broker)
    assert_one_verdict_per_call(broker, calls)
    accepted_keys: dict[str, str] = {}
    for seen in outcome_events(broker).values():
        event = seen[0]
        if event["outcome"] == "accepted" and event["idempotency_key"]:
            key = event["idempotency_key"]
            assert key not in accepted_keys, f"key {key} accepted twice"
            accepted_keys[key] = event["event_id"]


@generated(examples=40)
async def test_input_deleted_before_it_was_judged_is_counted_exactly(data: st.DataObject) -> None:
    """The worker lags (a generated number of small rounds), then each input partition loses
    a generated prefix of its log (retention). Exactly the records deleted before they were
    fetched are counted (a partition not assigned yet starts at its log's start: what was
    deleted there is missing from its calls, but was never this worker's to lose). A call
    none of whose records were lost is accepted once; a call that lost some gets one event,
    never `accepted`; a call that lost all gets none; the input is committed to its end."""
    broker = new_broker()
    count = data.draw(st.integers(1, 12))
    streams = {f"s{i}": weather_call(f"s{i}", f"c{i}", f"city{i}") for i in range(count)}
    produce(broker, streams)
    worker = new_worker(broker, kafka={"fetch_max_records": data.draw(st.integers(1, 4))})
    await worker.start()
    for _ in range(data.draw(st.integers(0, 6))):
        await worker.step()
    positions = consumer(worker).positions()
    lost: dict[str, int] = {}  # call id -> how many of its records were deleted unread
    deleted = 0
    for partition in range(PARTITIONS):
        tp = TopicPartition(INPUT, partition)
        log = broker.logs[INPUT][partition]
        before = data.draw(st.integers(0, len(log)), label=f"delete before, partition {partition}")
        broker.delete_records(INPUT, partition, before)
        # a partition not assigned yet starts at its log's start: what was deleted before is
        # missing from its calls, but this worker never had it to lose
        fetched = positions.get(tp)
        for record in log[fetched or 0 : before]:
            assert record.value is not None
            call_id = orjson.loads(record.value)["call_id"]
            lost[call_id] = lost.get(call_id, 0) + 1
            deleted += fetched is not None
    age_open_calls(broker)  # a call that lost its last record times out
    await run_until_idle(worker, broker, rounds=200)
    counted = worker.metrics.registry.get_sample_value("callgate_input_records_deleted_total")
    assert counted == deleted
    events = outcome_events(broker)
    for i in range(count):
        call_id = f"c{i}"
        outcomes = [event["outcome"] for event in events.get(call_id, [])]
        if call_id not in lost:
            assert outcomes == ["accepted"], call_id
        elif lost[call_id] == len(streams[f"s{i}"]):
            assert outcomes == [], call_id
        else:
            assert outcomes == ["incomplete"], (call_id, lost[call_id])
    assert_input_committed(broker)


async def test_an_out_of_range_position_the_partition_has_moved_on_from_is_not_acted_on() -> None:
    """The fetch that found a position out of range runs beside the rebalance listener: by the
    time the worker acts on it, the partition may have been restored elsewhere or revoked.
    Only a partition still at that position is moved to the log's start and counted."""
    broker = new_broker()
    streams, _ = traffic(6)
    produce(broker, streams)
    worker = new_worker(broker)
    await worker.start()
    await run_until_idle(worker, broker)
    fake = consumer(worker)
    tp = TopicPartition(INPUT, 0)
    at = await fake.position(tp)
    broker.delete_records(INPUT, 0, at + 1)  # nothing there yet: no record is lost
    assigned = worker.assignment
    await worker.fetcher.skip_deleted({tp: at - 1, TopicPartition("other", 0): 0}, assigned)
    assert await fake.position(tp) == at
    await worker.fetcher.skip_deleted({tp: at}, assigned)
    assert await fake.position(tp) == at + 1
    assert worker.metrics.registry.get_sample_value("callgate_input_records_deleted_total") == 1


async def test_a_keyed_duplicate_on_another_partition_is_decided_by_the_keys_owner() -> None:
    broker = new_broker()
    produce(
        broker,
        {
            "p0": payment_call("p0", "first", "k1", 100),
            "p1": payment_call("p1", "again", "k1", 100),
            "p2": payment_call("p2", "other", "k1", 999),
        },
    )
    worker = new_worker(broker)
    await worker.start()
    await run_until_idle(worker, broker)
    events = {call: seen[0] for call, seen in outcome_events(broker).items()}
    amounts = {"first": 100, "again": 100, "other": 999}
    (first,) = [e for e in events.values() if e["outcome"] == "accepted"]
    for call, event in events.items():
        if event is first:
            continue
        same = amounts[call] == amounts[first["call_id"]]
        assert event["outcome"] == "rejected"
        assert event["error_code"] == ("duplicate" if same else "idempotency_conflict")
        assert event["duplicate_of"] == first["event_id"]
        assert "arguments" not in event
    assert broker.records(requests_topic(GROUP)), "keyed calls went through the owner"
    assert broker.records(keys_topic(GROUP)), "the owner remembered the key"


async def test_a_restarted_owner_remembers_its_keys() -> None:
    broker = new_broker()
    produce(broker, {"p0": payment_call("p0", "first", "k1", 100)})
    worker = new_worker(broker)
    await worker.start()
    await run_until_idle(worker, broker)
    await worker.close()
    produce(broker, {"p1": payment_call("p1", "later", "k1", 100)}, clock_ms=2000)
    worker = new_worker(broker)
    await worker.start()
    await run_until_idle(worker, broker)
    assert outcome_events(broker)["later"][0]["error_code"] == "duplicate"


# -- failures --------------------------------------------------------------------------------


async def test_a_topic_that_refuses_an_event_for_good_gets_a_substitute() -> None:
    broker = new_broker()
    streams, calls = traffic(3)
    produce(broker, streams)
    broker.fail_topic(ACCEPTED, RecordTooLargeError())
    worker = new_worker(broker)
    await worker.start()
    await run_until_idle(worker, broker)
    events = outcome_events(broker)
    assert set(events) == calls
    for seen in events.values():
        (event,) = seen
        assert (event["_topic"], event["phase"], event["error_code"]) == (
            REJECTED,
            "delivery",
            "output_refused",
        )
    assert worker.stats.substituted == 3
    assert_input_committed(broker)


async def test_when_the_rejected_topic_refuses_too_the_event_is_dropped_and_counted() -> None:
    broker = new_broker()
    streams, _ = traffic(2)
    produce(broker, streams)
    broker.fail_topic(ACCEPTED, RecordTooLargeError())
    broker.fail_topic(REJECTED, RecordTooLargeError())
    worker = new_worker(broker)
    await worker.start()
    await run_until_idle(worker, broker)
    assert worker.stats.dropped == 2
    assert outcome_events(broker) == {}
    assert_input_committed(broker)


async def test_a_failing_topic_pauses_fetching_until_it_recovers_and_nothing_is_lost() -> None:
    broker = new_broker()
    streams, calls = traffic(6)
    produce(broker, streams)
    broker.fail_topic(ACCEPTED, RequestTimedOutError())
    worker = new_worker(broker)
    await worker.start()
    for _ in range(5):
        await worker.step()
    ready, why = worker.readiness()
    assert not ready
    assert ACCEPTED in why
    assert consumer(worker).paused(), "fetching paused while a topic fails"
    assert broker.committed == {}
    broker.fail_topic(ACCEPTED, None)
    for _ in range(100):  # bounded: the retry backoff is short
        await worker.step()
        if worker.idle() and worker.readiness()[0]:
            break
        await asyncio.sleep(0.02)
    await run_until_idle(worker, broker)
    assert worker.readiness()[0]
    assert_one_verdict_per_call(broker, calls)


async def test_another_topics_success_does_not_hide_a_failing_one() -> None:
    broker = new_broker()
    produce(broker, {"s0": weather_call("s0", "good", "x"), "s1": [b"not json"]})
    broker.fail_topic(ACCEPTED, RequestTimedOutError())
    worker = new_worker(broker)
    await worker.start()
    for _ in range(5):
        await worker.step()
    rejected = {
        call for call, seen in outcome_events(broker).items() if seen[0]["_topic"] == REJECTED
    }
    assert len(rejected) == 1, "the rejected topic works"
    assert not worker.readiness()[0], "the accepted one still fails"


async def test_writes_acknowledged_to_a_deleted_topic_are_not_lost() -> None:
    """A broker that acknowledges writes to a deleted topic (and drops them): the worker sees
    the topic gone before its checkpoints move past those writes, rewinds, waits, and writes
    the events again once the topic is back."""
    broker = new_broker()
    broker.auto_deliver = False
    first, calls = traffic(6)
    produce(broker, first)
    worker = new_worker(broker)
    await worker.start()
    await worker.step()  # judged and sent, not acknowledged yet
    broker.delete_topic_but_acknowledge_writes(ACCEPTED)
    broker.deliver()  # "acknowledged"
    for _ in range(5):
        await worker.step()
        broker.deliver()
    assert not worker.readiness()[0]
    assert "does not exist" in worker.readiness()[1]
    assert broker.committed == {}, "nothing committed past the lost writes"
    broker.create_topic(ACCEPTED, 2)
    broker.auto_deliver = True
    await run_until_idle(worker, broker)
    assert worker.readiness()[0]
    assert_one_verdict_per_call(broker, calls)
    assert_input_committed(broker)


async def test_every_partition_assigned_gets_its_changelog_when_the_cluster_says_fewer() -> None:
    """The partition counts the admin client reads may lag the group's assignment (an input
    just grown, another broker's view): the changelog gets a partition for every input
    partition assigned, or that partition's checkpoints would have nowhere to go."""
    broker = new_broker()
    streams, calls = traffic(9)
    produce(broker, streams)
    kafka = FakeKafka(broker, GROUP)
    kafka.lagging = {INPUT: 1}
    worker = new_worker(broker, fake_kafka=kafka)
    await worker.start()
    await run_until_idle(worker, broker)
    assert not worker.stopping, worker.readiness()
    assert len(broker.logs[changelog_topic(GROUP, INPUT)]) == PARTITIONS
    assert_one_verdict_per_call(broker, calls)
    assert_input_committed(broker)


async def test_a_topic_missing_for_many_checks_is_rewound_to_once() -> None:
    """The rewind when a topic is found gone restores every partition from its changelog;
    while it stays gone nothing is judged, so the checks after that rewind no more (each
    would read every changelog again, every check interval, for as long as it is gone)."""
    ticks = iter(range(10**9))  # each reading of the clock is a second later: checks are due
    broker = new_broker()
    broker.auto_deliver = False
    first, calls = traffic(6)
    produce(broker, first)
    kafka = FakeKafka(broker, GROUP)
    worker = new_worker(broker, lambda: float(next(ticks)), fake_kafka=kafka)
    await worker.start()
    await worker.step()
    broker.delete_topic_but_acknowledge_writes(ACCEPTED)
    broker.deliver()
    reads = found = None
    for step in range(20):
        await worker.step()
        broker.deliver()
        if found is None and "does not exist" in worker.readiness()[1]:
            found = step  # the check is done: the round after acts on it (rewinds)
        elif found is not None and reads is None:
            reads = kafka.reads
    assert reads is not None, "the topic was not seen gone"
    assert kafka.reads == reads, "rewound when found gone, not at every check after"
    broker.create_topic(ACCEPTED, 2)
    broker.auto_deliver = True
    await run_until_idle(worker, broker)
    assert_one_verdict_per_call(broker, calls)
    assert_input_committed(broker)


async def test_a_topic_deleted_while_its_writes_fail_holds_up_nothing_once_it_is_back() -> None:
    """A round's events wait for a deleted topic while a later round is written in full: the
    check sees the topic gone and rewinds, dropping the waiting events. The rounds that owed
    them must not wait for them for ever: once the topic is back, everything is written and
    committed."""
    ticks = iter(range(10**9))  # each reading of the clock is a second later: retries are due
    broker = new_broker()
    streams, calls = traffic(1)
    produce(broker, streams)
    invalid = {f"bad{i}": [b"not json"] for i in range(6)}
    produce(broker, invalid)
    worker = new_worker(broker, lambda: float(next(ticks)), kafka={"fetch_max_records": 2})
    await worker.start()
    del broker.logs[ACCEPTED]
    await rounds_until_seen_gone(worker, broker, 8)
    broker.create_topic(ACCEPTED, 2)
    await run_until_idle(worker, broker)
    assert worker.readiness()[0]
    assert worker.delivery.pending_records == 0
    assert_input_committed(broker)
    events = outcome_events(broker)
    assert set(events) >= calls
    assert len(events) == len(calls) + len(invalid)


@pytest.mark.parametrize("calls", [1, 4, 9])
async def test_a_deleted_topic_every_round_owes_is_seen_gone(calls: int) -> None:
    """Every round in flight owes records to the deleted topic, so none is ever acknowledged in
    full: the failing writes themselves must have the topics checked, or the worker retries
    them for ever without seeing the topic gone (and without rewinding)."""
    ticks = iter(range(10**9))  # each reading of the clock is a second later: checks are due
    broker = new_broker()
    streams, judged = traffic(calls)  # accepted calls only: every round writes to ACCEPTED
    produce(broker, streams)
    worker = new_worker(broker, lambda: float(next(ticks)), kafka={"fetch_max_records": 2})
    await worker.start()
    del broker.logs[ACCEPTED]
    await rounds_until_seen_gone(worker, broker, 10)
    assert broker.committed == {}, "nothing committed past the failing writes"
    broker.create_topic(ACCEPTED, 2)
    await run_until_idle(worker, broker)
    assert worker.readiness()[0]
    assert worker.delivery.pending_records == 0
    assert_one_verdict_per_call(broker, judged)
    assert_input_committed(broker)


@pytest.mark.parametrize("state", ["changelog", "keys"])
async def test_a_deleted_state_topic_stops_the_worker_and_says_what_went_with_it(
    state: str,
) -> None:
    """The checkpoints and the remembered keys live only in their topics: once one is deleted
    (here as the embedded broker does, its writes still acknowledged) no rewind can bring them
    back. The worker stops with a StateError naming the topic (once its checks have missed it
    for `STATE_GONE_AFTER_S`), never committing the records that came after the deletion."""
    broker = new_broker()
    broker.auto_deliver = False
    streams, _ = traffic(6)
    produce(broker, {name: records[:1] for name, records in streams.items()})
    ticks = iter(range(10**9))  # each reading of the clock is a second later: checks are due
    worker = new_worker(broker, clock=lambda: next(ticks))
    await worker.start()
    await worker.step()
    broker.deliver()
    judged = {p: len(broker.logs[INPUT][p]) for p in range(PARTITIONS)}
    topic = changelog_topic(GROUP, INPUT) if state == "changelog" else keys_topic(GROUP)
    broker.delete_topic_but_acknowledge_writes(topic)
    produce(broker, {name: records[1:] for name, records in streams.items()})
    for _ in range(20):
        await worker.step()
        broker.deliver()
        if worker.stopping:
            break
    assert worker.stopping, worker.readiness()
    with pytest.raises(StateError, match=f"internal topics deleted: {topic};"):
        await worker.run()
    for partition, end in judged.items():
        assert broker.committed.get((GROUP, INPUT, partition), 0) <= end, "committed past it"
    await worker.close()


async def test_the_output_topics_must_exist_before_anything_is_produced() -> None:
    broker = new_broker()
    del broker.logs[INCOMPLETE]
    worker = new_worker(broker)
    with pytest.raises(BrokerError, match=INCOMPLETE):
        await worker.start()


async def test_a_missing_input_topic_is_named_with_how_to_make_it() -> None:
    broker = new_broker()
    del broker.logs[INPUT]
    worker = new_worker(broker)
    with pytest.raises(BrokerError) as raised:
        await worker.start()
    assert f"topics do not exist: {INPUT} (input)." in str(raised.value)
    assert "callgate topics create" in str(raised.value)


async def test_an_offset_past_the_logs_end_is_never_committed() -> None:
    broker = new_broker()
    streams, _ = traffic(3)
    produce(broker, streams)
    worker = new_worker(broker)
    await worker.start()
    await run_until_idle(worker, broker)
    before = dict(broker.committed)
    # the broker lost its logs (a memory-only broker restarted): what was read is gone
    for partition in range(PARTITIONS):
        broker.logs[INPUT][partition].clear()
    offsets = {(INPUT, p): 5 for p in range(PARTITIONS)}
    assert not await worker.fetcher.commit(offsets, 1.0), "nothing to commit"
    assert broker.committed == before


# -- rebalances --------------------------------------------------------------------------------


async def test_a_partition_moves_to_another_worker_with_its_open_calls() -> None:
    broker = new_broker()
    text = orjson.dumps({"city": "Oslo", "units": "celsius"}).decode()
    stream = "s0"
    partition = sum(stream.encode()) % PARTITIONS
    first, second = text[:5], text[5:]
    opening = envelope(stream, "c0", 0, first, tool="get_weather")
    broker.append(INPUT, partition, key=b"s0", value=opening, timestamp=1)
    one = new_worker(broker)
    await one.start()
    await run_until_idle(one, broker)
    assert one.processor.assembler.open_calls == 1
    tp = TopicPartition(INPUT, partition)
    await consumer(one).revoke([tp])
    closing = envelope(stream, "c0", 1, second, final=True)
    broker.append(INPUT, partition, key=b"s0", value=closing, timestamp=2)
    two = new_worker(broker)
    await two.start()
    await run_until_idle(two, broker)
    events = outcome_events(broker)
    assert list(events) == ["c0"]
    (event,) = events["c0"]
    assert event["outcome"] == "accepted"
    assert event["source"]["first_offset"] == 0, "judged whole, from its first chunk"


def draw_partitions(data: st.DataObject, label: str) -> list[TopicPartition]:
    """One to all of the input partitions, drawn."""
    drawn = st.lists(st.integers(0, PARTITIONS - 1), min_size=1, max_size=3, unique=True)
    return [TopicPartition(INPUT, p) for p in data.draw(drawn, label=label)]


@generated(examples=40)
async def test_a_stalled_call_times_out_once_whenever_its_partition_moves(
    data: st.DataObject,
) -> None:
    """Calls that stall (no piece after their first) time out on their partition's record
    time. The partitions move at a generated round (to another worker or back to the same),
    before or after the records that age the stalled calls out arrive, in rounds of a few
    records: every call, stalled or not, gets one verdict, and the stalled ones `timeout`."""
    per_round = data.draw(st.integers(1, 4), label="records per round")
    before = data.draw(st.integers(0, 8), label="rounds before the move")
    aged_first = data.draw(st.booleans(), label="the aging records come before the move")
    moves_away = data.draw(st.booleans(), label="moves to another worker")
    moved = draw_partitions(data, "partitions moved")
    broker = new_broker()
    streams, calls = traffic(6)
    stalled = {f"stall{i}": weather_call(f"stall{i}", f"x{i}", "Oslo")[:1] for i in range(3)}
    produce(broker, {**stalled, **streams})
    mode = {"kafka": {"fetch_max_records": per_round}}
    one = new_worker(broker, **mode)
    await one.start()
    await consumer(one).join()
    if aged_first:
        age_open_calls(broker)
    for _ in range(before):
        await asyncio.wait_for(one.step(), ROUND_S)
        broker.deliver()
    await consumer(one).revoke(moved)
    if not aged_first:
        age_open_calls(broker)
    owner = one
    if moves_away:
        owner = new_worker(broker, **mode)
        await owner.start()
    await consumer(owner).join(moved)
    for worker in [one] if owner is one else [one, owner]:
        await run_until_idle(worker, broker, rounds=200)
    assert_one_verdict_per_call(broker, calls | {f"x{i}" for i in range(3)})
    events = outcome_events(broker)
    for i in range(3):
        assert events[f"x{i}"][0]["outcome"] == "incomplete", events[f"x{i}"][0]
        assert events[f"x{i}"][0]["reason"] == "timeout", events[f"x{i}"][0]


#: The ways a partition changes owner.
HANDOVERS = ("stop", "crash", "revoke")


@generated(examples=60)
async def test_every_kind_of_call_crosses_a_change_of_owner_unchanged(
    data: st.DataObject,
) -> None:
    """The process tests' traffic (`tests.support.traffic.mixed`: envelope streams of several
    calls, `openai.chat` and `anthropic.messages` streams, a stalled call), fed in rounds of a
    generated size with a generated share of the sends acknowledged. After a generated number
    of rounds the partitions change owner: the worker stops (drains, checkpoints, commits and
    leaves), crashes (dropped with its unacknowledged sends), or gives a generated set of them
    up to another worker. Every call gets the event one undisturbed pass over the input gives
    it, and an event written again is that event again."""
    calls = data.draw(st.integers(5, 40), label="calls")
    seed = data.draw(st.integers(0, 10_000), label="traffic seed")
    window = data.draw(st.integers(1, 12), label="streams open at once")
    traffic = mixed("t", calls, seed=seed, window=window)
    per_round = data.draw(st.integers(1, 12), label="records per round")
    before = data.draw(st.integers(0, 30), label="rounds before the handover")
    handover = data.draw(st.sampled_from(HANDOVERS), label="handover")
    broker = new_broker()
    for index, message in enumerate(traffic.messages):
        partition = partition_for_key(message.key, PARTITIONS)
        broker.append(
            INPUT,
            partition,
            key=message.key,
            value=message.value,
            headers=message.headers,
            timestamp=1000 + index,
        )
    age_open_calls(broker)  # the stalled call times out
    mode = {
        "kafka": {"fetch_max_records": per_round},
        "assembly": {"idle_timeout_s": IDLE_TIMEOUT_S},
    }
    broker.auto_deliver = False
    one = new_worker(broker, **mode)
    await one.start()
    await consumer(one).join()
    for _ in range(before):
        await asyncio.wait_for(one.step(), ROUND_S)
        broker.deliver(data.draw(st.integers(0, len(broker.pending)), label="acknowledged"))
    if handover == "crash":
        broker.pending.clear()
    broker.auto_deliver = True
    broker.deliver()
    if handover == "stop":
        await one.close()
    two = new_worker(broker, **mode)
    await two.start()
    owners = [two]
    if handover == "revoke":
        moved = draw_partitions(data, "partitions given up")
        await consumer(one).revoke(moved)
        await consumer(two).join(moved)
        owners = [one, two]
    else:
        await consumer(two).join()
    for owner in owners:
        await run_until_idle(owner, broker, rounds=400)
    settings = make_settings(**mode)
    outcomes = {"accepted": ACCEPTED, "rejected": REJECTED, "incomplete": INCOMPLETE}
    check(
        [as_seen(record) for topic in outcomes.values() for record in broker.records(topic)],
        traffic.expected,
        reference(settings, broker.records(INPUT)),
        outcomes,
        max_feedback_bytes=settings.limits.max_feedback_bytes,
    )


#: Where a round waits on the broker, by guarantee: a rebalance may come at any of them.
ROUND_WAITS = {
    "at_least_once": ["send_batch", "commit"],
    "exactly_once": [
        "send_batch",
        "send_offsets_to_transaction",
        "commit_transaction",
        "begin_transaction",
    ],
}


async def held_round(worker: Worker, broker: FakeBroker, hold: Hold) -> None:
    """Rounds until what they write or commit reaches the hold."""
    for _ in range(20):
        await worker.step()
        broker.deliver()
        if hold.reached.is_set():
            return
    raise AssertionError(f"no round reached {hold.point}")


@generated(examples=30)
async def test_a_rebalance_waits_for_the_round_in_progress(data: st.DataObject) -> None:
    """The consumer runs its rebalance listener in a task of its own, whenever the group
    rebalances: here while what the rounds write (at_least_once), or a commit of a partition
    given up (exactly_once), waits on the broker at a generated point. The partitions given up
    leave only once that is over (a transactional producer stopped under its commit never hears
    back, and the worker would wait for good), then move to another worker or come back; every
    call keeps one verdict, and one event under exactly_once."""
    guarantee = data.draw(st.sampled_from(sorted(ROUND_WAITS)), label="guarantee")
    point = data.draw(st.sampled_from(ROUND_WAITS[guarantee]), label="the round waits at")
    moves_away = data.draw(st.booleans(), label="moves to another worker")
    moved = draw_partitions(data, "partitions revoked")
    broker = new_broker()
    streams, calls = traffic(9)
    produce(broker, streams)
    mode = {"delivery": {"guarantee": guarantee}}
    one = new_worker(broker, **mode)
    await one.start()
    await consumer(one).join()
    # exactly_once: the commit of a partition given up (each partition commits on its own)
    client = f"{GROUP}-{INPUT}-{moved[0].partition}" if guarantee == "exactly_once" else None
    hold = broker.hold = Hold(point, client)
    rounds = asyncio.create_task(held_round(one, broker, hold))
    await asyncio.wait_for(hold.reached.wait(), timeout=ROUND_S)
    rebalance = asyncio.create_task(consumer(one).revoke(moved))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not rebalance.done(), "the partitions left while their writes or commit waited"
    hold.release.set()
    await asyncio.wait_for(asyncio.gather(rounds, rebalance), timeout=ROUND_S)
    workers = [one]
    if moves_away:
        two = new_worker(broker, **mode)
        await two.start()
        await consumer(two).join(moved)
        workers.append(two)
    else:
        await consumer(one).join(moved)
    for _ in range(10):
        for worker in workers:
            await worker.step()
            broker.deliver()
    if guarantee == "exactly_once":
        assert_one_event_per_call(broker, calls)
    else:
        assert_one_verdict_per_call(broker, calls)
    assert_input_committed(broker)


# -- exactly once --------------------------------------------------------------------------------


async def test_exactly_once_commits_records_checkpoints_and_offsets_together() -> None:
    broker = new_broker()
    streams, calls = traffic(9)
    produce(broker, streams)
    worker = new_worker(broker, delivery={"guarantee": "exactly_once"})
    await worker.start()
    for _ in range(10):
        await worker.step()
    await worker.delivery.settled()
    assert_one_event_per_call(broker, calls)
    for partition in range(PARTITIONS):
        assert broker.committed[(GROUP, INPUT, partition)] == len(broker.logs[INPUT][partition])


async def test_exactly_once_commits_on_an_interval_beside_the_rounds() -> None:
    """Rounds write into the partitions' open transactions at once; a partition's transaction
    commits once per commit interval, beside the rounds, with the checkpoint and the offset of
    every round before it; what a round makes while its partition commits goes into the next
    transaction. Each partition is committed once per interval however many rounds it read."""
    clock = Clock()
    broker = new_broker()
    streams, calls = traffic(9)
    produce(broker, streams)
    worker = new_worker(
        broker,
        clock,
        delivery={"guarantee": "exactly_once"},
        kafka={"commit_interval_ms": 1000, "fetch_max_records": 1},
    )
    await worker.start()
    await consumer(worker).join()
    for _ in range(5):  # within one interval (the first commit is due at once)
        await worker.step()
        clock.now += 0.1
    await worker.delivery.settled()
    first = dict(broker.committed)
    assert first, "the first rounds committed at once"
    for _ in range(4):  # still within the interval: nothing more is committed
        await worker.step()
        clock.now += 0.1
    await worker.delivery.settled()
    assert broker.committed == first
    clock.now += 1.0
    await rounds_until(worker, lambda: not consumer(worker).behind(), "every record read")
    await rounds_until(worker, worker.idle, "every partition committed", clock=clock)
    assert_one_event_per_call(broker, calls)
    assert_input_committed(broker)


async def test_exactly_once_a_deleted_changelog_stops_the_worker() -> None:
    """Under exactly_once the rounds writing checkpoints to a deleted changelog fail and are
    rewound; the failure has the topics checked, and the worker stops with a StateError naming
    the changelog (without the check it rewound them for ever, its readiness saying ready)."""
    broker = new_broker()
    streams, _ = traffic(6)
    produce(broker, {name: records[:1] for name, records in streams.items()})
    clock = Clock()
    worker = new_worker(broker, clock, delivery={"guarantee": "exactly_once"})
    await worker.start()
    await worker.step()
    await worker.delivery.settled()
    committed = dict(broker.committed)
    changelog = changelog_topic(GROUP, INPUT)
    del broker.logs[changelog]
    produce(broker, {name: records[1:] for name, records in streams.items()})
    await rounds_until(worker, lambda: worker.stopping, "stop", clock=clock)
    with pytest.raises(StateError, match=f"internal topics deleted: {changelog};"):
        await worker.run()
    assert broker.committed == committed, "no round committed once the state was gone"
    await worker.close()


async def test_exactly_once_a_deleted_outcome_topic_is_waited_for_and_judged_again() -> None:
    """Under exactly_once the rounds writing to a deleted outcome topic fail and are rewound;
    the failure has the topics checked: readiness names the topic, nothing is judged until it
    is back, and then every call has exactly one event (without the check, readiness said
    ready and nothing named the topic)."""
    broker = new_broker()
    streams, calls = traffic(9)
    produce(broker, streams)
    worker = new_worker(broker, delivery={"guarantee": "exactly_once"})
    await worker.start()
    del broker.logs[ACCEPTED]
    await rounds_until(
        worker, lambda: "does not exist" in worker.readiness()[1], "deleted topic seen gone"
    )
    assert worker.readiness() == (
        False,
        f"writes failing ({ACCEPTED}: does not exist); rounds rewound until done",
    )
    assert outcome_events(broker) == {}, "no round committed without its events"
    broker.create_topic(ACCEPTED, 2)
    await rounds_until(
        worker,
        lambda: worker.readiness()[0] and worker.idle() and not consumer(worker).behind(),
        "every call judged and committed once the topic is back",
    )
    assert_one_event_per_call(broker, calls)
    for partition in range(PARTITIONS):
        assert broker.committed[(GROUP, INPUT, partition)] == len(broker.logs[INPUT][partition])


async def test_a_former_owner_is_fenced_and_its_round_never_lands() -> None:
    """A member paused past its session comes back still fetching a partition the group gave to
    another: its writes and its transaction for that partition are refused, nothing of it is
    visible, it gives the partition up (never reopens it, which would fence the new owner in
    turn), and every call keeps exactly one event."""
    broker = new_broker()
    streams, calls = traffic(9)
    produce(broker, dict(list(streams.items())[:4]))
    exactly_once = {"delivery": {"guarantee": "exactly_once"}}
    one = new_worker(broker, **exactly_once)
    await one.start()
    for _ in range(5):
        await one.step()
    moved = TopicPartition(INPUT, 0)
    two = new_worker(broker, **exactly_once)
    await two.start()
    await consumer(two).join([moved])
    epoch = broker.epochs[f"{GROUP}-{INPUT}-0"]
    produce(broker, dict(list(streams.items())[4:]))
    for _ in range(5):
        await one.step()  # still believes it owns the moved partition: fenced there
        await two.step()
    await rounds_until(one, lambda: bool(fenced(one)), "fence seen")
    assert (INPUT, 0) not in one.assignment
    assert (INPUT, 0) in fenced(one)
    assert broker.epochs[f"{GROUP}-{INPUT}-0"] == epoch, "the former owner fenced the new one"
    assert one.readiness()[0], "a fenced producer says nothing about the topics it wrote to"
    await consumer(one).revoke([moved])  # the group tells it, late
    for _ in range(3):
        await one.step()
        await two.step()
    await one.delivery.settled()
    await two.delivery.settled()
    assert_one_event_per_call(broker, calls)
    assert_input_committed(broker)


async def test_a_partition_fenced_but_still_held_a_session_later_is_taken_back() -> None:
    """Fenced for another reason (its transaction timed out): no rebalance comes, so after a
    session the worker opens the partition again and judges on, with no event twice."""
    clock = Clock()
    broker = new_broker()
    streams, calls = traffic(6)
    produce(broker, dict(list(streams.items())[:3]))
    worker = new_worker(broker, clock, delivery={"guarantee": "exactly_once"})
    settings = worker.settings
    await worker.start()
    await worker.step()
    await worker.delivery.settled()
    for partition in range(PARTITIONS):  # the broker bumps every producer's epoch
        broker.epochs[f"{GROUP}-{INPUT}-{partition}"] += 1
    produce(broker, dict(list(streams.items())[3:]))
    await rounds_until(worker, lambda: bool(fenced(worker)), "fence seen")
    clock.now += settings.kafka.session_timeout_ms / 1000
    await rounds_until(worker, lambda: not fenced(worker), "partitions taken back")
    await rounds_until(
        worker, lambda: worker.idle() and not consumer(worker).behind(), "every call committed"
    )
    assert_one_event_per_call(broker, calls)
    assert_input_committed(broker)


async def test_exactly_once_a_round_whose_writes_fail_is_tried_again_not_paused_for_good() -> None:
    """The round's writes to a failing topic time out: the round is rewound, fetching goes on,
    and once the topic takes writes again every call has its one event."""
    clock = Clock()
    broker = new_broker()
    streams, calls = traffic(6)
    produce(broker, streams)
    worker = new_worker(broker, clock, delivery={"guarantee": "exactly_once"})
    await worker.start()
    broker.fail_topic(ACCEPTED, RequestTimedOutError())
    await rounds_until(worker, lambda: worker.stats.rewinds > 0, "rewind", clock=clock)
    assert not outcome_events(broker)
    assert not fenced(worker), "a commit that fails in time is rewound, never given up"
    broker.fail_topic(ACCEPTED, None)
    await rounds_until(
        worker,
        lambda: worker.idle() and not consumer(worker).behind(),
        "every call committed once the topic takes writes",
        clock=clock,
    )
    assert_one_event_per_call(broker, calls)
    assert_input_committed(broker)


async def test_a_transaction_that_never_commits_is_given_up_within_its_timeout() -> None:
    """The client's waits for a commit have no bound of their own: a round whose commit never
    returns fails at the transaction timeout, the partition is opened again (which aborts it
    and fences the stuck producer), and the calls are judged again, each into one event."""
    broker = new_broker()
    streams, calls = traffic(6)
    produce(broker, streams)
    worker = new_worker(
        broker, delivery={"guarantee": "exactly_once", "transaction_timeout_ms": 1000}
    )
    await worker.start()
    await consumer(worker).join()
    hold = broker.hold = Hold("commit_transaction")  # never released
    await rounds_until(worker, lambda: worker.stats.rewinds == 1, "rewind of the stuck commit")
    assert hold.reached.is_set()
    await rounds_until(
        worker, lambda: worker.idle() and not consumer(worker).behind(), "every call committed"
    )
    assert_one_event_per_call(broker, calls)
    assert_input_committed(broker)


async def test_a_commit_that_fails_after_a_round_outlived_the_session_reopens_nothing() -> None:
    """The worker stalls (a paused process: here a round whose fetch waits while the clock
    passes the session) with a commit in flight; once it runs again that commit fails by its
    timeout. Its membership may be lost and its partitions another member's: it gives them up
    without opening their producers again (which would fence that member), until the group
    assigns it partitions again; then it opens them and judges on, every call into one
    event."""
    clock = Clock()
    broker = new_broker()
    streams, calls = traffic(6)
    produce(broker, streams)
    worker = new_worker(
        broker, clock, delivery={"guarantee": "exactly_once", "transaction_timeout_ms": 1000}
    )
    session_s = worker.settings.kafka.session_timeout_ms / 1000
    await worker.start()
    await consumer(worker).join()
    hold = broker.hold = Hold("commit_transaction", f"{GROUP}-{INPUT}-0")
    await rounds_until(worker, hold.reached.is_set, "a commit in flight")
    epochs = dict(broker.epochs)
    fake = consumer(worker)
    clock.now += 1.0  # a while after the assignment
    fake.held_up = asyncio.Event()  # the next round's fetch waits: the worker stalls
    stalled = asyncio.create_task(worker.step())
    await asyncio.sleep(0)
    clock.now += session_s + 5  # the process was stopped this long
    fake.held_up.set()
    fake.held_up = None
    await asyncio.wait_for(stalled, ROUND_S)
    await rounds_until(worker, lambda: (INPUT, 0) in fenced(worker), "the partition given up")
    assert broker.epochs == epochs, "a producer opened again: it would fence the new owner"
    assert worker.stats.rewinds == 0
    hold.release.set()
    await fake.revoke([TopicPartition(INPUT, 0)])  # the group moves it on, then gives it back
    await fake.join([TopicPartition(INPUT, 0)])
    assert broker.epochs[f"{GROUP}-{INPUT}-0"] == epochs[f"{GROUP}-{INPUT}-0"] + 1
    await rounds_until(
        worker, lambda: worker.idle() and not fake.behind(), "every call committed", clock=clock
    )
    assert_one_event_per_call(broker, calls)
    assert_input_committed(broker)


async def test_a_stall_while_the_worker_runs_is_seen_by_its_pulse_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The process stopped past its session wherever its loop was (judging, between rounds,
    in a fetch): once it runs again it takes its membership for lost, says so once, and has
    its place back when the group assigns it partitions again."""
    clock = Clock()
    broker = new_broker()
    streams, _ = traffic(6)
    produce(broker, streams)
    worker = new_worker(broker, clock)
    session_s = worker.settings.kafka.session_timeout_ms / 1000
    await worker.start()
    fake = consumer(worker)
    await fake.join()
    clock.now += 1.0  # a while after the assignment
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(_until(lambda: worker.stats.emitted > 0), ROUND_S)
        caplog.set_level("WARNING", logger="callgate.worker")
        clock.now += session_s + 5  # the process was stopped this long
        await asyncio.wait_for(_until(lambda: worker.broker.membership_lost), ROUND_S)
        stalls = [r for r in caplog.records if "long enough to be expelled" in r.getMessage()]
        assert len(stalls) == 1, [r.getMessage() for r in caplog.records]
        await fake.revoke([TopicPartition(INPUT, 0)])  # the group moves it on and back
        await fake.join([TopicPartition(INPUT, 0)])
        await asyncio.wait_for(_until(lambda: not worker.broker.membership_lost), ROUND_S)
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, ROUND_S)
        await worker.close()
    assert len([r for r in caplog.records if "long enough to be expelled" in r.getMessage()]) == 1


async def test_a_stall_is_no_time_kafka_failed_to_answer(caplog: pytest.LogCaptureFixture) -> None:
    """The process stopped past the readiness bound while Kafka answered: what it sent meanwhile
    is read only once the loop runs again, so the rounds right after the stall find every
    answer late. That is the worker's stall, not Kafka's: no "Kafka unreachable", and ready
    again. Fetches still unanswered for the bound from the stall's end are Kafka's: said.
    (A paused member said Kafka was unreachable the moment it resumed: CI failed so.)"""
    clock = Clock()
    broker = new_broker()
    streams, _ = traffic(6)
    produce(broker, streams)
    worker = new_worker(broker, clock, wall=clock)
    bound_s = worker.settings.metrics.ready_within_ms / 1000
    await worker.start()
    fake = consumer(worker)
    fake.wall = clock
    await fake.join()
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(_until(lambda: worker.stats.emitted > 0), ROUND_S)
        await asyncio.wait_for(_until(lambda: worker.readiness()[0]), ROUND_S)
        caplog.set_level("INFO", logger="callgate.kafka")
        fake.unanswered = True  # the answers Kafka sent during the stall are not read yet
        clock.now += 3 * bound_s  # the process was stopped this long
        await asyncio.wait_for(_until(lambda: worker.readiness()[0]), ROUND_S)
        assert "Kafka unreachable" not in caplog.text, worker.readiness()

        def later() -> bool:  # time goes on a little at each poll: the loop runs, no stall
            clock.now += 0.05
            return "Kafka unreachable" in caplog.text

        await asyncio.wait_for(_until(later), ROUND_S)
        assert "no fetch answered" in worker.readiness()[1]
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, ROUND_S)
        await worker.close()


async def _until(done: Callable[[], bool]) -> None:
    """Yields to the running worker until `done()`; the caller bounds it."""
    while not done():
        await asyncio.sleep(0.01)


async def test_a_commit_that_never_returns_is_given_up_and_made_again() -> None:
    """The client retries a commit while the coordinator is away, without a bound of its own:
    the worker gives it up after the request timeout, and a later commit carries the offsets."""
    broker = new_broker()
    streams, calls = traffic(6)
    produce(broker, streams)
    worker = new_worker(broker, kafka={"request_timeout_ms": 1000})
    await worker.start()
    hold = broker.hold = Hold("commit")  # never released
    await asyncio.wait_for(held_round(worker, broker, hold), timeout=ROUND_S)
    await asyncio.wait_for(commit_settled(worker), timeout=ROUND_S)
    assert worker.stats.commit_errors == 1
    await run_until_idle(worker, broker)
    assert_one_verdict_per_call(broker, calls)
    assert_input_committed(broker)


async def test_rounds_go_on_while_a_commit_waits_and_a_stop_waits_for_it() -> None:
    """A commit runs beside the rounds: while the coordinator has not answered, later rounds
    are judged, written and checkpointed, and no second commit starts. Stopping waits for the
    commit in flight, then commits the rest: every input offset ends committed."""
    broker = new_broker()
    first, calls = traffic(6)
    produce(broker, first)
    worker = new_worker(broker, kafka={"commit_interval_ms": 0})
    await worker.start()
    hold = broker.hold = Hold("commit")
    await asyncio.wait_for(held_round(worker, broker, hold), timeout=ROUND_S)
    fake = consumer(worker)
    assert broker.committed == {}, "the first commit is held"
    assert len(fake.commits_asked) == 1
    later = {f"t{i}": weather_call(f"t{i}", f"d{i}", f"town{i}") for i in range(6)}
    produce(broker, later)
    for _ in range(6):
        await asyncio.wait_for(worker.step(), timeout=ROUND_S)
        broker.deliver()
    assert len(fake.commits_asked) == 1, "one commit in flight at a time"
    assert broker.committed == {}
    assert_one_verdict_per_call(broker, calls | {f"d{i}" for i in range(6)})
    worker.request_stop()
    closing = asyncio.create_task(worker.close())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not closing.done(), "the stop waits for the commit in flight"
    hold.release.set()
    await asyncio.wait_for(closing, timeout=ROUND_S)
    assert worker.stats.commit_errors == 0
    assert_input_committed(broker)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_checkpoint_that_cannot_be_restored_stops_the_worker(guarantee: str) -> None:
    """Not a partition left paused for good (the rebalance listener would swallow the error):
    the worker stops, and says which partitions and why."""
    broker = new_broker()
    produce(broker, traffic(3)[0])
    first = new_worker(broker, delivery={"guarantee": guarantee})
    await first.start()
    await run_until_idle(first, broker)
    changelog = changelog_topic(GROUP, INPUT)
    frames = [r for r in broker.records(changelog) if r.value]
    assert frames, "the first worker checkpointed"
    last = frames[-1]
    broker.logs[changelog][last.partition] = [
        r._replace(value=b"not a checkpoint") if r is last else r
        for r in broker.logs[changelog][last.partition]
    ]
    second = new_worker(broker, delivery={"guarantee": guarantee})
    await second.start()
    await second.step()
    with pytest.raises(StateError, match=rf"cannot restore .*{INPUT}\[{last.partition}\]"):
        await second.run()


async def test_a_stop_does_not_wait_for_a_rebalance_in_progress() -> None:
    broker = new_broker()
    worker = new_worker(broker)
    await worker.start()
    await worker.step()
    consumer(worker).held_up = asyncio.Event()
    running = asyncio.create_task(worker.run())
    await asyncio.sleep(0)
    worker.request_stop()
    await asyncio.wait_for(running, timeout=ROUND_S)
    await worker.close()


async def test_every_assigned_partition_has_its_lag_idle_ones_at_zero() -> None:
    """One partition gets traffic, the others none: each assigned partition (the idle ones and
    the idempotency requests' too) has its lag series, read between rounds once a second, and
    a partition behind has the records not judged yet as its lag."""
    broker = new_broker()
    now = [0.0]
    worker = new_worker(broker, clock=lambda: now[0])
    busy = 1
    for i in range(5):
        broker.append(INPUT, busy, key=b"s", value=b"x", timestamp=1000 + i)
    await worker.start()
    await run_until_idle(worker, broker)
    now[0] += 2.0
    await worker.step()
    lag = {
        (dict(labels)["topic"], int(dict(labels)["partition"])): value
        for labels, value in series(scrape(worker.metrics), "callgate_consumer_lag").items()
    }
    assert lag == dict.fromkeys(sorted(worker.assignment), 0.0)
    assert {(INPUT, p) for p in range(PARTITIONS)} <= set(lag)
    # records arrive while fetching is paused: the lag counts them
    worker.fetcher.pause(worker.assignment)
    for i in range(7):
        broker.append(INPUT, busy, key=b"s", value=b"x", timestamp=2000 + i)
    now[0] += 2.0
    await worker.step()
    assert (
        series(scrape(worker.metrics), "callgate_consumer_lag")[
            frozenset({("topic", INPUT), ("partition", str(busy))})
        ]
        == 7
    )
    await worker.close()


async def test_ready_while_fetches_are_answered_and_writes_acknowledged_within_the_bound() -> None:
    """/readyz's rule: every assigned partition fetched has had a fetch answered within
    `metrics.ready_within_ms`, and writes waiting have had an acknowledgement within it."""
    broker = new_broker()
    now = [1000.0]
    settings = make_settings(metrics={"ready_within_ms": 5000})
    registry = build_registry(settings)
    worker = Worker(
        settings,
        build_processor(settings, registry),
        lambda: build_key_store(settings),
        Metrics(tool_labels(registry)),
        kafka=FakeKafka(broker, GROUP),  # type: ignore[arg-type]
        clock=lambda: now[0],
        wall=lambda: now[0],
    )
    await worker.start()
    fake = consumer(worker)
    fake.wall = lambda: now[0]
    await run_until_idle(worker, broker)
    # the input's, the idempotency requests' and the pending-approval topic's partitions
    owned = PARTITIONS + settings.idempotency.partitions + settings.approval.partitions
    assert worker.readiness() == (True, f"consuming {owned} partitions")
    # the broker stops answering fetches: ready until the bound is passed
    fake.unanswered = True
    now[0] += 3
    await worker.step()
    assert worker.readiness()[0]
    now[0] += 3
    await worker.step()
    ready, reason = worker.readiness()
    assert not ready
    assert reason.startswith(f"no fetch answered within 5 s for {owned} of")
    assert f"{INPUT}[0]" in reason
    fake.unanswered = False
    await worker.step()
    assert worker.readiness()[0]
    # writes wait and none is acknowledged: ready until the bound is passed
    broker.auto_deliver = False
    streams, _ = traffic(6)
    produce(broker, streams)
    await worker.step()
    assert worker.delivery.pending_records
    now[0] += 6
    await worker.step()
    ready, reason = worker.readiness()
    assert not ready
    assert "written and none acknowledged for 6 s" in reason
    broker.auto_deliver = True
    broker.deliver()
    await run_until_idle(worker, broker)
    assert worker.readiness()[0]
    await worker.close()


async def test_a_grant_the_cluster_finds_missing_stops_the_worker_naming_it() -> None:
    """The group's Read refused on a fetch: the worker stops (never retries) with the grant
    named as `callgate topics acls` states it."""
    broker = new_broker()
    worker = new_worker(broker)
    await worker.start()
    consumer(worker).refusal = GroupAuthorizationFailedError()
    with pytest.raises(BrokerError) as raised:
        await asyncio.wait_for(worker.run(), ROUND_S)
    assert str(raised.value).startswith(
        f"not authorized: the worker's principal needs Read on group {GROUP} (join the consumer"
    )
    assert "`callgate topics acls`" in str(raised.value)
    await worker.close()


@pytest.mark.parametrize("stopped_by", ["request_stop", "cancel"])
async def test_run_leaves_no_task_of_its_own_pending(stopped_by: str) -> None:
    """`run`, stopped or cancelled, has ended its pulse when it returns: no task of the worker
    is left pending (to be destroyed pending when the loop closes). Looked at the moment `run`
    returns, before the loop turns again."""
    broker = new_broker()
    worker = new_worker(broker)
    await worker.start()
    await consumer(worker).join()
    pending_at_return: list[asyncio.Task[object]] = []

    def pulses() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() if t.get_name() == "callgate-pulse"]

    async def run() -> None:
        pulse = pulses()
        try:
            await worker.run()
        finally:
            pending_at_return.extend(t for t in pulse + pulses() if not t.done())

    running = asyncio.create_task(run())
    try:
        await asyncio.wait_for(_until(lambda: bool(pulses())), ROUND_S)
        if stopped_by == "cancel":
            running.cancel()
        else:
            worker.request_stop()
        await asyncio.wait((running,), timeout=ROUND_S)
        assert running.done()
        assert pending_at_return == [], "the pulse outlived run"
    finally:
        worker.request_stop()
        await asyncio.wait((running,), timeout=ROUND_S)
        await worker.close()
