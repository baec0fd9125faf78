"""MCP tool results judged by `check_tool_result`, on the MCP specification's own examples."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.datafiles import data_path
from worker.compose import violation_limits
from worker.core.canonical import canonical
from worker.core.tool_output import ToolOutputFinding, check_tool_result
from worker.model import Code, IncompleteReason, Outcome
from worker.schemas.contract import CompiledCheck
from worker.schemas.registry import SchemaRegistry
from worker.settings import LimitSettings

MCP = data_path("streams", "mcp")
PREFIX = "2026-07-28__"
MAX_DEPTH = LimitSettings().max_depth


def example(name: str) -> Any:
    return orjson.loads((MCP / f"{PREFIX}{name}.json").read_bytes())


def response(result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "result": result}


@pytest.fixture(scope="module")
def output_check(tmp_path_factory: pytest.TempPathFactory) -> CompiledCheck:
    """The spec's example tool with an outputSchema, loaded and compiled by the real registry."""
    root = tmp_path_factory.mktemp("schemas")
    (root / "mcp").mkdir()
    tool = example("Tool_with-output-schema-for-structured-content")
    (root / "mcp" / "weather.tools.json").write_text(json.dumps({"tools": [tool]}))
    contract = SchemaRegistry.load(root, limits=violation_limits(LimitSettings())).resolve(
        "weather.get_weather_data", None
    )
    check = getattr(contract, "output_check", None)
    assert check is not None
    return check  # type: ignore[no-any-return]


def test_structured_content_that_matches_schema_and_text_is_accepted(
    output_check: CompiledCheck,
) -> None:
    message = response(example("CallToolResult_result-with-structured-content"))
    assert check_tool_result(message, output_check, MAX_DEPTH) is None


def test_unstructured_results_pass_when_the_tool_declares_no_output_schema() -> None:
    full = example("CallToolResultResponse_call-tool-result-response")
    assert check_tool_result(full, None, MAX_DEPTH) is None
    array = response(example("CallToolResult_result-with-array-structured-content"))
    # its text is prose, not serialized JSON
    assert check_tool_result(array, None, MAX_DEPTH) is None


def test_a_tool_with_an_output_schema_must_return_structured_content(
    output_check: CompiledCheck,
) -> None:
    full = example("CallToolResultResponse_call-tool-result-response")
    finding = check_tool_result(full, output_check, MAX_DEPTH)
    assert finding is not None
    assert (finding.outcome, finding.code) == (Outcome.REJECTED, Code.OUTPUT_SCHEMA_VIOLATION)
    assert [(v.path, v.keyword) for v in finding.violations] == [
        ("/result/structuredContent", "required")
    ]


def test_schema_violations_point_into_the_result_and_echo_no_values(
    output_check: CompiledCheck,
) -> None:
    result = example("CallToolResult_result-with-structured-content")
    result["structuredContent"] = {"temperature": "scorching-secret", "conditions": "x"}
    finding = check_tool_result(response(result), output_check, MAX_DEPTH)
    assert finding is not None
    assert finding.code is Code.OUTPUT_SCHEMA_VIOLATION
    assert {v.path for v in finding.violations} <= {
        "/result/structuredContent/temperature",
        "/result/structuredContent/humidity",
        "/result/structuredContent",
    }
    assert finding.violations
    assert all("scorching" not in v.message for v in finding.violations)


def test_text_block_json_that_disagrees_with_structured_content_is_a_mismatch(
    output_check: CompiledCheck,
) -> None:
    result = example("CallToolResult_result-with-structured-content")
    result["content"][0]["text"] = (
        '{"temperature": 99, "conditions": "Partly cloudy", "humidity": 65}'
    )
    finding = check_tool_result(response(result), output_check, MAX_DEPTH)
    assert finding == ToolOutputFinding(
        Outcome.REJECTED, Code.OUTPUT_TEXT_MISMATCH, None, finding.violations if finding else ()
    )
    assert finding is not None
    assert finding.violations[0].path == "/result/content/0/text"
    assert "99" not in finding.violations[0].message


