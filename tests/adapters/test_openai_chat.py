"""The Chat Completions adapter: chunks, finish reasons, n > 1, refusals, errors, and every event
it cannot place breaking the calls it could belong to."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.adapters import streamgen
from tests.adapters.oracles import (
    CHAT,
    Gate,
    assemble,
    chunks_of,
    encode,
    permissive_contracts,
    records,
)
from worker.adapters.openai_chat import OpenAIChatAdapter
from worker.errors import InputFormatError
from worker.model import ChunkKind, FinishReason, IncompleteReason, Outcome


def chunk(index: int = 0, finish: str | None = None, **delta: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1727346178,
        "model": "gpt-4o-2024-08-06",
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def tool(index: int, arguments: Any, call_id: str | None = None, name: str | None = None) -> Any:
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        call["id"] = call_id
        call["type"] = "function"
    if name is not None:
        call["function"]["name"] = name
    return [call]


def shell_stream(finish: str = "tool_calls") -> list[dict[str, Any]]:
    return [
        chunk(role="assistant", content=None),
        chunk(tool_calls=tool(0, "", "call_1", "run_shell")),
        chunk(tool_calls=tool(0, '{"argv":')),
        chunk(tool_calls=tool(0, '["ls","pwd"]}')),
        chunk(finish=finish),
    ]


def outcomes(events: list[dict[str, Any]], stream_id: str = "s1") -> dict[str, str]:
    """Each call (and each malformed record) the stream makes, to how it ended."""
    return {
        call.call_id: call.incomplete or call.assembly_error or "complete"
        for call in assemble(CHAT, encode(events), stream_id)
    }


def test_first_chunk_names_the_tool_then_deltas_then_final_with_the_end() -> None:
    chunks = chunks_of(CHAT, encode(shell_stream()))
    calls = [c for c in chunks if c.kind == ChunkKind.TOOL_CALL]
    assert [(c.call_id, c.tool, c.delta, c.final) for c in calls] == [
        ("call_1", "run_shell", "", False),
        ("call_1", None, '{"argv":', False),
        ("call_1", None, '["ls","pwd"]}', False),
        ("call_1", None, "", True),
    ]
    assert all(c.seq is None for c in calls)
    assert (chunks[-1].kind, chunks[-1].finish_reason) == (ChunkKind.END, FinishReason.TOOL_CALLS)
    (call,) = assemble(CHAT, encode(shell_stream()))
    assert (call.incomplete, call.arguments) == (None, b'{"argv":["ls","pwd"]}')


@pytest.mark.parametrize(
    ("finish", "reason"),
    [("length", IncompleteReason.MAX_TOKENS), ("content_filter", IncompleteReason.CONTENT_FILTER)],
)
def test_a_cut_choice_leaves_its_calls_open_so_they_are_incomplete(
    finish: str, reason: IncompleteReason
) -> None:
    assert not any(c.final for c in chunks_of(CHAT, encode(shell_stream(finish))))
    (call,) = assemble(CHAT, encode(shell_stream(finish)), flush=False)
    assert call.incomplete == reason


def test_tool_calls_reported_for_a_cut_call_is_never_accepted_by_the_gate(tmp_path: Path) -> None:
    # Known in the field: finish_reason "tool_calls" for a call cut off by max_tokens.
    gate = Gate(permissive_contracts(tmp_path, ["run_shell"]))
    cut = shell_stream()
    cut[3] = chunk(tool_calls=tool(0, '["ls","pwd"'))
    (emission,) = gate.run([records(CHAT, encode(cut))])
    assert (emission.verdict.outcome, emission.verdict.code) == (Outcome.REJECTED, "invalid_json")
    (emission,) = gate.run([records(CHAT, encode(shell_stream()))])
    assert emission.verdict.outcome is Outcome.ACCEPTED  # the gate does not reject everything


def test_choices_get_their_own_ids_and_are_released_together_at_the_end() -> None:
    events = [
        chunk(0, role="assistant"),
        chunk(1, role="assistant"),
        chunk(0, tool_calls=tool(0, '{"a":1}', "call_same", "t")),
        chunk(1, tool_calls=tool(0, '{"a":', "call_same", "t")),
        chunk(0, finish="tool_calls"),
    ]
    head = chunks_of(CHAT, encode(events))
    assert {c.call_id for c in head} == {"call_same", "call_same#1"}
    assert not any(c.final or c.kind == ChunkKind.END for c in head)  # choice 1 is still going
    done = {c.call_id: c for c in assemble(CHAT, encode([*events, chunk(1, finish="length")]))}
    assert (done["call_same"].incomplete, done["call_same"].arguments) == (None, b'{"a":1}')
    assert done["call_same#1"].incomplete == IncompleteReason.MAX_TOKENS


#: a choice as generated: its calls (how many) and its finish reason (None: it never finishes)
_CHOICE = st.tuples(
    st.integers(1, 2), st.sampled_from(["tool_calls", "stop", "length", "content_filter", None])
)
_USAGE = {"object": "chat.completion.chunk", "choices": [], "usage": {"total_tokens": 3}}


def _choice_events(index: int, calls: int, finish: str | None) -> list[dict[str, Any]]:
    events = [chunk(index, tool_calls=tool(n, f'{{"n":{n}}}', f"c{n}", "t")) for n in range(calls)]
    return [*events, chunk(index, finish=finish)] if finish is not None else events


@given(st.lists(_CHOICE, min_size=2, max_size=3), st.randoms(use_true_random=False))
def test_each_call_ends_as_its_own_choice_finished(
    choices: list[tuple[int, str | None]], rng: random.Random
) -> None:
    """A call of a completion of several choices (their chunks interleaved, the usage chunk
    last) ends exactly as it would in a completion of its choice alone, whatever the other
    choices' finish reasons."""
    queues = [_choice_events(k, *c) for k, c in enumerate(choices)]
    events = [queue.pop(0) for queue in queues]  # each choice opened after the one before
    while any(queues):
        events.append(rng.choice([queue for queue in queues if queue]).pop(0))
    together = outcomes([*events, _USAGE])
    for k, (calls, finish) in enumerate(choices):
        alone = outcomes([*_choice_events(0, calls, finish), _USAGE])
        suffix = f"#{k}" if k else ""
        assert {n: together[f"c{n}{suffix}"] for n in range(calls)} == {
            n: alone[f"c{n}"] for n in range(calls)
        }


