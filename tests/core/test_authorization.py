"""The authorization phase: the contract's allow list, the tools' authorizers, and what a refusal
tells the model (nothing of the policy).

Contracts with an allow list are written to a temporary directory and loaded like any contracts
directory; generated principals and arguments hold the rule on every input, not only the
example: the call passes exactly when its principal is listed (and every authorizer says yes).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.datafiles import REPO
from worker._native import AssembledCall
from worker.compose import gate_limits, violation_limits
from worker.core.events import EventLimits, encode
from worker.core.pipeline import Gate
from worker.model import Code, Outcome, Phase, SchemaRef, Verdict
from worker.plugins import AuthorizationContext, Plugins, load_plugins
from worker.published.model import Rejected, parse_event
from worker.schemas.registry import SchemaRegistry
from worker.settings import Settings

FIXED = settings(derandomize=True, deadline=None, print_blob=True, max_examples=200)
SETTINGS = Settings()
MESSAGES = violation_limits(SETTINGS.limits)
LIMITS = gate_limits(SETTINGS)
ALLOWED = ["ops-oncall", "ops-lead", "svc:deployer"]
RESTART = SchemaRef("ops.restart_service", "1")


def contract(extra: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"target": {"type": "string", "minLength": 1, "maxLength": 64}},
        "required": ["target"],
        "additionalProperties": False,
        **extra,
    }


def load(root: Path, plugins: Plugins | None = None) -> Gate:
    registry = SchemaRegistry.load(root, limits=violation_limits(SETTINGS.limits))
    return Gate(registry, plugins if plugins is not None else load_plugins(root), LIMITS)


@pytest.fixture(scope="module")
def contracts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("contracts")
    (root / "ops").mkdir()
    listed = contract({"x-callgate": {"allowed_principals": ALLOWED}})
    (root / "ops" / "restart_service.v1.schema.json").write_bytes(orjson.dumps(listed))
    nobody = contract({"x-callgate": {"allowed_principals": []}})
    (root / "ops" / "wipe_disk.v1.schema.json").write_bytes(orjson.dumps(nobody))
    (root / "ops" / "status.v1.schema.json").write_bytes(orjson.dumps(contract({})))
    return root


@pytest.fixture(scope="module")
def gate(contracts: Path) -> Gate:
    return load(contracts)


def ask(gate: Gate, tool: str, principal: str | None, target: Any = "db") -> Verdict:
    arguments = orjson.dumps({"target": target})
    return gate.judge(AssembledCall("s", "c", tool, arguments, principal=principal))


def assert_refused(verdict: Verdict, code: Code = Code.UNAUTHORIZED) -> None:
    assert verdict.outcome is Outcome.REJECTED
    assert (verdict.phase, verdict.code, verdict.retryable) == (Phase.AUTHORIZATION, code, False)
    feedback = verdict.retry_feedback
    assert feedback is not None
    # the model learns that the call is not permitted, never which rule or principal decided
    assert feedback["violations"] == []
    assert "violations_omitted" not in feedback
    # a failing authorizer reads as any refusal: the model cannot tell a rule failed
    assert (feedback["error_type"], feedback["retryable"]) == ("unauthorized", False)
    text = orjson.dumps(feedback).decode()
    for secret in ("allowed_principals", "authorizer", "principal", *ALLOWED):
        assert secret not in text


@pytest.mark.parametrize("principal", ALLOWED)
def test_a_listed_principal_passes(gate: Gate, principal: str) -> None:
    verdict = ask(gate, "restart_service", principal)
    assert verdict.outcome is Outcome.ACCEPTED
    assert Phase.AUTHORIZATION in verdict.phases_us


@FIXED
@given(principal=st.one_of(st.none(), st.text(max_size=40)))
def test_only_a_listed_principal_passes_and_any_other_is_refused(
    gate: Gate, principal: str | None
) -> None:
    verdict = ask(gate, "restart_service", principal)
    if principal in ALLOWED:
        assert verdict.outcome is Outcome.ACCEPTED
    else:
        assert_refused(verdict)


def test_a_call_naming_no_principal_is_refused_where_there_is_a_list(gate: Gate) -> None:
    verdict = ask(gate, "restart_service", None)
    assert_refused(verdict)
    assert verdict.violations[0].message == (
        "the call names no principal and the contract has an allow list"
    )


def test_an_empty_list_refuses_everyone(gate: Gate) -> None:
    for principal in [*ALLOWED, None]:
        assert_refused(ask(gate, "wipe_disk", principal))


@FIXED
@given(principal=st.one_of(st.none(), st.text(max_size=40)))
def test_a_contract_without_a_list_or_authorizer_lets_everyone_through_unmeasured(
    gate: Gate, principal: str | None
) -> None:
    verdict = ask(gate, "status", principal)
    assert verdict.outcome is Outcome.ACCEPTED
    assert Phase.AUTHORIZATION not in verdict.phases_us


def test_authorization_runs_after_the_schema_and_before_the_key(gate: Gate) -> None:
    """An invalid call by a stranger is a schema violation (the phases run in order); a refused
    call never reaches its key's owner (it carries no request digest)."""
    invalid = ask(gate, "restart_service", "stranger", target=1)
    assert (invalid.phase, invalid.code) == (Phase.SCHEMA_VALIDATION, Code.SCHEMA_VIOLATION)
    refused = AssembledCall(
        "s", "c", "restart_service", b'{"target": "db"}', principal="x", idempotency_key="k"
    )
    verdict = gate.judge(refused)
    assert_refused(verdict)
    assert verdict.idempotency_digest is None


