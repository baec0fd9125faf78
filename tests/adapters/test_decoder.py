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


MESSAGE_START = (
    b'{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
    b'"model":"m","content":[],"stop_reason":null,"usage":{"input_tokens":1,"output_tokens":1}}}'
)
MESSAGE_STOP = b'{"type":"message_stop"}'


def test_an_open_vendor_stream_holds_the_safe_offset_until_it_finishes() -> None:
    decoder = Decoder()
    assert decoder.safe_offset("p0") is None
    decoder.decode(MESSAGE_START, fmt="anthropic.messages", key=b"a", scope="p0", offset=3)
    decoder.decode(MESSAGE_START, fmt="anthropic.messages", key=b"b", scope="p0", offset=5)
    assert decoder.safe_offset("p0") == 3
    decoder.decode(MESSAGE_STOP, fmt="anthropic.messages", key=b"a", scope="p0", offset=9)
    assert decoder.safe_offset("p0") == 5
    decoder.decode(MESSAGE_STOP, fmt="anthropic.messages", key=b"b", scope="p0", offset=10)
    assert decoder.safe_offset("p0") is None
    assert decoder.open_streams == 0


def test_idle_vendor_streams_expire_by_the_callers_clock() -> None:
    decoder = Decoder(idle_timeout_s=10)
    decoder.decode(MESSAGE_START, fmt="anthropic.messages", key=b"a", scope="p", offset=0, now=0)
    decoder.decode(MESSAGE_START, fmt="anthropic.messages", key=b"b", scope="p", offset=1, now=5)
    assert decoder.expire(9.0) == 0
    assert decoder.expire(10.0) == 1
    assert decoder.safe_offset("p") == 1


def test_streams_past_the_bound_are_forgotten_oldest_first() -> None:
    decoder = Decoder(max_streams=2)
    for offset, key in enumerate((b"a", b"b", b"c")):
        decoder.decode(MESSAGE_START, fmt="anthropic.messages", key=key, scope="p", offset=offset)
    assert decoder.open_streams == 2
    assert decoder.safe_offset("p") == 1
