"""The chain on whole calls, against the contracts shipped in schemas/ (the seed cases first)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.datafiles import SCHEMAS
from worker.core.pipeline import Gate, GateLimits
from worker.model import (
    AssembledCall,
    ChunkKind,
    Code,
    IncompleteReason,
    Outcome,
    Phase,
    RepairKind,
    SourceSpan,
    Trace,
    Verdict,
)
from worker.plugins import Plugins, load_plugins
from worker.schemas.registry import SchemaRegistry


@pytest.fixture(scope="module")
def registry() -> SchemaRegistry:
    return SchemaRegistry.load(SCHEMAS)


@pytest.fixture
def gate(registry: SchemaRegistry) -> Gate:
    return Gate(registry, load_plugins(["worker.plugins.builtin"]))


def call(text: str | bytes, tool: str | None = "get_weather", **kw: Any) -> AssembledCall:
    arguments = text.encode() if isinstance(text, str) else text
    kw.setdefault("tool_version", "1")
    return AssembledCall(stream_id="s", call_id="c", tool=tool, arguments=arguments, **kw)


def rejected(verdict: Verdict, phase: Phase, code: Code) -> Verdict:
    assert (verdict.outcome, verdict.phase, verdict.code) == (Outcome.REJECTED, phase, code), (
        verdict
    )
    assert verdict.retry_feedback is not None
    assert verdict.retry_feedback["error_type"] == code.value
    return verdict


# --- the seed cases ---------------------------------------------------------------------------


def test_trailing_comma_is_invalid_json(gate: Gate) -> None:
    rejected(gate.judge(call('{"city": "杭州",}')), Phase.JSON_PARSE, Code.INVALID_JSON)


def test_missing_units_is_a_required_violation_at_units(gate: Gate) -> None:
    verdict = rejected(
        gate.judge(call('{"city": "杭州"}')), Phase.SCHEMA_VALIDATION, Code.SCHEMA_VIOLATION
    )
    assert [(v.path, v.keyword) for v in verdict.violations] == [("/units", "required")]
    assert verdict.schema is not None
    assert (verdict.schema.id, verdict.schema.version) == ("weather.get_weather", "1")


def test_city_of_the_wrong_type(gate: Gate) -> None:
    verdict = rejected(
        gate.judge(call('{"city": 123, "units": "celsius"}')),
        Phase.SCHEMA_VALIDATION,
        Code.SCHEMA_VIOLATION,
    )
    assert [(v.path, v.keyword) for v in verdict.violations] == [("/city", "type")]
    assert "123" not in orjson.dumps(verdict.retry_feedback).decode()


def test_extra_property_is_additional_properties(gate: Gate) -> None:
    verdict = rejected(
        gate.judge(call('{"city": "Paris", "units": "celsius", "debug": true}')),
        Phase.SCHEMA_VALIDATION,
        Code.SCHEMA_VIOLATION,
    )
    assert [v.keyword for v in verdict.violations] == ["additionalProperties"]


def test_fenced_json_is_accepted_with_a_recorded_repair(gate: Gate) -> None:
    verdict = gate.judge(call('```json\n{"city": "杭州", "units": "celsius"}\n```'))
    assert verdict.outcome is Outcome.ACCEPTED, verdict
    assert [r.kind for r in verdict.repairs] == [RepairKind.MARKDOWN_FENCE]
    assert verdict.arguments == {"city": "杭州", "units": "celsius", "days": 1}


def test_fence_repair_is_validated_in_full(gate: Gate) -> None:
    verdict = rejected(
        gate.judge(call('```\n{"city": "Oslo"}\n```')),
        Phase.SCHEMA_VALIDATION,
        Code.SCHEMA_VIOLATION,
    )
    assert [r.kind for r in verdict.repairs] == [RepairKind.MARKDOWN_FENCE]


def test_duplicate_amount_key(gate: Gate) -> None:
    verdict = rejected(
        gate.judge(call('{"amount": 10, "amount": 100}', tool="create_payment")),
        Phase.JSON_PARSE,
        Code.DUPLICATE_KEY,
    )
    assert verdict.violations[0].path == "/amount"


# --- every other phase ------------------------------------------------------------------------


def test_nothing_else_is_repaired(gate: Gate) -> None:
    for text in (
        "{'city': 'Oslo', 'units': 'celsius'}",
        '{"city": "Oslo" "units": "celsius"}',
        'Here you go: {"city": "Oslo", "units": "celsius"}',
    ):
        rejected(gate.judge(call(text)), Phase.JSON_PARSE, Code.INVALID_JSON)


def test_refusal_and_model_error_are_not_retryable(gate: Gate) -> None:
    refusal = rejected(
        gate.judge(call("I can't help with that", channel=ChunkKind.REFUSAL)),
        Phase.RESPONSE_CLASSIFICATION,
        Code.REFUSAL,
    )
    error = rejected(
        gate.judge(call("overloaded", channel=ChunkKind.ERROR)),
        Phase.RESPONSE_CLASSIFICATION,
        Code.MODEL_ERROR,
    )
    assert refusal.retryable is False
    assert error.retryable is False


def test_limits_run_before_parsing(registry: SchemaRegistry) -> None:
    gate = Gate(registry, limits=GateLimits(max_bytes=64, max_depth=3))
    rejected(gate.judge(call('{"city": "' + "x" * 100 + '"}')), Phase.LIMITS, Code.TOO_LARGE)
    deep = gate.judge(call('{"a": [[[1]]]}'))
    rejected(deep, Phase.LIMITS, Code.TOO_DEEP)
    assert Phase.JSON_PARSE not in deep.phases_us


def test_root_must_be_an_object(gate: Gate) -> None:
    rejected(gate.judge(call('["Oslo", "celsius"]')), Phase.JSON_PARSE, Code.ROOT_NOT_OBJECT)


def test_unknown_tool_and_version(gate: Gate) -> None:
    rejected(gate.judge(call("{}", tool="rm_rf")), Phase.SCHEMA_VALIDATION, Code.UNKNOWN_TOOL)
    rejected(
        gate.judge(call("{}", tool_version="99")),
        Phase.SCHEMA_VALIDATION,
        Code.UNKNOWN_SCHEMA_VERSION,
    )
    rejected(gate.judge(call("{}", tool=None)), Phase.SCHEMA_VALIDATION, Code.UNKNOWN_TOOL)


def test_newest_version_judges_a_call_without_one(gate: Gate) -> None:
    verdict = gate.judge(call('{"city": "Oslo", "units": "celsius"}', tool_version=None))
    assert verdict.schema is not None
    newest = max(
        int(p.name.split(".v")[1].split(".")[0])
        for p in (SCHEMAS / "weather").glob("get_weather.v*.schema.json")
    )
    assert verdict.schema.version == str(newest)


def payment(**overrides: Any) -> str:
    body: dict[str, Any] = {
        "amount_minor": 1250,
        "currency": "EUR",
        "recipient": "acct_123",
        "description": "invoice 7",
        "idempotency_key": "pay-1",
    }
    body.update(overrides)
    return orjson.dumps({k: v for k, v in body.items() if v is not None}).decode()


def test_payment_accepted_requires_approval(gate: Gate) -> None:
    verdict = gate.judge(call(payment(), tool="create_payment"))
    assert verdict.outcome is Outcome.ACCEPTED, verdict
    assert verdict.requires_approval is True


def test_business_rule_rejects_a_payment_over_the_currency_ceiling(gate: Gate) -> None:
    verdict = rejected(
        gate.judge(call(payment(currency="JPY", amount_minor=5_000_000), tool="create_payment")),
        Phase.BUSINESS_VALIDATION,
        Code.BUSINESS_RULE,
    )
    assert verdict.violations[0].path == "/amount_minor"


def test_a_rule_that_raises_is_rule_error(registry: SchemaRegistry) -> None:
    plugins = Plugins()

    @plugins.rule("weather.get_weather")
    def broken(arguments: Any, context: Any) -> list[Any]:
        raise KeyError("oops")

    verdict = Gate(registry, plugins).judge(call('{"city": "Oslo", "units": "celsius"}'))
    rejected(verdict, Phase.BUSINESS_VALIDATION, Code.RULE_ERROR)
    assert verdict.retryable is False


def test_an_adapter_that_raises_is_adapter_error(registry: SchemaRegistry) -> None:
    plugins = Plugins()

    @plugins.adapter("weather.get_weather", "1")
    def broken(arguments: Any) -> dict[str, Any]:
        raise ValueError("oops")

    verdict = Gate(registry, plugins).judge(call('{"city": "Oslo", "units": "celsius"}'))
    rejected(verdict, Phase.NORMALIZATION, Code.ADAPTER_ERROR)


def test_idempotency_duplicate_conflict_and_replay(gate: Gate) -> None:
    source = SourceSpan("in", 0, 10, 12)
    first = gate.judge(call(payment(), tool="create_payment", source=source))
    assert first.outcome is Outcome.ACCEPTED
    replay = gate.judge(call(payment(), tool="create_payment", source=source))
    assert replay.outcome is Outcome.ACCEPTED  # the same input again, after a crash
    reordered = orjson.dumps(dict(reversed(orjson.loads(payment()).items()))).decode()
    other_source = SourceSpan("in", 0, 40, 41)
    duplicate = gate.judge(call(reordered, tool="create_payment", source=other_source))
    rejected(duplicate, Phase.IDEMPOTENCY, Code.DUPLICATE)
    conflict = gate.judge(
        call(payment(amount_minor=999), tool="create_payment", source=other_source)
    )
    rejected(conflict, Phase.IDEMPOTENCY, Code.IDEMPOTENCY_CONFLICT)


def test_side_effecting_tool_without_a_key_is_rejected(gate: Gate) -> None:
    # the schema requires the property too; drop it and the schema speaks first
    verdict = gate.judge(call(payment(idempotency_key=None), tool="create_payment"))
    assert verdict.outcome is Outcome.REJECTED
    assert verdict.code in (Code.SCHEMA_VIOLATION, Code.IDEMPOTENCY_KEY_MISSING)


def test_retry_budget_makes_a_rejection_final(gate: Gate) -> None:
    early = gate.judge(call('{"city": 1}', trace=Trace(attempt=1)))
    late = gate.judge(call('{"city": 1}', trace=Trace(attempt=3)))
    assert early.retryable is True
    assert late.retryable is False
    assert late.retry_feedback is not None
    assert late.retry_feedback["retry_budget_exhausted"] is True


def test_feedback_is_bounded(registry: SchemaRegistry) -> None:
    gate = Gate(registry, limits=GateLimits(max_feedback_bytes=300))
    verdict = gate.judge(call('{"city": 1, "units": 2, "a": 3, "b": 4, "c": 5}', tool_version="1"))
    assert len(orjson.dumps(verdict.retry_feedback)) <= 300


def test_incomplete_calls_are_recorded_not_judged(gate: Gate) -> None:
    verdict = gate.judge(call('["ls","pwd"', incomplete=IncompleteReason.MAX_TOKENS))
    assert (verdict.outcome, verdict.reason) == (Outcome.INCOMPLETE, IncompleteReason.MAX_TOKENS)


def test_assembly_bounds_are_limits_rejections(gate: Gate) -> None:
    rejected(gate.judge(call(b"", assembly_error=Code.TOO_LARGE)), Phase.LIMITS, Code.TOO_LARGE)
    rejected(
        gate.judge(call(b"", assembly_error=Code.MALFORMED_RECORD)),
        Phase.ASSEMBLY,
        Code.MALFORMED_RECORD,
    )


def test_every_phase_that_ran_is_timed(gate: Gate) -> None:
    verdict = gate.judge(call('{"city": "Oslo", "units": "celsius"}'))
    assert set(verdict.phases_us) >= {
        Phase.ASSEMBLY,
        Phase.RESPONSE_CLASSIFICATION,
        Phase.LIMITS,
        Phase.REPAIR,
        Phase.JSON_PARSE,
        Phase.SCHEMA_VALIDATION,
        Phase.NORMALIZATION,
    }
    assert all(us >= 0 for us in verdict.phases_us.values())
