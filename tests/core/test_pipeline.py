"""The chain on whole calls, against the contracts shipped in schemas/ (the seed cases first).

Every phase and code the gate decides is reached here with a call a producer could send; the
contracts a shipped directory has no example of (a side-effecting tool without a key argument)
are written to a temporary directory. Generated inputs cover where an exception may come from
(every one is that call's `internal_error`), the retry budget, the effective idempotency key and
retry feedback, which must never hold what the call sent.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS
from tests.support.numbers import number_texts, spellings
from worker._native import AssembledCall, EarlyRejection, ParseError, parse_json
from worker.compose import build_gate, build_registry, gate_limits, violation_limits
from worker.core.canonical import canonical, request_digest
from worker.core.events import EventLimits, encode
from worker.core.feedback import MALFORMED_RECORD_MESSAGE, UNDECLARED, build_feedback
from worker.core.pipeline import RETRYABLE, Gate, passed_on
from worker.core.tool_output import RESULT_MEMBERS
from worker.model import (
    ChunkKind,
    Code,
    IncompleteReason,
    Outcome,
    Phase,
    RepairKind,
    SchemaRef,
    Verdict,
    Violation,
)
from worker.plugins import Plugins, RuleContext, load_plugins
from worker.schemas.contract import CUT, Contract, LookupFailure
from worker.schemas.drafts import escape, pointer
from worker.schemas.registry import SchemaRegistry
from worker.settings import Settings

FIXED = settings(derandomize=True, deadline=None, print_blob=True)
SETTINGS = Settings(schemas={"dir": SCHEMAS})
MESSAGES = violation_limits(SETTINGS.limits)
REGISTRY = build_registry(SETTINGS)
GATE = build_gate(SETTINGS, REGISTRY)
PLUGINS = load_plugins(SCHEMAS)
LIMITS = gate_limits(SETTINGS)
WEATHER_V1 = SchemaRef("weather.get_weather", "1")
WEATHER_V2 = SchemaRef("weather.get_weather", "2")
PAYMENT = SchemaRef("payments.create_payment", "1")
MCP_WEATHER = "weather.get_weather_data"


def call(text: str | bytes, tool: str | None = "get_weather", **fields: Any) -> AssembledCall:
    """A call as the reassembler closes it (version 1 unless said otherwise)."""
    fields.setdefault("tool_version", "1")
    arguments = text.encode() if isinstance(text, str) else text
    return AssembledCall("stream-1", "call-1", tool, arguments, **fields)


def payment(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "amount_minor": 1250,
        "currency": "EUR",
        "recipient": "acct_123",
        "description": "invoice 7",
        "idempotency_key": "pay-1",
    }
    body.update(overrides)
    return body


def pay(body: Mapping[str, Any], **fields: Any) -> AssembledCall:
    fields.setdefault("tool_version", None)
    return call(orjson.dumps(body), "create_payment", **fields)


def rejected(verdict: Verdict, phase: Phase, code: Code, *, retryable: bool) -> Verdict:
    """The verdict is this rejection, its feedback says so, and nothing of an acceptance is left."""
    assert (verdict.outcome, verdict.phase, verdict.code, verdict.reason) == (
        Outcome.REJECTED,
        phase,
        code,
        None,
    ), verdict
    assert verdict.retryable is retryable
    feedback = verdict.retry_feedback
    assert feedback is not None
    assert feedback["error_type"] == code.value
    assert feedback["retryable"] is retryable
    assert verdict.arguments_json is None
    assert verdict.idempotency_digest is None
    return verdict


def accepted(verdict: Verdict, schema: SchemaRef) -> Verdict:
    assert (verdict.outcome, verdict.phase, verdict.code, verdict.reason) == (
        Outcome.ACCEPTED,
        None,
        None,
        None,
    ), (verdict, verdict.violations)
    assert verdict.schema == schema
    assert verdict.violations == ()
    assert verdict.retry_feedback is None
    assert verdict.arguments_json is not None
    return verdict


def where(verdict: Verdict) -> list[tuple[str, str]]:
    return [(v.path, v.keyword) for v in verdict.violations]


# --- the seed cases ---------------------------------------------------------------------------


def test_trailing_comma_is_invalid_json() -> None:
    verdict = rejected(
        GATE.judge(call('{"city": "杭州",}')), Phase.JSON_PARSE, Code.INVALID_JSON, retryable=True
    )
    (violation,) = verdict.violations
    assert (violation.path, violation.keyword) == ("", "invalid_json")
    assert "trailing comma" in violation.message
    assert verdict.schema is None  # the text is not read far enough to know the contract


def test_missing_units_is_a_required_violation_at_units() -> None:
    verdict = rejected(
        GATE.judge(call('{"city": "杭州"}')),
        Phase.SCHEMA_VALIDATION,
        Code.SCHEMA_VIOLATION,
        retryable=True,
    )
    assert where(verdict) == [("/units", "required")]
    assert verdict.schema == WEATHER_V1
    assert verdict.retry_feedback is not None
    assert verdict.retry_feedback["schema"] == {"id": "weather.get_weather", "version": "1"}
    assert [v["path"] for v in verdict.retry_feedback["violations"]] == ["/units"]


def test_city_of_the_wrong_type_is_a_type_violation_that_does_not_echo_the_value() -> None:
    verdict = rejected(
        GATE.judge(call('{"city": 98765, "units": "celsius"}')),
        Phase.SCHEMA_VALIDATION,
        Code.SCHEMA_VIOLATION,
        retryable=True,
    )
    assert where(verdict) == [("/city", "type")]
    assert b"98765" not in orjson.dumps(verdict.retry_feedback)
    assert all("98765" not in v.message for v in verdict.violations)


def test_an_extra_property_is_additional_properties_and_feedback_does_not_name_it() -> None:
    verdict = rejected(
        GATE.judge(call('{"city": "Paris", "units": "celsius", "debug": true}')),
        Phase.SCHEMA_VALIDATION,
        Code.SCHEMA_VIOLATION,
        retryable=True,
    )
    assert where(verdict) == [("/debug", "additionalProperties")]  # operators see the real path
    assert verdict.retry_feedback is not None
    assert [v["path"] for v in verdict.retry_feedback["violations"]] == ["/<undeclared>"]
    assert b"debug" not in orjson.dumps(verdict.retry_feedback)


def test_fenced_json_is_accepted_with_the_repair_recorded() -> None:
    verdict = accepted(
        GATE.judge(call('```json\n{"city": "杭州", "units": "celsius"}\n```')), WEATHER_V1
    )
    assert verdict.repairs == (RepairKind.MARKDOWN_FENCE,)
    assert verdict.arguments == {"city": "杭州", "units": "celsius", "days": 1}  # v1 -> internal


def test_a_repaired_text_is_validated_in_full() -> None:
    verdict = rejected(
        GATE.judge(call('```\n{"city": "Oslo"}\n```')),
        Phase.SCHEMA_VALIDATION,
        Code.SCHEMA_VIOLATION,
        retryable=True,
    )
    assert where(verdict) == [("/units", "required")]
    assert verdict.repairs == (RepairKind.MARKDOWN_FENCE,)


def test_a_duplicate_amount_key_is_rejected_at_its_path() -> None:
    verdict = rejected(
        GATE.judge(call('{"amount": 10, "amount": 100}', "create_payment", tool_version=None)),
        Phase.JSON_PARSE,
        Code.DUPLICATE_KEY,
        retryable=True,
    )
    assert where(verdict) == [("/amount", "duplicate_key")]


# --- assembly ---------------------------------------------------------------------------------

#: every reason a call ends unfinished, and whether sending it again can help
INCOMPLETE = [
    (IncompleteReason.MAX_TOKENS, True),
    (IncompleteReason.CONTENT_FILTER, False),
    (IncompleteReason.STREAM_ENDED, True),
    (IncompleteReason.TIMEOUT, True),
    (IncompleteReason.EVICTED, True),
    (IncompleteReason.SEQUENCE_GAP, True),
    (IncompleteReason.STREAM_CORRUPT, True),
    (IncompleteReason.MAX_LIFETIME, True),
]


@pytest.mark.parametrize(("reason", "retryable"), INCOMPLETE)
def test_an_unfinished_call_is_incomplete_and_never_judged(
    reason: IncompleteReason, retryable: bool
) -> None:
    # the text would be accepted, and a budget spent changes nothing: it is not a rejection
    verdict = GATE.judge(
        call(
            '{"city": "Oslo", "units": "celsius"}',
            incomplete=reason.value,
            idempotency_key="k-1",
            attempt=99,
        )
    )
    assert (verdict.outcome, verdict.phase, verdict.code, verdict.reason) == (
        Outcome.INCOMPLETE,
        Phase.ASSEMBLY,
        None,
        reason,
    )
    assert verdict.retryable is retryable
    assert verdict.retry_feedback is None
    assert verdict.arguments_json is None
    assert verdict.idempotency_key == "k-1"
    assert verdict.idempotency_digest is None
    assert list(verdict.phases_us) == [Phase.ASSEMBLY]


@pytest.mark.parametrize(
    ("code", "phase", "retryable"),
    [
        (Code.CALL_ID_REUSED, Phase.ASSEMBLY, False),
        (Code.INTERNAL_ERROR, Phase.ASSEMBLY, False),  # an adapter's bug on this record
        (Code.TOO_LARGE, Phase.LIMITS, True),
        (Code.TOO_MANY_CHUNKS, Phase.LIMITS, True),
        # the vendor's own verdict on a call it could not make (Gemini's finish reasons)
        (Code.MALFORMED_TOOL_CALL, Phase.RESPONSE_CLASSIFICATION, True),
        (Code.UNEXPECTED_TOOL_CALL, Phase.RESPONSE_CLASSIFICATION, False),
        (Code.UNSUPPORTED_CALL_KIND, Phase.RESPONSE_CLASSIFICATION, False),
    ],
)
def test_an_assembly_error_decides_the_call_with_its_detail(
    code: Code, phase: Phase, retryable: bool
) -> None:
    detail = "the record says something specific"
    verdict = rejected(
        GATE.judge(call(b"", assembly_error=code.value, assembly_detail=detail)),
        phase,
        code,
        retryable=retryable,
    )
    assert verdict.violations == (Violation("", code.value, detail),)
    # a bound passed is judged in `limits`, after the channel: the phases up to it ran
    ran = [Phase.ASSEMBLY, Phase.RESPONSE_CLASSIFICATION, Phase.LIMITS]
    assert list(verdict.phases_us) == (ran if phase is Phase.LIMITS else [Phase.ASSEMBLY])


@pytest.mark.parametrize("bound", [Code.TOO_LARGE, Code.TOO_MANY_CHUNKS])
@pytest.mark.parametrize(
    ("channel", "code"),
    [
        (ChunkKind.TEXT, Code.UNEXPECTED_CHANNEL),
        (ChunkKind.REFUSAL, Code.REFUSAL),
        (ChunkKind.ERROR, Code.MODEL_ERROR),
    ],
)
def test_a_call_past_its_bounds_on_another_channel_is_judged_by_its_channel_first(
    bound: Code, channel: ChunkKind, code: Code
) -> None:
    """The chain's order holds for the bounds the reassembler found: response_classification
    decides before limits (the reference judge's generated traffic found it the other way)."""
    past = call(b"", assembly_error=bound.value, assembly_detail="past", channel=channel)
    verdict = GATE.judge(past)
    assert (verdict.phase, verdict.code) == (Phase.RESPONSE_CLASSIFICATION, code)


def test_a_malformed_records_detail_stays_in_the_operators_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Why a record is unreadable is the producer's text (an event type, a key, a name): the
    event and its feedback say one fixed thing; the log keeps the detail."""
    detail = "openai.responses: unknown event type 'password=hunter2'"
    with caplog.at_level(logging.WARNING, logger="callgate.gate"):
        verdict = rejected(
            GATE.judge(call(b"", assembly_error="malformed_record", assembly_detail=detail)),
            Phase.ASSEMBLY,
            Code.MALFORMED_RECORD,
            retryable=False,
        )
    fixed = Violation("", "malformed_record", MALFORMED_RECORD_MESSAGE)
    assert verdict.violations == (fixed,)
    assert verdict.retry_feedback is not None
    assert "hunter2" not in orjson.dumps(verdict.retry_feedback).decode()
    assert detail in caplog.text


def test_an_assembly_error_without_detail_names_its_code() -> None:
    verdict = GATE.judge(call(b"", assembly_error=Code.CALL_ID_REUSED.value))
    assert verdict.violations == (Violation("", "call_id_reused", "call_id_reused"),)


# --- response classification --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("channel", "code", "retryable"),
    [
        (ChunkKind.REFUSAL, Code.REFUSAL, False),
        (ChunkKind.ERROR, Code.MODEL_ERROR, False),
        (ChunkKind.TEXT, Code.UNEXPECTED_CHANNEL, True),
    ],
)
def test_a_channel_that_is_not_a_tool_call_is_classified_before_anything_is_read(
    channel: ChunkKind, code: Code, retryable: bool
) -> None:
    # the text is a valid call: it must not matter
    verdict = rejected(
        GATE.judge(call('{"city": "Oslo", "units": "celsius"}', channel=channel.value)),
        Phase.RESPONSE_CLASSIFICATION,
        code,
        retryable=retryable,
    )
    assert verdict.violations == ()
    assert Phase.JSON_PARSE not in verdict.phases_us


# --- limits -----------------------------------------------------------------------------------


def test_arguments_nested_past_the_limit_are_too_deep_before_they_are_parsed() -> None:
    depth = LIMITS.max_depth + 1
    text = '{"city": ' + "[" * (depth - 1) + "]" * (depth - 1) + ', "units": "celsius"}'
    verdict = rejected(GATE.judge(call(text)), Phase.LIMITS, Code.TOO_DEEP, retryable=True)
    assert where(verdict) == [("", "maxDepth")]
    assert str(depth) in verdict.violations[0].message
    assert Phase.JSON_PARSE not in verdict.phases_us


def test_nesting_at_the_limit_is_allowed_and_brackets_inside_strings_do_not_count() -> None:
    at_limit = '{"city": ' + "[" * (LIMITS.max_depth - 1) + "]" * (LIMITS.max_depth - 1) + "}"
    verdict = GATE.judge(call(at_limit))
    assert verdict.code is Code.SCHEMA_VIOLATION  # got past limits and parsing
    in_string = orjson.dumps({"city": "[" * 50 + "{" * 50, "units": "celsius"})
    accepted(GATE.judge(call(in_string)), WEATHER_V1)


# --- repair -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"city": "Oslo", "units": "celsius"}\n```',
        '```JSON\n{"city": "Oslo", "units": "celsius"}\n```',
        '```\n{"city": "Oslo", "units": "celsius"}\n```',
        '  ```json\r\n{"city": "Oslo", "units": "celsius"}\r\n```  \n',
    ],
)
def test_a_fence_around_the_whole_text_is_the_one_repair(text: str) -> None:
    verdict = accepted(GATE.judge(call(text)), WEATHER_V1)
    assert verdict.repairs == (RepairKind.MARKDOWN_FENCE,)
    assert Phase.REPAIR in verdict.phases_us


@pytest.mark.parametrize(
    "text",
    [
        "{'city': 'Oslo', 'units': 'celsius'}",
        '{"city": "Oslo" "units": "celsius"}',
        'Here you go: {"city": "Oslo", "units": "celsius"}',
        'Here you go:\n```json\n{"city": "Oslo", "units": "celsius"}\n```',
        '```json\n{"city": "Oslo", "units": "celsius"}\n``` and that is all',
        '{"city": "Oslo", "units": "celsius",}',
        '{"city": "Oslo", "units": "celsius"} // done',
    ],
)
def test_nothing_else_is_repaired(text: str) -> None:
    verdict = rejected(GATE.judge(call(text)), Phase.JSON_PARSE, Code.INVALID_JSON, retryable=True)
    assert verdict.repairs == ()


def test_a_repaired_text_that_is_not_json_keeps_its_repair() -> None:
    verdict = rejected(
        GATE.judge(call('```json\n{"city": "Oslo",}\n```')),
        Phase.JSON_PARSE,
        Code.INVALID_JSON,
        retryable=True,
    )
    assert verdict.repairs == (RepairKind.MARKDOWN_FENCE,)


# --- json_parse -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code", "path"),
    [
        (b"", Code.INVALID_JSON, ""),
        (b'{"city": "Oslo"', Code.INVALID_JSON, ""),
        (b'{"a": {"b": 1, "b": 2}}', Code.DUPLICATE_KEY, "/a/b"),
        (b'{"a": NaN}', Code.NON_FINITE_NUMBER, "/a"),
        (b'{"a": [1, -Infinity]}', Code.NON_FINITE_NUMBER, "/a/1"),
        (b'{"a": 123456789012345678901234567890}', Code.INEXACT_NUMBER, "/a"),
        (b'{"a": 1e400}', Code.INEXACT_NUMBER, "/a"),
        (b'{"a": "\xff"}', Code.INVALID_UTF8, "/a"),
        (b'{"a": "\\ud800"}', Code.INVALID_UTF8, "/a"),
        (b'["Oslo", "celsius"]', Code.ROOT_NOT_OBJECT, ""),
        (b'"Oslo"', Code.ROOT_NOT_OBJECT, ""),
        (b"null", Code.ROOT_NOT_OBJECT, ""),
        (b"42", Code.ROOT_NOT_OBJECT, ""),
    ],
)
def test_text_that_is_not_one_strict_json_object_is_a_parse_rejection(
    text: bytes, code: Code, path: str
) -> None:
    verdict = rejected(GATE.judge(call(text)), Phase.JSON_PARSE, code, retryable=True)
    (violation,) = verdict.violations
    assert violation.path == path
    assert Phase.SCHEMA_VALIDATION not in verdict.phases_us


# --- schema_validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "version", "code"),
    [
        ("rm_rf", "1", Code.UNKNOWN_TOOL),
        (None, "1", Code.UNKNOWN_TOOL),
        ("", "1", Code.UNKNOWN_TOOL),
        ("get_weather", "99", Code.UNKNOWN_SCHEMA_VERSION),
        ("get_weather", "x", Code.UNKNOWN_SCHEMA_VERSION),
        ("get_weather", "+1", Code.UNKNOWN_SCHEMA_VERSION),
        ("weather.get_weather", "0", Code.UNKNOWN_SCHEMA_VERSION),
    ],
)
def test_a_call_no_contract_judges_is_rejected_in_schema_validation(
    tool: str | None, version: str, code: Code
) -> None:
    verdict = rejected(
        GATE.judge(call('{"city": "Oslo", "units": "celsius"}', tool, tool_version=version)),
        Phase.SCHEMA_VALIDATION,
        code,
        retryable=True,
    )
    assert verdict.schema is None
    assert len(verdict.violations) == 1
    assert verdict.violations[0].keyword == code.value


@pytest.mark.parametrize(
    ("tool", "version", "schema"),
    [
        ("get_weather", None, WEATHER_V2),  # the newest version judges a call without one
        ("weather.get_weather", None, WEATHER_V2),  # by schema id
        ("get_weather", "v1", WEATHER_V1),
        ("get_weather", "02", WEATHER_V2),
    ],
)
def test_a_tool_is_named_by_name_or_schema_id_and_its_version_read_once(
    tool: str, version: str | None, schema: SchemaRef
) -> None:
    verdict = GATE.judge(call('{"city": "Oslo", "units": "celsius"}', tool, tool_version=version))
    accepted(verdict, schema)


def test_every_violation_is_reported_at_its_path() -> None:
    verdict = rejected(
        GATE.judge(call('{"city": "", "units": "kelvin", "days": 0}', tool_version="2")),
        Phase.SCHEMA_VALIDATION,
        Code.SCHEMA_VIOLATION,
        retryable=True,
    )
    assert sorted(where(verdict)) == [
        ("/city", "minLength"),
        ("/days", "minimum"),
        ("/units", "enum"),
    ]


# --- business_validation ----------------------------------------------------------------------


def test_a_payment_over_its_currencys_ceiling_breaks_the_business_rule() -> None:
    verdict = rejected(
        GATE.judge(pay(payment(currency="JPY", amount_minor=1_000_001))),
        Phase.BUSINESS_VALIDATION,
        Code.BUSINESS_RULE,
        retryable=True,
    )
    assert where(verdict) == [("/amount_minor", "maxPaymentAmount")]
    assert verdict.schema == PAYMENT
    accepted(GATE.judge(pay(payment(currency="JPY", amount_minor=1_000_000))), PAYMENT)


def plugins_with(
    rule: Callable[[Mapping[str, Any], RuleContext], Any] | None = None,
    adapter: Callable[[Mapping[str, Any]], Any] | None = None,
) -> Plugins:
    plugins = Plugins()
    if rule is not None:
        plugins.rule("weather.get_weather")(rule)
    if adapter is not None:
        plugins.adapter("weather.get_weather", "1")(adapter)
    return plugins


SECRET = "s3cr3t-from-the-plugin"


def test_a_rule_that_raises_is_that_calls_rule_error() -> None:
    def broken(arguments: Mapping[str, Any], context: RuleContext) -> list[Violation]:
        raise KeyError(SECRET)

    verdict = rejected(
        Gate(REGISTRY, plugins_with(rule=broken), LIMITS).judge(
            call('{"city": "Oslo", "units": "celsius"}')
        ),
        Phase.BUSINESS_VALIDATION,
        Code.RULE_ERROR,
        retryable=False,
    )
    (violation,) = verdict.violations
    assert "broken" in violation.message
    assert "KeyError" in violation.message
    assert SECRET not in orjson.dumps(verdict.retry_feedback).decode()
    assert SECRET not in violation.message


@pytest.mark.parametrize(
    "found",
    [
        ["not a violation"],
        [Violation("/city", 5, "m")],  # type: ignore[arg-type]
        [Violation("/city", "k", None)],  # type: ignore[arg-type]
        [Violation(None, "k", "m")],  # type: ignore[arg-type]
        None,
    ],
)
def test_a_rule_that_returns_something_other_than_violations_is_rule_error(found: Any) -> None:
    """What a rule returns ends up in the event: anything but violations is the rule's bug."""

    def sloppy(arguments: Mapping[str, Any], context: RuleContext) -> Any:
        return found

    gate = Gate(REGISTRY, plugins_with(rule=sloppy), LIMITS)
    the_call = call('{"city": "Oslo", "units": "celsius"}')
    verdict = rejected(
        gate.judge(the_call), Phase.BUSINESS_VALIDATION, Code.RULE_ERROR, retryable=False
    )
    assert encode(
        the_call, verdict, EventLimits(1_000_000, 4096, MESSAGES)
    )  # and it can be written


def test_rules_see_the_schema_and_the_effective_key() -> None:
    seen: list[RuleContext] = []

    def spy(arguments: Mapping[str, Any], context: RuleContext) -> list[Violation]:
        seen.append(context)
        return []

    gate = Gate(REGISTRY, plugins_with(rule=spy), LIMITS)
    gate.judge(call('{"city": "Oslo", "units": "celsius"}', idempotency_key="k-7"))
    gate.judge(call('{"city": "Oslo", "units": "celsius"}'))
    assert seen == [RuleContext(WEATHER_V1, "k-7"), RuleContext(WEATHER_V1, None)]


def test_rules_only_see_schema_valid_arguments() -> None:
    seen: list[Mapping[str, Any]] = []

    def spy(arguments: Mapping[str, Any], context: RuleContext) -> list[Violation]:
        seen.append(arguments)
        return []

    gate = Gate(REGISTRY, plugins_with(rule=spy), LIMITS)
    gate.judge(call('{"city": 1, "units": "celsius"}'))
    assert seen == []


_RULE_TEXT = st.text(
    st.sampled_from(["a", "/", "~", '"', "\x01", "é", "\u2028", "😀"]), max_size=90
)
_RULE_PATH = _RULE_TEXT | st.lists(_RULE_TEXT, max_size=12).map(pointer)


@settings(FIXED, max_examples=60)
@given(
    message=st.text(st.sampled_from(["m", "\x01", "é", "😀", '"']), min_size=150, max_size=700),
    max_message_bytes=st.integers(64, 1024),
)
def test_the_feedback_says_each_message_as_the_event_does(
    message: str, max_message_bytes: int
) -> None:
    """A message is cut once, to `max_message_bytes` and marked so; the feedback shows it as
    the event's violation has it (the issue: the feedback cut every message to 200
    characters again, unmarked, a second bound on one thing)."""
    bounds = violation_limits(Settings(limits={"max_message_bytes": max_message_bytes}).limits)
    plugins = Plugins()
    plugins.rule("weather.get_weather")(lambda arguments, context: [Violation("", "k", message)])
    gate = Gate(REGISTRY, plugins, dataclasses.replace(LIMITS, violations=bounds))
    verdict = gate.judge(call('{"city": "Oslo", "units": "celsius"}'))
    (violation,) = verdict.violations
    assert verdict.retry_feedback is not None
    (shown,) = verdict.retry_feedback["violations"]
    assert shown["message"] == violation.message
    assert violation.message == message or (
        violation.message.endswith("\u2026") and message.startswith(violation.message[:-1])
    )


_KEY_CHARS = st.sampled_from(["k", "/", "~", '"', "\x01", "é", "😀"])
_WIDE = Gate(
    REGISTRY,
    PLUGINS,
    dataclasses.replace(
        LIMITS,
        violations=violation_limits(Settings(limits={"max_message_bytes": 1 << 20}).limits),
    ),
)


def _failing_call(where: str, keys: list[str]) -> AssembledCall:
    """A call whose violation path runs through `keys`: a key twice, a text cut off, or a tool
    result whose structuredContent has a member its output schema does not allow."""
    nested: Any = {"b": 1}
    for key in reversed(keys):
        nested = {key: nested}
    text = orjson.dumps(nested).decode()
    if where == "duplicate_key":
        return call(text.replace('{"b":1}', '{"b":1,"b":2}'))
    if where == "invalid_json":
        return call(text[: text.index('{"b":1}') + len('{"b":1')])
    message = result(structuredContent={**WEATHER_DATA, **nested})
    message["result"]["content"] = []
    return call(orjson.dumps(message), MCP_WEATHER, tool_version=None, channel="mcp_result")


@FIXED
@given(
    keys=st.lists(st.text(_KEY_CHARS, min_size=1, max_size=40), max_size=4),
    slack=st.integers(-2, 2),
    where=st.sampled_from(["duplicate_key", "invalid_json", "structuredContent"]),
    max_message_bytes=st.integers(64, 160),
)
def test_every_violation_is_bounded_whoever_made_it(
    keys: list[str], slack: int, where: str, max_message_bytes: int
) -> None:
    """The parser's failure paths (a key twice, a text cut off, below generated keys) and the
    tool-output check's (below `/result/structuredContent`) are bounded as the engines' are:
    one key is sized so that the path the call shows is the bound, or a byte or two off it,
    and whatever the path, the verdict's is within the bound, its first whole tokens."""
    bounds = violation_limits(Settings(limits={"max_message_bytes": max_message_bytes}).limits)
    gate = Gate(REGISTRY, PLUGINS, dataclasses.replace(LIMITS, violations=bounds))

    def sized(key: str) -> list[str]:  # the key the path shows first (a result's) or last
        return [key, *keys] if where == "structuredContent" else [*keys, key]

    (probe,) = _WIDE.judge(_failing_call(where, sized(""))).violations
    size = max(1, max_message_bytes - len(probe.path.encode()) + slack)
    the_call = _failing_call(where, sized("k" * size))
    (whole,) = _WIDE.judge(the_call).violations
    assert len(whole.path.encode()) == len(probe.path.encode()) + size
    verdict = gate.judge(the_call)
    assert verdict.outcome is Outcome.REJECTED
    (kept,) = verdict.violations
    assert len(kept.path.encode()) <= max_message_bytes
    assert len(kept.message.encode()) <= max_message_bytes
    if kept.path != whole.path:
        assert len(whole.path.encode()) > max_message_bytes
        assert kept.path.endswith(CUT)
        cut = _tokens(kept.path.removesuffix(CUT))
        assert cut == _tokens(whole.path)[: len(cut)]
    assert len(orjson.dumps(verdict.retry_feedback)) <= LIMITS.max_feedback_bytes


def _tokens(path: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


@FIXED
@given(
    found=st.lists(
        st.lists(st.builds(Violation, _RULE_PATH, _RULE_TEXT, _RULE_TEXT), max_size=5),
        min_size=1,
        max_size=3,
    ),
    max_violations=st.integers(1, 6),
    max_message_bytes=st.integers(64, 160),
)
def test_a_rules_violations_are_bounded_as_the_engines_are(
    found: list[list[Violation]], max_violations: int, max_message_bytes: int
) -> None:
    """A business rule's violations count toward `max_violations`, and each path, keyword and
    message is cut to `max_message_bytes` as the engines cut theirs: a path at a token boundary
    ending in CUT, a text ending in an ellipsis; one that fits is what the rule said."""
    bounds = violation_limits(
        Settings(
            limits={"max_violations": max_violations, "max_message_bytes": max_message_bytes}
        ).limits
    )
    plugins = Plugins()
    for returned in found:
        plugins.rule("weather.get_weather")(lambda arguments, context, said=returned: said)
    verdict = Gate(REGISTRY, plugins, dataclasses.replace(LIMITS, violations=bounds)).judge(
        call('{"city": "Oslo", "units": "celsius"}')
    )
    said = [violation for returned in found for violation in returned]
    if not said:
        accepted(verdict, WEATHER_V1)
        return
    rejected(verdict, Phase.BUSINESS_VALIDATION, Code.BUSINESS_RULE, retryable=True)
    assert len(verdict.violations) == min(len(said), max_violations)
    for original, kept in zip(said, verdict.violations, strict=False):
        assert len(kept.path.encode()) <= max_message_bytes
        for text, cut in ((original.keyword, kept.keyword), (original.message, kept.message)):
            assert len(cut.encode()) <= max_message_bytes
            assert cut == text or (cut.endswith("\u2026") and text.startswith(cut[:-1]))
        if kept.path != original.path:
            assert kept.path.endswith(CUT)
            shown = _tokens(kept.path.removesuffix(CUT))
            if original.path.startswith("/"):  # whole tokens, the first ones
                assert shown == _tokens(original.path)[: len(shown)]
            else:  # not a pointer: one token, too long to show
                assert shown == []
    assert len(orjson.dumps(verdict.retry_feedback)) <= LIMITS.max_feedback_bytes


# --- normalization ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "sent", "internal"),
    [
        (
            "1",
            {"city": "Oslo", "units": "celsius"},
            {"city": "Oslo", "units": "celsius", "days": 1},
        ),
        (
            "2",
            {"city": "Oslo", "units": "celsius"},
            {"city": "Oslo", "units": "celsius", "days": 1},
        ),
        (
            "2",
            {"city": "Oslo", "units": "celsius", "days": None},
            {"city": "Oslo", "units": "celsius", "days": 1},
        ),
        (
            "2",
            {"units": "fahrenheit", "days": 7, "city": "Oslo"},
            {"city": "Oslo", "units": "fahrenheit", "days": 7},
        ),
    ],
)
def test_version_adapters_turn_every_version_into_the_internal_shape(
    version: str, sent: dict[str, Any], internal: dict[str, Any]
) -> None:
    verdict = accepted(
        GATE.judge(call(orjson.dumps(sent), tool_version=version)),
        SchemaRef("weather.get_weather", version),
    )
    assert verdict.arguments == internal
    assert Phase.NORMALIZATION in verdict.phases_us


def test_without_an_adapter_the_arguments_are_the_text_as_validated() -> None:
    text = (
        b'{ "recipient":"acct_1" ,"amount_minor":1,"currency":"EUR",'
        b'"description":null,"idempotency_key":"k"}'
    )
    verdict = accepted(GATE.judge(call(text, "create_payment", tool_version=None)), PAYMENT)
    assert verdict.arguments_json == text
    fenced = accepted(
        GATE.judge(call(b"```json\n" + text + b"\n```", "create_payment", tool_version=None)),
        PAYMENT,
    )
    assert fenced.arguments_json == text


def test_an_adapter_that_raises_is_that_calls_adapter_error() -> None:
    def broken(arguments: Mapping[str, Any]) -> dict[str, Any]:
        raise ValueError(SECRET)

    verdict = rejected(
        Gate(REGISTRY, plugins_with(adapter=broken), LIMITS).judge(
            call('{"city": "Oslo", "units": "celsius"}')
        ),
        Phase.NORMALIZATION,
        Code.ADAPTER_ERROR,
        retryable=False,
    )
    assert "ValueError" in verdict.violations[0].message
    assert SECRET not in orjson.dumps(verdict.retry_feedback).decode()


def test_an_adapter_whose_result_is_not_json_is_adapter_error() -> None:
    def unserializable(arguments: Mapping[str, Any]) -> dict[str, Any]:
        return {"city": {1, 2}}

    rejected(
        Gate(REGISTRY, plugins_with(adapter=unserializable), LIMITS).judge(
            call('{"city": "Oslo", "units": "celsius"}')
        ),
        Phase.NORMALIZATION,
        Code.ADAPTER_ERROR,
        retryable=False,
    )


def test_approval_comes_from_the_contract() -> None:
    assert accepted(GATE.judge(pay(payment())), PAYMENT).requires_approval is False
    refund = {
        "payment_id": "pay_1",
        "amount_minor": 100,
        "currency": "EUR",
        "reason": None,
        "idempotency_key": "refund-1",
    }
    verdict = GATE.judge(call(orjson.dumps(refund), "refund_payment"))
    assert accepted(verdict, SchemaRef("payments.refund_payment", "1")).requires_approval is True
    weather = accepted(GATE.judge(call('{"city": "Oslo", "units": "celsius"}')), WEATHER_V1)
    assert weather.requires_approval is False


# --- idempotency: the effective key -----------------------------------------------------------

OPS_CONTRACTS: dict[str, dict[str, Any]] = {
    # side effects, no key argument: the key can only come from the envelope
    "restart_service": {"x-callgate": {"side_effects": True}},
    # no side effects declared, but a key is required
    "rotate_logs": {"x-callgate": {"idempotency": "required"}},
    # side effects, the key in an optional argument
    "send_email": {
        "x-callgate": {"side_effects": True, "idempotency_key_argument": "request_id"},
    },
}


@pytest.fixture(scope="module")
def ops_gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    """Contracts the shipped directory has no example of, loaded like any contracts directory."""
    root = tmp_path_factory.mktemp("contracts")
    (root / "ops").mkdir()
    for tool, extra in OPS_CONTRACTS.items():
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "target": {"type": "string", "minLength": 1, "maxLength": 64},
                "request_id": {"type": "string", "minLength": 1, "maxLength": 64},
            },
            "required": ["target"],
            "additionalProperties": False,
            **extra,
        }
        (root / "ops" / f"{tool}.v1.schema.json").write_bytes(orjson.dumps(schema))
    registry = SchemaRegistry.load(root, limits=violation_limits(SETTINGS.limits))
    return Gate(registry, load_plugins(root), LIMITS)