@pytest.mark.parametrize(
    ("text", "same"),
    [
        ('{"humidity": 65.0, "conditions": "Partly cloudy", "temperature": 22.5}', True),
        ('{"temperature": 22.5, "conditions": "Partly cloudy", "humidity": true}', False),
        ('{"temperature": 22.5, "conditions": "Partly cloudy"}', False),
        ('{"temperature": 22.5, "conditions": "Partly cloudy", "humidity": 65, "x": null}', False),
        ("[22.5]", False),
        ("Partly cloudy, 22.5 degrees", True),  # prose: nothing to compare
    ],
)
def test_text_comparison_is_json_equality(text: str, same: bool) -> None:
    result = example("CallToolResult_result-with-structured-content")
    result["content"][0]["text"] = text
    finding = check_tool_result(response(result), None, MAX_DEPTH)
    assert (finding is None) is same


def test_is_error_is_a_tool_error_not_a_parse_failure(output_check: CompiledCheck) -> None:
    message = response(example("CallToolResult_invalid-tool-input-error"))
    finding = check_tool_result(
        message, output_check, MAX_DEPTH
    )  # no structuredContent needed then
    assert finding is not None
    assert (finding.outcome, finding.code) == (Outcome.REJECTED, Code.TOOL_ERROR)
    assert all("departure" not in v.message for v in finding.violations)


@pytest.mark.parametrize(
    "name",
    [
        "InputRequiredResult_input-required-result-with-elicitation-and-sampling-and-request-state",
        "InputRequiredResult_input-required-result-with-request-state-only",
    ],
)
def test_input_required_is_its_own_incomplete_outcome(
    name: str, output_check: CompiledCheck
) -> None:
    finding = check_tool_result(response(example(name)), output_check, MAX_DEPTH)
    assert finding == ToolOutputFinding(
        Outcome.INCOMPLETE, None, IncompleteReason.INPUT_REQUIRED, ()
    )


@pytest.mark.parametrize(
    ("name", "code", "leak"),
    [
        ("InternalError_unexpected-error", "-32603", "Internal error"),
        ("InvalidParamsError_invalid-tool-arguments", "-32602", "calculate"),
        ("InvalidParamsError_unknown-tool", "-32602", "invalid_tool_name"),
    ],
)
def test_jsonrpc_errors_are_classified_by_code(name: str, code: str, leak: str) -> None:
    message = {"jsonrpc": "2.0", "id": 7, "error": example(name)}
    finding = check_tool_result(message, None, MAX_DEPTH)
    assert finding is not None
    assert (finding.outcome, finding.code) == (Outcome.REJECTED, Code.JSONRPC_ERROR)
    (violation,) = finding.violations
    assert (violation.path, violation.keyword) == ("/error/code", code)
    assert leak not in violation.message


@settings(max_examples=300)
@given(code=st.integers())
def test_a_jsonrpc_error_code_is_shown_only_when_the_specification_defines_it(code: int) -> None:
    """A code the server chose (outside -32768..-32000) is a value of the input: the violation,
    and so the retry feedback, says it is the server's own and never spells it."""
    finding = check_tool_result({"error": {"code": code, "message": "m"}}, None, MAX_DEPTH)
    assert finding is not None
    (violation,) = finding.violations
    if -32768 <= code <= -32000:
        assert violation.keyword == str(code)
    else:
        assert violation.keyword == "application_error"
        assert str(abs(code)) not in violation.keyword + violation.message


def test_a_missing_code() -> None:
    finding = check_tool_result({"error": {"message": "m"}}, None, MAX_DEPTH)
    assert finding is not None
    assert finding.violations[0].keyword == "invalid"


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"resultType": "task"}, "/result/resultType"),
        ({"isError": "yes"}, "/result/isError"),
        ({"content": None}, "/result/content"),
    ],
)
def test_malformed_results_are_schema_violations(change: dict[str, Any], path: str) -> None:
    result = copy.deepcopy(example("CallToolResult_result-with-unstructured-text"))
    result.update(change)
    finding = check_tool_result(response(result), None, MAX_DEPTH)
    assert finding is not None
    assert finding.code is Code.OUTPUT_SCHEMA_VIOLATION
    assert finding.violations[0].path == path
    finding = check_tool_result({"jsonrpc": "2.0", "id": 1, "result": []}, None, MAX_DEPTH)
    assert finding is not None
    assert finding.violations[0].path == "/result"


