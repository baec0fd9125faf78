"""Properties of the gate on any input: one verdict, never an exception, always an event.

Whatever bytes or JSON a call holds, under any tool, version, channel and key, the gate returns
one verdict whose fields agree with each other, and that verdict can be written as an event.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS
from worker._native import AssembledCall, ParseError, parse_json
from worker.compose import build_gate, build_registry, violation_limits
from worker.core.events import EventLimits, encode
from worker.model import Code, Outcome, Phase, Verdict
from worker.settings import Settings

FIXED = settings(derandomize=True, deadline=None, print_blob=True, max_examples=300)
SETTINGS = Settings(schemas={"dir": SCHEMAS})
MESSAGES = violation_limits(SETTINGS.limits)
GATE = build_gate(SETTINGS, build_registry(SETTINGS))
MAX_EVENT = SETTINGS.limits.max_event_bytes
MAX_FEEDBACK = SETTINGS.limits.max_feedback_bytes

TOOLS = st.sampled_from(
    [
        "get_weather",
        "weather.get_weather",
        "create_payment",
        "weather.get_weather_data",
        "nope",
        "",
    ]
)
VERSIONS = st.sampled_from([None, "1", "2", "v2", "9", "x"])
CHANNELS = st.sampled_from(["tool_call", "tool_call", "text", "refusal", "error", "mcp_result"])
JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)
PAYMENT_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "amount_minor": st.integers(-5, 10**9),
        "currency": st.sampled_from(["EUR", "JPY", "KWD", "XXX"]),
        "recipient": st.sampled_from(["acct_1", "", "a b"]),
        "description": st.none() | st.text(max_size=4),
        "idempotency_key": st.sampled_from(["k-1", "k-2", ""]),
        "city": st.sampled_from(["Oslo", ""]),
        "units": st.sampled_from(["celsius", "kelvin"]),
        "days": st.none() | st.integers(0, 20),
    },
)


def consistent(verdict: Verdict, the_call: AssembledCall) -> None:
    """The verdict's fields agree with each other and it can be written."""
    assert verdict.outcome in tuple(Outcome)
    if verdict.outcome is Outcome.ACCEPTED:
        assert (verdict.phase, verdict.code, verdict.reason) == (None, None, None)
        assert verdict.violations == ()
        assert verdict.retry_feedback is None
        assert verdict.feedback_json is None
        assert verdict.arguments_json is not None
        assert verdict.schema is not None
        orjson.loads(verdict.arguments_json)
        if verdict.idempotency_digest is not None:
            assert verdict.idempotency_key is not None
    elif verdict.outcome is Outcome.REJECTED:
        assert verdict.phase is not None
        assert verdict.code is not None
        assert verdict.reason is None
        assert verdict.arguments_json is None
        assert verdict.idempotency_digest is None
        assert verdict.retry_feedback is not None
        assert verdict.retry_feedback["error_type"] == verdict.code.value
        assert verdict.retry_feedback["retryable"] is verdict.retryable
        assert len(orjson.dumps(verdict.retry_feedback)) <= MAX_FEEDBACK
        assert verdict.feedback_json == orjson.dumps(verdict.retry_feedback)
    else:
        assert verdict.reason is not None
        assert verdict.code is None
        assert verdict.arguments_json is None
    assert verdict.code is not Code.INTERNAL_ERROR, "no input makes the gate fail"
    assert next(iter(verdict.phases_us)) == Phase.ASSEMBLY
    event = orjson.loads(encode(the_call, verdict, EventLimits(MAX_EVENT, MAX_FEEDBACK, MESSAGES)))
    assert (event["outcome"], event["call_id"]) == (verdict.outcome.value, the_call.call_id)


@FIXED
@given(
    text=st.binary(max_size=512),
    tool=TOOLS,
    version=VERSIONS,
    channel=CHANNELS,
    key=st.none() | st.text(max_size=4),
    attempt=st.none() | st.integers(1, 10),
)
def test_any_bytes_yield_one_consistent_verdict(
    *,
    text: bytes,
    tool: str,
    version: str | None,
    channel: str,
    key: str | None,
    attempt: int | None,
) -> None:
    the_call = AssembledCall(
        "s",
        "c",
        tool,
        text,
        tool_version=version,
        channel=channel,
        idempotency_key=key,
        attempt=attempt,
    )
    verdict = GATE.judge(the_call)
    consistent(verdict, the_call)
    if not isinstance(parse_json(text, SETTINGS.limits.max_depth), dict):
        # nothing that is not one JSON object (or a fence around one) is ever accepted
        assert verdict.outcome is not Outcome.ACCEPTED or text.lstrip().startswith(b"```")


@FIXED
@given(value=JSON | PAYMENT_LIKE, tool=TOOLS, version=VERSIONS, key=st.none() | st.text())
def test_any_json_yields_one_consistent_verdict(
    value: Any, tool: str, version: str | None, key: str | None
) -> None:
    the_call = AssembledCall(
        "s", "c", tool, orjson.dumps(value), tool_version=version, idempotency_key=key
    )
    verdict = GATE.judge(the_call)
    consistent(verdict, the_call)
    if not isinstance(value, dict):
        assert verdict.outcome is Outcome.REJECTED
        # a number the rule refuses (a float past 64 bits as orjson writes it) is found first
        parsed = parse_json(orjson.dumps(value), SETTINGS.limits.max_depth)
        expected = Code(parsed.code) if isinstance(parsed, ParseError) else Code.ROOT_NOT_OBJECT
        assert verdict.code is expected


@FIXED
@given(value=PAYMENT_LIKE, key=st.none() | st.sampled_from(["k-1", "k-2"]))
def test_an_accepted_payment_always_has_a_key_and_its_digest(
    value: dict[str, Any], key: str | None
) -> None:
    the_call = AssembledCall("s", "c", "create_payment", orjson.dumps(value), idempotency_key=key)
    verdict = GATE.judge(the_call)
    consistent(verdict, the_call)
    if verdict.outcome is Outcome.ACCEPTED:
        assert verdict.idempotency_key == value["idempotency_key"]
        assert verdict.idempotency_digest is not None
        assert verdict.requires_approval is False
        assert verdict.arguments == value