@pytest.mark.parametrize("tool", ["restart_service", "rotate_logs", "send_email"])
def test_a_tool_that_needs_a_key_is_rejected_without_one(ops_gate: Gate, tool: str) -> None:
    verdict = rejected(
        ops_gate.judge(call('{"target": "db"}', tool)),
        Phase.IDEMPOTENCY,
        Code.IDEMPOTENCY_KEY_MISSING,
        retryable=True,
    )
    assert verdict.violations == (
        Violation("", "idempotency_key", "this tool has side effects and needs an idempotency key"),
    )
    assert verdict.idempotency_key is None
    assert verdict.schema == SchemaRef(f"ops.{tool}", "1")


@pytest.mark.parametrize("tool", ["restart_service", "rotate_logs", "send_email"])
def test_a_tool_that_needs_a_key_is_accepted_pending_its_envelope_key(
    ops_gate: Gate, tool: str
) -> None:
    verdict = accepted(
        ops_gate.judge(call('{"target": "db"}', tool, idempotency_key="env-1")),
        SchemaRef(f"ops.{tool}", "1"),
    )
    assert verdict.idempotency_key == "env-1"
    assert verdict.idempotency_digest == request_digest(
        SchemaRef(f"ops.{tool}", "1"), {"target": "db"}
    )


