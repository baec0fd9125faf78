"""A partition's transaction (`worker.runtime.transactions`) on the in-memory broker: a step with
the broker that is given up (its bound, or its caller cancelled) while a request is in flight is
read to its end, says how it ended, and makes no further request."""

from __future__ import annotations

import asyncio
import gc

import pytest
from aiokafka.errors import KafkaError, ProducerFenced
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.runtime.fakes import FakeBroker, FakeProducer, Hold
from tests.support.unwaited import unwaited
from worker.runtime.outbox import Record
from worker.runtime.transactions import Transactions

GROUP = "g"
WHERE = ("in", 0)
#: how long a wait may take before it is taken for a hang
HANG_S = 60.0
#: loop turns after which a released request's answer has surely been read by its step
SETTLED_TURNS = 30


class _Sink:
    def acknowledged(self, record: Record) -> None:
        pass

    def refused(self, record: Record, error: KafkaError) -> Record | None:
        return None

    def topic_failing(self, topic: str, error: KafkaError) -> None:
        pass

    def topic_recovered(self, topic: str) -> None:
        pass


STEP = "a step of a partition's transaction no longer waited for"


@pytest.mark.asyncio
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    point=st.sampled_from(["send_offsets_to_transaction", "commit_transaction"]),
    cut_by=st.sampled_from(["timeout", "cancel"]),
    fenced=st.booleans(),
    turns=st.integers(0, 3),
    settle=st.sampled_from([0, 2, SETTLED_TURNS]),
)
async def test_a_step_given_up_in_flight_is_read_to_its_end(
    point: str, cut_by: str, fenced: bool, turns: int, settle: int
) -> None:
    """A commit's step cut off (by the transaction timeout, or its caller cancelled) while the
    producer's request (its offsets, its commit) is in flight under `asyncio.shield`, as
    aiokafka's is; the request is answered `turns` loop turns later, made or refused because a
    newer producer fenced this one, and the partition is closed `settle` turns after that.
    Nothing is ever left as "Future exception was never retrieved"; the answer, once the step
    had the turns to read it, is said in one line (a commit made, or the fencing); and a step
    given up before its commit never commits."""
    broker = FakeBroker()
    broker.create_topic(WHERE[0], 1)
    tid = f"{GROUP}-{WHERE[0]}-{WHERE[1]}"
    transactions = Transactions(
        lambda topic, partition: FakeProducer(broker, transactional_id=tid),
        _Sink(),
        asyncio.get_running_loop().time,
        group=GROUP,
        timeout_s=0.05 if cut_by == "timeout" else HANG_S,
    )
    with unwaited("callgate.transactions") as watched:
        await transactions.open(WHERE)
        hold = broker.hold = Hold(point, tid)
        commit = transactions.commit(WHERE, 7)
        await asyncio.wait_for(hold.reached.wait(), HANG_S)
        if cut_by == "cancel":
            commit.cancel()
        with pytest.raises(KafkaError if cut_by == "timeout" else asyncio.CancelledError):
            await commit
        del commit
        if fenced:
            await FakeProducer(broker, transactional_id=tid).start()
        for _ in range(turns):
            await asyncio.sleep(0)
        hold.release.set()
        for _ in range(settle):
            await asyncio.sleep(0)
        await asyncio.wait_for(transactions.close(WHERE, HANG_S), HANG_S)
        gc.collect()
    assert watched.unread == []
    committed = broker.committed.get((GROUP, *WHERE))
    if fenced:
        expected = [f"{STEP} was refused: {ProducerFenced()!r}"]
    elif point == "commit_transaction":
        expected = [f"{STEP} was made"]
    else:  # given up before its commit: no further request, nothing to say
        expected = []
    if settle == SETTLED_TURNS:
        assert watched.lines == expected
    else:
        assert len(watched.lines) <= 1
    assert committed == (7 if watched.lines == [f"{STEP} was made"] else None)
