"""The delivery ledger, flow control and retry backoff: pure, no broker."""

from __future__ import annotations

import pytest

from worker.model import (
    AssembledCall,
    Code,
    IncompleteReason,
    Outcome,
    Phase,
    SourceSpan,
    Verdict,
)
from worker.runtime.delivery import (
    Backoff,
    DeliveryLedger,
    FlowControl,
    FlowDecision,
    ReplayGuard,
    replay_mark,
)

A0 = ("in", 0)
A1 = ("in", 1)


def test_offsets_wait_for_their_batch_to_be_acknowledged() -> None:
    ledger: DeliveryLedger[int] = DeliveryLedger()
    batch = ledger.record_batch(2, {A0: 10})
    assert ledger.pending == 2
    assert ledger.committable() == {}
    ledger.acknowledge(batch)
    assert ledger.committable() == {}
    ledger.acknowledge(batch)
    assert ledger.pending == 0
    assert ledger.committable() == {A0: 10}


def test_a_later_batch_never_commits_before_an_earlier_one() -> None:
    ledger: DeliveryLedger[int] = DeliveryLedger()
    first = ledger.record_batch(1, {A0: 5})
    second = ledger.record_batch(1, {A0: 9, A1: 3})
    ledger.acknowledge(second)
    assert ledger.committable() == {}, "batch 1's output is still unacknowledged"
    ledger.acknowledge(first)
    assert ledger.committable() == {A0: 9, A1: 3}


def test_a_batch_without_outputs_releases_once_earlier_ones_are_done() -> None:
    ledger: DeliveryLedger[int] = DeliveryLedger()
    first = ledger.record_batch(1, {A0: 4})
    ledger.record_batch(0, {A0: 6})
    assert ledger.committable() == {}
    ledger.acknowledge(first)
    assert ledger.committable() == {A0: 6}


def test_committed_offsets_are_not_offered_again() -> None:
    ledger: DeliveryLedger[int] = DeliveryLedger()
    ledger.record_batch(0, {A0: 4, A1: 2})
    ledger.mark_committed({A0: 4, A1: 2})
    assert ledger.committable() == {}
    ledger.record_batch(0, {A0: 4, A1: 7})
    assert ledger.committable() == {A1: 7}
    assert ledger.committed(A0) == 4


def test_a_revoked_partition_is_forgotten_even_in_flight() -> None:
    ledger: DeliveryLedger[int] = DeliveryLedger()
    batch = ledger.record_batch(1, {A0: 8, A1: 8})
    ledger.forget([A0])
    ledger.acknowledge(batch)
    assert ledger.committable() == {A1: 8}
    assert ledger.committed(A0) is None


def test_extra_or_unknown_acknowledgements_do_not_go_negative() -> None:
    ledger: DeliveryLedger[int] = DeliveryLedger()
    batch = ledger.record_batch(1, {A0: 1})
    ledger.acknowledge(batch, 5)
    ledger.acknowledge(999)
    assert ledger.pending == 0
    assert ledger.batches_in_flight == 0


def test_flow_pauses_above_the_limit_and_resumes_at_half() -> None:
    flow = FlowControl(limit=100)
    assert flow.update(100, producer_failing=False) is FlowDecision.KEEP
    assert flow.update(101, producer_failing=False) is FlowDecision.PAUSE
    assert flow.paused
    assert flow.update(120, producer_failing=False) is FlowDecision.KEEP
    assert flow.update(51, producer_failing=False) is FlowDecision.KEEP
    assert flow.update(50, producer_failing=False) is FlowDecision.RESUME
    assert not flow.paused


def test_flow_pauses_while_the_producer_fails_whatever_the_backlog() -> None:
    flow = FlowControl(limit=100)
    assert flow.update(0, producer_failing=True) is FlowDecision.PAUSE
    assert flow.update(0, producer_failing=True) is FlowDecision.KEEP
    assert flow.update(0, producer_failing=False) is FlowDecision.RESUME


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(base_s=0.1, cap_s=0.5)
    assert backoff.delay == 0.0
    assert [backoff.failed() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.succeeded()
    assert backoff.delay == 0.0


def _call(first: int, *, chunks: int, partition: int = 0) -> AssembledCall:
    return AssembledCall(
        stream_id="s",
        call_id="c",
        tool="get_weather",
        arguments=b"",
        source=SourceSpan("in", partition, first, first),
        chunks=chunks,
    )


GAP = Verdict(Outcome.INCOMPLETE, Phase.ASSEMBLY, reason=IncompleteReason.SEQUENCE_GAP)
POISON = Verdict(Outcome.REJECTED, Phase.ASSEMBLY, Code.MALFORMED_RECORD)
ACCEPTED = Verdict(Outcome.ACCEPTED)


def test_replay_guard_drops_only_fragments_inside_the_window() -> None:
    guard = ReplayGuard()
    guard.resume(A0, committed=100, metadata=replay_mark(180))
    assert guard.active
    assert guard.window(A0) == 180
    # the tail of a call that began before offset 100: judged already by the previous owner
    assert guard.is_judged_fragment(_call(120, chunks=0), GAP)
    assert guard.is_judged_fragment(_call(130, chunks=0), POISON)
    # a whole call replayed from its start: emitted again (same event_id), never dropped
    assert not guard.is_judged_fragment(_call(110, chunks=3), ACCEPTED)
    # a real gap inside a call whose start was replayed
    assert not guard.is_judged_fragment(_call(110, chunks=2), GAP)
    # past the window, or on another partition: everything is new
    assert not guard.is_judged_fragment(_call(180, chunks=0), GAP)
    assert not guard.is_judged_fragment(_call(120, chunks=0, partition=1), GAP)
    assert guard.dropped == 2


def test_replay_guard_window_closes_once_fed_past_the_mark() -> None:
    guard = ReplayGuard()
    guard.resume(A0, committed=100, metadata=replay_mark(180))
    guard.fed(A0, 150)
    assert guard.window(A0) == 180
    guard.fed(A0, 180)
    assert guard.window(A0) is None
    assert not guard.active
    assert not guard.is_judged_fragment(_call(120, chunks=0), GAP)


@pytest.mark.parametrize(
    ("committed", "metadata"),
    [
        (None, replay_mark(50)),
        (50, ""),
        (50, None),
        (50, "other:7"),
        (50, "callgate:fed=x"),
        (50, replay_mark(50)),
        (50, replay_mark(10)),
    ],
)
def test_replay_guard_without_a_usable_mark_opens_no_window(
    committed: int | None, metadata: str | None
) -> None:
    guard = ReplayGuard()
    guard.resume(A0, committed=committed, metadata=metadata)
    assert guard.window(A0) is None


def test_replay_guard_forgets_a_revoked_partition() -> None:
    guard = ReplayGuard()
    guard.resume(A0, committed=1, metadata=replay_mark(9))
    guard.forget(A0)
    assert not guard.active
