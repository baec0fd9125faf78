"""The Gemini adapter: whole and streamed (`partialArgs`) calls, derived call ids, every finish
reason, and every event it cannot place breaking the calls it could belong to."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.adapters import streamgen
from tests.adapters.oracles import GEMINI, assemble, chunks_of, encode, sdk_calls
from worker.adapters.gemini import GeminiAdapter, parse_path
from worker.errors import InputFormatError
from worker.model import ChunkKind, Code, FinishReason, IncompleteReason

CALLS = [streamgen.WEATHER, streamgen.STOCK, streamgen.SHELL]


def stream(calls: list[Any] | None = None, **options: Any) -> list[dict[str, Any]]:
    return streamgen.gemini_stream("g1", calls or [streamgen.WEATHER], random.Random(1), **options)


def outcomes(events: list[dict[str, Any]], stream_id: str = "s1") -> dict[str, str]:
    return {
        call.call_id: call.incomplete or call.assembly_error or "complete"
        for call in assemble(GEMINI, encode(events), stream_id)
    }


def chunk(*parts: dict[str, Any], finish: str | None = None, index: int | None = None) -> Any:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}}
    if finish is not None:
        candidate["finishReason"] = finish
    if index is not None:
        candidate["index"] = index
    return {"candidates": [candidate]}


def call(**fields: Any) -> dict[str, Any]:
    return {"functionCall": fields}


def piece(path: str, **value: Any) -> dict[str, Any]:
    return call(partialArgs=[{"jsonPath": path, **value}], willContinue=True)


def test_whole_calls_of_one_chunk_are_parallel_calls_with_ids_from_their_position() -> None:
    events = stream(CALLS)
    assert sum("functionCall" in p for p in events[1]["candidates"][0]["content"]["parts"]) == 2
    done = assemble(GEMINI, encode(events), "st", flush=False)
    assert [(c.call_id, c.tool, c.arguments.decode(), c.incomplete) for c in done] == [
        ("st#0#0", "get_weather", streamgen.WEATHER[2], None),
        ("st#0#1", "get_stock_price", streamgen.STOCK[2], None),
        ("st#0#2", "run_shell", streamgen.SHELL[2], None),
    ]
    # the same stream under the same key names the same calls: a replay decides as the first
    assert [c.call_id for c in assemble(GEMINI, encode(events), "st")] == [c.call_id for c in done]


def test_a_vendor_id_names_the_call() -> None:
    events = stream(CALLS[:2], with_ids=True)
    assert outcomes(events) == {"call_weather_1": "complete", "call_stock_2": "complete"}


def test_calls_are_held_until_the_candidate_finishes() -> None:
    events = stream(CALLS)
    chunks = chunks_of(GEMINI, encode(events[:-1]))
    assert chunks
    assert not any(c.final for c in chunks)
    last = chunks_of(GEMINI, encode(events))
    assert [c.call_id for c in last if c.final] == ["s1#0#0", "s1#0#1", "s1#0#2"]
    assert (last[-1].kind, last[-1].finish_reason) == (ChunkKind.END, FinishReason.TOOL_CALLS)


def test_partial_arguments_are_written_as_json_in_document_order() -> None:
    events = [
        chunk(call(name="cook", willContinue=True)),
        chunk(piece("$.recipe.title", stringValue="Las", willContinue=True)),
        chunk(piece("$.recipe.title", stringValue='agna "al" forno')),
        chunk(piece("$.recipe['serves n']", numberValue=4)),
        chunk(piece("$.recipe.steps[0]", stringValue="Boil")),
        chunk(piece("$.recipe.steps[1]", stringValue="Bake")),
        chunk(piece("$.recipe.vegan", boolValue=False)),
        chunk(piece("$.notes", nullValue="NULL_VALUE")),
        chunk(call()),
        chunk({"text": ""}, finish="STOP"),
    ]
    (done,) = assemble(GEMINI, encode(events), flush=False)
    expected = {
        "recipe": {
            "title": 'Lasagna "al" forno',
            "serves n": 4,
            "steps": ["Boil", "Bake"],
            "vegan": False,
        },
        "notes": None,
    }
    assert (done.tool, orjson.loads(done.arguments), done.incomplete) == ("cook", expected, None)
    assert orjson.loads(sdk_calls(GEMINI, events).calls["s1#0#0"].arguments) == expected


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("$.a", ["a"]),
        ("$.a.b[0][12]", ["a", "b", 0, 12]),
        ("$['a.b']", ["a.b"]),
        ('$["it\'s"]["x\\ty"]', ["it's", "x\ty"]),
        ("$['\\u00e9\\'']", ["é'"]),
        ("$.é_1", ["é_1"]),
    ],
)
def test_json_paths(text: str, steps: list[Any]) -> None:
    assert parse_path(text, "t") == steps


@pytest.mark.parametrize("text", ["a", "$.", "$.1a", "$[01]", "$[-1]", "$[*]", "$..a", "$['a]"])
def test_json_paths_that_are_refused(text: str) -> None:
    with pytest.raises(InputFormatError):
        parse_path(text, "t")


def _partial(*pieces: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        chunk(call(name="t", willContinue=True)),
        *[chunk(p) for p in pieces],
        chunk(call()),
        chunk(finish="STOP"),
    ]


#: partial streams that cannot be placed, and what the malformed record says
UNPLACEABLE = {
    "a key again": (
        [piece("$.a", numberValue=1), piece("$.b", numberValue=2), piece("$.a", numberValue=3)],
        "is not after",
    ),
    "back into a closed object": (
        [piece("$.a.x", numberValue=1), piece("$.b", numberValue=2), piece("$.a.y", numberValue=3)],
        "is not after",
    ),
    "an array from 1": ([piece("$.a[1]", numberValue=1)], "an array starts at [0]"),
    "an index skipped": (
        [piece("$.a[0]", numberValue=1), piece("$.a[2]", numberValue=1)],
        "is not after",
    ),
    "into a scalar": (
        [piece("$.a", numberValue=1), piece("$.a.b", numberValue=1)],
        "is not after",
    ),
    "the root": ([piece("$", numberValue=1)], "the arguments are an object"),
    "a string left open": (
        [piece("$.a", stringValue="x", willContinue=True), piece("$.b", numberValue=1)],
        "is not finished",
    ),
    "two values": ([piece("$.a", numberValue=1, boolValue=True)], "exactly one of"),
    "a number that continues": (
        [piece("$.a", numberValue=1, willContinue=True)],
        "only a string continues",
    ),
    "an unknown member": (
        [call(partialArgs=[{"jsonPath": "$.a", "numberValue": 1, "note": 1}])],
        "a member the API does not define",
    ),
    "a bad null": ([piece("$.a", nullValue=None)], "'nullValue' must be 'NULL_VALUE'"),
}


@pytest.mark.parametrize("what", UNPLACEABLE)
def test_a_partial_value_that_cannot_be_placed_breaks_the_call(what: str) -> None:
    pieces, message = UNPLACEABLE[what]
    calls = {c.call_id: c for c in assemble(GEMINI, encode(_partial(*pieces)))}
    (record,) = [c for c in calls.values() if c.assembly_error == Code.MALFORMED_RECORD]
    assert message in (record.assembly_detail or "")
    assert calls["s1#0#0"].incomplete == IncompleteReason.STREAM_CORRUPT


_NOT_STRINGS = st.one_of(
    st.integers(-(2**53), 2**53),
    st.floats(-1e18, 1e18),
    st.booleans(),
    st.none(),
)


@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_a_value_that_is_not_the_next_piece_of_an_open_string_breaks_the_stream(
    seed: int, data: st.DataObject
) -> None:
    # the string's next piece replaced by a number, boolean or null at the same path: written
    # into the string, `numberValue: 123` after "Par" made the accepted text "Par2"
    rng = random.Random(seed)
    calls = [(f"c{i}", f"tool_{i}", streamgen.arguments(rng)) for i in range(rng.randint(1, 3))]
    events = streamgen.gemini_stream("g1", calls, rng, partial=True)
    open_at = [
        i
        for i, event in enumerate(events)
        for part in event["candidates"][0]["content"]["parts"]
        if part.get("functionCall", {}).get("partialArgs", [{}])[0].get("willContinue")
    ]
    at = data.draw(st.sampled_from(open_at)) + 1
    (part,) = events[at]["candidates"][0]["content"]["parts"]
    path = part["functionCall"]["partialArgs"][0]["jsonPath"]
    value = streamgen._partial_arg(path, data.draw(_NOT_STRINGS))
    part["functionCall"]["partialArgs"] = [value]
    done = assemble(GEMINI, encode(events))
    (record,) = [c for c in done if c.assembly_error == Code.MALFORMED_RECORD]
    assert "is not finished" in (record.assembly_detail or "")
    opened = sum("name" in p.get("functionCall", {}) for e in events[:at] for p in _parts(e))
    assert {c.call_id: c.incomplete for c in done if c is not record} == {
        f"s1#0#{n}": IncompleteReason.STREAM_CORRUPT for n in range(opened)
    }


def _parts(event: dict[str, Any]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = event["candidates"][0]["content"]["parts"]
    return parts


def test_a_call_that_ends_inside_an_open_string_breaks_the_stream() -> None:
    events = [
        chunk(call(name="t", willContinue=True)),
        chunk(call(partialArgs=[{"jsonPath": "$.a", "stringValue": "x", "willContinue": True}])),
        chunk(finish="STOP"),
    ]
    assert outcomes(events)["s1#0#0"] == IncompleteReason.STREAM_CORRUPT


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        ("SAFETY", IncompleteReason.CONTENT_FILTER),
        ("RECITATION", IncompleteReason.CONTENT_FILTER),
        ("PROHIBITED_CONTENT", IncompleteReason.CONTENT_FILTER),
        ("OTHER", IncompleteReason.STREAM_ENDED),
        ("TOO_MANY_TOOL_CALLS", IncompleteReason.STREAM_ENDED),
        ("A_REASON_NOT_KNOWN_YET", IncompleteReason.STREAM_ENDED),
    ],
)
def test_finish_reasons_that_release_nothing(finish: str, expected: str) -> None:
    assert outcomes(stream(CALLS[:2], finish=finish)) == {
        "s1#0#0": expected,
        "s1#0#1": expected,
    }


@pytest.mark.parametrize(
    ("finish", "code"),
    [
        ("MALFORMED_FUNCTION_CALL", Code.MALFORMED_TOOL_CALL),
        ("UNEXPECTED_TOOL_CALL", Code.UNEXPECTED_TOOL_CALL),
    ],
)
def test_the_vendors_verdict_on_a_call_is_a_rejection_of_its_own_code(
    finish: str, code: str
) -> None:
    events = [
        chunk({"text": "Sure."}),
        {
            "candidates": [
                {
                    "content": {"role": "model", "parts": []},
                    "finishReason": finish,
                    "finishMessage": "Malformed function call: print(default_api.secret('x'))",
                }
            ]
        },
    ]
    (record,) = assemble(GEMINI, encode(events))
    assert (record.call_id, record.assembly_error) == ("record:in:0:1", code)
    assert "secret" not in (record.assembly_detail or "")
    # a call seen before it is not released
    assert outcomes([chunk(call(name="t", args={})), *events[1:]])["s1#0#0"] == (
        IncompleteReason.STREAM_ENDED
    )


def test_max_tokens_keeps_the_calls_a_part_came_after_and_cuts_the_last() -> None:
    events = stream(CALLS, finish="MAX_TOKENS")
    assert outcomes(events) == {
        "s1#0#0": "complete",
        "s1#0#1": "complete",
        "s1#0#2": IncompleteReason.MAX_TOKENS,
    }
    text_after = [*events[:-1], chunk({"text": "That is all."}), events[-1]]
    assert set(outcomes(text_after).values()) == {"complete"}


def test_max_tokens_inside_streamed_arguments_cuts_that_call() -> None:
    events = stream(CALLS[:2], partial=True, finish="MAX_TOKENS", cut_after=9)
    assert outcomes(events) == {"s1#0#0": "complete", "s1#0#1": IncompleteReason.MAX_TOKENS}
    # the joined pieces are a plausible object...
    assert sdk_calls(GEMINI, events).calls["s1#0#1"].arguments.startswith('{"ticker"')


def test_stop_with_a_call_still_streaming_ends_it_incomplete() -> None:
    events = stream([streamgen.WEATHER], partial=True)
    cut = [e for e in events if e["candidates"][0]["content"]["parts"] != [{"functionCall": {}}]]
    assert outcomes(cut) == {"s1#0#0": IncompleteReason.STREAM_ENDED}


def test_two_candidates_name_their_calls_apart_and_end_the_stream_together() -> None:
    first = chunk(call(name="a", args={"x": 1}, id="c1"))
    second = chunk(call(name="b", args={"y": 2}, id="c1"), index=1)
    events = [first, second, chunk(finish="STOP"), chunk(finish="MAX_TOKENS", index=1)]
    chunks = chunks_of(GEMINI, encode(events))
    assert not any(c.kind == ChunkKind.END for c in chunks_of(GEMINI, encode(events[:3])))
    assert (chunks[-1].kind, chunks[-1].finish_reason) == (ChunkKind.END, None)
    assert outcomes(events) == {"c1": "complete", "c1#1": IncompleteReason.MAX_TOKENS}
    assert set(sdk_calls(GEMINI, events).calls) == {"c1", "c1#1"}


#: a candidate as generated: its calls (how many), whether text follows them, its finish reason
_CANDIDATE = st.tuples(
    st.integers(1, 2),
    st.booleans(),
    st.sampled_from(["STOP", "MAX_TOKENS", "SAFETY", "OTHER", "MALFORMED_FUNCTION_CALL"]),
)


def _candidate_events(index: int, calls: int, text_after: bool, finish: str) -> list[Any]:
    parts = [call(name=f"t{n}", args={"n": n}) for n in range(calls)]
    if text_after:
        parts.append({"text": "done"})
    return [chunk(*parts, index=index), chunk(finish=finish, index=index)]


@given(st.lists(_CANDIDATE, min_size=2, max_size=3))
def test_each_call_ends_as_its_own_candidate_finished(
    candidates: list[tuple[int, bool, str]],
) -> None:
    """A call of a response of several candidates ends exactly as it would in a response of
    its candidate alone, whatever the other candidates' finish reasons."""
    contents = [_candidate_events(k, *c)[0] for k, c in enumerate(candidates)]
    finishes = [_candidate_events(k, *c)[1] for k, c in enumerate(candidates)]
    together = {k: v for k, v in outcomes(contents + finishes).items() if k.startswith("s1#")}
    for k, candidate in enumerate(candidates):
        alone = outcomes(_candidate_events(0, *candidate))
        assert {f"s1#{k}#{n}": alone[f"s1#0#{n}"] for n in range(candidate[0])} == {
            f"s1#{k}#{n}": together[f"s1#{k}#{n}"] for n in range(candidate[0])
        }


