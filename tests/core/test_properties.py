"""Properties: any bytes and any JSON give exactly one verdict, and never an exception."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS
from worker.core.pipeline import Gate
from worker.model import AssembledCall, Outcome
from worker.plugins import load_plugins
from worker.schemas.registry import SchemaRegistry

GATE = Gate(
    SchemaRegistry.load(SCHEMAS),
    load_plugins(["worker.plugins.builtin"]),
)
TOOLS = st.sampled_from(["get_weather", "create_payment", "nope", "weather.get_weather"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(text=st.binary(max_size=512), tool=TOOLS)
def test_random_bytes_yield_one_verdict(text: bytes, tool: str) -> None:
    verdict = GATE.judge(AssembledCall("s", "c", tool, text))
    assert verdict.outcome in (Outcome.ACCEPTED, Outcome.REJECTED)


@settings(max_examples=300, deadline=None)
@given(value=JSON, tool=TOOLS)
def test_random_json_yields_one_verdict(value: object, tool: str) -> None:
    text = json.dumps(value).encode()
    verdict = GATE.judge(AssembledCall("s", "c", tool, text))
    assert verdict.outcome in (Outcome.ACCEPTED, Outcome.REJECTED)
    if not isinstance(value, dict):
        assert verdict.outcome is Outcome.REJECTED
