"""Flow control's rule, on generated sequences of what is in flight after each round."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.runtime.flow import FlowControl

MAX_RECORDS = 100
MAX_BYTES = 10_000

rounds = st.lists(
    st.tuples(st.integers(0, 2 * MAX_RECORDS), st.integers(0, 2 * MAX_BYTES), st.booleans()),
    max_size=60,
)


@given(rounds)
def test_pauses_above_a_limit_or_while_held_and_resumes_only_at_half(
    seen: list[tuple[int, int, bool]],
) -> None:
    flow = FlowControl(MAX_RECORDS, MAX_BYTES)
    for records, nbytes, held in seen:
        was = flow.paused
        decision = flow.update(records, nbytes, held)
        # a decision is given exactly when the state changes, and says which way
        assert decision == (None if flow.paused == was else flow.paused)
        over = records > MAX_RECORDS or nbytes > MAX_BYTES
        if over or held:
            assert flow.paused, "above a limit or held: fetching is paused"
        under = records <= MAX_RECORDS // 2 and nbytes <= MAX_BYTES // 2
        if was and flow.paused is False:
            assert under, "resumed only at half the limits"
            assert not held, "resumed only with nothing holding the rounds"
        if was and not held and under:
            assert not flow.paused, "at half the limits with nothing holding it resumes"
        if not was and not over and not held:
            assert not flow.paused, "below the limits it never pauses"