def test_continuation_does_not_end_the_candidate() -> None:
    events = [chunk(call(name="a", args={})), chunk(finish="CONTINUATION"), chunk(finish="STOP")]
    assert not any(c.kind == ChunkKind.END for c in chunks_of(GEMINI, encode(events[:2])))
    assert outcomes(events) == {"s1#0#0": "complete"}


def test_a_blocked_prompt_ends_the_stream_filtered() -> None:
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {}}
    (end,) = chunks_of(GEMINI, encode([blocked]))
    assert (end.kind, end.finish_reason) == (ChunkKind.END, FinishReason.CONTENT_FILTER)


def test_an_error_chunk_is_a_vendor_error_with_a_short_code() -> None:
    events = [
        chunk(call(name="a", args={})),
        {"error": {"code": 503, "status": "UNAVAILABLE", "message": "user text here"}},
    ]
    chunks = chunks_of(GEMINI, encode(events))
    error = next(c for c in chunks if c.kind == ChunkKind.ERROR)
    assert error.delta == "UNAVAILABLE"
    assert outcomes(events)["s1#0#0"] == IncompleteReason.STREAM_ENDED


#: whole-call streams that cannot be placed
BROKEN = {
    "a call without a name": ([chunk(call(args={}))], "needs its 'name'"),
    "args not an object": ([chunk(call(name="a", args=[1]))], "'args' must be an object"),
    "args and partialArgs": (
        [chunk(call(name="a", args={}, partialArgs=[]))],
        "either 'args' or 'partialArgs'",
    ),
    "an id twice": (
        [chunk(call(name="a", args={}, id="x"), call(name="b", args={}, id="x"))],
        "repeats another call's id",
    ),
    "a user's role": ([{"candidates": [{"content": {"role": "user"}}]}], "must be 'model'"),
    "a candidate out of order": ([chunk(call(name="a", args={}), index=2)], "the next index"),
    "parts not an array": ([{"candidates": [{"content": {"parts": {}}}]}], "'parts' must be"),
    "a new call while one streams": (
        [chunk(call(name="a", willContinue=True)), chunk(call(name="b", args={}))],
        "a new call while",
    ),
}


