"""The delivery ledger, flow control and retry backoff: pure, no broker."""

from __future__ import annotations

from worker.runtime.delivery import Backoff, DeliveryLedger, FlowControl, FlowDecision

A0 = ("in", 0)
A1 = ("in", 1)


def test_offsets_wait_for_their_batch_to_be_acknowledged() -> None:
    ledger = DeliveryLedger()
    batch = ledger.record_batch(2, {A0: 10})
    assert ledger.pending == 2
    assert ledger.committable() == {}
    ledger.acknowledge(batch)
    assert ledger.committable() == {}
    ledger.acknowledge(batch)
    assert ledger.pending == 0
    assert ledger.committable() == {A0: 10}


def test_a_later_batch_never_commits_before_an_earlier_one() -> None:
    ledger = DeliveryLedger()
    first = ledger.record_batch(1, {A0: 5})
    second = ledger.record_batch(1, {A0: 9, A1: 3})
    ledger.acknowledge(second)
    assert ledger.committable() == {}, "batch 1's output is still unacknowledged"
    ledger.acknowledge(first)
    assert ledger.committable() == {A0: 9, A1: 3}


def test_a_batch_without_outputs_releases_once_earlier_ones_are_done() -> None:
    ledger = DeliveryLedger()
    first = ledger.record_batch(1, {A0: 4})
    ledger.record_batch(0, {A0: 6})
    assert ledger.committable() == {}
    ledger.acknowledge(first)
    assert ledger.committable() == {A0: 6}


def test_committed_offsets_are_not_offered_again() -> None:
    ledger = DeliveryLedger()
    ledger.record_batch(0, {A0: 4, A1: 2})
    ledger.mark_committed({A0: 4, A1: 2})
    assert ledger.committable() == {}
    ledger.record_batch(0, {A0: 4, A1: 7})
    assert ledger.committable() == {A1: 7}
    assert ledger.committed(A0) == 4


def test_a_revoked_partition_is_forgotten_even_in_flight() -> None:
    ledger = DeliveryLedger()
    batch = ledger.record_batch(1, {A0: 8, A1: 8})
    ledger.forget([A0])
    ledger.acknowledge(batch)
    assert ledger.committable() == {A1: 8}
    assert ledger.committed(A0) is None


def test_extra_or_unknown_acknowledgements_do_not_go_negative() -> None:
    ledger = DeliveryLedger()
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
