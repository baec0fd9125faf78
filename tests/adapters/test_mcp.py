"""The `mcp.result` adapter, alone and through the whole chain with the shipped MCP contract."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.datafiles import SCHEMAS, data_path
from worker.adapters.decoder import Decoder
from worker.adapters.input import read_records
from worker.core.processor import InboundRecord, Processor
from worker.errors import InputFormatError
from worker.model import ChunkKind, Outcome
from worker.settings import load_settings

FMT = "mcp.result"
MCP = data_path("streams", "mcp")
TOOL = "weather.get_weather_data"


def result(name: str) -> Any:
    return orjson.loads((MCP / f"2026-07-28__{name}.json").read_bytes())


def test_one_record_is_one_final_mcp_result_chunk_with_the_message_text() -> None:
    path = MCP / "2026-07-28__CallToolResultResponse_call-tool-result-response.json"
    with path.open("rb") as fp:
        (value,) = read_records(fp, FMT)  # the spec prints it over many lines
    decoder = Decoder()
    (chunk,) = decoder.decode(value, fmt=FMT, key=b"m1", headers={"tool": TOOL})
    assert chunk.kind is ChunkKind.MCP_RESULT
    assert (chunk.call_id, chunk.tool, chunk.final) == ("call-tool-example", TOOL, True)
    assert orjson.loads(chunk.delta) == orjson.loads(path.read_bytes())
    assert decoder.open_streams == 0
    (chunk,) = decoder.decode(value, fmt=FMT, key=b"m1", headers={"tool": TOOL, "call-id": "c9"})
    assert chunk.call_id == "c9"


@pytest.mark.parametrize(
    ("message", "headers", "error"),
    [
        ({"jsonrpc": "2.0", "id": 1, "result": {}}, {}, "'tool' header"),
        ({"jsonrpc": "1.0", "id": 1, "result": {}}, {"tool": "t"}, "JSON-RPC 2.0"),
        ({"jsonrpc": "2.0", "id": True, "result": {}}, {"tool": "t"}, "'id'"),
        ({"jsonrpc": "2.0", "id": 1}, {"tool": "t"}, "exactly one of"),
        ({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}}, {"tool": "t"}, "exactly one"),
        ({"jsonrpc": "2.0", "id": 1, "method": "x", "result": {}}, {"tool": "t"}, "request"),
    ],
)
def test_malformed_records_raise(
    message: dict[str, Any], headers: dict[str, str], error: str
) -> None:
    with pytest.raises(InputFormatError, match=error):
        Decoder().decode(orjson.dumps(message), fmt=FMT, key=b"m", headers=headers)


@pytest.mark.parametrize(
    ("payload", "outcome", "detail"),
    [
        (("result", "CallToolResult_result-with-structured-content"), Outcome.ACCEPTED, None),
        (("result", "CallToolResult_invalid-tool-input-error"), Outcome.REJECTED, "tool_error"),
        (
            ("result", "InputRequiredResult_input-required-result-with-request-state-only"),
            Outcome.INCOMPLETE,
            "input_required",
        ),
        (("error", "InvalidParamsError_unknown-tool"), Outcome.REJECTED, "jsonrpc_error"),
        (
            ("result", "CallToolResult_result-with-unstructured-text"),
            Outcome.REJECTED,
            "output_schema_violation",
        ),
    ],
)
def test_spec_examples_through_the_whole_chain(
    payload: tuple[str, str], outcome: Outcome, detail: str | None
) -> None:
    processor = Processor.from_settings(load_settings(schemas={"dir": SCHEMAS}))
    member, name = payload
    value = orjson.dumps({"jsonrpc": "2.0", "id": "r1", member: result(name)})
    headers = {"content-format": FMT, "tool": TOOL}
    (emission,) = processor.feed(InboundRecord("mcp", 0, 0, b"m1", value, headers), now=0.0)
    verdict = emission.verdict
    assert verdict.outcome is outcome
    assert (verdict.code or verdict.reason) == detail
    assert processor.flush() == []
