"""The at-least-once protocol's bookkeeping: a round is checkpointed only after its records and
every earlier round's are acknowledged, and committed only after its checkpoints are."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.runtime.delivery import Ledger

FRAME = (b"k", b"v", [])
VERIFIED = 1.0  # the outcome topics were seen after every acknowledgement of these tests


def test_the_steps_in_order() -> None:
    ledger = Ledger()
    ledger.open_round(0, 2, {("in", 0): [FRAME]}, {("in", 0): 10})
    ledger.open_round(1, 1, {("in", 0): [FRAME]}, {("in", 0): 20})
    assert ledger.checkpoints_to_send(VERIFIED) == []
    ledger.acknowledged(1, 0.0)  # a later round acknowledged first: still waits for round 0
    assert ledger.checkpoints_to_send(VERIFIED) == []
    ledger.acknowledged(0, 0.0, 2)
    assert [r.id for r in ledger.checkpoints_to_send(VERIFIED)] == [0, 1]
    assert ledger.take_committable() == {}
    ledger.checkpoint_acknowledged(1)
    assert ledger.take_committable() == {}  # round 0's checkpoint first
    ledger.checkpoint_acknowledged(0)
    assert ledger.take_committable() == {("in", 0): 20}
    assert ledger.idle()


def test_a_failed_commit_is_retried_with_the_next() -> None:
    ledger = Ledger()
    ledger.open_round(0, 0, {}, {("in", 0): 5})
    ledger.checkpoints_to_send(VERIFIED)
    offsets = ledger.take_committable()
    ledger.recommit(offsets)
    assert ledger.take_committable() == {("in", 0): 5}


def test_a_revoked_partition_never_checkpoints_or_commits() -> None:
    ledger = Ledger()
    ledger.open_round(0, 1, {("in", 0): [FRAME], ("in", 1): [FRAME]}, {("in", 0): 3, ("in", 1): 4})
    ledger.acknowledged(0, 0.0)
    assert len(ledger.checkpoints_to_send(VERIFIED)) == 1
    ledger.forget([("in", 1)])
    ledger.checkpoint_acknowledged(0)
    assert ledger.take_committable() == {("in", 0): 3}


@settings(max_examples=300, derandomize=True)
@given(data=st.data())
def test_nothing_is_committed_before_it_is_written(data: st.DataObject) -> None:
    """Whatever order acknowledgements come in, a committed offset's round and every earlier
    round had all records and checkpoints acknowledged."""
    ledger = Ledger()
    rounds = data.draw(st.integers(1, 6))
    records = [data.draw(st.integers(0, 3)) for _ in range(rounds)]
    for r in range(rounds):
        ledger.open_round(r, records[r], {("in", 0): [FRAME]}, {("in", 0): (r + 1) * 10})
    acked_records = [0] * rounds
    acked_checkpoints: set[int] = set()
    sent: set[int] = set()
    events = [("record", r) for r in range(rounds) for _ in range(records[r])]
    events += [("checkpoint", r) for r in range(rounds)]
    order = data.draw(st.permutations(events))
    committed = 0
    for kind, r in order:
        if kind == "record":
            ledger.acknowledged(r, 0.0)
            acked_records[r] += 1
        elif r in sent:
            ledger.checkpoint_acknowledged(r)
            acked_checkpoints.add(r)
        for round_ in ledger.checkpoints_to_send(VERIFIED):
            sent.add(round_.id)
        offset = ledger.take_committable().get(("in", 0))
        if offset is not None:
            done = offset // 10
            for earlier in range(done):
                assert acked_records[earlier] == records[earlier]
                assert earlier in acked_checkpoints
            committed = max(committed, offset)