def test_a_refusal_is_the_refusal_channel_closed_at_stop() -> None:
    events = [
        chunk(role="assistant", refusal=""),
        chunk(refusal="I can't"),
        chunk(refusal=" help."),
        chunk(finish="stop"),
    ]
    chunks = chunks_of(CHAT, encode(events), stream_id="r9")
    refusal = [c for c in chunks if c.kind == ChunkKind.REFUSAL]
    assert {c.call_id for c in refusal} == {"r9#refusal"}
    assert "".join(c.delta for c in refusal) == "I can't help."
    assert refusal[-1].final
    assert chunks[-1].finish_reason == FinishReason.REFUSAL


def test_text_is_not_a_call_and_a_usage_chunk_after_the_end_is_a_new_empty_stream() -> None:
    events = [chunk(role="assistant", content=""), chunk(content="Hello"), chunk(finish="stop")]
    usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": {}}
    chunks = chunks_of(CHAT, encode([*events, usage]))
    assert [(c.kind, c.finish_reason) for c in chunks] == [(ChunkKind.END, FinishReason.STOP)]


def test_the_usage_chunk_ends_a_stream_whose_choice_never_finished() -> None:
    usage = {"object": "chat.completion.chunk", "choices": [], "usage": {"total_tokens": 3}}
    events = [chunk(tool_calls=tool(0, "{", "c1", "t")), usage]
    (call,) = assemble(CHAT, encode(events), flush=False)
    assert call.incomplete == IncompleteReason.STREAM_ENDED


def test_a_stream_error_ends_it_without_the_vendor_message_and_releases_nothing() -> None:
    error = {"error": {"message": "secret prompt text leaked here", "type": "server_error"}}
    events = [
        chunk(0, tool_calls=tool(0, "{}", "c0", "t")),
        chunk(1, tool_calls=tool(0, "{}", "c1", "t")),
        chunk(0, finish="tool_calls"),  # choice 0 is complete, held until the end
        error,
    ]
    chunks = chunks_of(CHAT, encode(events))
    error_chunk = next(c for c in chunks if c.kind == ChunkKind.ERROR)
    assert (error_chunk.call_id, error_chunk.delta, error_chunk.final) == (
        "s1#error",
        "server_error",
        True,
    )
    assert chunks[-1].finish_reason == FinishReason.ERROR
    assert all("secret" not in c.delta for c in chunks)
    assert outcomes(events)["c0"] == IncompleteReason.STREAM_ENDED


def test_missing_vendor_ids_get_a_deterministic_one() -> None:
    events = [chunk(tool_calls=tool(0, "{}", None, "t")), chunk(finish="tool_calls")]
    (call,) = assemble(CHAT, encode(events), stream_id="st")
    assert call.call_id == "st#0#0"


