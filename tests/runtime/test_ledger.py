"""The at-least-once protocol's bookkeeping: a round is checkpointed only after its records and
every earlier round's are acknowledged, and committed only after its checkpoints are; a
forgotten partition is never committed and never waited for."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.runtime.ledger import Ledger

FRAME = (b"k", b"v", [])
P0, P1 = ("in", 0), ("in", 1)
VERIFIED = 1.0  # the outcome topics were seen after every acknowledgement of these tests


def test_the_steps_in_order() -> None:
    ledger = Ledger()
    ledger.open_round(0, {P0: 2}, {P0: [FRAME]}, {P0: 10})
    ledger.open_round(1, {P0: 1}, {P0: [FRAME]}, {P0: 20})
    assert ledger.checkpoints_to_send(VERIFIED) == []
    ledger.acknowledged(1, P0, 0.0)  # a later round acknowledged first: still waits for round 0
    assert ledger.checkpoints_to_send(VERIFIED) == []
    ledger.acknowledged(0, P0, 0.0, 2)
    assert [r.id for r in ledger.checkpoints_to_send(VERIFIED)] == [0, 1]
    assert ledger.take_committable() == {}
    ledger.checkpoint_acknowledged(1, P0)
    assert ledger.take_committable() == {}  # round 0's checkpoint first
    ledger.checkpoint_acknowledged(0, P0)
    assert ledger.take_committable() == {("in", 0): 20}
    assert ledger.idle()


def test_a_failed_commit_is_retried_with_the_next() -> None:
    ledger = Ledger()
    ledger.open_round(0, {}, {}, {P0: 5})
    ledger.checkpoints_to_send(VERIFIED)
    offsets = ledger.take_committable()
    ledger.recommit(offsets)
    assert ledger.take_committable() == {("in", 0): 5}


def test_a_revoked_partition_never_checkpoints_or_commits() -> None:
    ledger = Ledger()
    ledger.open_round(0, {P0: 1}, {P0: [FRAME], P1: [FRAME]}, {P0: 3, P1: 4})
    ledger.acknowledged(0, P0, 0.0)
    assert len(ledger.checkpoints_to_send(VERIFIED)) == 1
    ledger.forget([P1], 0.0)
    ledger.checkpoint_acknowledged(0, P0)
    assert ledger.take_committable() == {P0: 3}


def test_a_forgotten_partition_s_records_are_not_waited_for() -> None:
    ledger = Ledger()
    ledger.open_round(0, {P0: 1, P1: 2}, {P0: [FRAME], P1: [FRAME]}, {P0: 3, P1: 4})
    ledger.acknowledged(0, P0, 0.0)
    ledger.forget([P1], 0.5)  # its two records were dropped by the outbox: never acknowledged
    assert ledger.pending_records == 0
    assert ledger.checkpoints_to_send(0.4) == [], "acknowledged when forgotten, not before"
    assert len(ledger.checkpoints_to_send(VERIFIED)) == 1
    ledger.acknowledged(0, P1, 0.6)  # a late acknowledgement of a forgotten record: nothing
    ledger.checkpoint_acknowledged(0, P0)
    assert ledger.take_committable() == {P0: 3}
    assert ledger.idle()


@settings(max_examples=300, derandomize=True)
@given(data=st.data())
def test_nothing_is_committed_before_it_is_written(data: st.DataObject) -> None:
    """Whatever order acknowledgements come in, a committed offset's round and every earlier
    round had all records and checkpoints acknowledged."""
    ledger = Ledger()
    rounds = data.draw(st.integers(1, 6))
    records = [data.draw(st.integers(0, 3)) for _ in range(rounds)]
    for r in range(rounds):
        ledger.open_round(r, {P0: records[r]}, {P0: [FRAME]}, {P0: (r + 1) * 10})
    acked_records = [0] * rounds
    acked_checkpoints: set[int] = set()
    sent: set[int] = set()
    events = [("record", r) for r in range(rounds) for _ in range(records[r])]
    events += [("checkpoint", r) for r in range(rounds)]
    order = data.draw(st.permutations(events))
    committed = 0
    for kind, r in order:
        if kind == "record":
            ledger.acknowledged(r, P0, 0.0)
            acked_records[r] += 1
        elif r in sent:
            ledger.checkpoint_acknowledged(r, P0)
            acked_checkpoints.add(r)
        for round_ in ledger.checkpoints_to_send(VERIFIED):
            sent.add(round_.id)
        offset = ledger.take_committable().get(P0)
        if offset is not None:
            done = offset // 10
            for earlier in range(done):
                assert acked_records[earlier] == records[earlier]
                assert earlier in acked_checkpoints
            committed = max(committed, offset)


@settings(max_examples=300, derandomize=True)
@given(data=st.data())
def test_forgetting_partitions_never_stalls_the_others(data: st.DataObject) -> None:
    """Rounds over three partitions; records and checkpoints acknowledged in any order,
    partitions forgotten at any point, their records then dropped (never acknowledged) or
    acknowledged late. Once everything owed for the partitions kept is acknowledged, every
    round settles: the kept partitions' last offsets are committable, no forgotten partition's
    offset ever is, and nothing is pending."""
    partitions = [("in", p) for p in range(3)]
    ledger = Ledger()
    rounds = data.draw(st.integers(1, 5))
    made = [{where: data.draw(st.integers(0, 2)) for where in partitions} for _ in range(rounds)]
    for r in range(rounds):
        ledger.open_round(
            r,
            made[r],
            {where: [FRAME] * data.draw(st.integers(1, 2)) for where in partitions},
            dict.fromkeys(partitions, (r + 1) * 10),
        )
    records = [
        (r, where) for r in range(rounds) for where in partitions for _ in range(made[r][where])
    ]
    forgotten: set[tuple[str, int]] = set()
    committed: dict[tuple[str, int], int] = {}
    clock = 0.0
    steps = st.one_of(st.just("acknowledge"), st.sampled_from(partitions))
    for step in data.draw(st.lists(steps, max_size=20)):
        clock += 1.0
        if isinstance(step, tuple):
            forgotten.add(step)
            ledger.forget([step], clock)
        elif records:
            r, where = records.pop(data.draw(st.integers(0, len(records) - 1)))
            if where not in forgotten or data.draw(st.booleans()):  # else dropped
                ledger.acknowledged(r, where, clock)
        committed.update(ledger.take_committable())
        assert not forgotten & set(committed), "a forgotten partition was committed"
    for r, where in records:  # what is still owed for the kept partitions arrives
        if where not in forgotten:
            ledger.acknowledged(r, where, clock)
    for _ in range(rounds):
        for round_ in ledger.checkpoints_to_send(clock + 1.0):
            for where, frames in round_.checkpoints.items():
                ledger.checkpoint_acknowledged(round_.id, where, len(frames))
        committed.update(ledger.take_committable())
    assert ledger.idle()
    assert ledger.pending_records == 0
    kept = {where: rounds * 10 for where in partitions if where not in forgotten}
    assert {w: o for w, o in committed.items() if w not in forgotten} == kept
