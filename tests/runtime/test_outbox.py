"""The outbox on an in-memory producer (`tests.runtime.fakes`), which, like aiokafka's, holds one
unsent batch per topic partition and waits for a missing topic's metadata: `dispatch()` never
waits for either (it is not a coroutine), and whatever happens in between (rounds dispatched
while earlier batches wait, acknowledgements in any order, a topic failing for a while, a topic
missing until later) every record is written once, acknowledged once, a keyed record in its
key's partition, and each topic partition keeps the order its records were added in."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, RequestTimedOutError, TopicAuthorizationFailedError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.runtime.fakes import FakeBroker, FakeProducer
from worker._native import partition_for_key
from worker.runtime.outbox import (
    Backoff,
    Outbox,
    Record,
    observe_failed_transaction,
    transaction_error,
)

pytestmark = pytest.mark.asyncio

TOPICS = ("a", "b")
#: a topic missing until the test creates it; the producer waits for its metadata meanwhile
LATE = "late"
PARTITIONS = 2


@dataclass
class Sink:
    acknowledged_values: list[bytes] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)

    def acknowledged(self, record: Record) -> None:
        assert record.value is not None
        self.acknowledged_values.append(record.value)

    def refused(self, record: Record, error: KafkaError) -> Record | None:
        raise AssertionError(f"nothing here is refused for good: {error!r}")

    def topic_failing(self, topic: str, error: KafkaError) -> None:
        self.failing.add(topic)

    def topic_recovered(self, topic: str) -> None:
        self.failing.discard(topic)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def new_outbox(batch_records: int) -> tuple[FakeBroker, Outbox, Sink, Clock]:
    broker = FakeBroker(auto_deliver=False, metadata_waits=True)
    for topic in TOPICS:
        broker.create_topic(topic, PARTITIONS)
    sink, clock = Sink(), Clock()
    producer = FakeProducer(broker, batch_records=batch_records)
    outbox = Outbox(producer, sink, clock, backoff=Backoff(base_s=0.1, cap_s=0.4))
    return broker, outbox, sink, clock


async def settle() -> None:
    """Let the senders run until none can move without an acknowledgement."""
    for _ in range(20):
        await asyncio.sleep(0)


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(
            st.just("round"),
            st.lists(
                # a partition named, or None: a keyed record
                st.tuples(
                    st.sampled_from((*TOPICS, LATE)),
                    st.one_of(st.none(), st.integers(0, PARTITIONS - 1)),
                ),
                max_size=6,
            ),
        ),
        st.tuples(st.just("deliver"), st.integers(0, 3)),
        st.tuples(st.just("fail"), st.sampled_from(TOPICS)),
        st.tuples(st.just("recover"), st.sampled_from(TOPICS)),
        st.tuples(st.just("tick"), st.just(0)),
        st.tuples(st.just("create"), st.just(LATE)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=OPERATIONS, batch_records=st.integers(1, 4))
async def test_every_record_is_written_and_acknowledged_once_in_order(
    operations: list[tuple[str, object]], batch_records: int
) -> None:
    broker, outbox, sink, clock = new_outbox(batch_records)
    added: list[Record] = []
    retried = False
    for kind, argument in operations:
        if kind == "round":
            assert isinstance(argument, list)
            for topic, partition in argument:
                value = f"{len(added)}".encode()
                key = value if partition is None else None
                record = Record(0, topic, key, value, [], partition)
                added.append(record)
                outbox.add(record)
            outbox.dispatch()
        elif kind == "deliver":
            assert isinstance(argument, int)
            broker.deliver(argument)
        elif kind == "fail":
            assert isinstance(argument, str)
            broker.fail_topic(argument, RequestTimedOutError())
            retried = True
        elif kind == "recover":
            assert isinstance(argument, str)
            broker.fail_topic(argument, None)
        elif kind == "create":
            broker.create_topic(LATE, PARTITIONS)
        else:
            clock.now += 0.5
        await settle()
        # what it holds is what was added and not acknowledged yet, in records and in bytes
        unacknowledged = len(added) - len(sink.acknowledged_values)
        assert outbox.held_records == unacknowledged
        held = sorted(r.value or b"" for r in added)
        for value in sink.acknowledged_values:
            held.remove(value)
        assert outbox.held_bytes == sum(2 * len(v) if k else len(v) for v, k in _keys(added, held))
    for topic in TOPICS:
        broker.fail_topic(topic, None)
    broker.create_topic(LATE, PARTITIONS)
    for _ in range(len(added) + 10):  # every retry is due after the backoff's cap
        clock.now += 0.5
        outbox.dispatch()
        await settle()
        broker.deliver()
        await settle()
        if not outbox.queued and not outbox.in_flight:
            break
    assert not outbox.queued
    assert not outbox.in_flight
    assert (outbox.held_records, outbox.held_bytes) == (0, 0)
    await outbox.close()

    values = sorted(record.value or b"" for record in added)
    assert sorted(sink.acknowledged_values) == values  # each acknowledged once
    written = [r for topic in (*TOPICS, LATE) for r in broker.records(topic)]
    assert sorted(r.value or b"" for r in written) == values  # each written once
    for r in written:
        if r.key is not None:
            assert r.partition == partition_for_key(r.key, PARTITIONS)
    if not retried:  # a retried batch goes behind what was sent after it
        for topic in (*TOPICS, LATE):
            for log in broker.logs[topic]:
                order = [int(r.value or b"") for r in log]
                assert order == sorted(order), f"{topic}: {order}"


def _keys(added: list[Record], values: list[bytes]) -> list[tuple[bytes, bool]]:
    """The values still held, each with whether its record has a key (its value as key)."""
    keyed = {record.value: record.key is not None for record in added}
    return [(value, keyed[value]) for value in values]


async def test_rounds_dispatched_while_a_batch_waits_go_together_behind_it() -> None:
    broker, outbox, sink, _ = new_outbox(batch_records=100)
    for round_id in range(4):
        outbox.add(Record(round_id, "a", None, f"r{round_id}".encode(), [], 0))
        outbox.dispatch()
        await settle()
    # r0 is unsent; the sender holds r1 in a batch waiting for it; r2 and r3 wait behind
    assert [len(records) for _, _, _, records in broker.pending] == [1]
    assert outbox.queued == 3
    broker.deliver()
    await settle()
    assert [len(records) for _, _, _, records in broker.pending] == [1]
    broker.deliver()
    await settle()
    assert [len(records) for _, _, _, records in broker.pending] == [2]
    broker.deliver()
    await settle()
    assert sink.acknowledged_values == [b"r0", b"r1", b"r2", b"r3"]
    assert not outbox.queued
    assert not outbox.in_flight


async def test_flush_returns_once_every_record_is_handed_over() -> None:
    broker, outbox, _, _ = new_outbox(batch_records=100)
    outbox.add(Record(0, "a", None, b"first", [], 0))
    outbox.dispatch()
    await settle()
    outbox.add(Record(1, "a", None, b"second", [], 0))
    flushing = asyncio.ensure_future(outbox.flush())
    await settle()
    assert not flushing.done()  # "second" waits for "first" to go
    broker.deliver()
    await asyncio.wait_for(flushing, timeout=1.0)
    assert outbox.queued == 0
    assert outbox.in_flight == 1


async def test_a_discarded_record_waiting_for_its_partition_is_not_sent() -> None:
    broker, outbox, sink, _ = new_outbox(batch_records=100)
    for value in (b"sent", b"handed over"):  # unsent; in a batch waiting for it
        outbox.add(Record(0, "a", None, value, [], 0))
        outbox.dispatch()
        await settle()
    outbox.add(Record(1, "a", None, b"dropped", [], 0))
    outbox.add(Record(1, "a", None, b"kept", [], 1))
    outbox.dispatch()
    await settle()
    outbox.discard(lambda record: record.value in (b"dropped", b"handed over"))
    for _ in range(3):
        broker.deliver()
        await settle()
    # what a sender handed to the producer goes, as a record in flight does
    assert sorted(sink.acknowledged_values) == [b"handed over", b"kept", b"sent"]
    assert not outbox.queued
    assert not outbox.in_flight
    assert (outbox.held_records, outbox.held_bytes) == (0, 0), "the dropped one let go"


async def test_close_stops_a_sender_waiting_on_the_producer() -> None:
    broker, outbox, _, _ = new_outbox(batch_records=100)
    outbox.add(Record(0, "a", None, b"first", [], 0))
    outbox.dispatch()
    outbox.add(Record(1, "a", None, b"second", [], 0))
    outbox.dispatch()
    await settle()
    await asyncio.wait_for(outbox.close(), timeout=1.0)
    assert len(broker.pending) == 1


async def test_a_bug_in_a_sender_is_raised_by_the_next_dispatch() -> None:
    broker, outbox, _, _ = new_outbox(batch_records=100)

    class BrokenBatch:
        def append(self, **_: object) -> object:
            raise ZeroDivisionError("a bug")

    outbox.producer.create_batch = BrokenBatch  # type: ignore[method-assign]
    outbox.add(Record(0, "a", None, b"x", [], 0))
    outbox.dispatch()
    await settle()
    with pytest.raises(ZeroDivisionError):
        outbox.dispatch()
    assert not broker.pending


@pytest.mark.parametrize("stale_for_ticks", [0, 1, 3])
async def test_a_partition_the_producer_does_not_know_yet_is_written_once_it_shows(
    stale_for_ticks: int,
) -> None:
    """A partition added to a topic (a changelog grown with its input) is not in the producer's
    metadata until it is read again: the outbox reads it again at once; while it still does
    not show, the topic is failing and its records are retried, then each is written once."""
    broker, outbox, sink, clock = new_outbox(batch_records=100)
    broker.create_topic("grown", 1)
    broker.logs["grown"].append([])  # partition 1 added
    producer = outbox.producer
    producer.unseen.add(("grown", 1))
    producer.client.stale = stale_for_ticks > 0
    for i in range(3):
        outbox.add(Record(0, "grown", None, f"{i}".encode(), [], 1))
    outbox.dispatch()
    for _ in range(stale_for_ticks):
        await settle()
        assert sink.failing == {"grown"}
        assert not broker.pending
        clock.now += 0.5
        outbox.dispatch()
    producer.client.stale = False
    clock.now += 0.5
    outbox.dispatch()
    await settle()
    broker.deliver()
    await settle()
    assert [r.value for r in broker.logs["grown"][1]] == [b"0", b"1", b"2"]
    assert sorted(sink.acknowledged_values) == [b"0", b"1", b"2"]
    assert not sink.failing
    assert producer.client.updates == stale_for_ticks + 1
    await outbox.close()


async def test_a_topic_whose_metadata_is_awaited_holds_back_no_other_topic() -> None:
    """aiokafka waits for a missing topic's metadata (a deleted topic's: the whole request
    timeout). Its keyed records wait for it apart: the rounds go on, the other topics are
    written, and once the topic shows its records are written in their keys' partitions."""
    broker, outbox, sink, _ = new_outbox(batch_records=100)
    for i in range(5):
        outbox.add(Record(i, LATE, f"k{i}".encode(), f"late{i}".encode(), []))
        outbox.add(Record(i, "a", f"k{i}".encode(), f"a{i}".encode(), []))
        outbox.dispatch()
        await settle()
        broker.deliver()
        await settle()
    assert sorted(sink.acknowledged_values) == [f"a{i}".encode() for i in range(5)]
    assert outbox.queued == 5
    broker.create_topic(LATE, PARTITIONS)
    await settle()
    broker.deliver()
    await settle()
    assert sorted(r.value or b"" for r in broker.records(LATE)) == [
        f"late{i}".encode() for i in range(5)
    ]
    assert not outbox.queued
    assert not outbox.in_flight
    await outbox.close()