def test_an_empty_object_annotation_chunk_carrying_nothing_is_skipped() -> None:
    # Azure's content-filter annotations: object "", no delta; the SDK skips them too
    annotation = {"object": "", "id": "", "choices": [{"index": 0, "content_filter_results": {}}]}
    events = [*shell_stream()[:4], annotation, shell_stream()[4]]
    assert outcomes(events) == {"call_1": "complete"}


def test_the_payment_with_a_piece_given_as_an_object_is_never_accepted(tmp_path: Path) -> None:
    events = [
        chunk(tool_calls=tool(0, '{"amount_minor": 1', "call_pay", "create_payment")),
        chunk(tool_calls=tool(0, {"0": "0"})),
        chunk(tool_calls=tool(0, '00000, "currency": "EUR"}')),
        chunk(finish="tool_calls"),
    ]
    assert outcomes(events) == {"record:in:0:1": "malformed_record", "call_pay": "stream_corrupt"}
    gate = Gate(permissive_contracts(tmp_path, ["create_payment"]))
    verdicts = [e.verdict.outcome for e in gate.run([records(CHAT, encode(events))])]
    assert Outcome.ACCEPTED not in verdicts


OPENED = [
    chunk(role="assistant", content=None),
    chunk(tool_calls=tool(0, "", "call_a", "transfer")),
    chunk(tool_calls=tool(0, '{"to":')),
]
#: (the event after OPENED, what its malformed record says): each breaks call_a, still streaming
BROKEN = {
    "arguments an object": (chunk(tool_calls=tool(0, {"x": 1})), "'arguments' must be a string"),
    "arguments a number": (chunk(tool_calls=tool(0, 7)), "'arguments' must be a string"),
    "the call's id changes": (chunk(tool_calls=tool(0, '"b"}', "call_b")), "id changed"),
    "the call's id repeats": (chunk(tool_calls=tool(0, '"b"}', "call_a")), "id changed"),
    "the call's name changes": (chunk(tool_calls=tool(0, "", None, "drain")), "name changed"),
    "a new call skips an index": (chunk(tool_calls=tool(2, "", "c", "t")), "out of order"),
    "a call without function": (chunk(tool_calls=[{"index": 0}]), "'function' must be an object"),
    "a type other than function": (
        chunk(tool_calls=[{"index": 0, "type": "x", "function": {}}]),
        "'type' must be 'function'",
    ),
    "tool_calls not an array": (chunk(tool_calls={"index": 0}), "tool_calls must be an array"),
    "a tool call not an object": (chunk(tool_calls=["x"]), "tool_calls must be an object"),
    "a negative index": (chunk(tool_calls=tool(-1, "x")), "'index' must be an integer >= 0"),
    "a new call without a name": (chunk(tool_calls=tool(1, "{}", "c")), "needs its name"),
    "a new call with an empty id": (chunk(tool_calls=tool(1, "{}", "", "t")), "must not be empty"),
    "a new call reusing an id": (chunk(tool_calls=tool(1, "{}", "call_a", "t")), "repeats"),
    "a choice out of order": (chunk(2, content="x"), "a new choice must have the next index"),
    "delta not an object": (
        {**chunk(), "choices": [{"index": 0, "delta": None}]},
        "'delta' must be an object",
    ),
    "choices not an array": ({**chunk(), "choices": {"0": {}}}, "'choices' must be an array"),
    "a choice not an object": ({**chunk(), "choices": ["x"]}, "'choices' must be an object"),
    "content not a string": (chunk(content=["x"]), "'content' must be a string"),
    "refusal not a string": (chunk(refusal={"x": 1}), "'refusal' must be a string"),
    "the legacy function_call": (chunk(function_call={"name": "f"}), "legacy"),
    "finish_reason not a string": (chunk(finish=1), "'finish_reason' must be a string"),  # type: ignore[arg-type]
    "logprobs not an object": (
        {**chunk(), "choices": [{"index": 0, "delta": {}, "logprobs": 1}]},
        "'logprobs' must be an object",
    ),
    "usage not an object": ({**chunk(), "usage": 5}, "'usage' must be an object"),
    "moderation not an object": ({**chunk(), "moderation": "x"}, "'moderation' must be an object"),
    "another object": ({**chunk(), "object": "chat.completion"}, "'object' must be"),
    "no object": ({"choices": [{"index": 0, "delta": {}}]}, "'object' must be"),
    "an empty object carrying a delta": ({**chunk(content="x"), "object": ""}, "'object' must be"),
}