# -- text blocks against structuredContent, generated ----------------------------------------

FIXED = settings(derandomize=True, deadline=None, print_blob=True)
JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    # as the strict parser reads a record: a float is never integral (an integral value is an int)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=10,
)


def with_text(structured: Any, text: str) -> dict[str, Any]:
    return response({"content": [{"type": "text", "text": text}], "structuredContent": structured})


@FIXED
@given(structured=st.dictionaries(st.text(max_size=4), JSON, max_size=4), indent=st.booleans())
def test_a_text_block_that_serializes_structured_content_agrees(
    structured: dict[str, Any], indent: bool
) -> None:
    # another writer: key order reversed, maybe indented, floats that are integers as 1.0
    text = json.dumps(dict(reversed(list(structured.items()))), indent=2 if indent else None)
    assert check_tool_result(with_text(structured, text), None, MAX_DEPTH) is None


@FIXED
@given(
    structured=st.dictionaries(st.text(max_size=4), JSON, max_size=4),
    other=st.dictionaries(st.text(max_size=4), JSON, max_size=4),
)
def test_a_text_block_of_other_json_is_a_mismatch(
    structured: dict[str, Any], other: dict[str, Any]
) -> None:
    finding = check_tool_result(with_text(structured, json.dumps(other)), None, MAX_DEPTH)
    # JSON equality (RFC 8785 forms): keys in any order, 1 is 1.0, but true is not 1
    if canonical(other) == canonical(structured):
        assert finding is None
    else:
        assert finding is not None
        assert finding.code is Code.OUTPUT_TEXT_MISMATCH


@pytest.mark.parametrize(
    "text",
    [
        # a lenient reader takes the last value of a repeated key: 99, not what the gate checked
        '{"temperature": 22.5, "conditions": "Partly cloudy", "humidity": 65, "humidity": 99}',
        # NaN reads as a number in lenient parsers; it is not the structured value
        '{"temperature": NaN, "conditions": "Partly cloudy", "humidity": 65}',
    ],
)
def test_a_text_block_that_is_json_but_not_strict_json_is_a_mismatch(text: str) -> None:
    structured = {"temperature": 22.5, "conditions": "Partly cloudy", "humidity": 65}
    finding = check_tool_result(with_text(structured, text), None, MAX_DEPTH)
    assert finding is not None
    assert finding.code is Code.OUTPUT_TEXT_MISMATCH
    assert finding.violations[0].path == "/result/content/0/text"


def test_a_text_block_nested_past_the_depth_limit_is_a_mismatch() -> None:
    structured = {"a": 1}
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    finding = check_tool_result(with_text(structured, deep), None, MAX_DEPTH)
    assert finding is not None
    assert finding.code is Code.OUTPUT_TEXT_MISMATCH
    # within the limit it is compared like any other JSON
    fits = "[" * 3 + "]" * 3
    finding = check_tool_result(with_text([[[]]], fits), None, 3)
    assert finding is None


@pytest.mark.parametrize("text", ["{the result} is below", "[1] see above", "{", "  [draft]"])
def test_prose_that_starts_like_json_is_not_compared(text: str) -> None:
    assert check_tool_result(with_text({"a": 1}, text), None, MAX_DEPTH) is None


#: Numbers and constants a lenient reader (Python's json, JavaScript's JSON.parse) takes and the
#: strict parser refuses: past a double's range, past 64 bits, NaN and the infinities.
_LENIENT_ONLY = st.one_of(
    st.integers(min_value=309, max_value=100_000).map(lambda e: f"1e{e}"),
    st.integers(min_value=309, max_value=100_000).map(lambda e: f"-0.5E+{e}"),
    st.integers(min_value=2**64, max_value=10**80).map(str),
    st.sampled_from(["NaN", "Infinity", "-Infinity"]),
)


