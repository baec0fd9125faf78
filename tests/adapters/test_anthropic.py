"""The Anthropic Messages adapter: tool blocks, max_tokens, server tools, refusal, errors."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.adapters import streamgen
from tests.adapters.oracles import assemble, chunks_of, encode, sdk_calls
from worker.adapters.anthropic import AnthropicAdapter
from worker.errors import InputFormatError
from worker.model import ChunkKind, FinishReason, IncompleteReason

FMT = "anthropic.messages"
TWO = [
    ("toolu_1", "get_weather", streamgen.WEATHER[2]),
    ("toolu_2", "run_shell", streamgen.SHELL[2]),
]


def test_max_tokens_with_two_tool_blocks_keeps_the_closed_one_and_cuts_the_open_one() -> None:
    events = streamgen.anthropic_stream(
        "m1", TWO, random.Random(3), stop_reason="max_tokens", cut_last_after=3
    )
    chunks = chunks_of(FMT, encode(events))
    assert [c.call_id for c in chunks if c.final] == ["toolu_1"]
    assert chunks[-1].finish_reason is FinishReason.LENGTH
    done = {c.call_id: c for c in assemble(FMT, encode(events), flush=False)}
    assert done["toolu_1"].incomplete is None
    assert done["toolu_1"].arguments.decode() == TWO[0][2]
    assert done["toolu_2"].incomplete is IncompleteReason.MAX_TOKENS
    # the SDK's partial parse of the cut block looks like usable arguments
    sdk = sdk_calls(FMT, events)
    cut = [b for b in sdk.snapshot.content if b.type == "tool_use"][-1]
    assert isinstance(cut.input, dict)
    assert done["toolu_2"].arguments.decode() == sdk.calls[-1][2]


def test_model_context_window_exceeded_is_a_length_stop() -> None:
    events = streamgen.anthropic_stream(
        "m2", TWO, random.Random(3), stop_reason="model_context_window_exceeded", cut_last_after=2
    )
    done = {c.call_id: c for c in assemble(FMT, encode(events), flush=False)}
    assert done["toolu_2"].incomplete is IncompleteReason.MAX_TOKENS


def test_server_tool_use_blocks_are_not_client_calls() -> None:
    events = streamgen.anthropic_stream("m3", TWO[:1], random.Random(1), server_tool=True)
    done = assemble(FMT, encode(events))
    assert [c.call_id for c in done] == ["toolu_1"]
    assert all(c.call_id.startswith("toolu_") for c in chunks_of(FMT, encode(events)) if c.call_id)


def test_the_first_empty_partial_json_yields_no_chunk() -> None:
    events = streamgen.anthropic_stream("m4", TWO[:1], random.Random(1))
    pieces = [c.delta for c in chunks_of(FMT, encode(events)) if c.kind is ChunkKind.TOOL_CALL]
    assert pieces[0] == ""  # the opening chunk, carrying the name
    assert all(pieces[1:-1])
    assert "".join(pieces) == TWO[0][2]


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("end_turn", FinishReason.STOP),
        ("stop_sequence", FinishReason.STOP),
        ("pause_turn", FinishReason.STOP),
        ("tool_use", FinishReason.TOOL_CALLS),
        ("max_tokens", FinishReason.LENGTH),
        ("refusal", FinishReason.REFUSAL),
        ("something_new", None),
    ],
)
def test_stop_reasons_are_normalized(reason: str, finish: FinishReason | None) -> None:
    events = streamgen.anthropic_stream("m5", [], random.Random(1), stop_reason=reason)
    assert chunks_of(FMT, encode(events))[-1].finish_reason is finish


def test_a_refusal_becomes_a_refusal_chunk_then_end() -> None:
    events = streamgen.anthropic_stream("m6", [], random.Random(1), stop_reason="refusal")
    events[-2]["delta"]["stop_details"] = {"type": "refusal", "explanation": "Not allowed."}
    chunks = chunks_of(FMT, encode(events), stream_id="z")
    refusal, end = chunks[-2:]
    assert (refusal.kind, refusal.call_id, refusal.delta, refusal.final) == (
        ChunkKind.REFUSAL,
        "z:refusal",
        "Not allowed.",
        True,
    )
    assert end.finish_reason is FinishReason.REFUSAL


def test_an_error_event_ends_the_stream_and_open_calls_are_not_complete() -> None:
    events = streamgen.anthropic_stream("m7", TWO[:1], random.Random(1))[:8]
    events.append(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded: 'x'"}}
    )
    chunks = chunks_of(FMT, encode(events))
    error = next(c for c in chunks if c.kind is ChunkKind.ERROR)
    assert (error.delta, error.final) == ("overloaded_error", True)
    assert chunks[-1].finish_reason is FinishReason.ERROR
    calls = {c.call_id: c for c in assemble(FMT, encode(events), flush=False)}
    assert calls["toolu_1"].incomplete is IncompleteReason.STREAM_ENDED


def _fed(events: list[dict[str, Any]]) -> None:
    adapter = AnthropicAdapter("s", {})
    for event in events:
        adapter.feed(event)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e.insert(7, {"type": "content_block_delta", "index": 9, "delta": {}}), "never"),
        (lambda e: e.append({"type": "ping"}), "after the end of the stream"),
        (
            lambda e: e.insert(7, {"type": "content_block_stop", "index": 1}),
            "after its stop|already stopped",
        ),
        (lambda e: e[5]["content_block"].pop("name"), "'name'"),
        (lambda e: e[6]["delta"].update(partial_json=None), "partial_json"),
        (lambda e: e.insert(6, dict(e[5])), "already started"),
    ],
)
def test_malformed_events_raise(mutate: Any, message: str) -> None:
    events = streamgen.anthropic_stream("m8", TWO[:1], random.Random(1))
    assert events[5]["type"] == "content_block_start"
    mutate(events)
    with pytest.raises(InputFormatError, match=message):
        _fed(events)