def test_the_refusal_is_a_published_rejected_event_naming_its_principal(gate: Gate) -> None:
    call = AssembledCall("s", "c", "restart_service", b'{"target": "db"}', principal="mallory")
    verdict = gate.judge(call)
    event = parse_event(
        encode(call, verdict, EventLimits(65536, SETTINGS.limits.max_feedback_bytes, MESSAGES))
    )
    assert isinstance(event, Rejected)
    assert (event.phase, event.error_code, event.principal) == (
        "authorization",
        "unauthorized",
        "mallory",
    )
    assert event.retry_feedback.violations == ()


# --- authorizers (plugins) ----------------------------------------------------------------------


def with_authorizer(contracts: Path, *authorizers: Any) -> Gate:
    plugins = load_plugins(contracts)
    for authorizer in authorizers:
        plugins.authorizer(RESTART.id)(authorizer)
    return load(contracts, plugins)


def small_restarts_only(arguments: Mapping[str, Any], context: AuthorizationContext) -> bool:
    return context.principal == "ops-lead" or arguments["target"] != "db"


def test_an_authorizer_sees_the_call_and_decides_after_the_list(contracts: Path) -> None:
    seen: list[AuthorizationContext] = []

    def record(arguments: Mapping[str, Any], context: AuthorizationContext) -> bool:
        seen.append(context)
        return True

    gate = with_authorizer(contracts, record, small_restarts_only)
    assert ask(gate, "restart_service", "ops-lead").outcome is Outcome.ACCEPTED
    assert ask(gate, "restart_service", "ops-oncall", target="cache").outcome is Outcome.ACCEPTED
    refused = ask(gate, "restart_service", "ops-oncall")
    assert_refused(refused)
    assert refused.violations[0].keyword == "authorizer"
    # a principal the list refuses reaches no authorizer
    assert_refused(ask(gate, "restart_service", "stranger"))
    assert [c.principal for c in seen] == ["ops-lead", "ops-oncall", "ops-oncall"]
    assert seen[0] == AuthorizationContext(RESTART, "restart_service", "ops-lead", None)


@pytest.mark.parametrize(
    ("authorizer", "why"),
    [
        (lambda arguments, context: 1 / 0, "failed: ZeroDivisionError"),
        (lambda arguments, context: "yes", "returned str, not a bool"),
        (lambda arguments, context: None, "returned NoneType, not a bool"),
    ],
)
def test_an_authorizer_that_fails_refuses_the_call_and_nothing_else(
    contracts: Path, authorizer: Any, why: str
) -> None:
    gate = with_authorizer(contracts, authorizer)
    verdict = ask(gate, "restart_service", "ops-lead")
    assert_refused(verdict, Code.AUTHORIZER_ERROR)
    assert why in verdict.violations[0].message
    # the next call is judged as usual
    assert ask(gate, "status", None).outcome is Outcome.ACCEPTED


def test_an_authorizer_alone_guards_a_contract_without_a_list(contracts: Path) -> None:
    plugins = load_plugins(contracts)
    plugins.authorizer("ops.status")(lambda arguments, context: context.principal is not None)
    gate = load(contracts, plugins)
    assert ask(gate, "status", "anyone").outcome is Outcome.ACCEPTED
    assert_refused(ask(gate, "status", None))


def test_the_readme_example_prints_what_the_readme_shows() -> None:
    """`callgate check` on the README's authorization example, as a user runs it."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker",
            "check",
            "--schemas",
            "examples/contracts/authorization",
            "examples/authorization.jsonl",
        ],
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=True,
    )
    events = [orjson.loads(line) for line in result.stdout.splitlines()]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert [(e["call_id"], e["outcome"], e["error_code"], e.get("principal")) for e in events] == [
        ("c1", "accepted", None, "ops-oncall"),
        ("c2", "rejected", "unauthorized", "marketing-bot"),
        ("c3", "rejected", "unauthorized", None),
    ]
    for event in events[1:]:
        assert orjson.dumps(event["violations"]).decode() in readme
        feedback = event["retry_feedback"]
        assert (feedback["violations"], feedback["retryable"]) == ([], False)
        assert feedback["instruction"] in readme
    assert "3 calls: 1 accepted, 2 rejected, 0 incomplete" in result.stderr.decode()
