"""The Bedrock ConverseStream adapter: tool blocks in both record forms (boto3's event object, and
the event-stream payload with its type in a header), every stop reason, server tools, the AWS
event-stream file layout, and every event it cannot place breaking the calls it could belong
to."""

from __future__ import annotations

import io
import random
import re
from typing import Any

import orjson
import pytest

from tests.adapters import streamgen
from tests.adapters.oracles import (
    BEDROCK,
    RECORDED,
    assemble,
    chunks_of,
    decoder,
    encode,
    eventstream_messages,
    records,
    sdk_calls,
)
from worker.adapters.bedrock import BedrockAdapter
from worker.adapters.input import RecordFault, read_records
from worker.errors import InputFormatError
from worker.model import ChunkKind, Code, FinishReason, IncompleteReason

TWO = [streamgen.WEATHER, streamgen.SHELL]


def stream(calls: list[Any] | None = None, **options: Any) -> list[dict[str, Any]]:
    return streamgen.bedrock_stream(calls or TWO[:1], random.Random(1), **options)


def outcomes(events: list[dict[str, Any]]) -> dict[str, str]:
    return {
        call.call_id: call.incomplete or call.assembly_error or "complete"
        for call in assemble(BEDROCK, encode(events))
    }


def start(index: int, call_id: str = "t1", name: str = "tool", **extra: Any) -> dict[str, Any]:
    tool = {"toolUseId": call_id, "name": name, **extra}
    return {"contentBlockStart": {"contentBlockIndex": index, "start": {"toolUse": tool}}}


def delta(index: int, **body: Any) -> dict[str, Any]:
    return {"contentBlockDelta": {"contentBlockIndex": index, "delta": body}}


def stop(index: int) -> dict[str, Any]:
    return {"contentBlockStop": {"contentBlockIndex": index}}


def message(*events: dict[str, Any], reason: str = "tool_use") -> list[dict[str, Any]]:
    return [
        {"messageStart": {"role": "assistant"}},
        *events,
        {"messageStop": {"stopReason": reason}},
    ]


def test_tool_blocks_stream_their_input_and_are_released_at_message_stop() -> None:
    events = stream(TWO)
    chunks = chunks_of(BEDROCK, encode(events))
    pieces = [c for c in chunks if c.kind == ChunkKind.TOOL_CALL and c.call_id == "call_weather_1"]
    assert (pieces[0].tool, pieces[0].delta) == ("get_weather", "")
    assert "".join(p.delta for p in pieces) == streamgen.WEATHER[2]
    stop_at = next(i for i, e in enumerate(events) if "messageStop" in e)
    assert not any(c.final for c in chunks_of(BEDROCK, encode(events[:stop_at])))
    assert [c.call_id for c in chunks if c.final] == ["call_weather_1", "call_shell_3"]
    end = next(c for c in chunks if c.kind == ChunkKind.END)
    assert end.finish_reason == FinishReason.TOOL_CALLS
    assert outcomes(events) == {"call_weather_1": "complete", "call_shell_3": "complete"}


def test_the_metadata_after_message_stop_is_taken_quietly() -> None:
    events = stream()
    assert "metadata" in events[-1]
    dec = decoder()
    out = [c for r in records(BEDROCK, encode(events)) for c in dec.decode(r, BEDROCK)]
    assert not any(c.kind == ChunkKind.MALFORMED for c in out)
    assert dec.dropped_records == 0


def test_the_event_stream_payload_form_reads_as_the_boto3_form() -> None:
    events = stream(TWO)
    boto3_form = assemble(BEDROCK, encode(events))
    dec = decoder()
    payloads = []
    for number, event in enumerate(events):
        ((kind, body),) = event.items()
        (record,) = records(BEDROCK, [orjson.dumps(body)], headers={"event-type": kind})
        payloads.append(record._replace(offset=number))
    chunks = [c for r in payloads for c in dec.decode(r, BEDROCK)]
    assert [(c.kind, c.call_id, c.delta, c.final) for c in chunks] == [
        (c.kind, c.call_id, c.delta, c.final) for c in chunks_of(BEDROCK, encode(events))
    ]
    assert len(boto3_form) == 2


