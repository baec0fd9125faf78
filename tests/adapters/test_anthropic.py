"""The Anthropic Messages adapter: tool blocks, max_tokens, server tools, refusal, errors, and every
event it cannot place breaking the calls it could belong to."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.adapters import streamgen
from tests.adapters.oracles import ANTHROPIC, assemble, chunks_of, encode, sdk_calls
from worker.adapters.anthropic import AnthropicAdapter
from worker.errors import InputFormatError
from worker.model import ChunkKind, FinishReason, IncompleteReason

TWO = [
    ("toolu_1", "get_weather", streamgen.WEATHER[2]),
    ("toolu_2", "run_shell", streamgen.SHELL[2]),
]


def stream(calls: list[tuple[str, str, str]] = TWO[:1], **options: Any) -> list[dict[str, Any]]:
    """message_start, a text block (0), a tool_use block per call (1, 2, ...), the end."""
    return streamgen.anthropic_stream("m1", calls, random.Random(1), **options)


def outcomes(events: list[dict[str, Any]]) -> dict[str, str]:
    return {
        call.call_id: call.incomplete or call.assembly_error or "complete"
        for call in assemble(ANTHROPIC, encode(events))
    }


def delta(index: int, kind: str = "input_json_delta", **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": kind, **fields}}


def test_a_tool_block_streams_its_input_and_is_released_at_message_stop() -> None:
    events = stream()
    chunks = chunks_of(ANTHROPIC, encode(events))
    pieces = [c for c in chunks if c.kind == ChunkKind.TOOL_CALL]
    assert (pieces[0].tool, pieces[0].delta) == ("get_weather", "")  # the opening chunk
    assert all(p.delta for p in pieces[1:-1])  # the first empty partial_json yields no chunk
    assert "".join(p.delta for p in pieces) == TWO[0][2]
    stop = next(i for i, e in enumerate(events) if e["type"] == "content_block_stop" and e["index"])
    assert not any(c.final for c in chunks_of(ANTHROPIC, encode(events[: stop + 1])))
    assert pieces[-1].final
    assert (chunks[-1].kind, chunks[-1].finish_reason) == (ChunkKind.END, FinishReason.TOOL_CALLS)


def test_max_tokens_with_two_tool_blocks_keeps_the_stopped_one_and_cuts_the_open_one() -> None:
    events = stream(TWO, stop_reason="max_tokens", cut_last_after=3)
    assert outcomes(events) == {"toolu_1": "complete", "toolu_2": IncompleteReason.MAX_TOKENS}
    # the SDK's partial parse of the cut block looks like usable arguments
    sdk = sdk_calls(ANTHROPIC, events)
    cut = [b for b in sdk.snapshot.content if b.type == "tool_use"][-1]
    assert isinstance(cut.input, dict)


def test_model_context_window_exceeded_is_a_length_stop() -> None:
    events = stream(TWO, stop_reason="model_context_window_exceeded", cut_last_after=2)
    assert outcomes(events)["toolu_2"] == IncompleteReason.MAX_TOKENS


def test_server_tool_use_blocks_are_not_client_calls() -> None:
    events = stream(server_tool=True)
    assert outcomes(events) == {"toolu_1": "complete"}


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
    assert chunks_of(ANTHROPIC, encode(stream([], stop_reason=reason)))[-1].finish_reason == finish


@pytest.mark.parametrize("reason", ["refusal", "something_new"])
def test_stopped_blocks_are_released_only_after_a_normal_or_length_stop(reason: str) -> None:
    assert outcomes(stream(stop_reason=reason))["toolu_1"] == IncompleteReason.STREAM_ENDED


def test_a_refusal_becomes_a_refusal_chunk_then_end() -> None:
    events = stream([], stop_reason="refusal")
    events[-2]["delta"]["stop_details"] = {"type": "refusal", "explanation": "Not allowed."}
    chunks = chunks_of(ANTHROPIC, encode(events), stream_id="z")
    refusal, end = chunks[-2:]
    assert (refusal.kind, refusal.call_id, refusal.delta, refusal.final) == (
        ChunkKind.REFUSAL,
        "z#refusal",
        "Not allowed.",
        True,
    )
    assert end.finish_reason == FinishReason.REFUSAL


def test_an_error_event_ends_the_stream_and_releases_nothing() -> None:
    events = stream(TWO)
    second = next(i for i, e in enumerate(events) if e.get("index") == 2)
    events = [
        *events[:second],
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded: 'x'"}},
    ]
    chunks = chunks_of(ANTHROPIC, encode(events))
    error = next(c for c in chunks if c.kind == ChunkKind.ERROR)
    assert (error.delta, error.final) == ("overloaded_error", True)
    assert chunks[-1].finish_reason == FinishReason.ERROR
    assert outcomes(events)["toolu_1"] == IncompleteReason.STREAM_ENDED  # stopped, never released


def _at(events: list[dict[str, Any]], kind: str, index: int | None = None) -> int:
    return next(
        i
        for i, e in enumerate(events)
        if e["type"] == kind and (index is None or e.get("index") == index)
    )


def _insert(kind: str, index: int | None, event: dict[str, Any], after: bool = False) -> Any:
    def change(events: list[dict[str, Any]]) -> None:
        events.insert(_at(events, kind, index) + after, event)

    return change


def _set(kind: str, index: int | None, path: tuple[str, ...], value: Any) -> Any:
    def change(events: list[dict[str, Any]]) -> None:
        target = events[_at(events, kind, index)]
        for step in path[:-1]:
            target = target[step]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return change


_DELETE = object()
BLOCK_START = "content_block_start"
BLOCK_DELTA = "content_block_delta"
#: (a change of the one-call stream, what its malformed record says): each breaks toolu_1
BROKEN = {
    "partial_json a number": (
        _insert(BLOCK_DELTA, 1, delta(1, partial_json=100000), after=True),
        "'delta.partial_json' must be a string",
    ),
    "a text_delta in the tool_use block": (
        _insert(BLOCK_DELTA, 1, delta(1, "text_delta", text="}"), after=True),
        "a tool_use block takes no text_delta",
    ),
    "an unknown delta type in the tool_use block": (
        _insert(BLOCK_DELTA, 1, delta(1, "new_delta", text="}"), after=True),
        "a tool_use block takes no new_delta",
    ),
    "a delta for a block never started": (
        _insert(BLOCK_DELTA, 1, delta(7, partial_json="}"), after=True),
        "block 7 is not the open block",
    ),
    "a delta for the stopped text block": (
        _insert(BLOCK_DELTA, 1, delta(0, "text_delta", text="x"), after=True),
        "block 0 is not the open block",
    ),
    "a delta after the tool block stopped": (
        _insert("content_block_stop", 1, delta(1, partial_json=" "), after=True),
        "block 1 is not the open block",
    ),
    "a second stop": (
        _insert("content_block_stop", 1, {"type": "content_block_stop", "index": 1}, True),
        "block 1 is not the open block",
    ),
    "a block started again": (
        _insert("content_block_stop", 1, {"type": BLOCK_START, "index": 1, "content_block": {}}),
        "starts while block 1 is open",
    ),
    "a block after the message_delta": (
        _insert("message_delta", None, {"type": BLOCK_START, "index": 2}, after=True),
        "starts after the message_delta",
    ),
    "a delta after the message_delta": (
        _insert("message_delta", None, delta(1, partial_json=" "), after=True),
        "block 1 is not the open block",
    ),
    "message_delta without usage": (
        _set("message_delta", None, ("usage",), _DELETE),
        "'usage' must be an object",
    ),
    "message_delta without a delta": (
        _set("message_delta", None, ("delta",), "end_turn"),
        "'delta' must be an object",
    ),
    "message_stop without message_delta": (
        _set("message_delta", None, ("type",), "unknown_event"),
        "without a message_delta",
    ),
}
#: (a change of the stream's tool block start, what its malformed record says): the call never
#: opens, and the stream's later records are dropped
BROKEN_START = {
    "a block out of order": (_set(BLOCK_START, 1, ("index",), 2), "the next block is 1, not 2"),
    "a tool_use without a name": (
        _set(BLOCK_START, 1, ("content_block", "name"), _DELETE),
        "'name' must be a non-empty string",
    ),
    "a tool_use with its input given": (
        _set(BLOCK_START, 1, ("content_block", "input"), {"amount": 1}),
        "starts with an empty input",
    ),
    "a text block without its text": (
        _set(BLOCK_START, 0, ("content_block", "text"), None),
        "'text' must be a string",
    ),
    "a second message_start": (
        _insert(BLOCK_START, 1, {"type": "message_start", "message": {"content": []}}),
        "already started",
    ),
}


@pytest.mark.parametrize("what", BROKEN)
def test_an_event_that_cannot_be_placed_breaks_the_tool_call(what: str) -> None:
    change, message = BROKEN[what]
    events = stream()
    change(events)
    calls = {c.call_id: c for c in assemble(ANTHROPIC, encode(events))}
    (record,) = [c for c in calls.values() if c.assembly_error == "malformed_record"]
    assert message in (record.assembly_detail or "")
    assert calls["toolu_1"].incomplete == IncompleteReason.STREAM_CORRUPT


@pytest.mark.parametrize("what", BROKEN_START)
def test_a_start_that_cannot_be_placed_opens_no_call(what: str) -> None:
    change, message = BROKEN_START[what]
    events = stream()
    change(events)
    (record,) = assemble(ANTHROPIC, encode(events))
    assert record.assembly_error == "malformed_record"
    assert message in (record.assembly_detail or "")


def test_a_bad_event_after_a_blocks_stop_still_breaks_it_as_it_is_held() -> None:
    events = stream(TWO)
    events.insert(_at(events, BLOCK_START, 2), delta(1, partial_json="}"))  # after block 1 stopped
    assert outcomes(events) == {
        f"record:in:0:{_at(events, BLOCK_START, 2) - 1}": "malformed_record",
        "toolu_1": IncompleteReason.STREAM_CORRUPT,
    }


@pytest.mark.parametrize(
    "first",
    [
        {"type": BLOCK_START, "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "message_start", "message": {"content": [{"type": "text"}], "usage": {}}},
        {"type": "message_start", "message": {"content": []}},
    ],
    ids=["no message_start", "a message_start with content", "a message_start without usage"],
)
def test_a_stream_must_start_with_an_empty_message_start(first: dict[str, Any]) -> None:
    adapter = AnthropicAdapter("s", {}, None, max_calls=10)
    with pytest.raises(InputFormatError, match=r"message_start|content|usage"):
        adapter.feed(first)


def test_the_adapter_names_no_call_after_its_end() -> None:
    adapter = AnthropicAdapter("s", {}, None, max_calls=10)
    for event in stream():
        adapter.feed(event)
    assert (adapter.finished, adapter.open_calls(), adapter.held) == (True, [], 0)


def test_open_calls_names_stopped_blocks_until_message_stop() -> None:
    adapter = AnthropicAdapter("s", {}, None, max_calls=10)
    events = stream(TWO)
    for event in events[: _at(events, BLOCK_START, 2)]:
        adapter.feed(event)
    assert (adapter.open_calls(), adapter.held) == (["toolu_1"], 1)


def test_a_stream_past_its_bound_of_calls_is_broken() -> None:
    adapter = AnthropicAdapter("s", {}, None, max_calls=1)
    events = stream(TWO)
    for event in events[: _at(events, BLOCK_START, 2)]:
        adapter.feed(event)
    with pytest.raises(InputFormatError, match="more than 1 calls"):
        adapter.feed(events[_at(events, BLOCK_START, 2)])
    assert adapter.open_calls() == ["toolu_1"]


@pytest.mark.parametrize("deltas", [[], [""], ["", ""]], ids=["no delta", "one empty", "two empty"])
def test_a_tool_without_parameters_streams_no_text_and_its_input_is_the_empty_object(
    deltas: list[str],
) -> None:
    """What Claude sends for a tool without parameters: `input: {}` and at most empty
    `partial_json`s. The SDK hands its user `{}`; so does the adapter, and the call passes."""
    events = stream([("toolu_1", "list_files", "")])
    start = next(i for i, e in enumerate(events) if e.get("content_block", {}).get("name"))
    stop = next(i for i, e in enumerate(events) if i > start and e["type"] == "content_block_stop")
    events[start + 1 : stop] = [delta(1, partial_json=text) for text in deltas]
    (call,) = assemble(ANTHROPIC, encode(events))
    assert (call.incomplete, call.assembly_error, call.arguments) == (None, None, b"{}")
    assert sdk_calls(ANTHROPIC, events).snapshot.content[1].input == {}
    # a block that took text keeps exactly that text
    events[start + 1 : start + 1] = [delta(1, partial_json='{"a"'), delta(1, partial_json=":1}")]
    (call,) = assemble(ANTHROPIC, encode(events))
    assert call.arguments == b'{"a":1}'


_STOPS = [
    "tool_use",
    "end_turn",
    "stop_sequence",
    "pause_turn",
    "max_tokens",
    "model_context_window_exceeded",
    "refusal",
    "something_new",
]


@pytest.mark.parametrize("stop_reason", _STOPS)
@pytest.mark.parametrize("last", ["call", "text"])
@pytest.mark.parametrize("stopped", [True, False], ids=["stopped", "open"])
@pytest.mark.parametrize(
    "texts", [("", ""), ("", '{"a":1}'), ('{"a":1}', ""), ('{"a":1}', '{"b":2}')]
)
def test_a_block_the_token_limit_may_have_cut_is_never_released_with_or_without_text(
    stop_reason: str, last: str, stopped: bool, texts: tuple[str, str]
) -> None:
    """Every stop reason, two tool blocks whose text is empty (a tool without parameters, or a
    parameter the API held back until the limit cut it) or not, then perhaps a text block, the
    message's last block stopped or left open: under a token-limit stop the last block, when it
    is a call, is `incomplete` `max_tokens` (never `{}`); a block still open is never released;
    every other stopped call is released, `{}` when it streamed no text."""
    events: list[dict[str, Any]] = [stream([], stop_reason=stop_reason)[0]]
    blocks = [("toolu_1", texts[0]), ("toolu_2", texts[1])]
    if last == "text":
        blocks.append(("", "Done."))
    for index, (call_id, text) in enumerate(blocks):
        if call_id:
            block = {"type": "tool_use", "id": call_id, "name": "t", "input": {}}
            deltas = [delta(index, partial_json="")] + [
                delta(index, partial_json=part) for part in (text[:3], text[3:]) if part
            ]
        else:
            block = {"type": "text", "text": ""}
            deltas = [delta(index, "text_delta", text=text)]
        events += [{"type": BLOCK_START, "index": index, "content_block": block}, *deltas]
        if stopped or index < len(blocks) - 1:
            events.append({"type": "content_block_stop", "index": index})
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]
    length = stop_reason in ("max_tokens", "model_context_window_exceeded")
    released = stop_reason not in ("refusal", "something_new")
    expected: dict[str, tuple[str, bytes]] = {}
    for index, (call_id, text) in enumerate(blocks):
        if not call_id:
            continue
        is_last = index == len(blocks) - 1
        if is_last and length:
            expected[call_id] = (IncompleteReason.MAX_TOKENS, b"")
        elif not released or (is_last and not stopped):
            expected[call_id] = (IncompleteReason.STREAM_ENDED, b"")
        else:
            expected[call_id] = ("complete", (text or "{}").encode())
    got = {
        call.call_id: (call.incomplete or call.assembly_error or "complete", call.arguments)
        for call in assemble(ANTHROPIC, encode(events))
        if call.call_id.startswith("toolu_")
    }
    assert got == expected


def _stop_reason(reason: str | None) -> dict[str, Any]:
    delta = {"stop_reason": reason, "stop_sequence": None}
    return {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 9}}


@pytest.mark.parametrize(
    ("first", "later", "outcome"),
    [
        ("max_tokens", "tool_use", IncompleteReason.STREAM_CORRUPT),  # a cut call made whole
        ("tool_use", "max_tokens", IncompleteReason.STREAM_CORRUPT),
        ("tool_use", "end_turn", IncompleteReason.STREAM_CORRUPT),
        ("tool_use", "tool_use", "complete"),  # the same again: a usage update
        ("tool_use", None, "complete"),  # no reason: a usage update, the first stands
        ("max_tokens", None, IncompleteReason.MAX_TOKENS),
    ],
)
def test_the_first_stop_reason_stands(first: str, later: str | None, outcome: str) -> None:
    events = stream(stop_reason=first)
    stop = _at(events, "message_delta")
    events.insert(stop + 1, _stop_reason(later))
    found = outcomes(events)
    assert found.pop("toolu_1") == outcome
    refused = outcome == IncompleteReason.STREAM_CORRUPT
    assert list(found.values()) == (["malformed_record"] if refused else [])


def test_a_stop_reason_restored_without_its_name_is_not_changed_either() -> None:
    """A state written before the adapter kept the reason's name has only its meaning: any
    later reason is taken for another (refused), a later message_delta without one is not."""
    events = stream(stop_reason="max_tokens")
    stop = _at(events, "message_delta")
    adapter = AnthropicAdapter("m1", {}, None, max_calls=8)
    for event in events[: stop + 1]:
        adapter.feed(event)
    state = adapter.state()
    del state["reason"]
    restored = AnthropicAdapter("m1", {}, state, max_calls=8)
    restored.feed(_stop_reason(None))
    with pytest.raises(InputFormatError, match="stop_reason"):
        restored.feed(_stop_reason("tool_use"))