@st.composite
def _lenient_json_texts(draw: st.DrawFn, structured: dict[str, Any]) -> str:
    """JSON that a lenient reader takes but that cannot be what the gate checked: a number the
    strict parser refuses somewhere in it, a key twice, or the structured value itself with one
    of those spliced in."""
    how = draw(st.sampled_from(["alone", "member", "element", "twice", "scalar"]))
    if how == "alone":
        return draw(_LENIENT_ONLY)
    if how == "member":
        body = json.dumps({**structured, "x": None})
        return body.replace('"x": null', f'"x": {draw(_LENIENT_ONLY)}')
    if how == "element":
        return f"[{json.dumps(structured)}, {draw(_LENIENT_ONLY)}]"
    if how == "twice":
        body = json.dumps(structured)[1:-1]
        comma = ", " if body else ""
        return "{" + body + comma + '"k": 1, "k": ' + json.dumps(draw(JSON)) + "}"
    return json.dumps(draw(JSON.filter(lambda value: not isinstance(value, dict))))


@FIXED
@given(
    data=st.data(),
    structured=st.dictionaries(st.text(max_size=4), JSON, max_size=4),
    space=st.sampled_from(["", " ", "\n\t "]),
)
def test_a_text_block_a_lenient_reader_takes_as_json_must_be_the_structured_value(
    data: st.DataObject, structured: dict[str, Any], space: str
) -> None:
    text = space + data.draw(_lenient_json_texts(structured)) + space
    json.loads(text)  # a lenient reader takes it
    finding = check_tool_result(with_text(structured, text), None, MAX_DEPTH)
    assert finding is not None, text
    assert finding.code is Code.OUTPUT_TEXT_MISMATCH


@FIXED
@given(text=st.text(max_size=30))
def test_text_no_lenient_reader_takes_as_json_is_prose(text: str) -> None:
    try:
        json.loads(text)
        lenient = True
    except ValueError:
        lenient = False
    finding = check_tool_result(with_text({"a": 1}, text), None, MAX_DEPTH)
    if not lenient:
        assert finding is None, text
    elif text.strip() not in ('{"a": 1}', '{"a":1}', '{"a":1.0}'):
        assert finding is not None, text


#: What a text block may hold in place of its text string: JavaScript's `JSON.parse` reads its
#: argument as a string first, so `99` reads as 99 and `["{\"a\": 2}"]` as {"a": 2}.
_NOT_TEXT = st.one_of(
    JSON.filter(lambda value: not isinstance(value, str)),
    JSON.map(lambda value: [json.dumps(value)]),
)


@FIXED
@given(
    structured=st.none() | st.dictionaries(st.text(max_size=4), JSON, max_size=4),
    text=_NOT_TEXT,
    missing=st.booleans(),
    position=st.integers(0, 2),
)
def test_a_text_block_whose_text_is_not_a_string_is_refused(
    structured: dict[str, Any] | None, text: Any, missing: bool, position: int
) -> None:
    """A text block holds its text as a string, or the result is malformed, with or without
    structuredContent: a reader that takes the text as it is (`JSON.parse(block.text)`) would
    otherwise read a value the gate never compared. (`{"type": "text", "text": ["{\\"a\\": 2}"]}`
    beside `structuredContent: {"a": 1}` was accepted.)"""
    block: dict[str, Any] = {"type": "text"} if missing else {"type": "text", "text": text}
    content: list[Any] = [{"type": "text", "text": "prose"}] * position + [block]
    result: dict[str, Any] = {"content": content}
    if structured is not None:
        result["structuredContent"] = structured
    finding = check_tool_result(response(result), None, MAX_DEPTH)
    assert finding is not None, block
    assert finding.code is Code.OUTPUT_SCHEMA_VIOLATION
    assert [(v.path, v.keyword) for v in finding.violations] == [
        (f"/result/content/{position}/text", "type")
    ]