@pytest.mark.parametrize("what", BROKEN)
def test_an_event_that_cannot_be_placed_breaks_the_stream(what: str) -> None:
    before = chunk(call(name="first", args={"k": 1}))
    changes, message = BROKEN[what]
    calls = {
        c.call_id: c for c in assemble(GEMINI, encode([before, *changes, chunk(finish="STOP")]))
    }
    record = next(c for c in calls.values() if c.assembly_error == Code.MALFORMED_RECORD)
    assert message in (record.assembly_detail or "")
    assert calls["s1#0#0"].incomplete == IncompleteReason.STREAM_CORRUPT


def test_a_content_after_the_finish_is_refused() -> None:
    adapter = GeminiAdapter("s1", {}, None, max_calls=10)
    adapter.feed(chunk(call(name="a", args={}), index=0))
    adapter.feed(chunk(call(name="b", args={}), index=1))
    adapter.feed(chunk(finish="STOP", index=0))
    with pytest.raises(InputFormatError, match="after the candidate's finishReason"):
        adapter.feed(chunk(call(name="c", args={}), index=0))


def test_the_adapter_state_survives_a_checkpoint_mid_string() -> None:
    events = stream(CALLS, partial=True)
    whole = GeminiAdapter("s1", {}, None, max_calls=10)
    restored = GeminiAdapter("s1", {}, None, max_calls=10)
    out_whole, out_restored = [], []
    for event in events:
        out_whole += whole.feed(event)
        state = orjson.loads(orjson.dumps(restored.state()))
        restored = GeminiAdapter("s1", {}, state, max_calls=10)
        out_restored += restored.feed(event)
    assert [(c.call_id, c.delta, c.final) for c in out_whole] == [
        (c.call_id, c.delta, c.final) for c in out_restored
    ]


def test_a_stream_past_its_bound_of_calls_is_broken() -> None:
    adapter = GeminiAdapter("s1", {}, None, max_calls=1)
    with pytest.raises(InputFormatError, match="more than 1 calls"):
        adapter.feed(chunk(call(name="a", args={}), call(name="b", args={})))
