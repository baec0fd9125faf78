"""The Chat Completions adapter: chunks, finish reasons, n > 1, refusals, errors, bad input."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.adapters import streamgen
from tests.adapters.oracles import assemble, chunks_of, encode
from worker.adapters.decoder import Decoder
from worker.adapters.openai_chat import OpenAIChatAdapter
from worker.core.processor import InboundRecord, Processor
from worker.errors import InputFormatError
from worker.model import ChunkKind, FinishReason, IncompleteReason, Outcome
from worker.settings import load_settings

FMT = "openai.chat"


def chunk(index: int = 0, finish: str | None = None, **delta: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    }


def tool(index: int, arguments: str, call_id: str | None = None, name: str | None = None) -> Any:
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id:
        call["id"] = call_id
        call["type"] = "function"
    if name:
        call["function"]["name"] = name
    return [call]


def shell_stream(finish: str) -> list[dict[str, Any]]:
    return [
        chunk(role="assistant", content=None),
        chunk(tool_calls=tool(0, "", "call_1", "run_shell")),
        chunk(tool_calls=tool(0, '{"argv":')),
        chunk(tool_calls=tool(0, '["ls","pwd"')),
        chunk(finish=finish),
    ]


def test_first_chunk_names_the_tool_then_deltas_then_final_on_tool_calls() -> None:
    chunks = chunks_of(FMT, encode(shell_stream("tool_calls")))
    calls = [c for c in chunks if c.kind is ChunkKind.TOOL_CALL]
    assert [(c.call_id, c.tool, c.delta, c.final) for c in calls] == [
        ("call_1", "run_shell", "", False),
        ("call_1", None, '{"argv":', False),
        ("call_1", None, '["ls","pwd"', False),
        ("call_1", None, "", True),
    ]
    assert all(c.seq is None for c in calls)
    assert chunks[-1].kind is ChunkKind.END
    assert chunks[-1].finish_reason is FinishReason.TOOL_CALLS


@pytest.mark.parametrize(
    ("finish", "reason"),
    [("length", IncompleteReason.MAX_TOKENS), ("content_filter", IncompleteReason.CONTENT_FILTER)],
)
def test_a_cut_choice_leaves_its_calls_open_so_they_are_incomplete(
    finish: str, reason: IncompleteReason
) -> None:
    chunks = chunks_of(FMT, encode(shell_stream(finish)))
    assert not any(c.final for c in chunks)
    (call,) = assemble(FMT, encode(shell_stream(finish)), flush=False)
    assert call.incomplete is reason
    assert call.arguments == b'{"argv":["ls","pwd"'


def test_tool_calls_reported_for_a_cut_call_is_never_accepted_by_the_chain(tmp_path: Path) -> None:
    # Known in the field: finish_reason "tool_calls" for a call cut off by max_tokens.
    schemas = tmp_path / "ops"
    schemas.mkdir()
    (schemas / "run_shell.v1.schema.json").write_bytes(
        orjson.dumps(
            {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {"argv": {"type": "array", "items": {"type": "string"}}},
                "required": ["argv"],
                "additionalProperties": False,
            }
        )
    )
    processor = Processor.from_settings(load_settings(schemas={"dir": tmp_path}))
    emissions = []
    for offset, value in enumerate(encode(shell_stream("tool_calls"))):
        record = InboundRecord("in", 0, offset, b"s1", value, {"content-format": FMT})
        emissions += processor.feed(record, now=0.0)
    emissions += processor.flush()
    (emission,) = emissions
    assert emission.verdict.outcome is Outcome.REJECTED
    assert emission.verdict.code == "invalid_json"
    # and the same call, complete, is accepted: the chain is not rejecting everything
    whole = [*shell_stream("tool_calls")]
    whole.insert(4, chunk(tool_calls=tool(0, "]}")))
    emissions = []
    for offset, value in enumerate(encode(whole)):
        record = InboundRecord("in", 1, offset, b"s2", value, {"content-format": FMT})
        emissions += processor.feed(record, now=0.0)
    (emission,) = emissions
    assert emission.verdict.outcome is Outcome.ACCEPTED


def test_choices_get_their_own_ids_and_the_stream_ends_after_the_last_choice() -> None:
    events = [
        chunk(0, role="assistant"),
        chunk(1, role="assistant"),
        chunk(0, tool_calls=tool(0, '{"a":1}', "call_same", "t")),
        chunk(1, tool_calls=tool(0, '{"a":', "call_same", "t")),
        chunk(0, finish="tool_calls"),
    ]
    decoder = Decoder()
    chunks = [c for e in encode(events) for c in decoder.decode(e, fmt=FMT, key=b"s1")]
    assert all(c.kind is not ChunkKind.END for c in chunks)  # choice 1 is still going
    assert {c.call_id for c in chunks} == {"call_same", "call_same:1"}
    tail = decoder.decode(orjson.dumps(chunk(1, finish="length")), fmt=FMT, key=b"s1")
    assert tail[-1].kind is ChunkKind.END
    assert tail[-1].finish_reason is FinishReason.LENGTH
    assert decoder.open_streams == 0

    done = assemble(FMT, encode([*events, chunk(1, finish="length")]), flush=False)
    by_id = {c.call_id: c for c in done}
    assert by_id["call_same"].incomplete is None
    assert by_id["call_same"].arguments == b'{"a":1}'
    assert by_id["call_same:1"].incomplete is IncompleteReason.MAX_TOKENS


def test_refusal_becomes_a_refusal_channel_closed_at_stop() -> None:
    events = [
        chunk(role="assistant", refusal=""),
        chunk(refusal="I can't"),
        chunk(refusal=" help."),
        chunk(finish="stop"),
    ]
    chunks = chunks_of(FMT, encode(events), stream_id="r9")
    refusal = [c for c in chunks if c.kind is ChunkKind.REFUSAL]
    assert {c.call_id for c in refusal} == {"r9:refusal"}
    assert "".join(c.delta for c in refusal) == "I can't help."
    assert refusal[-1].final
    assert chunks[-1].finish_reason is FinishReason.REFUSAL


def test_text_is_not_a_call_and_the_trailing_usage_chunk_is_ignored() -> None:
    events = [chunk(role="assistant", content=""), chunk(content="Hello"), chunk(finish="stop")]
    usage = {"id": "chatcmpl-1", "choices": [], "usage": {"total_tokens": 3}}
    decoder = Decoder()
    chunks = [c for e in encode([*events, usage]) for c in decoder.decode(e, fmt=FMT, key=b"s")]
    assert [(c.kind, c.finish_reason) for c in chunks] == [(ChunkKind.END, FinishReason.STOP)]
    assert decoder.open_streams == 0


def test_usage_chunk_ends_a_stream_whose_choice_never_finished() -> None:
    events = [chunk(tool_calls=tool(0, "{", "c1", "t")), {"id": "x", "choices": [], "usage": {}}]
    (call,) = assemble(FMT, encode(events), flush=False)
    assert call.incomplete is IncompleteReason.STREAM_ENDED


def test_a_stream_error_is_an_error_chunk_without_the_vendor_message() -> None:
    event = {"error": {"message": "secret prompt text leaked here", "type": "server_error"}}
    chunks = chunks_of(FMT, encode([chunk(tool_calls=tool(0, "{", "c1", "t")), event]))
    error = next(c for c in chunks if c.kind is ChunkKind.ERROR)
    assert (error.call_id, error.delta, error.final) == ("s1:error", "server_error", True)
    assert chunks[-1].finish_reason is FinishReason.ERROR
    assert all("secret" not in c.delta for c in chunks)


def test_missing_vendor_ids_get_a_deterministic_one() -> None:
    events = [chunk(tool_calls=tool(0, "{}", None, "t")), chunk(finish="tool_calls")]
    (call,) = assemble(FMT, encode(events), stream_id="st")
    assert call.call_id == "st:0:0"


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([{"choices": {}}], "'choices' must be an array"),
        ([{"choices": [{"delta": {}}]}], "'index' must be an integer"),
        ([chunk(tool_calls=tool(0, "{"))], "needs its name"),
        ([chunk(tool_calls={"index": 0})], "tool_calls must be an array"),
        (
            [chunk(tool_calls=tool(0, "", "a", "t")), chunk(tool_calls=tool(0, "", "b"))],
            "id changed",
        ),
        (
            [chunk(tool_calls=tool(0, "", "a", "t")), chunk(tool_calls=tool(1, "", "a", "t"))],
            "repeats another call's id",
        ),
        (
            [
                chunk(tool_calls=tool(0, "{", "a", "t")),
                chunk(finish="length"),
                chunk(tool_calls=tool(0, "}")),
            ],
            "needs its name",  # the stream ended: a late delta is a call without a start
        ),
        ([chunk(function_call={"name": "f", "arguments": ""})], "legacy"),
        ([chunk(tool_calls=[{"index": 0, "function": {"name": "t", "arguments": 5}}])], "string"),
    ],
)
def test_malformed_events_raise_a_specific_input_format_error(
    events: list[dict[str, Any]], message: str
) -> None:
    decoder = Decoder()
    *before, last = encode(events)
    for event in before:
        decoder.decode(event, fmt=FMT, key=b"s1")
    with pytest.raises(InputFormatError, match=message):
        decoder.decode(last, fmt=FMT, key=b"s1")


def test_the_adapter_refuses_events_after_its_end() -> None:
    adapter = OpenAIChatAdapter("s1", {})
    adapter.feed(chunk(finish="stop"))
    assert adapter.finished
    with pytest.raises(InputFormatError, match="after the end of the stream"):
        adapter.feed(chunk(content="x"))


def test_n_choices_from_the_generator_keep_every_call() -> None:
    rng = random.Random(7)
    calls = [("c1", "a", '{"x":1}'), ("c2", "b", '{"y":[1,2]}')]
    events = streamgen.chat_stream("cc", [calls, calls, calls[:1]], rng)
    done = assemble(FMT, encode(events))
    assert sorted(c.call_id for c in done) == ["c1", "c1:1", "c1:2", "c2", "c2:1"]
    assert all(c.incomplete is None for c in done)
