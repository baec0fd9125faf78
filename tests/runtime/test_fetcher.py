"""The fetcher on an in-memory consumer (`tests.runtime.fakes`): what it reads ahead is handed
out once, in order, within its bounds; a batch of a partition placed again since is not the
partition's any more; and the membership rule of a worker whose round outlived its session."""

from __future__ import annotations

import asyncio
import gc

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, UnknownMemberIdError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.runtime.fakes import FakeBroker, FakeConsumer, Hold
from tests.support.unwaited import unwaited
from worker.metrics import Metrics
from worker.runtime.fetcher import CONTACT_SLACK_S, Fetcher, Membership
from worker.runtime.worker import PULSE_S
from worker.settings import KafkaSettings

TOPIC = "in"
#: how long a wait may take before it is taken for a hang
HANG_S = 60.0
PARTITIONS = 3


class Listener:
    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        pass

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        pass


def fetcher_on(broker: FakeBroker, *, max_records: int, buffered: int) -> Fetcher:
    """A fetcher whose consumer hands out at most `buffered` records a call (what aiokafka
    holds of the partitions at a time)."""
    consumer = FakeConsumer(broker, "g", max_records=buffered)
    consumer.subscribe(topics=[TOPIC], listener=Listener())
    return Fetcher(consumer, Metrics(frozenset()), fetch_timeout_ms=1, max_records=max_records)


def loaded(counts: list[int]) -> FakeBroker:
    broker = FakeBroker()
    broker.create_topic(TOPIC, PARTITIONS)
    for partition, count in enumerate(counts):
        for offset in range(count):
            broker.append(TOPIC, partition, key=None, value=b"%d" % offset)
    return broker


@pytest.mark.asyncio
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.integers(0, 60), min_size=PARTITIONS, max_size=PARTITIONS),
    max_records=st.integers(1, 25),
    buffered=st.integers(1, 40),
    room=st.integers(0, 100),
)
async def test_every_record_is_handed_out_once_in_order_within_the_bounds(
    counts: list[int], max_records: int, buffered: int, room: int
) -> None:
    broker = loaded(counts)
    fetcher = fetcher_on(broker, max_records=max_records, buffered=buffered)
    await fetcher.consumer.join()
    stop = asyncio.Event()
    seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for _ in range(sum(counts) + 5):
        batch = await fetcher.fetch(stop, room)
        assert sum(len(records) for records in batch.values()) <= max_records
        # read ahead: within the room (or a round's worth), one handout of a partition at most
        assert fetcher.ahead_records <= max(room, max_records) + buffered
        for tp, records in batch.items():
            seen[tp.partition].extend(record.offset for record in records)
    assert seen == {p: list(range(count)) for p, count in enumerate(counts)}
    assert fetcher.ahead_records == 0


@pytest.mark.asyncio
async def test_a_batch_of_a_partition_placed_again_since_is_not_the_partition_s() -> None:
    broker = loaded([10, 10, 10])
    fetcher = fetcher_on(broker, max_records=30, buffered=30)
    await fetcher.consumer.join()
    batch = await fetcher.fetch(asyncio.Event(), 0)
    assert {tp.partition for tp in batch} == {0, 1, 2}
    await fetcher.place({(TOPIC, 1): 4})  # a rewind or a rebalance ran meanwhile
    assert {tp.partition for tp in fetcher.current(batch)} == {0, 2}
    again = await fetcher.fetch(asyncio.Event(), 0)
    assert [r.offset for r in again[TopicPartition(TOPIC, 1)]] == list(range(4, 10))


class CountingConsumer(FakeConsumer):
    """Counts the committed-offset requests in flight at once (each yields to the loop once,
    as a request to the broker does)."""

    in_flight = 0
    most_in_flight = 0

    async def committed(self, tp: TopicPartition) -> int | None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        return await super().committed(tp)


