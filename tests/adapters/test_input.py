"""Reading `callgate check` input: JSON lines, multi-line JSON documents, recorded SSE."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.adapters.oracles import RECORDED
from tests.datafiles import SCHEMAS, data_path
from worker.adapters.input import Read, RecordFault, read_records
from worker.check import run_check
from worker.compose import build_key_store, build_processor
from worker.errors import InputFormatError
from worker.settings import Settings, load_settings

GENERATED = data_path("generated")


def records(data: bytes, fmt: str | None = None) -> list[bytes]:
    return list(read_records(io.BytesIO(data), fmt))


def check(
    settings: Settings,
    source: io.BytesIO | io.BufferedReader,
    out: io.BytesIO,
    **options: Any,
) -> None:
    """`callgate check` on one input, as the command runs it."""
    run_check(
        build_processor(settings),
        build_key_store(settings),
        source,
        out,
        max_feedback_bytes=settings.limits.max_feedback_bytes,
        **options,
    )


def test_json_lines_yield_one_record_per_line_and_a_bad_line_alone() -> None:
    data = b'{"a":1}\r\n\n  \n{"b":\n{"c":[1,2]}\n{"d":"x"}'
    assert records(data) == [b'{"a":1}', b'{"b":', b'{"c":[1,2]}', b'{"d":"x"}']


def test_pretty_printed_documents_are_split_at_each_top_level_value() -> None:
    doc = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"text": 'a } ] " {'}]}}
    pretty = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    values = records(pretty + b"\n" + pretty + b"\nnot json\n" + pretty)
    assert [orjson.loads(v) for v in values[:2]] == [doc, doc]
    assert values[2] == b"not json"
    assert orjson.loads(values[3]) == doc
    assert records(b'{\n "cut": "off') == [b'{\n "cut": "off']


def test_sse_records_are_the_event_data_and_done_ends_them() -> None:
    path = RECORDED / "openai_chat" / "single_tool_call_GetWeatherArgs.sse"
    values = records(path.read_bytes(), "openai.chat")
    assert all(orjson.loads(v)["object"] == "chat.completion.chunk" for v in values)
    assert len(values) == path.read_bytes().count(b"data: {")


def test_an_sse_event_after_done_is_a_fault_never_dropped_unsaid() -> None:
    path = RECORDED / "openai_chat" / "single_tool_call_GetWeatherArgs.sse"
    late = b'data: {"after": "done"}\n\ndata: [DONE]\n\n'
    values = records(path.read_bytes() + late, "openai.chat")
    after = RecordFault("an event after data: [DONE], the end of the server's events")
    assert values[-2:] == [after, after]
    assert len(values) == path.read_bytes().count(b"data: {") + 2


def test_a_tool_call_after_done_is_never_accepted_and_never_unsaid() -> None:
    """A Chat stream whose `[DONE]` comes before its last chunks: those are malformed records,
    and the calls still open end `stream_corrupt` (never judged from what came after)."""
    path = RECORDED / "openai_chat" / "single_tool_call_GetWeatherArgs.sse"
    body = path.read_bytes()
    cut = body.index(b"data: {", body.index(b"data: {") + 1)  # after the first chunk
    data = body[:cut] + b"data: [DONE]\n\n" + body[cut:]
    settings = load_settings(schemas={"dir": SCHEMAS})
    out = io.BytesIO()
    check(settings, io.BytesIO(data), out, name="late.sse", fmt="openai.chat")
    events = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert not [e for e in events if e["outcome"] == "accepted"]
    assert {e["error_code"] or e["reason"] for e in events} == {
        "malformed_record",
        "stream_corrupt",
    }


def test_empty_input_and_unknown_format() -> None:
    assert records(b"") == []
    assert records(b"\n \n") == []
    with pytest.raises(InputFormatError, match=r"unknown format 'x\.y'"):
        records(b"{}", "x.y")


def test_a_record_larger_than_the_bound_is_a_fault_and_the_rest_is_read() -> None:
    def read(data: bytes) -> list[Read]:
        return list(read_records(io.BytesIO(data), max_record_bytes=64))

    long = b"{" + b" " * 100 + b"}"
    line = RecordFault("a line is longer than 64 bytes")
    assert read(b"{}\n" + long + b"\n[1]\n") == [b"{}", line, b"[1]"]
    assert read(b"{}\n" + long) == [b"{}", line]
    assert read(long + b"\n{}") == [line, b"{}"]
    document = RecordFault("a JSON document is longer than 64 bytes")
    assert read(b"{\n" + long + b"\n}\n{\n}\n") == [document, b"{\n}"]
    sse = RecordFault("the SSE event at line 1 is larger than 64 bytes")
    assert read(b"data: " + long + b"\n\ndata: {}\n\n") == [sse, b"{}"]


CASES = [
    ("openai.chat", RECORDED / "openai_chat" / "parallel_tool_calls_weather_and_stock.sse", 2),
    ("openai.responses", GENERATED / "openai_responses_parallel_calls.sse", 3),
    ("anthropic.messages", GENERATED / "anthropic_max_tokens_two_tool_blocks.sse", 2),
]


@pytest.mark.parametrize(("fmt", "path", "calls"), CASES, ids=[c[0] for c in CASES])
def test_callgate_check_accepts_each_format_as_sse_and_as_json_lines(
    fmt: str, path: Path, calls: int
) -> None:
    settings = load_settings(schemas={"dir": SCHEMAS})
    as_recorded = path.read_bytes()
    as_lines = b"\n".join(records(as_recorded, fmt)) + b"\n"
    outputs = []
    for body in (as_recorded, as_lines):
        out = io.BytesIO()
        check(settings, io.BytesIO(body), out, name=path.name, fmt=fmt, stream_id="s1")
        events = [orjson.loads(line) for line in out.getvalue().splitlines()]
        assert len(events) == calls
        assert all(event["error_code"] != "malformed_record" for event in events)
        outputs.append([(e["call_id"], e["outcome"], e.get("reason")) for e in events])
    assert outputs[0] == outputs[1]


def test_an_mcp_result_file_without_the_tool_header_is_a_malformed_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = RECORDED / "mcp" / "2026-07-28__CallToolResultResponse_call-tool-result-response.json"
    out = io.BytesIO()
    settings = load_settings(schemas={"dir": SCHEMAS})
    with path.open("rb") as source, caplog.at_level(logging.WARNING):
        check(settings, source, out, name=path.name, fmt="mcp.result", stream_id="s1")
    (event,) = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert event["error_code"] == "malformed_record"
    assert "'tool' header" in caplog.text  # why: in the operator's log, not in the event


def test_an_mcp_result_file_is_judged_with_the_tool_header_given() -> None:
    path = RECORDED / "mcp" / "2026-07-28__CallToolResultResponse_call-tool-result-response.json"
    out = io.BytesIO()
    settings = load_settings(schemas={"dir": SCHEMAS})
    with path.open("rb") as source:
        check(
            settings,
            source,
            out,
            name=path.name,
            fmt="mcp.result",
            headers={"tool": "weather.get_weather_data"},
        )
    (event,) = [orjson.loads(line) for line in out.getvalue().splitlines()]
    # the shipped tool declares an outputSchema; this example returns text only
    assert (event["phase"], event["error_code"]) == (
        "tool_output_validation",
        "output_schema_violation",
    )
    assert event["call_id"] == "call-tool-example"