def test_the_argument_the_contract_names_is_the_key(ops_gate: Gate) -> None:
    verdict = accepted(
        ops_gate.judge(call('{"target": "db", "request_id": "arg-1"}', "send_email")),
        SchemaRef("ops.send_email", "1"),
    )
    assert verdict.idempotency_key == "arg-1"
    assert verdict.idempotency_digest is not None
    # the same key in both places is one key
    both = ops_gate.judge(
        call('{"target": "db", "request_id": "arg-1"}', "send_email", idempotency_key="arg-1")
    )
    assert (both.outcome, both.idempotency_key) == (Outcome.ACCEPTED, "arg-1")
    assert both.idempotency_digest == verdict.idempotency_digest


def test_an_argument_another_contract_does_not_name_is_no_key(ops_gate: Gate) -> None:
    rejected(
        ops_gate.judge(call('{"target": "db", "request_id": "arg-1"}', "restart_service")),
        Phase.IDEMPOTENCY,
        Code.IDEMPOTENCY_KEY_MISSING,
        retryable=True,
    )


def test_a_payment_carries_its_argument_key_and_its_request_digest() -> None:
    body = payment(idempotency_key="pay-42")
    verdict = accepted(GATE.judge(pay(body)), PAYMENT)
    assert verdict.idempotency_key == "pay-42"
    assert verdict.idempotency_digest == request_digest(PAYMENT, body)
    # key order and spacing do not make another request; a value does
    reordered = GATE.judge(call(orjson.dumps(dict(reversed(body.items()))), "create_payment"))
    assert reordered.idempotency_digest == verdict.idempotency_digest
    other = GATE.judge(pay(payment(idempotency_key="pay-42", amount_minor=1251)))
    assert other.idempotency_digest not in (None, verdict.idempotency_digest)