def test_a_block_without_input_is_a_call_without_arguments() -> None:
    events = message(start(0, "t1", "list_all"), delta(0, toolUse={"input": ""}), stop(0))
    (call,) = assemble(BEDROCK, encode(events))
    assert (call.tool, call.arguments, call.incomplete) == ("list_all", b"{}", None)
    assert sdk_calls(BEDROCK, events).calls["t1"].arguments == "{}"


def test_a_server_tool_and_its_result_are_no_client_calls() -> None:
    path = RECORDED / "bedrock_converse" / "pydanticai_nova_server_tool_then_tool_use.eventstream"
    with path.open("rb") as fp:
        values = list(read_records(fp, BEDROCK))
    assert b"server_tool_use" in values[1]
    assert [c.tool for c in assemble(BEDROCK, values)] == ["final_result"]


@pytest.mark.parametrize(
    ("reason", "first", "last"),
    [
        ("end_turn", "complete", "complete"),
        ("stop_sequence", "complete", "complete"),
        ("max_tokens", "complete", IncompleteReason.MAX_TOKENS),
        ("model_context_window_exceeded", "complete", IncompleteReason.MAX_TOKENS),
        ("guardrail_intervened", IncompleteReason.CONTENT_FILTER, IncompleteReason.CONTENT_FILTER),
        ("content_filtered", IncompleteReason.CONTENT_FILTER, IncompleteReason.CONTENT_FILTER),
        ("a_reason_not_known_yet", IncompleteReason.STREAM_ENDED, IncompleteReason.STREAM_ENDED),
    ],
)
def test_stop_reasons(reason: str, first: str, last: str) -> None:
    assert outcomes(stream(TWO, stop_reason=reason)) == {
        "call_weather_1": first,
        "call_shell_3": last,
    }


def test_max_tokens_releases_a_stopped_call_a_block_came_after() -> None:
    events = message(
        start(0, "t1"),
        delta(0, toolUse={"input": "{}"}),
        stop(0),
        delta(1, text="and so"),
        stop(1),
        reason="max_tokens",
    )
    assert outcomes(events) == {"t1": "complete"}


def test_a_block_still_open_at_message_stop_is_never_released() -> None:
    events = stream(TWO, cut_last_after=2)  # tool_use, yet the last block never stopped
    assert outcomes(events) == {
        "call_weather_1": "complete",
        "call_shell_3": IncompleteReason.STREAM_ENDED,
    }


@pytest.mark.parametrize("reason", ["malformed_tool_use", "malformed_model_output"])
def test_a_malformed_tool_use_is_a_rejection_of_its_own_code(reason: str) -> None:
    calls = {c.call_id: c for c in assemble(BEDROCK, encode(stream(TWO, stop_reason=reason)))}
    record = next(c for c in calls.values() if c.call_id.startswith("record:"))
    assert record.assembly_error == Code.MALFORMED_TOOL_CALL
    assert calls["call_weather_1"].incomplete == IncompleteReason.STREAM_ENDED


def test_an_exception_event_is_a_vendor_error_with_its_name() -> None:
    events = stream()
    first = next(i for i, e in enumerate(events) if "toolUse" in str(e.get("contentBlockDelta")))
    cut = [
        *events[: first + 1],
        {"throttlingException": {"message": "Rate exceeded for account 123"}},
    ]
    chunks = chunks_of(BEDROCK, encode(cut))
    error = next(c for c in chunks if c.kind == ChunkKind.ERROR)
    assert error.delta == "throttlingException"
    assert outcomes(cut)["call_weather_1"] == IncompleteReason.STREAM_ENDED


