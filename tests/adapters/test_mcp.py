"""The `mcp.result` adapter, alone and through the whole chain with the shipped MCP contract."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.adapters.oracles import assembler, decoder, records
from tests.datafiles import SCHEMAS, data_path
from worker._native import Chunk
from worker.adapters.decoder import ENVELOPE
from worker.adapters.input import read_records
from worker.compose import build_processor
from worker.model import ChunkKind, Outcome
from worker.settings import load_settings

FMT = "mcp.result"
MCP = data_path("streams", "mcp")
TOOL = "weather.get_weather_data"


def result(name: str) -> Any:
    return orjson.loads((MCP / f"2026-07-28__{name}.json").read_bytes())


def decode(value: bytes, headers: dict[str, str]) -> list[Chunk]:
    (record,) = records(FMT, [value], "m1", headers=headers)
    return decoder().decode(record, FMT)


def test_one_record_is_one_final_mcp_result_chunk_with_the_message_text() -> None:
    path = MCP / "2026-07-28__CallToolResultResponse_call-tool-result-response.json"
    with path.open("rb") as fp:
        (value,) = read_records(fp, FMT)  # the spec prints it over many lines
    (chunk,) = decode(value, {"tool": TOOL})
    assert chunk.kind == ChunkKind.MCP_RESULT
    assert (chunk.call_id, chunk.tool, chunk.final) == ("call-tool-example", TOOL, True)
    assert orjson.loads(chunk.delta) == orjson.loads(path.read_bytes())
    (chunk,) = decode(value, {"tool": TOOL, "call-id": "c9"})
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
def test_malformed_records_are_malformed_chunks(
    message: dict[str, Any], headers: dict[str, str], error: str
) -> None:
    (chunk,) = decode(orjson.dumps(message), headers)
    assert (chunk.kind, chunk.error) == (ChunkKind.MALFORMED, "malformed_record")
    assert error in chunk.delta


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
    processor = build_processor(load_settings(schemas={"dir": SCHEMAS}))
    member, name = payload
    value = orjson.dumps({"jsonrpc": "2.0", "id": "r1", member: result(name)})
    (emission,) = processor.feed("mcp", 0, records(FMT, [value], "m1", headers={"tool": TOOL}))
    verdict = emission.verdict
    assert verdict.outcome is outcome
    assert (verdict.code or verdict.reason) == detail
    assert processor.flush() == []


def test_a_result_under_the_key_and_id_of_an_open_call_leaves_the_call_alone() -> None:
    """README, "How a vendor stream's calls are named": a JSON-RPC id names a result, never a
    call (the class: tests/native/test_assembler.py)."""
    call = [
        orjson.dumps({"stream_id": "s1", "call_id": "1", "kind": "tool_call", "seq": seq, **piece})
        for seq, piece in enumerate([{"tool": "t", "delta": "{"}, {"delta": "}", "final": True}])
    ]
    message = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": []}})
    mixed = [
        *records(ENVELOPE, call[:1]),
        *records(FMT, [message], "s1", headers={"tool": TOOL}),
        *records(ENVELOPE, call[1:]),
    ]
    mixed = [record._replace(offset=i, key=b"s1") for i, record in enumerate(mixed)]
    dec, asm = decoder(), assembler()
    out = list(asm.feed_records("in", 0, mixed, dec.decode)) + list(asm.flush())
    assert [(c.channel, c.call_id, c.incomplete, c.assembly_error, c.arguments) for c in out] == [
        ("mcp_result", "1", None, None, message),
        ("tool_call", "1", None, None, b"{}"),
    ]