async def test_a_topic_without_metadata_fails_once_for_all_its_records() -> None:
    """When the producer gives up on a topic's metadata, its records fail together: the topic
    is failing once (one step of its backoff, not one per record), and they are written once
    it shows."""
    broker, outbox, sink, clock = new_outbox(batch_records=100)
    for i in range(8):
        outbox.add(Record(0, LATE, f"k{i}".encode(), f"{i}".encode(), []))
    outbox.dispatch()
    await settle()
    broker.time_out_metadata_waits()
    await settle()
    assert sink.failing == {LATE}
    assert outbox.queued == 8
    broker.create_topic(LATE, PARTITIONS)
    clock.now += 0.1  # the backoff's first step
    outbox.dispatch()
    await settle()
    broker.deliver()
    await settle()
    assert sorted(sink.acknowledged_values) == [f"{i}".encode() for i in range(8)]
    assert not sink.failing
    await outbox.close()


@dataclass
class RefusingSink(Sink):
    refused_values: list[bytes] = field(default_factory=list)

    def refused(self, record: Record, error: KafkaError) -> Record | None:
        assert record.value is not None
        self.refused_values.append(record.value)
        return None


async def test_a_topic_not_authorized_refuses_each_of_its_records_once() -> None:
    """aiokafka says a topic is not authorized when it reads the topic's metadata: no retry
    cures that, so each record waiting for it is refused for good, once, and none is retried."""
    broker = FakeBroker(auto_deliver=False)
    sink = RefusingSink()
    producer = FakeProducer(broker)

    async def not_authorized(topic: str) -> set[int]:
        raise TopicAuthorizationFailedError()

    producer.partitions_for = not_authorized  # type: ignore[method-assign]
    outbox = Outbox(producer, sink, Clock())
    for i in range(3):
        outbox.add(Record(0, LATE, f"k{i}".encode(), f"{i}".encode(), []))
    outbox.dispatch()
    await settle()
    assert sorted(sink.refused_values) == [b"0", b"1", b"2"]
    assert not outbox.queued
    assert not sink.failing
    await outbox.close()


async def test_a_transactional_producer_that_never_began_a_transaction_has_no_error() -> None:
    """A producer stopped before its first transaction began (its start was refused, say, for
    want of a grant) has no transaction error to report, and reading what it left raises
    nothing: the start's own error is the one the worker reports."""
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", transactional_id="never-began")
    assert transaction_error(producer) is None
    observe_failed_transaction(producer)
    await producer.stop()
    assert transaction_error(producer) is None
    observe_failed_transaction(producer)
