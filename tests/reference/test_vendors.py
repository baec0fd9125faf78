"""The gate's events on hostile vendor streams equal the reference judge's.

For each vendor format the reference reads (`tests/reference/chat.py`: OpenAI Chat
Completions; `tests/reference/anthropic.py`: Anthropic Messages; `tests/reference/bedrock.py`:
Amazon Bedrock ConverseStream; `tests/reference/gemini.py`: Google Gemini;
`tests/reference/responses.py`: OpenAI
Responses, `responses.responses_stream`), generated streams
(`traffic.chat_stream`, `traffic.anthropic_stream`, `bedrock_traffic.bedrock_stream`,
`gemini_traffic.gemini_stream`) go through `callgate check --format ...` (a recorded SSE file)
and through the worker's processor (the events as records keyed by the stream id with their
`content-format`, fed in fetched batches cut at drawn places; SSE's `[DONE]` is no record);
both must give exactly the events the reference derives from the README, in the fields
`Expected` names, with no `event_id` twice. With early verdicts on (the default) the events
are the whole judgement's but for calls rejected early, which the whole judgement never
accepts (`gate.early_sound`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.reference import (
    anthropic,
    bedrock,
    bedrock_traffic,
    chat,
    gemini,
    gemini_traffic,
    responses,
    traffic,
)
from tests.reference.conftest import TIMEOUT, repeat
from tests.reference.envelope import Unmodeled
from tests.reference.gate import RealGate, decided_as_reference

pytestmark = pytest.mark.timeout(TIMEOUT)

VENDORS: dict[str, tuple[Callable[[], st.SearchStrategy[list[bytes]]], Any]] = {
    "openai.chat": (traffic.chat_stream, chat.judge),
    "anthropic.messages": (traffic.anthropic_stream, anthropic.judge),
    "bedrock.converse": (bedrock_traffic.bedrock_stream, bedrock.judge),
    "google.gemini": (gemini_traffic.gemini_stream, gemini.judge),
    "openai.responses": (responses.responses_stream, responses.judge),
}


@pytest.mark.parametrize("fmt", sorted(VENDORS))
def test_the_gate_decides_every_vendor_call_as_the_reference(
    vendor_gate: RealGate, fmt: str
) -> None:
    repeat(lambda: _decided_alike(vendor_gate, fmt))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cuts=st.lists(st.integers(0, 30), max_size=3))
def _decided_alike(gate: RealGate, fmt: str, data: st.DataObject, cuts: list[int]) -> None:
    stream, judge = VENDORS[fmt]
    records = data.draw(stream())
    try:
        expected = judge(records, "stream", gate.contracts, gate.limits)
    except Unmodeled:
        assume(False)
        return
    fetched = [r for r in records if r != b"[DONE]"]
    whole = gate.check(records, fmt)
    paths = {
        ("check", False): whole,
        ("keyed", False): gate.keyed(fetched, fmt, cuts),
        ("check", True): gate.check(records, fmt, early=True),
        ("keyed", True): gate.keyed(fetched, fmt, cuts, early=True),
    }
    decided_as_reference(expected, whole, paths)