@pytest.mark.asyncio
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    places=st.lists(
        st.tuples(
            st.none() | st.integers(0, 50),  # its checkpoint's offset, or none
            st.none() | st.integers(0, 50),  # its committed offset, or none
            st.integers(0, 5),  # where its log starts
        ),
        min_size=1,
        max_size=8,
    )
)
async def test_each_partition_is_placed_at_its_checkpoint_else_its_commit_else_its_start(
    places: list[tuple[int | None, int | None, int]],
) -> None:
    broker = FakeBroker()
    broker.create_topic(TOPIC, len(places))
    consumer = CountingConsumer(broker, "g")
    consumer.subscribe(topics=[TOPIC], listener=Listener())
    fetcher = Fetcher(consumer, Metrics(frozenset()), fetch_timeout_ms=1, max_records=10)
    await consumer.join()
    for partition, (_, committed, start) in enumerate(places):
        broker.starts[(TOPIC, partition)] = start
        if committed is not None:
            broker.committed[("g", TOPIC, partition)] = committed
    await fetcher.place(
        {(TOPIC, partition): checkpoint for partition, (checkpoint, _, _) in enumerate(places)}
    )
    assert consumer.positions() == {
        TopicPartition(TOPIC, partition): next(o for o in place if o is not None)
        for partition, place in enumerate(places)
    }
    # the committed offsets asked for are asked at once, not one round trip after another
    assert consumer.most_in_flight == sum(checkpoint is None for checkpoint, _, _ in places)


@pytest.mark.asyncio
async def test_a_batch_put_back_is_fetched_again_from_its_first_record() -> None:
    broker = loaded([10, 0, 0])
    fetcher = fetcher_on(broker, max_records=4, buffered=10)
    await fetcher.consumer.join()
    first = await fetcher.fetch(asyncio.Event(), 100)
    assert [r.offset for r in first[TopicPartition(TOPIC, 0)]] == [0, 1, 2, 3]
    fetcher.put_back(first)
    assert fetcher.ahead_records == 0, "what was read ahead of it goes too"
    again = await fetcher.fetch(asyncio.Event(), 100)
    assert [r.offset for r in again[TopicPartition(TOPIC, 0)]] == [0, 1, 2, 3]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_round_that_outlived_the_session_loses_the_membership_until_assigned() -> None:
    clock = Clock()
    membership = Membership(6.0, 2.0, clock)
    began = clock.now
    clock.now += 3.5
    membership.ran(began)
    assert not membership.lost, "within the session less a heartbeat interval"
    began = clock.now
    clock.now += 15.0  # paused (SIGSTOP) in the middle of a round
    membership.ran(began)
    assert membership.lost
    membership.assigned()  # it rejoined: the group gave it partitions again
    assert not membership.lost


def test_a_round_outlived_by_a_rebalance_that_assigned_during_it_keeps_the_membership() -> None:
    clock = Clock()
    membership = Membership(6.0, 2.0, clock)
    began = clock.now
    clock.now += 10.0  # the fetch waited out a rebalance, which assigned partitions
    membership.assigned()
    clock.now += 1.0
    membership.ran(began)
    assert not membership.lost


def test_a_membership_taken_for_lost_that_no_rebalance_follows_is_kept_a_session_later() -> None:
    """Heartbeats go on between the rounds: a member that was expelled hears it within one and
    rejoins; one that hears nothing for a session stayed."""
    clock = Clock()
    membership = Membership(6.0, 2.0, clock)
    began = clock.now
    clock.now += 7.0
    membership.ran(began)
    assert membership.lost
    clock.now += 6.0
    assert not membership.lost