@pytest.mark.parametrize("what", BROKEN)
def test_an_event_that_cannot_be_placed_breaks_the_streaming_call(what: str) -> None:
    event, message = BROKEN[what]
    events = [*OPENED, event, chunk(tool_calls=tool(0, '"b"}')), chunk(finish="tool_calls")]
    calls = {c.call_id: c for c in assemble(CHAT, encode(events))}
    assert {k: c.incomplete or c.assembly_error for k, c in calls.items()} == {
        "record:in:0:3": "malformed_record",
        "call_a": "stream_corrupt",
    }
    assert message in (calls["record:in:0:3"].assembly_detail or "")


def test_a_piece_for_an_earlier_call_after_a_later_one_started_breaks_both() -> None:
    events = [
        chunk(tool_calls=tool(0, '{"a":', "call_0", "t")),
        chunk(tool_calls=tool(1, '{"b":1}', "call_1", "t")),
        chunk(tool_calls=tool(0, "1}")),
        chunk(finish="tool_calls"),
    ]
    assert outcomes(events) == {
        "record:in:0:2": "malformed_record",
        "call_0": "stream_corrupt",
        "call_1": "stream_corrupt",
    }


def test_a_delta_after_its_choice_finished_breaks_the_calls_held_for_the_end() -> None:
    events = [
        chunk(0, tool_calls=tool(0, '{"a":1}', "c0", "t")),
        chunk(1, tool_calls=tool(0, '{"b":1}', "c1", "t")),
        chunk(0, finish="tool_calls"),
        chunk(0, tool_calls=tool(0, "}")),  # the SDK would append it to c0's arguments
        chunk(1, finish="tool_calls"),
    ]
    assert outcomes(events) == {
        "record:in:0:3": "malformed_record",
        "c0": "stream_corrupt",
        "c1#1": "stream_corrupt",
    }


def test_an_empty_delta_after_the_finish_changes_nothing_and_is_taken() -> None:
    events = [
        chunk(0, tool_calls=tool(0, "{}", "c0", "t")),
        chunk(1, tool_calls=tool(0, "{}", "c1", "t")),
        chunk(0, finish="tool_calls"),
        chunk(0, content="", tool_calls=[]),
        chunk(1, finish="tool_calls"),
    ]
    assert outcomes(events) == {"c0": "complete", "c1#1": "complete"}


def test_a_stream_past_its_bound_of_calls_is_broken() -> None:
    adapter = OpenAIChatAdapter("s1", {}, None, max_calls=2)
    adapter.feed(chunk(tool_calls=tool(0, "{}", "c0", "t")))
    adapter.feed(chunk(tool_calls=tool(1, "{}", "c1", "t")))
    with pytest.raises(InputFormatError, match="more than 2 calls"):
        adapter.feed(chunk(tool_calls=tool(2, "{}", "c2", "t")))
    assert (adapter.open_calls(), adapter.held) == (["c0", "c1"], 2)


def test_open_calls_names_every_call_and_refusal_until_the_end() -> None:
    adapter = OpenAIChatAdapter("s1", {}, None, max_calls=10)
    adapter.feed(chunk(0, tool_calls=tool(0, "{}", "c0", "t")))
    adapter.feed(chunk(1, refusal="no"))
    adapter.feed(chunk(0, finish="tool_calls"))
    assert (adapter.open_calls(), adapter.held) == (["c0", "s1#refusal#1"], 2)
    adapter.feed(chunk(1, finish="stop"))
    assert (adapter.finished, adapter.open_calls(), adapter.held) == (True, [], 0)


def test_n_choices_from_the_generator_keep_every_call() -> None:
    rng = random.Random(7)
    calls = [("c1", "a", '{"x":1}'), ("c2", "b", '{"y":[1,2]}')]
    events = streamgen.chat_stream("cc", [calls, calls, calls[:1]], rng)
    done = assemble(CHAT, encode(events))
    assert sorted(c.call_id for c in done) == ["c1", "c1#1", "c1#2", "c2", "c2#1"]
    assert all(c.incomplete is None for c in done)
    assert orjson.loads(done[0].arguments) in ({"x": 1}, {"y": [1, 2]})


def test_a_stream_of_more_choices_than_its_bound_is_broken() -> None:
    adapter = OpenAIChatAdapter("s1", {}, None, max_calls=2)
    adapter.feed(chunk(0, content="a"))
    adapter.feed(chunk(1, content="b"))
    with pytest.raises(InputFormatError, match="more than 2 choices"):
        adapter.feed(chunk(2, content="c"))
