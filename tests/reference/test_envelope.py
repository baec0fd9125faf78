"""The gate's events on hostile envelope traffic equal the reference judge's.

Generated traffic (`tests/reference/traffic.py`) goes through `callgate check` (unkeyed) and
the worker's processor (keyed by stream id, fed in fetched batches cut at drawn places); both
must give exactly the events the reference judge (`tests/reference/envelope.py`, written from
the README) derives, in the fields `Expected` names, and no two events may share an `event_id`.
With early verdicts on (the default) each path's events are the whole judgement's but for
calls rejected early, which the whole judgement never accepts (`gate.early_sound`).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.reference import envelope, traffic
from tests.reference.conftest import TIMEOUT, repeat
from tests.reference.gate import RealGate, decided_as_reference

pytestmark = pytest.mark.timeout(TIMEOUT)


def test_the_gate_decides_every_call_as_the_reference(gate: RealGate) -> None:
    repeat(lambda: _decided_alike(gate))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=traffic.traffic(), cuts=st.lists(st.integers(0, 40), max_size=3))
def _decided_alike(gate: RealGate, records: list[bytes], cuts: list[int]) -> None:
    try:
        expected = envelope.judge(records, gate.contracts, gate.limits)
    except envelope.Unmodeled:
        assume(False)
        return
    whole = gate.check(records)
    paths = {
        ("check", False): whole,
        ("keyed", False): gate.keyed(records, cuts=cuts),
        ("check", True): gate.check(records, early=True),
        ("keyed", True): gate.keyed(records, cuts=cuts, early=True),
    }
    decided_as_reference(expected, whole, paths)
