"""Lint rules: each one fires on the schema it describes, with file, pointer and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.datafiles import SCHEMAS
from worker.schemas.lint import Finding, lint_path


def lint_path_of(tmp_path: Path, schema: Any, name: str = "t.v1.schema.json") -> list[Finding]:
    domain = tmp_path / "d"
    domain.mkdir(exist_ok=True)
    (domain / "CHANGELOG.md").write_text("# d\n")
    (domain / name).write_text(json.dumps(schema))
    return lint_path(tmp_path)


def findings(tmp_path: Path, schema: Any, name: str = "t.v1.schema.json") -> set[tuple[str, str]]:
    return {(f.pointer, f.rule) for f in lint_path_of(tmp_path, schema, name)}


def test_the_shipped_contracts_are_clean() -> None:
    assert lint_path(SCHEMAS) == []


def test_strict_mode_rules(tmp_path: Path) -> None:
    found = findings(
        tmp_path,
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "object", "properties": {}}},
            "required": ["b"],
        },
    )
    assert ("", "strict-additional-properties") in found
    assert ("/properties/a", "strict-required") in found
    assert ("/properties/b", "strict-additional-properties") in found
    assert ("/properties/b", "strict-required") not in found


def test_enum_money_and_timestamp_rules(tmp_path: Path) -> None:
    found = findings(
        tmp_path,
        {
            "type": "object",
            "properties": {
                "mode": {"type": "string", "description": "Must be one of 'fast', 'slow' or 'off'"},
                "level": {"type": "string", "description": "One of 'a', 'b'", "enum": ["a", "b"]},
                "total_price": {"type": "number"},
                "amount_minor": {"type": "integer"},
                "created_at": {"type": "string", "format": "date-time"},
                "sent_at": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}T.*Z$"},
                "expires_at": {"type": "integer"},
                "expires_at_ms": {"type": "integer"},
            },
            "required": [
                *("mode", "level", "total_price", "amount_minor", "created_at", "sent_at"),
                *("expires_at", "expires_at_ms"),
            ],
            "additionalProperties": False,
        },
    )
    assert found == {
        ("/properties/mode", "enum-in-description"),
        ("/properties/total_price", "money-as-number"),
        ("/properties/created_at", "bare-timestamp"),
        ("/properties/expires_at", "bare-timestamp"),
    }


def test_unversioned_files_unenforceable_schemas_and_missing_changelog(tmp_path: Path) -> None:
    found = findings(tmp_path, {"type": "object", "additionalProperties": False}, "t.schema.json")
    assert ("", "no-version") in found
    bad = tmp_path / "e"
    bad.mkdir()
    (bad / "u.v1.schema.json").write_text(json.dumps({"unevaluatedProperties": False}))
    result = lint_path(tmp_path)
    assert any(f.rule == "no-changelog" and f.file == str(bad) for f in result)
    refusals = [f for f in result if f.rule == "unenforceable"]
    assert [f.why.split(" ")[0] for f in refusals] == ["fastjsonschema"]  # rs enforces it
    assert "unevaluatedProperties" in str(refusals[0])
    assert str(refusals[0]).startswith(str(bad / "u.v1.schema.json") + "#/")


def test_mcp_tools_are_linted_at_their_pointer(tmp_path: Path) -> None:
    tools = {"tools": [{"name": "s", "inputSchema": {"type": "object", "properties": {"q": {}}}}]}
    found = findings(tmp_path, tools, "crm.tools.json")
    assert ("", "no-version") in found
    assert ("/tools/0/inputSchema", "strict-additional-properties") in found
    assert ("/tools/0/inputSchema/properties/q", "strict-required") in found


def test_a_rule_is_silenced_only_with_a_reason(tmp_path: Path) -> None:
    open_object = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    silenced = {**open_object, "x-lint": {"ignore": ["strict-required"], "why": "a is optional"}}
    assert findings(tmp_path, silenced) == set()
    no_reason = {**open_object, "x-lint": {"ignore": ["strict-required"]}}
    assert ("/x-lint", "bad-suppression") in findings(tmp_path, no_reason)


KEY_TYPES = {
    "string": ({"type": "string"}, False),
    "strict optional": ({"type": ["string", "null"]}, False),
    "enum": ({"enum": ["a", "b"]}, False),
    "integer": ({"type": "integer"}, True),
    "string or number": ({"type": ["string", "number"]}, True),
    "untyped": ({"description": "anything"}, True),
}


@pytest.mark.parametrize("declared", [True, False])
@pytest.mark.parametrize("kind", sorted(KEY_TYPES))
def test_the_idempotency_key_argument_must_be_a_declared_string(
    tmp_path: Path, declared: bool, kind: str
) -> None:
    node, not_a_string = KEY_TYPES[kind]
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, **({"request_id": node} if declared else {})},
        "required": ["city", "request_id"] if declared else ["city"],
        "additionalProperties": False,
        "x-callgate": {"idempotency_key_argument": "request_id"},
    }
    found = [f for f in lint_path_of(tmp_path, schema) if f.rule == "idempotency-key-argument"]
    expected = not declared or not_a_string
    assert len(found) == expected, found
    if found:
        assert found[0].pointer == "/x-callgate/idempotency_key_argument"
        assert "'request_id'" in found[0].why
        assert ("does not declare" in found[0].why) == (not declared)


@pytest.mark.parametrize(
    ("listed", "why"),
    [
        (["ops", "ops"], "names a principal twice: the contract would not load"),
        ("ops", "must be a list of principal names (non-empty strings)"),
        ([], "names no principal: every call of this tool is refused"),
    ],
)
def test_the_allowed_principals_must_be_a_list_of_distinct_names(
    tmp_path: Path, listed: Any, why: str
) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
        "x-callgate": {"allowed_principals": listed},
    }
    found = [f for f in lint_path_of(tmp_path, schema) if f.rule == "allowed-principals"]
    assert [f.pointer for f in found] == ["/x-callgate/allowed_principals"]
    assert found[0].why.startswith(why)


def test_a_list_of_distinct_principals_is_clean(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
        "x-callgate": {"allowed_principals": ["ops", "svc:deployer"]},
    }
    assert lint_path_of(tmp_path, schema) == []


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        (
            {
                "call_kind": "custom_tool_call",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /a/"},
            },
            "x-callgate.format: a Lark grammar is not checked by callgate",
        ),
        (
            {
                "call_kind": "custom_tool_call",
                "format": {"type": "grammar", "syntax": "regex", "definition": "(a"},
            },
            "x-callgate.format: RE2 cannot compile the regex grammar",
        ),
        ({"call_kind": "computer_call"}, "x-callgate.call_kind must be one of"),
        ({"format": {"type": "text"}}, "x-callgate.format declares a custom tool's grammar"),
        (
            {
                "call_kind": "custom_tool_call",
                "format": {"type": "grammar", "syntax": "regex", "definition": "[a-z]+"},
            },
            None,
        ),
        ({"call_kind": "apply_patch_call"}, None),
    ],
)
def test_a_contract_kind_or_grammar_the_load_refuses_is_a_finding(
    tmp_path: Path, meta: dict[str, Any], why: str | None
) -> None:
    schema = {
        "type": "object",
        "properties": {"input": {"type": "string"}},
        "required": ["input"],
        "additionalProperties": False,
        "x-callgate": meta,
    }
    found = [f for f in lint_path_of(tmp_path, schema) if f.rule == "call-kind"]
    if why is None:
        assert found == []
        return
    assert [f.pointer for f in found] == ["/x-callgate"]
    assert found[0].why.startswith(why)
    assert found[0].why.endswith("it would not load")