@settings(max_examples=2000)
@given(
    session_ms=st.integers(1000, 60_000),
    callback_share=st.floats(0.0, 1.5),
    sync_delay_share=st.floats(0.0, 1.0),
    stall_at_share=st.floats(0.0, 3.0),
    pulse_phase=st.floats(0.0, 1.0, exclude_max=True),
    stall_share=st.floats(0.0, 2.0),
)
def test_every_stall_the_group_expels_the_member_for_is_taken_for_lost(
    *,
    session_ms: int,
    callback_share: float,
    sync_delay_share: float,
    stall_at_share: float,
    pulse_phase: float,
    stall_share: float,
) -> None:
    """A model of the coordinator: it expels the member when it heard nothing from it for a
    session. It hears the member at the assignment (up to `CONTACT_SLACK_S` before the member's
    callback begins) and at every heartbeat, which the client sends a heartbeat interval (the
    one the consumer is given) after the assignment callback returned, then every interval. The
    member stalls at any point after its assignment (in its callback, before its first
    heartbeat, or later); its pulse's last beat before the stall was `pulse_phase` of a beat
    earlier. Whenever the group expels it, the beat after the stall takes the membership for
    lost; a stall the member can tell was shorter than the session less what it may have gone
    unheard before never does. (A paused member expelled 4 s into a 6 s session, having
    stalled before its first heartbeat, was unsaid before: CI failed so.)"""
    kafka = KafkaSettings(session_timeout_ms=session_ms)
    session_s, heartbeat_s = session_ms / 1000, kafka.heartbeat_interval_ms / 1000
    clock = Clock()
    membership = Membership(session_s, heartbeat_s, clock)
    assigned_at = clock.now
    membership.assigned()
    heard = [assigned_at - sync_delay_share * CONTACT_SLACK_S]
    settled_at = assigned_at + callback_share * session_s
    stalled_at = assigned_at + stall_at_share * session_s
    if stalled_at >= settled_at:  # the callback returned before the stall: heartbeats run
        clock.now = settled_at
        membership.settled()
        heartbeat = settled_at + heartbeat_s
        while heartbeat <= stalled_at:
            heard.append(heartbeat)
            heartbeat += heartbeat_s
    beat = stalled_at - pulse_phase * PULSE_S
    clock.now = stalled_at + stall_share * session_s
    membership.ran(beat)
    if clock.now - heard[-1] > session_s:
        assert membership.lost, "expelled by the group, unsaid"
    began = max(beat, assigned_at)
    if began >= settled_at + heartbeat_s:  # its last beat saw the heartbeats begun
        if clock.now - began <= session_s - heartbeat_s - CONTACT_SLACK_S:
            assert not membership.lost, "within the session less a heartbeat interval"
    elif clock.now - assigned_at <= session_s - CONTACT_SLACK_S:
        assert not membership.lost, "within the session from the assignment"


def _raised_from(exc: Exception, cause: Exception) -> Exception:
    exc.__cause__ = cause
    return exc


#: how a commit request no longer waited for is answered, and the line that says it
ANSWERS: dict[str, tuple[Exception | None, str]] = {
    "made": (None, "a commit no longer waited for was made"),
    "refused": (
        _raised_from(CommitFailedError(), UnknownMemberIdError("g")),
        "a commit no longer waited for was refused: "
        "CommitFailedError from UnknownMemberIdError('g')",
    ),
    "bug": (ValueError("a bug"), "a commit no longer waited for failed"),
}


@pytest.mark.asyncio
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cut_by=st.sampled_from(["timeout", "cancel"]),
    answer=st.sampled_from(sorted(ANSWERS)),
    turns=st.integers(0, 3),
)
async def test_a_commit_cut_off_in_flight_is_read_to_its_end(
    cut_by: str, answer: str, turns: int
) -> None:
    """A commit whose caller stops waiting while the client's request is in flight (its
    timeout, or a revoke's or a stop's deadline cancelling it), answered `turns` loop turns
    later: the answer (made, refused, or a bug) is read and said in one line, and nothing is
    left as "Task exception was never retrieved" (the consumer's request runs under a
    shield, as aiokafka's does)."""
    broker = loaded([1, 1, 1])
    fetcher = fetcher_on(broker, max_records=10, buffered=10)
    consumer = fetcher.consumer
    await consumer.join()
    consumer.commit_refusal, line = ANSWERS[answer]
    hold = Hold("commit")
    broker.hold = hold
    with unwaited("callgate.worker") as watched:
        offsets = {(TOPIC, partition): 1 for partition in range(PARTITIONS)}
        cut = asyncio.ensure_future(fetcher.commit(offsets, 0.01 if cut_by == "timeout" else 3600))
        await hold.reached.wait()
        if cut_by == "cancel":
            cut.cancel()
        with pytest.raises(TimeoutError if cut_by == "timeout" else asyncio.CancelledError):
            await cut
        del cut
        for _ in range(turns):
            await asyncio.sleep(0)
        hold.release.set()
        await fetcher.close(HANG_S)
        gc.collect()
    assert watched.unread == []
    assert watched.lines == [line]
    made = {TopicPartition(TOPIC, partition): 1 for partition in range(PARTITIONS)}
    assert consumer.commits == ([made] if answer == "made" else [])