def test_envelope_and_argument_keys_that_differ_are_a_mismatch() -> None:
    verdict = rejected(
        GATE.judge(pay(payment(idempotency_key="arg-key"), idempotency_key="envelope-key")),
        Phase.IDEMPOTENCY,
        Code.IDEMPOTENCY_KEY_MISMATCH,
        retryable=True,
    )
    assert where(verdict) == [("/idempotency_key", "idempotency_key")]
    assert verdict.idempotency_key == "envelope-key"
    assert verdict.schema == PAYMENT
    assert verdict.retry_feedback is not None
    # a retryable code tells the model what to fix
    assert verdict.retry_feedback["instruction"] != "The call cannot be executed as sent."


def test_a_business_rule_decides_before_a_key_mismatch() -> None:
    """The first phase that fails decides: business_validation runs before idempotency."""
    verdict = GATE.judge(
        pay(
            payment(currency="JPY", amount_minor=5_000_000, idempotency_key="arg-key"),
            idempotency_key="envelope-key",
        )
    )
    rejected(verdict, Phase.BUSINESS_VALIDATION, Code.BUSINESS_RULE, retryable=True)


def test_a_rejection_after_the_key_is_known_carries_the_effective_key() -> None:
    body = payment(currency="JPY", amount_minor=5_000_000, idempotency_key="pay-9")
    verdict = rejected(
        GATE.judge(pay(body)), Phase.BUSINESS_VALIDATION, Code.BUSINESS_RULE, retryable=True
    )
    assert verdict.idempotency_key == "pay-9"


