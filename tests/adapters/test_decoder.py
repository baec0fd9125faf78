"""The decoder: format dispatch, strict parsing of vendor events, per-scope state."""

from __future__ import annotations

import pytest

from worker.adapters.decoder import Decoder, formats
from worker.errors import InputFormatError
from worker.model import ChunkKind

RESULT = b'{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":false}}'


def test_every_format_is_listed() -> None:
    assert formats() == [
        "anthropic.messages",
        "callgate.envelope",
        "mcp.result",
        "openai.chat",
        "openai.responses",
    ]


def test_a_vendor_event_with_a_duplicate_key_is_refused_not_merged() -> None:
    smuggled = b'{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":true,"isError":false}}'
    with pytest.raises(InputFormatError, match=r"duplicate_key at /result/isError"):
        Decoder().decode(smuggled, fmt="mcp.result", key=b"s", headers={"tool": "t"})


def test_a_vendor_event_with_a_huge_integer_is_refused() -> None:
    with pytest.raises(InputFormatError, match="not strict JSON"):
        Decoder().decode(
            b'{"jsonrpc":"2.0","id":123456789012345678901234,"result":{}}',
            fmt="mcp.result",
            key=b"s",
            headers={"tool": "t"},
        )


def test_vendor_records_need_a_key_and_a_known_format() -> None:
    with pytest.raises(InputFormatError, match="stream id as its key"):
        Decoder().decode(RESULT, fmt="mcp.result", headers={"tool": "t"})
    with pytest.raises(InputFormatError, match=r"unknown content-format 'x\.y'"):
        Decoder().decode(RESULT, fmt="x.y", key=b"s")


def test_state_is_kept_per_scope_and_dropped_with_it() -> None:
    decoder = Decoder()
    start = (
        b'{"type":"content_block_start","index":0,'
        b'"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}'
    )
    for scope in ("p0", "p1"):
        (chunk,) = decoder.decode(start, fmt="anthropic.messages", key=b"s", scope=scope)
        assert (chunk.kind, chunk.call_id, chunk.tool) == (
            ChunkKind.TOOL_CALL,
            "toolu_1",
            "get_weather",
        )
    assert decoder.open_streams == 2
    decoder.drop_scope("p0")
    assert decoder.open_streams == 1
