"""The registry: layout, lookups, both engines' violations, and every load-time refusal."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.datafiles import SCHEMAS, data_path
from tests.support.contracts import load_registry
from worker.errors import SchemaLoadError, UnsupportedKeywordError
from worker.model import Code, Violation
from worker.schemas.contract import Contract, IdempotencyPolicy, LookupFailure
from worker.schemas.registry import SchemaRegistry

ENGINES = ["fastjsonschema", "jsonschema-rs"]
FIXTURES = data_path("streams", "mcp")


def write(directory: Path, relative: str, document: Any) -> Path:
    path = directory / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


def contract(registry: SchemaRegistry, tool: str, version: str | None = None) -> Contract:
    found = registry.resolve(tool, version)
    assert isinstance(found, Contract), found
    return found


def one_schema(tmp_path: Path, schema: Any, engine: str) -> Contract:
    write(tmp_path, "d/t.v1.schema.json", schema)
    return contract(load_registry(tmp_path, engine=engine), "t")


@pytest.fixture(scope="module", params=ENGINES)
def shipped(request: pytest.FixtureRequest) -> SchemaRegistry:
    return load_registry(SCHEMAS, engine=request.param)


# --- the shipped contracts ---------------------------------------------------------------------


def test_the_shipped_contracts_load_with_their_names(shipped: SchemaRegistry) -> None:
    assert shipped.tool_names() == {
        "get_weather",
        "create_payment",
        "refund_payment",
        "weather.get_weather_data",
    }
    assert contract(shipped, "get_weather").ref.version == "2"  # newest without a version
    assert contract(shipped, "weather.get_weather", "v1").ref.version == "1"
    assert contract(shipped, "mcp.weather.get_weather_data").tool == "weather.get_weather_data"


def test_unknown_tool_and_version_are_lookup_failures(shipped: SchemaRegistry) -> None:
    missing = shipped.resolve("get_wether", None)
    assert isinstance(missing, LookupFailure)
    assert missing.code is Code.UNKNOWN_TOOL
    old = shipped.resolve("get_weather", "7")
    assert isinstance(old, LookupFailure)
    assert old.code is Code.UNKNOWN_SCHEMA_VERSION
    assert "['1', '2']" in old.message


def test_missing_units_is_reported_at_units(shipped: SchemaRegistry) -> None:
    check = contract(shipped, "get_weather", "1").check
    assert check({"city": "Paris", "units": "celsius"}) == ()
    assert check({"city": "Paris"}) == (
        Violation("/units", "required", "is a required property 'units'"),
    )


def test_a_number_for_city_is_a_type_violation_without_the_value(shipped: SchemaRegistry) -> None:
    (violation,) = contract(shipped, "get_weather", "1").check({"city": 123, "units": "celsius"})
    assert (violation.path, violation.keyword) == ("/city", "type")
    assert violation.message == "must be of type string"


def test_an_extra_property_is_refused_by_name_in_the_path(shipped: SchemaRegistry) -> None:
    violations = contract(shipped, "get_weather", "1").check(
        {"city": "Paris", "units": "celsius", "debug": True}
    )
    assert violations == (
        Violation("/debug", "additionalProperties", "is not an allowed property"),
    )


def test_every_violation_is_reported_and_none_quotes_the_instance(shipped: SchemaRegistry) -> None:
    check = contract(shipped, "create_payment").check
    sent = {
        "amount_minor": 12.75,
        "currency": "XBT",
        "recipient_id": "secret-recipient\n",
        "description": 987654321,
        "extra_field_value": "leak-me",
    }
    violations = check(sent)
    assert {(v.path, v.keyword) for v in violations} >= {
        ("/amount_minor", "type"),
        ("/currency", "enum"),
        ("/description", "type"),
        ("/idempotency_key", "required"),
        ("/extra_field_value", "additionalProperties"),
    }
    for violation in violations:
        for value in ("12.75", "XBT", "secret-recipient", "987654321", "leak-me"):
            assert value not in violation.message


def test_payment_metadata_comes_from_x_callgate(shipped: SchemaRegistry) -> None:
    meta = contract(shipped, "create_payment").meta
    assert meta.side_effects
    assert not meta.requires_approval
    assert meta.idempotency is IdempotencyPolicy.REQUIRED
    refund = contract(shipped, "refund_payment").meta
    assert (refund.side_effects, refund.requires_approval) == (True, True)
    assert not contract(shipped, "get_weather").meta.side_effects


def test_the_mcp_output_schema_judges_the_fixture_result(shipped: SchemaRegistry) -> None:
    found = contract(shipped, "weather.get_weather_data")
    assert found.output_check is not None
    result = json.loads(
        (FIXTURES / "2026-07-28__CallToolResult_result-with-structured-content.json").read_text()
    )
    assert found.output_check(result["structuredContent"]) == ()
    assert found.output_check({"temperature": "hot"}) != ()
    assert contract(shipped, "get_weather").output_check is None


# --- layout ------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_an_output_schema_file_beside_its_input_schema(tmp_path: Path, engine: str) -> None:
    write(tmp_path, "d/t.v1.schema.json", {"type": "object"})
    write(tmp_path, "d/t.v1.output.schema.json", {"type": "object", "required": ["ok"]})
    found = contract(load_registry(tmp_path, engine=engine), "t")
    assert found.output_check is not None
    assert found.output_check({"ok": True}) == ()
    assert found.output_check({})[0].path == "/ok"


def test_an_output_schema_without_its_input_schema_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "d/t.v1.output.schema.json", {"type": "object"})
    with pytest.raises(SchemaLoadError, match="needs its input schema"):
        load_registry(tmp_path)


def test_a_schema_file_without_a_version_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "d/t.schema.json", {"type": "object"})
    with pytest.raises(SchemaLoadError, match="no version"):
        load_registry(tmp_path)


def test_a_tool_name_in_two_domains_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a/t.v1.schema.json", {"type": "object"})
    write(tmp_path, "b/t.v1.schema.json", {"type": "object"})
    with pytest.raises(SchemaLoadError, match="unique"):
        load_registry(tmp_path)


def test_a_missing_directory_and_an_empty_one_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SchemaLoadError, match="does not exist"):
        load_registry(tmp_path / "nope")
    with pytest.raises(SchemaLoadError, match="no schemas"):
        load_registry(tmp_path)


def test_one_bad_file_means_no_registry(tmp_path: Path) -> None:
    write(tmp_path, "a/good.v1.schema.json", {"type": "object"})
    (tmp_path / "a/bad.v1.schema.json").write_text("{not json")
    with pytest.raises(SchemaLoadError) as caught:
        load_registry(tmp_path)
    assert caught.value.file is not None
    assert caught.value.file.endswith("bad.v1.schema.json")


def test_an_unknown_engine_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a/t.v1.schema.json", {"type": "object"})
    with pytest.raises(SchemaLoadError, match="unknown engine"):
        load_registry(tmp_path, engine="ajv")


# --- MCP tools/list ----------------------------------------------------------------------------


def _tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object", "required": ["q"]}, **extra}


@pytest.mark.parametrize("engine", ENGINES)
def test_tools_of_two_servers_are_prefixed_by_server(tmp_path: Path, engine: str) -> None:
    write(tmp_path, "crm.tools.json", {"tools": [_tool("search")]})
    write(
        tmp_path,
        "docs.tools.json",
        {"jsonrpc": "2.0", "id": 1, "result": {"tools": [_tool("search")]}},
    )
    registry = load_registry(tmp_path, engine=engine)
    assert registry.tool_names() == {"crm.search", "docs.search"}
    assert contract(registry, "docs.search").ref.id == "mcp.docs.search"
    assert contract(registry, "crm.search").check({})[0].path == "/q"


def test_a_single_tool_definition_file_loads(tmp_path: Path) -> None:
    fixture = json.loads(
        (FIXTURES / "2026-07-28__Tool_with-output-schema-for-structured-content.json").read_text()
    )
    write(tmp_path, "weather.tools.json", fixture)
    found = contract(load_registry(tmp_path), "weather.get_weather_data")
    assert found.ref.version == "1"
    assert found.output_check is not None


def test_a_colliding_mcp_tool_name_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a/crm.tools.json", {"tools": [_tool("search")]})
    write(tmp_path, "b/crm.tools.json", {"tools": [_tool("search")]})
    with pytest.raises(SchemaLoadError, match=re.escape("'crm.search'")):
        load_registry(tmp_path)


def test_a_tool_listed_twice_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "crm.tools.json", {"tools": [_tool("search"), _tool("search")]})
    with pytest.raises(SchemaLoadError, match="listed twice"):
        load_registry(tmp_path)


def test_an_mcp_tool_with_an_unenforceable_schema_is_refused(tmp_path: Path) -> None:
    tool = {"name": "s", "inputSchema": {"type": "object", "unevaluatedProperties": False}}
    write(tmp_path, "crm.tools.json", {"tools": [tool]})
    with pytest.raises(UnsupportedKeywordError) as caught:
        load_registry(tmp_path)
    assert caught.value.keyword == "unevaluatedProperties"
    assert caught.value.file is not None
    assert "crm.tools.json#/tools/0/inputSchema" in caught.value.file


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keyword", "schema"),
    [
        (
            "unevaluatedProperties",
            {
                "properties": {"a": {"minContains": 1, "contains": {}}},
                "unevaluatedProperties": False,
            },
        ),
        ("minContains", {"properties": {"a": {"contains": {}, "minContains": 2}}}),
        ("$dynamicRef", {"$defs": {"x": {"$dynamicAnchor": "x"}}, "$dynamicRef": "#x"}),
        ("$anchor", {"$defs": {"x": {"$anchor": "x"}}, "$ref": "#x"}),
    ],
)
def test_fastjsonschema_refuses_what_it_would_ignore(
    tmp_path: Path, keyword: str, schema: dict[str, Any]
) -> None:
    with pytest.raises(UnsupportedKeywordError) as caught:
        one_schema(tmp_path, schema, "fastjsonschema")
    assert keyword in str(caught.value)
    assert caught.value.file is not None
    assert caught.value.file.endswith("t.v1.schema.json")


def test_jsonschema_rs_enforces_what_fastjsonschema_refuses(tmp_path: Path) -> None:
    check = one_schema(
        tmp_path,
        {"properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False},
        "jsonschema-rs",
    ).check
    assert check({"a": 1}) == ()
    assert check({"a": 1, "b": 2}) == (
        Violation(
            "/b", "unevaluatedProperties", "is not an allowed property (not covered by the schema)"
        ),
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_2020_12_translations_keep_their_meaning_on_both_engines(
    tmp_path: Path, engine: str
) -> None:
    check = one_schema(
        tmp_path,
        {
            "prefixItems": [{"type": "string"}],
            "items": {"type": "integer"},
            "dependentRequired": {"a": ["b"]},
            "$defs": {"pos": {"minimum": 0}},
            "properties": {"n": {"$ref": "#/$defs/pos", "maximum": 10}},
        },
        engine,
    ).check
    assert check(["x", 1, 2]) == ()
    assert check(["x", "y"]) != ()
    assert check({"a": 1}) != ()
    assert check({"n": 5}) == ()
    assert check({"n": 11}) != ()  # the $ref sibling applies in 2020-12
    assert check({"n": -1}) != ()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "https://example.com/other.json"},
        {"properties": {"a": {"$ref": "other.json#/x"}}},
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "$ref": "http://localhost:1234/integer.json",
        },
    ],
)
def test_remote_refs_are_refused_and_never_fetched(
    tmp_path: Path, engine: str, schema: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_fetch(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("fetched")

    monkeypatch.setattr(urllib.request, "urlopen", no_fetch)
    with pytest.raises(SchemaLoadError, match="remote references are never fetched"):
        one_schema(tmp_path, schema, engine)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "object", "requried": ["a"]}, "requried"),
        ({"$schema": "http://json-schema.org/draft-04/schema#"}, "$schema"),
        ({"type": "strnig"}, "not a valid schema"),
        ({"properties": {"a": {"pattern": "^\\p{L}+$"}}}, "Unicode property escapes"),
        ({"patternProperties": {"(unclosed": {}}}, "a group is not closed"),
        ({"items": [{"type": "string"}]}, "items"),
        ({"x-callgate": {"requires_aproval": True}}, "unknown keys"),
        ({"x-callgate": {"side_effects": "yes"}}, "true or false"),
        ({"x-callgate": {"idempotency": "sometimes"}}, "idempotency"),
        ({"x-callgate": {"allowed_principals": "ops"}}, "allowed_principals must be a list"),
        ({"x-callgate": {"allowed_principals": ["ops", ""]}}, "non-empty strings"),
        ({"x-callgate": {"allowed_principals": ["ops", 1]}}, "non-empty strings"),
        ({"x-callgate": {"allowed_principals": ["ops", "ops"]}}, "names a principal twice"),
    ],
)
def test_bad_schemas_are_refused_with_the_reason(
    tmp_path: Path, engine: str, schema: dict[str, Any], why: str
) -> None:
    with pytest.raises(SchemaLoadError, match=re.escape(why)):
        one_schema(tmp_path, schema, engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_defaults_are_never_filled_and_formats_never_asserted(tmp_path: Path, engine: str) -> None:
    check = one_schema(
        tmp_path,
        {"properties": {"a": {"default": 1}, "when": {"type": "string", "format": "date-time"}}},
        engine,
    ).check
    instance: dict[str, Any] = {"when": "not a date"}
    assert check(instance) == ()
    assert instance == {"when": "not a date"}


@pytest.mark.parametrize("engine", ENGINES)
def test_patterns_mean_what_ecma_262_says(tmp_path: Path, engine: str) -> None:
    check = one_schema(
        tmp_path,
        {"properties": {"id": {"pattern": "^[a-z]+$"}, "n": {"pattern": "^\\d+$"}}},
        engine,
    ).check
    assert check({"id": "abc", "n": "42"}) == ()
    assert check({"id": "abc\n"}) != ()  # Python's $ would accept the final newline
    assert check({"n": "\u0664\u0662"}) != ()  # Arabic-Indic digits are not ECMA \d


@pytest.mark.timeout(10)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_redos_pattern_gets_a_prompt_rejection_from_both_engines(
    tmp_path: Path, engine: str
) -> None:
    check = one_schema(
        tmp_path, {"properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}, engine
    ).check
    violations = check({"s": "a" * 100_000 + "!"})
    assert [(v.path, v.keyword) for v in violations] == [("/s", "pattern")]
    assert violations[0].message == 'must match the pattern "^(a+)+$"'
    assert check({"s": "a" * 1000}) == ()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("engine", ENGINES)
def test_safe_repetition_loads_and_answers_promptly(tmp_path: Path, engine: str) -> None:
    check = one_schema(
        tmp_path, {"properties": {"slug": {"pattern": "^[a-z]+(-[a-z]+)*$"}}}, engine
    ).check
    assert check({"slug": "a-b-c"}) == ()
    assert check({"slug": "a" * 50_000 + "-!"}) != ()


def test_a_contract_exposes_the_names_its_schemas_declare(shipped: SchemaRegistry) -> None:
    payment = contract(shipped, "create_payment")
    assert {"amount_minor", "currency", "recipient", "idempotency_key"} <= payment.declared_names
    assert payment.output_declared_names == frozenset()
    weather = contract(shipped, "weather.get_weather_data")
    assert weather.declared_names
    assert weather.output_declared_names


# --- numbers in schemas ------------------------------------------------------------------------


def _write_text(directory: Path, relative: str, text: str) -> Path:
    path = directory / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_schema_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    _write_text(tmp_path, "d/t.v1.schema.json", '{"type": "object", "type": "string"}')
    with pytest.raises(SchemaLoadError, match="duplicate_key"):
        load_registry(tmp_path)