@FIXED
@given(
    envelope=st.none() | st.sampled_from(["k-1", "k-2", "ключ", ""]),
    argument=st.none() | st.sampled_from(["k-1", "k-2", "K_3"]),  # the schema's pattern
    over_ceiling=st.booleans(),
    bad_amount=st.booleans(),
)
def test_the_verdict_always_carries_the_effective_key(
    envelope: str | None, argument: str | None, over_ceiling: bool, bad_amount: bool
) -> None:
    body = payment(idempotency_key=argument)
    if argument is None:
        del body["idempotency_key"]
    if over_ceiling:
        body.update(currency="JPY", amount_minor=5_000_000)
    if bad_amount:
        body.update(amount_minor="12.50")
    verdict = GATE.judge(pay(body, idempotency_key=envelope))
    if argument is None:  # the schema requires the argument: it speaks first
        assert verdict.code is Code.SCHEMA_VIOLATION
        assert verdict.idempotency_key == envelope
    elif bad_amount:  # schema-invalid, but the key the call names is known
        assert verdict.code is Code.SCHEMA_VIOLATION
        assert verdict.idempotency_key == (envelope if envelope is not None else argument)
    elif over_ceiling:
        assert verdict.code is Code.BUSINESS_RULE
        assert verdict.idempotency_key == (envelope if envelope is not None else argument)
    elif envelope is not None and envelope != argument:
        assert verdict.code is Code.IDEMPOTENCY_KEY_MISMATCH
        assert verdict.idempotency_key == envelope
    else:
        assert verdict.outcome is Outcome.ACCEPTED
        assert verdict.idempotency_key == argument
        assert verdict.idempotency_digest == request_digest(PAYMENT, body)


def test_an_optional_key_on_a_plain_tool_is_still_decided() -> None:
    keyed = accepted(
        GATE.judge(call('{"city": "Oslo", "units": "celsius"}', idempotency_key="w-1")),
        WEATHER_V1,
    )
    assert keyed.idempotency_key == "w-1"
    # compared by the arguments the accepted event carries (as adapted: what runs, what the
    # executor and an approval digest), under the version the call named
    assert keyed.idempotency_digest == request_digest(
        WEATHER_V1, {"city": "Oslo", "units": "celsius", "days": 1}
    )
    plain = accepted(GATE.judge(call('{"city": "Oslo", "units": "celsius"}')), WEATHER_V1)
    assert (plain.idempotency_key, plain.idempotency_digest) == (None, None)


def test_the_same_arguments_under_another_version_are_another_request() -> None:
    text = '{"city": "Oslo", "units": "celsius"}'
    v1 = GATE.judge(call(text, idempotency_key="w-1", tool_version="1"))
    v2 = GATE.judge(call(text, idempotency_key="w-1", tool_version="2"))
    assert v1.idempotency_digest is not None
    assert v2.idempotency_digest is not None
    assert v1.idempotency_digest != v2.idempotency_digest


# --- tool_output_validation (MCP results) -----------------------------------------------------

WEATHER_DATA = {"temperature": 22.5, "conditions": "Partly cloudy", "humidity": 65}


def result(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "content": [{"type": "text", "text": orjson.dumps(WEATHER_DATA).decode()}],
        "structuredContent": WEATHER_DATA,
    }
    body.update(overrides)
    return {"jsonrpc": "2.0", "id": 3, "result": body}


def judge_result(message: Any, **fields: Any) -> Verdict:
    return GATE.judge(
        call(orjson.dumps(message), MCP_WEATHER, tool_version=None, channel="mcp_result", **fields)
    )


