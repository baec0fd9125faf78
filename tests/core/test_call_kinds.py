"""Every kind of call the client runs, judged by a contract of its kind (`x-callgate.call_kind`).

A custom tool's free-form text is judged as `{"input": <text>}` by its schema and then by its
declared grammar (`x-callgate.format`, a regex matched whole); the built-in tools' calls by their
own contracts; a remote MCP tool's approval request by the tool's function contract, always
marked as requiring approval. A call of a kind no contract of its tool judges is rejected
`unsupported_call_kind` and counted. Generated texts decide the grammar and the kinds.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.adapters.oracles import RECORDED, RESPONSES, Gate, records
from tests.test_metrics import new_metrics, value
from worker._native import AssembledCall
from worker.adapters.input import read_records
from worker.compose import build_gate, build_registry, event_limits
from worker.core.events import encode
from worker.errors import SchemaLoadError
from worker.model import CallKind, Code, Outcome, Phase, RepairKind
from worker.settings import Settings

FIXED = settings(derandomize=True, deadline=None, print_blob=True, max_examples=300)
DRAFT = "https://json-schema.org/draft/2020-12/schema"
#: a custom tool's regex grammar, and the same language for Python's `re` (the reference)
GRAMMAR = r"SELECT [a-z]+ FROM [a-z]+( WHERE [a-z]+ > [0-9]{1,3})?"
CONTRACTS: dict[str, dict[str, Any]] = {
    "write_sql": {
        "$schema": DRAFT,
        "type": "object",
        "properties": {"input": {"type": "string", "maxLength": 60}},
        "x-callgate": {
            "call_kind": "custom_tool_call",
            "format": {"type": "grammar", "syntax": "regex", "definition": GRAMMAR},
        },
    },
    "free_text": {"$schema": DRAFT, "x-callgate": {"call_kind": "custom_tool_call"}},
    "apply_patch": {
        "$schema": DRAFT,
        "type": "object",
        "required": ["type", "path"],
        "properties": {
            "type": {"enum": ["create_file", "update_file"]},
            "path": {"type": "string", "pattern": "^src/"},
        },
        "x-callgate": {"call_kind": "apply_patch_call", "side_effects": False},
    },
    "get_weather": {
        "$schema": DRAFT,
        "type": "object",
        "required": ["city"],
        "properties": {"city": {"type": "string"}},
    },
}
MCP_TOOLS = {"tools": [{"name": "shorten", "inputSchema": {"type": "object", "required": ["url"]}}]}


def _write(directory: Path, contracts: dict[str, dict[str, Any]]) -> Path:
    domain = directory / "tools"
    domain.mkdir(parents=True)
    for tool, schema in contracts.items():
        (domain / f"{tool}.v1.schema.json").write_bytes(orjson.dumps(schema))
    return directory


@pytest.fixture(scope="module")
def settings_(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    directory = _write(tmp_path_factory.mktemp("contracts"), CONTRACTS)
    (directory / "tools" / "zip1.tools.json").write_bytes(orjson.dumps(MCP_TOOLS))
    return Settings(schemas={"dir": directory})


@pytest.fixture(scope="module")
def gate(settings_: Settings) -> Any:
    return build_gate(settings_, build_registry(settings_))


def call(text: str | bytes, tool: str, kind: CallKind = CallKind.FUNCTION_CALL) -> AssembledCall:
    arguments = text.encode() if isinstance(text, str) else text
    return AssembledCall("s1", "call-1", tool, arguments, call_kind=kind.value)


def event(settings_: Settings, judged: AssembledCall, gate: Any) -> dict[str, Any]:
    written = encode(judged, gate.judge(judged), event_limits(settings_.limits))
    return dict(orjson.loads(written))


_WORDS = st.sampled_from(["users", "orders", "x", "", "FROM", "1", "Users", "é"])
_SQL = st.one_of(
    st.builds(
        lambda a, b, w, n: f"SELECT {a} FROM {b}" + (f" WHERE {w} > {n}" if w else ""),
        _WORDS,
        _WORDS,
        _WORDS,
        st.sampled_from(["25", "1000", "7", "", "x"]),
    ),
    st.text(max_size=70),
)


@FIXED
@given(text=_SQL)
def test_a_custom_tools_text_passes_only_its_schema_and_its_whole_grammar(
    gate: Any, settings_: Settings, text: str
) -> None:
    judged = call(text, "write_sql", CallKind.CUSTOM_TOOL_CALL)
    verdict = gate.judge(judged)
    fits = len(text) <= 60 and re.fullmatch(GRAMMAR, text, re.ASCII) is not None
    assert (verdict.outcome is Outcome.ACCEPTED) == fits, verdict
    written = event(settings_, judged, gate)
    assert written["call_kind"] == "custom_tool_call"
    if fits:
        assert written["arguments"] == {"input": text}
        assert verdict.repairs == ()
    else:
        assert verdict.code is Code.SCHEMA_VIOLATION
        assert verdict.phase is Phase.SCHEMA_VALIDATION


@FIXED
@given(text=st.text(max_size=40))
def test_a_custom_tool_without_a_grammar_takes_any_text_as_it_came(
    gate: Any, settings_: Settings, text: str
) -> None:
    # text a fence or a JSON parser would change is taken as it is: no repair, no parse
    for sent in (text, f"```\n{text}\n```", "[" * 300):
        judged = call(sent, "free_text", CallKind.CUSTOM_TOOL_CALL)
        assert gate.judge(judged).outcome is Outcome.ACCEPTED
        assert event(settings_, judged, gate)["arguments"] == {"input": sent}


def test_a_custom_tools_text_that_is_not_utf8_is_rejected(gate: Any) -> None:
    verdict = gate.judge(call(b"SELECT a FROM b\xff", "free_text", CallKind.CUSTOM_TOOL_CALL))
    assert (verdict.outcome, verdict.code) == (Outcome.REJECTED, Code.INVALID_UTF8)


@pytest.mark.parametrize(
    ("tool", "kind", "code"),
    [
        ("nowhere", CallKind.CUSTOM_TOOL_CALL, Code.UNSUPPORTED_CALL_KIND),
        ("nowhere", CallKind.SHELL_CALL, Code.UNSUPPORTED_CALL_KIND),
        ("nowhere", CallKind.LOCAL_SHELL_CALL, Code.UNSUPPORTED_CALL_KIND),
        ("get_weather", CallKind.CUSTOM_TOOL_CALL, Code.UNSUPPORTED_CALL_KIND),
        ("get_weather", CallKind.APPLY_PATCH_CALL, Code.UNSUPPORTED_CALL_KIND),
        ("write_sql", CallKind.FUNCTION_CALL, Code.UNSUPPORTED_CALL_KIND),
        ("apply_patch", CallKind.FUNCTION_CALL, Code.UNSUPPORTED_CALL_KIND),
        ("nowhere", CallKind.FUNCTION_CALL, Code.UNKNOWN_TOOL),
        ("zip1.nowhere", CallKind.MCP_APPROVAL_REQUEST, Code.UNKNOWN_TOOL),
    ],
)
def test_a_call_no_contract_of_its_kind_judges_is_rejected_and_counted(
    gate: Any, tool: str, kind: CallKind, code: Code
) -> None:
    text = '{"city": "Oslo", "type": "create_file", "path": "src/a"}'
    verdict = gate.judge(call(text, tool, kind))
    assert (verdict.outcome, verdict.phase, verdict.code) == (
        Outcome.REJECTED,
        Phase.SCHEMA_VALIDATION,
        code,
    )
    assert verdict.retryable is (code is Code.UNKNOWN_TOOL)
    metrics = new_metrics()
    metrics.observe(verdict, tool)
    labels = {"phase": "schema_validation", "code": code.value}
    assert value(metrics, "callgate_rejections_total", **labels) == 1


@FIXED
@given(
    path=st.sampled_from(["src/a.py", "etc/passwd", "src/", ""]),
    op=st.sampled_from(["create_file", "update_file", "delete_file"]),
)
def test_a_built_in_tools_call_is_judged_by_its_own_contract(
    gate: Any, settings_: Settings, path: str, op: str
) -> None:
    text = orjson.dumps({"type": op, "path": path, "diff": "+x\n"})
    judged = call(text, "apply_patch", CallKind.APPLY_PATCH_CALL)
    verdict = gate.judge(judged)
    fits = path.startswith("src/") and op != "delete_file"
    assert (verdict.outcome is Outcome.ACCEPTED) == fits
    written = event(settings_, judged, gate)
    assert written["call_kind"] == "apply_patch_call"
    if fits:
        assert written["arguments"] == orjson.loads(text)


def test_an_mcp_approval_request_is_judged_by_its_tool_and_always_needs_approval(
    gate: Any, settings_: Settings
) -> None:
    judged = call('{"url": "https://example.com"}', "zip1.shorten", CallKind.MCP_APPROVAL_REQUEST)
    verdict = gate.judge(judged)
    assert verdict.outcome is Outcome.ACCEPTED
    assert verdict.requires_approval is True
    written = event(settings_, judged, gate)
    assert (written["call_kind"], written["requires_approval"]) == ("mcp_approval_request", True)
    # the same tool called as a function needs no approval its contract does not ask for
    assert gate.judge(call('{"url": "u"}', "zip1.shorten")).requires_approval is False
    assert gate.judge(call("{}", "zip1.shorten", CallKind.MCP_APPROVAL_REQUEST)).code is (
        Code.SCHEMA_VIOLATION
    )


@FIXED
@given(
    arguments=st.dictionaries(
        st.text(max_size=5), st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5)
    )
)
def test_double_encoded_arguments_are_decoded_once_only_when_the_call_says_so(
    gate: Any, settings_: Settings, arguments: dict[str, Any]
) -> None:
    inner = orjson.dumps({**arguments, "city": "Oslo"})
    once = orjson.dumps(inner.decode())
    flagged = AssembledCall("s1", "c", "get_weather", once, double_encoded=True)
    verdict = gate.judge(flagged)
    assert verdict.outcome is Outcome.ACCEPTED
    assert verdict.repairs == (RepairKind.DOUBLE_ENCODED,)
    written = event(settings_, flagged, gate)
    assert written["repairs"] == [{"kind": "double_encoded"}]
    assert written["arguments"] == orjson.loads(inner)
    # the strict default never decodes: the text is a JSON string, not an object
    plain = gate.judge(AssembledCall("s1", "c", "get_weather", once))
    assert (plain.code, plain.repairs) == (Code.ROOT_NOT_OBJECT, ())
    # decoded once only: a text encoded twice over is still a string after one decoding
    twice = orjson.dumps(once.decode())
    again = gate.judge(AssembledCall("s1", "c", "get_weather", twice, double_encoded=True))
    assert (again.code, again.repairs) == (Code.ROOT_NOT_OBJECT, (RepairKind.DOUBLE_ENCODED,))
    # a server with the habit may still send plain arguments: judged as they came, no repair
    direct = gate.judge(AssembledCall("s1", "c", "get_weather", inner, double_encoded=True))
    assert (direct.outcome, direct.repairs) == (Outcome.ACCEPTED, ())


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        (
            {
                "call_kind": "custom_tool_call",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /a/"},
            },
            "a Lark grammar is not checked by callgate",
        ),
        (
            {
                "call_kind": "custom_tool_call",
                "format": {"type": "grammar", "syntax": "peg", "definition": "a"},
            },
            "unknown grammar syntax 'peg'",
        ),
        (
            {
                "call_kind": "custom_tool_call",
                "format": {"type": "grammar", "syntax": "regex", "definition": "(a"},
            },
            "RE2 cannot compile the regex grammar",
        ),
        ({"call_kind": "custom_tool_call", "format": {"type": "json"}}, "x-callgate.format must"),
        ({"format": {"type": "text"}}, "only a contract of call_kind custom_tool_call"),
        ({"call_kind": "mcp_approval_request"}, "x-callgate.call_kind must be one of"),
        ({"call_kind": "computer_call"}, "x-callgate.call_kind must be one of"),
    ],
)
def test_a_contract_declaring_what_callgate_cannot_check_does_not_load(
    tmp_path: Path, meta: dict[str, Any], says: str
) -> None:
    directory = _write(tmp_path, {"t": {"$schema": DRAFT, "x-callgate": meta}})
    with pytest.raises(SchemaLoadError, match=re.escape(says)):
        build_registry(Settings(schemas={"dir": directory}))


def test_a_custom_tools_text_has_the_same_size_bounds_as_any_call(tmp_path: Path) -> None:
    directory = _write(tmp_path, {"write_sql": CONTRACTS["free_text"]})
    recorded = RECORDED / "openai_responses" / "vercel_custom_tool_call.jsonl"
    with recorded.open("rb") as fp:
        values = list(read_records(fp, RESPONSES))
    accepted = Gate(directory).run([records(RESPONSES, values)])
    assert [orjson.loads(e.value)["arguments"] for e in accepted] == [
        {"input": "SELECT * FROM users WHERE age > 25"}
    ]
    for bound in ({"max_bytes": 20}, {"max_chunks": 2}):
        (emission,) = Gate(directory, **bound).run([records(RESPONSES, values)])
        event = orjson.loads(emission.value)
        assert (event["outcome"], event["phase"], event["call_kind"]) == (
            "rejected",
            "limits",
            "custom_tool_call",
        )
        assert event["error_code"] in ("too_large", "too_many_chunks")
