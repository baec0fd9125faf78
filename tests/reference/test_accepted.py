"""What is accepted is exactly what was validated, and what the model streamed.

The property that matters most, on its own: for every event the gate accepts, on both paths
(`callgate check`, unkeyed; the worker's processor, keyed by stream id), its `arguments` read
exactly (every number as its decimal value, no double in between) are a value the reference
validator (`tests/reference/exact.py`) finds valid under the schema version the event names,
and equal the exact value of the text the model streamed for that call: that text embedded
without its insignificant whitespace (strings and number texts as they came; written again from
the value when it spells an integer past 2^53 with a fraction or an exponent), however it was
pretty-printed, and the event one line; an ordinary JSON reader (integers exact, any other
number a double) reads those arguments as that value too. The traffic
(`traffic.numbered_traffic`) numbers every piece, so what the model streamed is known whatever
the transport did (losses, repeats, reordering, differing copies); its numbers are drawn from
exact doubles and from numbers no double holds (`traffic.NUMBERS`), in every spelling.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reference import exact, traffic
from tests.reference.conftest import TIMEOUT, repeat
from tests.reference.gate import RealGate

pytestmark = pytest.mark.timeout(TIMEOUT)


def accepted_but_wrong(
    gate: RealGate, events: list[bytes], calls: dict[tuple[str, str], traffic.Call]
) -> list[str]:
    """Every accepted event whose arguments are not valid or not what the model streamed."""
    wrong = []
    for raw in events:
        event = exact.read(raw, bounded=False)
        if event["outcome"] != "accepted":
            continue
        ident = (event["stream_id"], event["call_id"])
        arguments = event["arguments"]
        schema = gate.contracts.schemas[event["tool"]][event["schema"]["version"]]
        violated = exact.errors(exact.validator(schema), arguments)
        if violated:
            wrong.append(f"{ident}: accepted {arguments} violates {violated}")
        if ident not in calls:
            wrong.append(f"{ident}: accepted a call nobody streamed")
            continue
        try:
            exact.read(calls[ident].text)
        except exact.Fault as fault:  # README: such a call is rejected (inexact_number, ...)
            wrong.append(f"{ident}: accepted {calls[ident].text!r}, which is {fault.code}")
        streamed = exact.read(calls[ident].text, bounded=False)
        embedded = b'"arguments":' + exact.compact(calls[ident].text).encode()
        # README: without insignificant whitespace, texts as they came, unless they hold an
        # integer past 2^53 (then written again from the value)
        if not exact.respelt(calls[ident].text) and embedded not in raw:
            wrong.append(f"{ident}: {raw!r} does not embed {embedded!r}")
        if not exact.equal(arguments, streamed):
            wrong.append(f"{ident}: accepted {arguments}, the model streamed {streamed}")
        # README: an ordinary reader (integers exact, other numbers doubles) reads it so too
        read = exact.ordinary(raw)["arguments"]
        if not exact.equal(read, streamed):
            wrong.append(f"{ident}: an ordinary reader reads {read}, the model streamed {streamed}")
    return wrong


def test_every_accepted_call_is_valid_and_what_the_model_streamed(gate: RealGate) -> None:
    repeat(lambda: _accepted_exactly(gate))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    drawn=traffic.numbered_traffic(traffic.NUMBERS), cuts=st.lists(st.integers(0, 40), max_size=3)
)
def _accepted_exactly(
    gate: RealGate,
    drawn: tuple[list[bytes], dict[tuple[str, str], traffic.Call]],
    cuts: list[int],
) -> None:
    records, calls = drawn
    for path, events in (("check", gate.check(records)), ("keyed", gate.keyed(records, cuts=cuts))):
        assert accepted_but_wrong(gate, events, calls) == [], path