#: (events, what the malformed record says): each breaks the stream's calls
BROKEN = {
    "two members": (
        [{"contentBlockStop": {"contentBlockIndex": 0}, "messageStop": {}}],
        "one member",
    ),
    "an unknown event": (
        [{"contentBlockFinish": {"contentBlockIndex": 0}}],
        "not a ConverseStream",
    ),
    "a block index skipped": ([start(2, "t2")], "the next block is 1"),
    "a delta for a closed block": ([delta(0, toolUse={"input": "{}"})], "not the open block"),
    "a start while a block is open": ([start(1, "t2"), start(2, "t3")], "is open"),
    "an id again": ([start(1, "t1")], "repeats another block's id"),
    "a start without a name": ([start(1, "t2", name="")], "'name' must be a non-empty"),
    "a text delta in a tool block": (
        [start(1, "t2"), delta(1, text="hello")],
        "takes only toolUse input",
    ),
    "tool input in a text block": (
        [delta(1, text="hi"), delta(1, toolUse={"input": "{}"})],
        "takes no input",
    ),
    "input not a string": ([start(1, "t2"), delta(1, toolUse={"input": {}})], "must be a string"),
    "a second message start": ([{"messageStart": {"role": "assistant"}}], "already started"),
    "a stop without a reason": ([{"messageStop": {}}], "'stopReason'"),
}


@pytest.mark.parametrize("what", BROKEN)
def test_an_event_that_cannot_be_placed_breaks_the_stream(what: str) -> None:
    changes, text = BROKEN[what]
    events = message(start(0, "t1"), delta(0, toolUse={"input": '{"a":1}'}), stop(0), *changes)
    calls = {c.call_id: c for c in assemble(BEDROCK, encode(events))}
    record = next(c for c in calls.values() if c.assembly_error == Code.MALFORMED_RECORD)
    assert text in (record.assembly_detail or "")
    assert calls["t1"].incomplete == IncompleteReason.STREAM_CORRUPT


def test_a_stream_must_start_with_message_start() -> None:
    with pytest.raises(InputFormatError, match="must start with messageStart"):
        BedrockAdapter("s1", {}, None, max_calls=10).feed(start(0))


def test_the_adapter_state_survives_a_checkpoint_after_every_event() -> None:
    events = stream(TWO, server_tool=True)
    whole = BedrockAdapter("s1", {}, None, max_calls=10)
    restored = whole
    out_whole, out_restored = [], []
    restored = BedrockAdapter("s1", {}, None, max_calls=10)
    for event in events[:-1]:
        out_whole += whole.feed(event)
        state = orjson.loads(orjson.dumps(restored.state()))
        restored = BedrockAdapter("s1", {}, state, max_calls=10)
        out_restored += restored.feed(event)
    assert [(c.call_id, c.delta, c.final) for c in out_whole] == [
        (c.call_id, c.delta, c.final) for c in out_restored
    ]


def test_event_stream_files_read_as_botocore_reads_them() -> None:
    for path in sorted((RECORDED / "bedrock_converse").glob("*.eventstream")):
        body = path.read_bytes()
        ours = [orjson.loads(v) for v in read_records(io.BytesIO(body), BEDROCK)]
        assert ours == [
            {kind: orjson.loads(payload)} for kind, payload in eventstream_messages(body)
        ]


def _second_prelude_zeroed(body: bytes) -> bytes:
    at = int.from_bytes(body[:4], "big")
    return body[:at] + b"\x00" * 12 + body[at + 12 :]


@pytest.mark.parametrize(
    ("damage", "message", "read"),
    [  # how many frames are read beside the fault: all but one, or the first only
        (lambda b: b[:-3], "ends inside the frame", -1),
        (lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], "fails its CRC", -1),
        (_second_prelude_zeroed, "the frame at byte \\d+ is damaged", 1),
    ],
    ids=["cut", "a flipped bit", "a damaged prelude"],
)
def test_a_damaged_event_stream_frame_is_a_fault_in_its_place(
    damage: Any, message: str, read: int
) -> None:
    events = stream()
    body = streamgen.to_eventstream(events)
    records_read = list(read_records(io.BytesIO(damage(body)), BEDROCK))
    faults = [r for r in records_read if isinstance(r, RecordFault)]
    assert len(faults) == 1
    assert re.search(message, faults[0].detail)
    # a frame that fails its CRC is passed over; after a damaged prelude nothing can be found
    expected = len(events) - 1 if read == -1 else read
    assert len(records_read) - 1 == expected
