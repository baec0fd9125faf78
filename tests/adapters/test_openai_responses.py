"""The Responses API adapter: parallel calls, incomplete mid-call, sequence numbers, bad input."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from tests.adapters import streamgen
from tests.adapters.oracles import RECORDED, assemble, chunks_of, encode, sdk_calls
from worker.adapters.openai_responses import OpenAIResponsesAdapter
from worker.errors import InputFormatError
from worker.model import ChunkKind, FinishReason, IncompleteReason

FMT = "openai.responses"
CALLS = [streamgen.WEATHER, streamgen.STOCK, streamgen.SHELL]


def test_parallel_calls_interleave_and_map_item_ids_to_call_ids() -> None:
    events = streamgen.responses_stream("r1", CALLS, random.Random(11), numbered=False)
    kinds = [e["type"] for e in events if e["type"].endswith(".delta")]
    owners = [e["item_id"] for e in events if e["type"].endswith(".delta")]
    assert len(kinds) > 6
    assert owners != sorted(owners)  # really interleaved
    chunks = chunks_of(FMT, encode(events))
    assert {c.call_id for c in chunks if c.kind is ChunkKind.TOOL_CALL} == {c[0] for c in CALLS}
    firsts = [c for c in chunks if c.tool is not None]
    assert sorted((c.call_id, c.tool) for c in firsts) == sorted((c[0], c[1]) for c in CALLS)
    assert sum(c.final for c in chunks) == 3  # arguments.done closes, output_item.done is a no-op
    assert chunks[-1].finish_reason is FinishReason.TOOL_CALLS
    done = assemble(FMT, encode(events), flush=False)
    assert sorted((c.call_id, c.tool, c.arguments.decode()) for c in done) == sorted(CALLS)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("max_output_tokens", IncompleteReason.MAX_TOKENS),
        ("content_filter", IncompleteReason.CONTENT_FILTER),
    ],
)
def test_incomplete_mid_call_leaves_the_open_call_incomplete(
    reason: str, expected: IncompleteReason
) -> None:
    weather_deltas = len(streamgen.split_text(streamgen.WEATHER[2], random.Random(5)))
    events = streamgen.responses_stream(
        "r2",
        [streamgen.WEATHER, streamgen.SHELL],
        random.Random(5),
        parallel=False,
        cut_after=weather_deltas + 2,  # the first call is finished, the second mid-way
        incomplete_reason=reason,
    )
    done = {c.call_id: c for c in assemble(FMT, encode(events), flush=False)}
    assert done["call_weather_1"].incomplete is None
    assert done["call_weather_1"].arguments.decode() == streamgen.WEATHER[2]
    assert done["call_shell_3"].incomplete is expected
    # the SDK hands back the partial text as a plain string
    sdk = {c[0]: c[2] for c in sdk_calls(FMT, events).calls}
    assert sdk["call_shell_3"] == done["call_shell_3"].arguments.decode()


def test_the_recorded_incomplete_response_payload_ends_a_stream_as_max_tokens() -> None:
    payload = orjson.loads(
        (
            RECORDED / "openai_responses" / "dotnet_nonstream_incomplete_max_output_tokens.json"
        ).read_bytes()
    )
    events = streamgen.responses_stream("x", [streamgen.SHELL], random.Random(1), cut_after=2)
    events[-1]["response"] = payload
    (call,) = assemble(FMT, encode(events), flush=False)
    assert call.incomplete is IncompleteReason.MAX_TOKENS


def test_sequence_numbers_drop_replayed_events_and_turn_a_lost_one_into_a_gap() -> None:
    events = streamgen.responses_stream("r3", [streamgen.WEATHER], random.Random(2))
    replayed = events[:5] + events[3:]  # events 3 and 4 twice
    (call,) = assemble(FMT, encode(replayed), flush=False)
    assert call.incomplete is None
    assert call.arguments.decode() == streamgen.WEATHER[2]

    lost = events[:4] + events[5:]  # one delta never arrives
    assert events[4]["type"] == "response.function_call_arguments.delta"
    (call,) = assemble(FMT, encode(lost), flush=False)
    assert call.incomplete is IncompleteReason.SEQUENCE_GAP


def test_a_stream_without_sequence_numbers_numbers_nothing() -> None:
    events = streamgen.responses_stream("r4", [streamgen.WEATHER], random.Random(2), numbered=False)
    assert all(c.seq is None for c in chunks_of(FMT, encode(events)))
    numbered = streamgen.responses_stream("r4", [streamgen.WEATHER], random.Random(2))
    seqs = [c.seq for c in chunks_of(FMT, encode(numbered)) if c.kind is ChunkKind.TOOL_CALL]
    assert seqs == list(range(len(seqs)))


def test_only_a_finished_item_is_a_whole_call() -> None:
    item = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "t",
        "arguments": '{"a":1}',
        "status": "completed",
    }
    events = [
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": {"id": "r", "output": [item]}},
    ]
    (call,) = assemble(FMT, encode(events), flush=False)
    assert (call.call_id, call.tool, call.arguments, call.incomplete) == (
        "call_1",
        "t",
        b'{"a":1}',
        None,
    )


def test_refusal_events_become_the_refusal_channel() -> None:
    events = [
        {"type": "response.refusal.delta", "item_id": "m", "output_index": 0, "delta": "No,"},
        {"type": "response.refusal.delta", "item_id": "m", "output_index": 0, "delta": " sorry."},
        {
            "type": "response.refusal.done",
            "item_id": "m",
            "output_index": 0,
            "refusal": "No, sorry.",
        },
        {"type": "response.completed", "response": {"id": "r", "output": []}},
    ]
    chunks = chunks_of(FMT, encode(events), stream_id="q")
    assert chunks[-1].finish_reason is FinishReason.REFUSAL
    (call,) = assemble(FMT, encode(events), stream_id="q", flush=False)
    assert (call.call_id, call.channel, call.arguments) == (
        "q:refusal",
        ChunkKind.REFUSAL,
        b"No, sorry.",
    )


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (
            {"type": "error", "code": "rate_limit_exceeded", "message": "user text"},
            "rate_limit_exceeded",
        ),
        ({"type": "error", "code": "has spaces and a message", "message": "x"}, "error"),
        (
            {
                "type": "response.failed",
                "response": {"id": "r", "error": {"code": "server_error", "message": "boom"}},
            },
            "server_error",
        ),
        ({"type": "response.failed", "response": {"id": "r", "error": None}}, "response_failed"),
    ],
)
def test_vendor_errors_are_error_chunks_with_a_short_code(event: dict[str, Any], code: str) -> None:
    opened = streamgen.responses_stream("r5", [streamgen.WEATHER], random.Random(1), numbered=False)
    events = [*opened[:4], event]
    chunks = chunks_of(FMT, encode(events))
    error = next(c for c in chunks if c.kind is ChunkKind.ERROR)
    assert (error.call_id, error.delta, error.final) == ("s1:error", code, True)
    assert chunks[-1].finish_reason is FinishReason.ERROR
    done = assemble(FMT, encode(events), flush=False)
    assert {c.call_id: c.incomplete for c in done}["call_weather_1"] is (
        IncompleteReason.STREAM_ENDED
    )


def _fed(events: list[dict[str, Any]]) -> OpenAIResponsesAdapter:
    adapter = OpenAIResponsesAdapter("s1", {})
    for event in events:
        adapter.feed(event)
    return adapter


@pytest.mark.parametrize(
    ("index", "change", "message"),
    [
        (3, {"item_id": "nope"}, "not an open function call"),
        (3, {"delta": 7}, "'delta' must be a string"),
        (2, {"item": {"type": "function_call", "id": "x", "name": "t"}}, "'call_id'"),
        (None, {"type": 5}, "'type' must be a non-empty string"),
    ],
)
def test_malformed_events_raise(index: int | None, change: dict[str, Any], message: str) -> None:
    events = streamgen.responses_stream("r6", [streamgen.WEATHER], random.Random(1), numbered=False)
    target = events[index if index is not None else 0]
    target.update(change)
    with pytest.raises(InputFormatError, match=message):
        _fed(events)


def test_done_arguments_that_contradict_the_deltas_are_refused() -> None:
    events = streamgen.responses_stream("r7", [streamgen.WEATHER], random.Random(1), numbered=False)
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    done["arguments"] = '{"city":"Elsewhere"}'
    with pytest.raises(InputFormatError, match="differ from the streamed deltas"):
        _fed(events)


def test_a_delta_after_the_close_is_refused() -> None:
    events = streamgen.responses_stream("r8", [streamgen.WEATHER], random.Random(1), numbered=False)
    delta = next(e for e in events if e["type"] == "response.function_call_arguments.delta")
    with pytest.raises(InputFormatError, match="after the call was closed"):
        _fed([*events[:-1], delta])
