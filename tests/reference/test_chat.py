"""The gate's events on hostile Chat Completions streams equal the reference judge's.

Generated streams (`traffic.chat_stream`) go through `callgate check --format openai.chat`
(a recorded SSE file) and through the worker's processor (the events as records keyed by the
stream id, `content-format: openai.chat`, fed in fetched batches cut at drawn places); both
must give exactly the events `tests/reference/chat.py` derives from the README, in the fields
`Expected` names, with no `event_id` twice.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.reference import chat, traffic
from tests.reference.conftest import TIMEOUT, repeat
from tests.reference.gate import RealGate, event_ids, observed, same

pytestmark = pytest.mark.timeout(TIMEOUT)
FORMAT = "openai.chat"


def fetched(records: list[bytes]) -> list[bytes]:
    """The records a producer writes to Kafka: each vendor event, not SSE's `[DONE]` (the
    stream's end is its finish reason, its usage chunk or the end of input alike)."""
    return [r for r in records if r != b"[DONE]"]


def test_the_gate_decides_every_chat_call_as_the_reference(gate: RealGate) -> None:
    repeat(lambda: _decided_alike(gate))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=traffic.chat_stream(), cuts=st.lists(st.integers(0, 30), max_size=3))
def _decided_alike(gate: RealGate, records: list[bytes], cuts: list[int]) -> None:
    try:
        expected = chat.judge(records, "stream", gate.contracts, gate.limits)
    except chat.Unmodeled:
        assume(False)
        return
    for path, events in (
        ("check", gate.check(records, FORMAT)),
        ("keyed", gate.keyed(fetched(records), FORMAT, cuts)),
    ):
        got = observed(events)
        assert same(got, expected), (path, got, expected)
        ids = event_ids(events)
        assert len(set(ids)) == len(ids), (path, ids)