MCP_REF = SchemaRef("mcp.weather.get_weather_data", "1")


def test_a_result_that_matches_its_output_schema_is_accepted_as_its_result() -> None:
    message = result()
    verdict = accepted(judge_result(message), MCP_REF)
    assert verdict.arguments == message["result"]
    assert Phase.TOOL_OUTPUT_VALIDATION in verdict.phases_us


@pytest.mark.parametrize(
    ("message", "code", "path"),
    [
        (result(structuredContent={"temperature": "hot"}), Code.OUTPUT_SCHEMA_VIOLATION, None),
        (
            result(content=[{"type": "text", "text": '{"temperature": 1}'}]),
            Code.OUTPUT_TEXT_MISMATCH,
            "/result/content/0/text",
        ),
        (result(isError=True), Code.TOOL_ERROR, "/result/isError"),
        (
            {"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "bad"}},
            Code.JSONRPC_ERROR,
            "/error/code",
        ),
        ({"jsonrpc": "2.0", "id": 3, "result": []}, Code.OUTPUT_SCHEMA_VIOLATION, "/result"),
    ],
)
def test_a_result_that_fails_is_rejected_in_tool_output_validation(
    message: Any, code: Code, path: str | None
) -> None:
    verdict = rejected(judge_result(message), Phase.TOOL_OUTPUT_VALIDATION, code, retryable=False)
    assert verdict.schema == MCP_REF
    if path is not None:
        assert verdict.violations[0].path == path


def test_a_result_that_asks_for_input_is_incomplete() -> None:
    message = {"jsonrpc": "2.0", "id": 3, "result": {"resultType": "input_required"}}
    verdict = judge_result(message, idempotency_key="r-1")
    assert (verdict.outcome, verdict.phase, verdict.reason) == (
        Outcome.INCOMPLETE,
        Phase.TOOL_OUTPUT_VALIDATION,
        IncompleteReason.INPUT_REQUIRED,
    )
    assert verdict.retryable is False
    assert verdict.idempotency_key == "r-1"


def test_a_result_is_parsed_as_strictly_as_arguments() -> None:
    verdict = GATE.judge(
        call(
            b'{"result": {"content": [], "content": []}}',
            MCP_WEATHER,
            tool_version=None,
            channel="mcp_result",
        )
    )
    assert (verdict.outcome, verdict.phase, verdict.code) == (
        Outcome.REJECTED,
        Phase.JSON_PARSE,
        Code.DUPLICATE_KEY,
    )
    assert where(verdict) == [("/result/content", "duplicate_key")]


def test_result_feedback_names_only_declared_output_members() -> None:
    message = result(structuredContent={**WEATHER_DATA, "api_token": "tok-123"})
    verdict = rejected(
        judge_result(message),
        Phase.TOOL_OUTPUT_VALIDATION,
        Code.OUTPUT_SCHEMA_VIOLATION,
        retryable=False,
    )
    assert where(verdict) == [("/result/structuredContent/api_token", "additionalProperties")]
    feedback = orjson.dumps(verdict.retry_feedback).decode()
    assert "api_token" not in feedback
    assert "tok-123" not in feedback
    assert "/result/structuredContent/<undeclared>" in feedback


# --- the retry budget -------------------------------------------------------------------------


@FIXED
@given(budget=st.integers(1, 6), attempt=st.none() | st.integers(0, 9))
def test_a_retryable_rejection_at_the_budget_is_final(budget: int, attempt: int | None) -> None:
    gate = Gate(REGISTRY, PLUGINS, dataclasses.replace(LIMITS, retry_budget=budget))
    verdict = gate.judge(call('{"city": 1, "units": "celsius"}', attempt=attempt))
    spent = attempt is not None and attempt >= budget
    rejected(verdict, Phase.SCHEMA_VALIDATION, Code.SCHEMA_VIOLATION, retryable=not spent)
    assert verdict.retry_feedback is not None
    assert verdict.retry_feedback.get("retry_budget_exhausted", False) is spent
    if spent:
        assert "do not retry" in verdict.retry_feedback["instruction"]
    # a final code is final whatever the attempt, and never says a budget was spent
    refusal = gate.judge(call("no", channel="refusal", attempt=attempt))
    assert refusal.retryable is False
    assert refusal.retry_feedback is not None
    assert "retry_budget_exhausted" not in refusal.retry_feedback


def test_the_shipped_budget_is_the_settings_one() -> None:
    budget = SETTINGS.retry.budget
    below = GATE.judge(call('{"city": 1}', attempt=budget - 1))
    at = GATE.judge(call('{"city": 1}', attempt=budget))
    assert (below.retryable, at.retryable) == (True, False)


# --- the phases that ran ----------------------------------------------------------------------

ORDER = list(Phase)


@pytest.mark.parametrize(
    ("the_call", "last"),
    [
        (call('{"city": "Oslo", "units": "celsius"}'), Phase.NORMALIZATION),
        (call('{"city": 1}'), Phase.SCHEMA_VALIDATION),
        (call("{"), Phase.JSON_PARSE),
        (call("x", channel="refusal"), Phase.RESPONSE_CLASSIFICATION),
        (pay(payment(currency="JPY", amount_minor=5_000_000)), Phase.BUSINESS_VALIDATION),
        (pay(payment(), idempotency_key="other"), Phase.IDEMPOTENCY),
    ],
)
def test_every_phase_that_ran_is_timed_in_order_and_none_after_the_deciding_one(
    the_call: AssembledCall, last: Phase
) -> None:
    verdict = GATE.judge(the_call)
    phases = [Phase(p) for p in verdict.phases_us]
    assert phases[0] is Phase.ASSEMBLY
    assert phases[-1] is last
    assert phases == sorted(phases, key=ORDER.index)
    assert all(us >= 0 for us in verdict.phases_us.values())
    if verdict.phase is not None:
        assert verdict.phase is last


# --- internal errors: one call's fault never leaves that call ---------------------------------


class Boom(Exception):
    """What a broken part of callgate raises (its message holds a call's data)."""


BOOM_TEXT = "boom-holds-the-arguments"


class _FaultyMeta:
    """A contract's metadata whose one attribute raises."""

    def __init__(self, meta: Any, broken: str, error: type[Exception]) -> None:
        self._meta = meta
        self._broken = broken
        self._error = error

    def __getattr__(self, name: str) -> Any:
        if name == self._broken:
            raise self._error(BOOM_TEXT)
        return getattr(self._meta, name)


class _FaultyNames(frozenset[str]):
    """Declared names whose membership test raises (feedback is built from them)."""

    error: type[Exception] = Boom

    def __contains__(self, item: object) -> bool:
        raise self.error(BOOM_TEXT)


class FaultyRegistry:
    """The shipped registry, with one part of one contract (or the lookup itself) broken."""

    def __init__(self, fault: str, error: type[Exception]) -> None:
        self.fault = fault
        self.error = error

    def resolve(self, tool: str, version: str | int | None) -> Contract | LookupFailure:
        if self.fault == "resolve":
            raise self.error(BOOM_TEXT)
        contract = REGISTRY.resolve(tool, version)
        if not isinstance(contract, Contract):
            return contract
        error = self.error

        def raising(instance: Any) -> tuple[Violation, ...]:
            raise error(BOOM_TEXT)

        if self.fault == "check":
            return dataclasses.replace(contract, check=raising)
        if self.fault == "output_check":
            return dataclasses.replace(contract, output_check=raising)
        if self.fault == "declared_names":
            names = type("Names", (_FaultyNames,), {"error": error})(contract.declared_names)
            return dataclasses.replace(contract, declared_names=names)
        if self.fault.startswith("meta."):
            meta = _FaultyMeta(contract.meta, self.fault.removeprefix("meta."), error)
            return dataclasses.replace(contract, meta=meta)  # type: ignore[arg-type]
        return contract


class FaultyPlugins(Plugins):
    """The shipped plugins, with their lookup broken."""

    def __init__(self, fault: str, error: type[Exception]) -> None:
        super().__init__()
        self._shipped = PLUGINS
        self.fault = fault
        self.error = error

    def rules_for(self, schema_id: str) -> tuple[Any, ...]:
        if self.fault == "rules_for":
            raise self.error(BOOM_TEXT)
        return self._shipped.rules_for(schema_id)

    def adapter_for(self, ref: SchemaRef) -> Any:
        if self.fault == "adapter_for":
            raise self.error(BOOM_TEXT)
        return self._shipped.adapter_for(ref)


VALID_WEATHER = '{"city": "Oslo", "units": "celsius"}'
INVALID_WEATHER = '{"city": 5, "units": "celsius"}'

#: where it breaks -> (a call that gets there, the phase that was running)
FAULTS: dict[str, tuple[Callable[[], AssembledCall], Phase]] = {
    "resolve": (lambda: call(VALID_WEATHER), Phase.SCHEMA_VALIDATION),
    "check": (lambda: call(VALID_WEATHER), Phase.SCHEMA_VALIDATION),
    "declared_names": (lambda: call(INVALID_WEATHER), Phase.SCHEMA_VALIDATION),
    "meta.idempotency_key_argument": (lambda: pay(payment()), Phase.SCHEMA_VALIDATION),
    "rules_for": (lambda: call(VALID_WEATHER), Phase.BUSINESS_VALIDATION),
    "meta.needs_key": (lambda: call(VALID_WEATHER), Phase.IDEMPOTENCY),
    "adapter_for": (lambda: call(VALID_WEATHER), Phase.NORMALIZATION),
    "meta.requires_approval": (lambda: call(VALID_WEATHER), Phase.NORMALIZATION),
    "output_check": (
        lambda: call(orjson.dumps(result()), MCP_WEATHER, tool_version=None, channel="mcp_result"),
        Phase.TOOL_OUTPUT_VALIDATION,
    ),
}
ERRORS: list[type[Exception]] = [
    Boom,
    ValueError,
    KeyError,
    TypeError,
    AttributeError,
    RecursionError,
    AssertionError,
    ZeroDivisionError,
]


@contextmanager
def gate_log() -> Iterator[list[logging.LogRecord]]:
    """The records the gate logs while the block runs."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("callgate.gate")
    handler = Keep(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


@settings(FIXED, suppress_health_check=[HealthCheck.too_slow])
@given(
    fault=st.sampled_from(sorted(FAULTS)),
    error=st.sampled_from(ERRORS),
    ids=st.tuples(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12)),
    key=st.none() | st.text(max_size=8),
)
def test_an_exception_anywhere_is_that_calls_internal_error_in_its_phase(
    fault: str, error: type[Exception], ids: tuple[str, str], key: str | None
) -> None:
    make, phase = FAULTS[fault]
    template = make()
    if fault == "meta.needs_key":
        key = None  # a keyed call never asks whether it needs one
    stream_id, call_id = ids
    the_call = AssembledCall(
        stream_id,
        call_id,
        template.tool,
        template.arguments,
        channel=template.channel,
        tool_version=template.tool_version,
        idempotency_key=key,
    )
    plugins = FaultyPlugins(fault, error)
    gate = Gate(FaultyRegistry(fault, error), plugins, LIMITS)  # type: ignore[arg-type]
    with gate_log() as records:
        verdict = gate.judge(the_call)
    rejected(verdict, phase, Code.INTERNAL_ERROR, retryable=False)
    (violation,) = verdict.violations
    assert violation.keyword == "internal_error"
    assert error.__name__ in violation.message
    event = encode(the_call, verdict, EventLimits(1_000_000, 4096, MESSAGES))
    assert BOOM_TEXT.encode() not in event  # the exception's text stays in the log
    assert orjson.loads(event)["error_code"] == "internal_error"
    # logged once, at error level, with the exception and the call's ids
    (record,) = [r for r in records if r.levelno >= logging.ERROR]
    assert record.exc_info is not None
    assert record.exc_info[0] is error
    message = record.getMessage()
    for part in (repr(call_id), repr(stream_id), the_call.event_id, phase.value):
        assert part in message
    # and the gate goes on judging the next call as if nothing happened
    assert GATE.judge(call(VALID_WEATHER)).outcome is Outcome.ACCEPTED


def test_an_internal_error_after_the_key_is_known_keeps_the_effective_key() -> None:
    registry = FaultyRegistry("meta.requires_approval", Boom)
    gate = Gate(registry, PLUGINS, LIMITS)  # type: ignore[arg-type]
    verdict = gate.judge(pay(payment(idempotency_key="pay-77")))
    rejected(verdict, Phase.NORMALIZATION, Code.INTERNAL_ERROR, retryable=False)
    assert verdict.idempotency_key == "pay-77"


def test_an_unknown_incomplete_reason_is_an_internal_error_not_a_crash() -> None:
    with gate_log() as records:
        verdict = GATE.judge(call(b"{}", incomplete="solar_flare"))
    rejected(verdict, Phase.ASSEMBLY, Code.INTERNAL_ERROR, retryable=False)
    assert len([r for r in records if r.levelno >= logging.ERROR]) == 1


# --- retry feedback holds nothing the call sent -----------------------------------------------

#: a character no schema, message or instruction holds: what the call sent carries it
MARK = "\u2603"
marked_text = st.text(min_size=0, max_size=6).map(lambda s: MARK + s)
marked_value: st.SearchStrategy[Any] = st.recursive(
    marked_text | st.sampled_from([True, False, None]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(marked_text, inner, max_size=3),
    max_leaves=6,
)
DECLARED = ["city", "units", "days", "amount_minor", "currency", "recipient", "description"]


@st.composite
def arguments_with_input(draw: st.DrawFn) -> dict[str, Any]:
    """Arguments whose every undeclared name and every string value is marked."""
    body: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(DECLARED), unique=True, max_size=4)):
        body[name] = draw(marked_value)
    body.update(draw(st.dictionaries(marked_text, marked_value, max_size=4)))
    return body


@FIXED
@given(
    body=arguments_with_input(),
    tool=st.sampled_from(["get_weather", "create_payment", MCP_WEATHER, "unknown"]),
    version=st.sampled_from([None, "1", "2"]),
    attempt=st.none() | st.integers(0, 5),
    duplicated=st.booleans(),
)
def test_feedback_never_holds_what_the_call_sent(
    body: dict[str, Any], tool: str, version: str | None, attempt: int | None, duplicated: bool
) -> None:
    text = orjson.dumps(body)
    if duplicated and body:  # the same member twice: a parse error that names its path
        first = next(iter(body))
        text = text[:-1] + b"," + orjson.dumps({first: 0})[1:]
    verdict = GATE.judge(call(text, tool, tool_version=version, attempt=attempt))
    if verdict.outcome is Outcome.ACCEPTED:
        return
    feedback = orjson.dumps(verdict.retry_feedback).decode()
    assert MARK not in feedback, (verdict, feedback)


#: a value text that fails the strict parse at its own path, by the code it fails with
PARSE_FAULTS = {
    Code.INEXACT_NUMBER: "0.99999999999999999",
    Code.NON_FINITE_NUMBER: "NaN",
    Code.INVALID_UTF8: '"\\udc00"',
    Code.DUPLICATE_KEY: "1",  # written twice
}


@FIXED
@given(
    tool=st.sampled_from(["get_weather", "create_payment", "unknown"]),
    code=st.sampled_from(sorted(PARSE_FAULTS)),
    pick=st.integers(0, 50),
    undeclared=st.none() | marked_text,
    streamed=st.booleans(),
)
def test_a_parse_failure_feedback_names_what_the_contract_declares(
    tool: str, code: Code, pick: int, undeclared: str | None, streamed: bool
) -> None:
    """A text that fails to parse is judged before its contract is looked up; its feedback path
    still shows a name the call's contract declares, as a schema violation's would, and hides
    any other (an undeclared name, or every name when the tool resolves to no contract), at the
    final judgement and at the early one alike. (It showed `/<undeclared>` for every name.)"""
    contract = REGISTRY.resolve(tool, "1")
    declared = sorted(contract.declared_names) if isinstance(contract, Contract) else ["city"]
    name = undeclared if undeclared is not None else declared[pick % len(declared)]
    member = orjson.dumps(name).decode() + ": " + PARSE_FAULTS[code]
    if code is Code.DUPLICATE_KEY:
        member += ", " + member
    text = "{" + member + "}"
    path = "/" + escape(name)
    # streamed: the reassembler's early judge refused it first, and hands that on with the call
    early = EarlyRejection("json", code.value, pointer=path, detail="why") if streamed else None
    offset = None if early is None else 0
    judged = GATE.judge(call(text, tool, early=early, early_offset=offset))
    assert (judged.outcome, judged.code) == (Outcome.REJECTED, code), judged
    assert [v.path for v in judged.violations] == [path]
    assert judged.retry_feedback is not None
    shown = [v["path"] for v in judged.retry_feedback["violations"]]
    visible = isinstance(contract, Contract) and name in contract.declared_names
    assert shown == ["/" + (escape(name) if visible else UNDECLARED)]


def test_a_tool_result_that_fails_to_parse_shows_the_result_members_it_declares() -> None:
    text = b'{"jsonrpc": "2.0", "id": 3, "result": {"structuredContent": {"temperature": NaN}}}'
    verdict = GATE.judge(call(text, MCP_WEATHER, tool_version=None, channel="mcp_result"))
    assert verdict.code is Code.NON_FINITE_NUMBER, verdict
    assert verdict.retry_feedback is not None
    shown = [v["path"] for v in verdict.retry_feedback["violations"]]
    assert shown == ["/result/structuredContent/temperature"]


@FIXED
@given(structured=st.dictionaries(marked_text, marked_value, max_size=4), text=marked_text)
def test_result_feedback_never_holds_what_the_tool_returned(
    structured: dict[str, Any], text: str
) -> None:
    message = result(
        structuredContent={**WEATHER_DATA, **structured},
        content=[{"type": "text", "text": text}],
    )
    verdict = judge_result(message)
    if verdict.outcome is Outcome.ACCEPTED:
        assert not structured
        return
    assert MARK not in orjson.dumps(verdict.retry_feedback).decode()


MEMBERS = st.sampled_from(sorted(RESULT_MEMBERS)) | marked_text
member_value: st.SearchStrategy[Any] = st.recursive(
    marked_text | st.integers(-(2**63), 2**63 - 1) | st.sampled_from([True, False, None]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(MEMBERS, inner, max_size=4),
    max_leaves=8,
)


@FIXED
@given(message=st.dictionaries(MEMBERS, member_value, max_size=4))
def test_feedback_on_any_mcp_message_holds_nothing_of_it(message: dict[str, Any]) -> None:
    verdict = judge_result(message)
    if verdict.retry_feedback is not None:
        assert MARK not in orjson.dumps(verdict.retry_feedback).decode()


@FIXED
@given(
    name=st.sampled_from(sorted(RESULT_MEMBERS | set(WEATHER_DATA))) | marked_text,
    nested=st.booleans(),
    unparsable=st.booleans(),
)
def test_result_feedback_names_inside_structured_content_only_what_the_output_schema_declares(
    name: str, nested: bool, unparsable: bool
) -> None:
    """Below `/result/structuredContent` the tool chose every key: feedback shows one only when
    the output schema declares it, as an argument's path shows only its input schema's names;
    the result's own members (`result`, `content`, `text`, `error`, ...) name the envelope,
    not what the tool put in its structured value. (A key `error` or `text` the output schema
    does not declare was shown: `/result/structuredContent/error`.)"""
    value = "NaN" if unparsable else "[]"  # NaN: a parse failure at that path, else a violation
    member = orjson.dumps(name).decode() + ": " + value
    inner = ("{" + member + "}") if nested else value
    text = (
        '{"jsonrpc": "2.0", "id": 3, "result": {"content": [], "structuredContent": '
        '{"temperature": 1, "conditions": "x", "humidity": 1, "extra": ' + inner + "}}}"
    )
    if not nested:  # the key itself, beside the declared ones
        text = text.replace('"extra"', orjson.dumps(name).decode())
        if name in WEATHER_DATA:
            text = text.replace(orjson.dumps(name).decode() + ": 1, ", "", 1)
    verdict = GATE.judge(call(text, MCP_WEATHER, tool_version=None, channel="mcp_result"))
    assert verdict.outcome is Outcome.REJECTED, (text, verdict)
    assert verdict.retry_feedback is not None
    (path,) = [v.path for v in verdict.violations]
    (shown,) = [v["path"] for v in verdict.retry_feedback["violations"]]
    tokens = path.split("/")[1:]
    assert tokens[:2] == ["result", "structuredContent"], path
    expected = ["result", "structuredContent"] + [
        escape(t) if t in WEATHER_DATA else UNDECLARED for t in tokens[2:]
    ]
    assert shown == "/" + "/".join(expected), (text, path, shown)


# --- every retryable code says what to fix ----------------------------------------------------


def test_every_retryable_code_has_an_instruction_of_its_own() -> None:
    default = build_feedback(
        Code.INTERNAL_ERROR, None, (), retryable=False, budget_exhausted=False, max_bytes=4096
    ).fields["instruction"]
    for code in RETRYABLE:
        feedback = build_feedback(
            code, None, (), retryable=True, budget_exhausted=False, max_bytes=4096
        ).fields
        assert feedback["instruction"] != default, code


def test_the_gate_holds_no_state_between_calls() -> None:
    """A call judged after a failing one is judged as it would be alone."""
    first = GATE.judge(call('{"city": "Oslo", "units": "celsius"}'))
    GATE.judge(pay(payment(idempotency_key="a"), idempotency_key="b"))
    GATE.judge(call(b"", incomplete="solar_flare"))
    again = GATE.judge(call('{"city": "Oslo", "units": "celsius"}'))
    assert (again.outcome, again.idempotency_key, again.arguments_json) == (
        first.outcome,
        first.idempotency_key,
        first.arguments_json,
    )


def test_a_contract_that_takes_no_key_ignores_one(tmp_path: Path) -> None:
    """`x-callgate.idempotency: none`: a key in the envelope is neither checked nor carried."""
    domain = tmp_path / "notes"
    domain.mkdir()
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "x-callgate": {"idempotency": "none"},
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    (domain / "add_note.v1.schema.json").write_bytes(orjson.dumps(schema))
    settings = Settings(schemas={"dir": tmp_path})
    gate = build_gate(settings, build_registry(settings))
    verdict = gate.judge(
        AssembledCall("s", "c", "add_note", b'{"text": "x"}', idempotency_key="k1")
    )
    assert verdict.outcome is Outcome.ACCEPTED
    assert (verdict.idempotency_key, verdict.idempotency_digest) == (None, None)


# --- an early verdict's feedback is the final judgement's -------------------------------------


@pytest.fixture(scope="module")
def tags_gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = tmp_path_factory.mktemp("tags")
    (root / "t").mkdir()
    item = {"type": "string", "maxLength": 3}
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "array", "items": item}}},
        "required": ["tags"],
        "additionalProperties": False,
    }
    (root / "t" / "tags.v1.schema.json").write_bytes(orjson.dumps(schema))
    settings = Settings(schemas={"dir": root})
    return build_gate(settings, build_registry(settings))


@FIXED
@given(
    tags=st.lists(st.lists(st.sampled_from(["a", "bc"]), max_size=4), min_size=1, max_size=4),
    data=st.data(),
)
def test_an_early_rejection_says_in_its_feedback_what_the_final_judgement_says(
    tags_gate: Gate, tags: list[list[str]], data: st.DataObject
) -> None:
    """The same violation, found as the call streams (the reassembler's early judge, whose path
    tells an array index from a key) or once it is whole, gives the same retry feedback: an
    index stays an index in both. (The early one showed `/tags/<undeclared>/<undeclared>` where
    the final one showed `/tags/1/0`.)"""
    outer = data.draw(st.integers(0, len(tags) - 1))
    inner = data.draw(st.integers(0, len(tags[outer])))
    tags[outer].insert(inner, "toolong")
    text = orjson.dumps({"tags": tags})
    final = tags_gate.judge(call(text, "tags"))
    assert final.code is Code.SCHEMA_VIOLATION
    assert [v.path for v in final.violations] == [f"/tags/{outer}/{inner}"]
    early = EarlyRejection("schema", "maxLength", path=("tags", outer, inner), detail="3")
    judged = tags_gate.judge(call(text, "tags", early=early, early_offset=0))
    assert judged.violations == final.violations
    assert judged.retry_feedback == final.retry_feedback


# --- the arguments passed on: what an ordinary reader reads is what was judged ----------------


@settings(FIXED, max_examples=400)
@given(
    whole=st.integers(-(2**63), 2**64 - 1) | st.integers(2**53 - 3, 2**53 + 3),
    at=st.integers(0, 20),
    other=number_texts(),
    string=st.sampled_from(['"9007199254740993.0"', '"1e99 \\" 12345678901234567.0"', '"x"']),
)
def test_the_arguments_passed_on_read_as_judged_by_an_ordinary_reader(
    whole: int, at: int, other: str, string: str
) -> None:
    """Every spelling of an integer (digits, a fraction, an exponent) beside any other number
    and a string that looks like a number: an ordinary reader (orjson, as the approval and,
    through pydantic, the executor read) reads the text passed on as the value judged, and
    its canonical form (the idempotency digest's and the fingerprint's) is the value's. The
    text is passed on as it came unless it holds an integer past 2^53."""
    forms = spellings(Decimal(whole))
    spelt = forms[at % len(forms)]
    text = f'{{"n": {spelt}, "s": {string}, "m": [{other}, {{}}, []]}}'.encode()
    value = parse_json(text, 64)
    if isinstance(value, ParseError):  # `other` may be a number no double or integer holds
        return
    out = passed_on(text, value)
    read = orjson.loads(out)
    assert read == value
    assert canonical(read) == canonical(value)
    respelt = abs(whole) > 2**53 or _integer_past_doubles(other)
    assert (out != text) == respelt, (text, out)


def _integer_past_doubles(text: str) -> bool:
    number = Decimal(text)
    return number == number.to_integral_value() and abs(number) > 2**53
