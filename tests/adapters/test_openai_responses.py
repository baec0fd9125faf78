"""The Responses API adapter: parallel calls, every final form of a call's text checked, incomplete
mid-call, sequence numbers, and every event it cannot place breaking the calls it could belong
to."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.adapters import streamgen
from tests.adapters.oracles import RECORDED, RESPONSES, assemble, chunks_of, encode, sdk_calls
from tests.datafiles import SCHEMAS
from worker.adapters.input import read_records
from worker.adapters.openai_responses import UNJUDGED_KINDS, OpenAIResponsesAdapter
from worker.compose import build_gate, build_registry
from worker.errors import InputFormatError
from worker.model import ChunkKind, Code, FinishReason, IncompleteReason
from worker.settings import Settings

SETTINGS = Settings(schemas={"dir": SCHEMAS})
GATE = build_gate(SETTINGS, build_registry(SETTINGS))
CALLS = [streamgen.WEATHER, streamgen.STOCK, streamgen.SHELL]
DELTA = "response.function_call_arguments.delta"
ARGS_DONE = "response.function_call_arguments.done"
ITEM_DONE = "response.output_item.done"
ADDED = "response.output_item.added"
COMPLETED = "response.completed"


def stream(calls: list[Any] | None = None, **options: Any) -> list[dict[str, Any]]:
    options.setdefault("numbered", False)
    return streamgen.responses_stream(
        "r1", calls or [streamgen.WEATHER], random.Random(1), **options
    )


def outcomes(events: list[dict[str, Any]], *, flush: bool = True) -> dict[str, str]:
    return {
        call.call_id: call.incomplete or call.assembly_error or "complete"
        for call in assemble(RESPONSES, encode(events), flush=flush)
    }


def at(events: list[dict[str, Any]], kind: str) -> int:
    return next(i for i, e in enumerate(events) if e["type"] == kind)


def test_parallel_calls_interleave_and_are_released_at_the_completed_response() -> None:
    events = stream(CALLS, numbered=False)
    owners = [e["item_id"] for e in events if e["type"] == DELTA]
    assert len(owners) > 6
    assert owners != sorted(owners)  # really interleaved
    chunks = chunks_of(RESPONSES, encode(events))
    firsts = sorted((c.call_id, c.tool) for c in chunks if c.tool is not None)
    assert firsts == sorted((c[0], c[1]) for c in CALLS)
    finals = [c for c in chunks if c.final]
    assert {c.call_id: c.expected for c in finals} == {c[0]: c[2] for c in CALLS}
    assert not any(c.final for c in chunks_of(RESPONSES, encode(events[:-1])))
    assert chunks[-1].finish_reason == FinishReason.TOOL_CALLS
    done = assemble(RESPONSES, encode(events), flush=False)
    assert sorted((c.call_id, c.tool, c.arguments.decode()) for c in done) == sorted(CALLS)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("max_output_tokens", IncompleteReason.MAX_TOKENS),
        ("content_filter", IncompleteReason.CONTENT_FILTER),
    ],
)
def test_incomplete_mid_call_releases_the_finished_call_and_leaves_the_other_open(
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
    assert outcomes(events, flush=False) == {"call_weather_1": "complete", "call_shell_3": expected}
    # the SDK hands back the cut call's partial text as a plain string
    assert sdk_calls(RESPONSES, events).calls["call_shell_3"].arguments.startswith('{"argv')


def test_the_recorded_incomplete_response_payload_ends_a_stream_as_max_tokens() -> None:
    payload = orjson.loads(
        (
            RECORDED / "openai_responses" / "dotnet_nonstream_incomplete_max_output_tokens.json"
        ).read_bytes()
    )
    events = stream([streamgen.SHELL], cut_after=2)
    events[-1]["response"] = {**payload, "id": "r1", "output": []}
    assert outcomes(events, flush=False) == {"call_shell_3": IncompleteReason.MAX_TOKENS}


@given(
    seed=st.integers(0, 2**32 - 1),
    cut_after=st.none() | st.integers(0, 12),
    status=st.sampled_from(["incomplete", "in_progress", "failed", "searching"]),
    item_done=st.booleans(),
    data=st.data(),
)
def test_a_call_whose_final_item_says_it_did_not_finish_is_never_released(
    seed: int, cut_after: int | None, status: str, item_done: bool, data: st.DataObject
) -> None:
    # the final response is a final form of each call too: one whose item there said it was
    # cut was released whole once its `.done` had come (a cut call accepted)
    rng = random.Random(seed)
    calls = [(f"call_{i}", f"tool_{i}", streamgen.arguments(rng)) for i in range(rng.randint(1, 3))]
    events = streamgen.responses_stream(
        "r1", calls, rng, numbered=rng.random() < 0.5, cut_after=cut_after
    )
    finished = sorted({e["output_index"] for e in events if e["type"] == ARGS_DONE})
    assume(finished)
    index = data.draw(st.sampled_from(finished))
    if not item_done:  # the item's own `.done` lost: the final response alone says it
        events = [e for e in events if (e["type"], e.get("output_index")) != (ITEM_DONE, index)]
        for number, event in enumerate(events):
            if "sequence_number" in event:
                event["sequence_number"] = number
    before = outcomes(events)
    (final,) = [i for i in events[-1]["response"]["output"] if i["call_id"] == f"call_{index}"]
    final["status"] = status
    found = outcomes(events)
    if cut_after is None:  # a response that completed with a call unfinished: unplaceable
        assert found.pop(f"record:in:0:{len(events) - 1}") == "malformed_record"
        assert found == dict.fromkeys(before, IncompleteReason.STREAM_CORRUPT)
    else:  # a cut response: that call is cut, the others end as they did
        assert found == {**before, f"call_{index}": IncompleteReason.MAX_TOKENS}


def test_a_lost_event_turns_the_streaming_calls_into_a_sequence_gap() -> None:
    events = stream(numbered=True)
    lost = at(events, DELTA) + 1
    assert events[lost]["type"] == DELTA
    assert outcomes([*events[:lost], *events[lost + 1 :]]) == {
        "call_weather_1": IncompleteReason.SEQUENCE_GAP
    }


def test_a_replayed_event_breaks_the_stream() -> None:
    events = stream(numbered=True)
    first = at(events, DELTA)
    replayed = [*events[: first + 1], events[first], *events[first + 1 :]]
    assert outcomes(replayed) == {
        f"record:in:0:{first + 1}": "malformed_record",
        "call_weather_1": IncompleteReason.STREAM_CORRUPT,
    }


def test_a_stream_without_sequence_numbers_numbers_nothing() -> None:
    assert all(c.seq is None for c in chunks_of(RESPONSES, encode(stream())))
    numbered = chunks_of(RESPONSES, encode(stream(numbered=True)))
    seqs = [c.seq for c in numbered if c.kind == ChunkKind.TOOL_CALL]
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
        {"type": "response.created", "response": {"id": "r", "output": []}},
        {"type": ITEM_DONE, "output_index": 0, "item": item},
        {"type": COMPLETED, "response": {"id": "r", "output": [item]}},
    ]
    (call,) = assemble(RESPONSES, encode(events), flush=False)
    assert (call.call_id, call.tool, call.arguments, call.incomplete) == (
        "call_1",
        "t",
        b'{"a":1}',
        None,
    )


def test_refusal_events_become_the_refusal_channel() -> None:
    events = [
        {"type": "response.created", "response": {"id": "r", "output": []}},
        {"type": "response.refusal.delta", "delta": "No,"},
        {"type": "response.refusal.delta", "delta": " sorry."},
        {"type": "response.refusal.done", "refusal": "No, sorry."},
        {"type": COMPLETED, "response": {"id": "r", "output": []}},
    ]
    chunks = chunks_of(RESPONSES, encode(events), stream_id="q")
    assert chunks[-1].finish_reason == FinishReason.REFUSAL
    (call,) = assemble(RESPONSES, encode(events), stream_id="q", flush=False)
    assert (call.call_id, call.channel, call.arguments) == ("q#refusal", "refusal", b"No, sorry.")


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
                "response": {"id": "r1", "error": {"code": "server_error"}},
            },
            "server_error",
        ),
        ({"type": "response.failed", "response": {"id": "r1", "error": None}}, "response_failed"),
        ({"type": "response.in_progress", "error": {"code": "server_error"}}, "server_error"),
    ],
)
def test_vendor_errors_are_error_chunks_with_a_short_code(event: dict[str, Any], code: str) -> None:
    events = stream()
    events = [*events[: at(events, ARGS_DONE) + 1], event]  # the call finished, not released
    chunks = chunks_of(RESPONSES, encode(events))
    error = next(c for c in chunks if c.kind == ChunkKind.ERROR)
    assert (error.call_id, error.delta, error.final) == ("s1#error", code, True)
    assert chunks[-1].finish_reason == FinishReason.ERROR
    assert outcomes(events, flush=False)["call_weather_1"] == IncompleteReason.STREAM_ENDED


def _change(kind: str, *path: str | int, value: Any = None, delete: bool = False) -> Any:
    def change(events: list[dict[str, Any]]) -> None:
        target: Any = events[at(events, kind)]
        for step in path[:-1]:
            target = target[step]
        if delete:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return change


def _insert(kind: str, event: dict[str, Any]) -> Any:
    def change(events: list[dict[str, Any]]) -> None:
        events.insert(at(events, kind), event)

    return change


#: (a change of the one-call stream, what the malformed record says): each breaks the call
BROKEN = {
    "a delta naming another item": (
        _change(DELTA, "item_id", value="fc_other"),
        "is not output_index 0's",
    ),
    "a delta at an index with no item": (
        _change(DELTA, "output_index", value=5),
        "no item was added at output_index 5",
    ),
    "a delta without output_index": (_change(DELTA, "output_index", delete=True), "output_index"),
    "a delta not a string": (_change(DELTA, "delta", value={"x": 1}), "'delta' must be a string"),
    "a .done that differs from the item's": (
        _change(ITEM_DONE, "item", "arguments", value='{"city":"Elsewhere"}'),
        "differs from its earlier one",
    ),
    "a .done with another name": (_change(ARGS_DONE, "name", value="drain"), "'name' differs"),
    "an item done with another call_id": (
        _change(ITEM_DONE, "item", "call_id", value="call_x"),
        "call id changed",
    ),
    "an item done ending incomplete after its .done": (
        _change(ITEM_DONE, "item", "status", value="incomplete"),
        "a finished call's item ends",
    ),
    "a completed text that differs": (
        _change(COMPLETED, "response", "output", 0, "arguments", value="{}"),
        "differs from the call's .done",
    ),
    "a completed response lacking the call": (
        _change(COMPLETED, "response", "output", value=[]),
        "lacks call",
    ),
    "a completed response naming a call never streamed": (
        _change(COMPLETED, "response", "output", 0, "call_id", value="call_x"),
        "a call never streamed",
    ),
    "a completed response of another id": (
        _change(COMPLETED, "response", "id", value="r9"),
        "another response's id",
    ),
    "a delta after the .done": (
        _insert(ITEM_DONE, {"type": DELTA, "item_id": "fc_r1_0", "output_index": 0, "delta": "}"}),
        "after the call's item finished",
    ),
    "a text delta at the call's index": (
        _insert(ARGS_DONE, {"type": "response.output_text.delta", "output_index": 0, "delta": "x"}),
        "is a function_call",
    ),
    "an item added again at the call's index": (
        _insert(ARGS_DONE, {"type": ADDED, "output_index": 0, "item": {"type": "message"}}),
        "already added at output_index 0",
    ),
    "a lifecycle event with output items": (
        _insert(
            ARGS_DONE, {"type": "response.in_progress", "response": {"id": "r1", "output": [{}]}}
        ),
        "output items before the end",
    ),
    "an event with a sequence number in a stream without": (
        _change(ARGS_DONE, "sequence_number", value=99),
        "on some events of a stream only",
    ),
}


@pytest.mark.parametrize("what", BROKEN)
def test_an_event_that_cannot_be_placed_breaks_the_call(what: str) -> None:
    change, message = BROKEN[what]
    events = stream()
    change(events)
    calls = {c.call_id: c for c in assemble(RESPONSES, encode(events))}
    (record,) = [c for c in calls.values() if c.assembly_error == "malformed_record"]
    assert message in (record.assembly_detail or "")
    assert calls["call_weather_1"].incomplete == IncompleteReason.STREAM_CORRUPT


def test_done_arguments_that_contradict_the_deltas_make_the_call_stream_corrupt() -> None:
    events = stream()
    for kind in (ARGS_DONE, ITEM_DONE):
        done = events[at(events, kind)]
        (done if kind == ARGS_DONE else done["item"])["arguments"] = '{"city":"Elsewhere"}'
    events[-1]["response"]["output"][0]["arguments"] = '{"city":"Elsewhere"}'
    assert outcomes(events) == {"call_weather_1": IncompleteReason.STREAM_CORRUPT}


@pytest.mark.parametrize(
    "first",
    [
        {"type": "response.in_progress", "response": {"id": "r1", "output": []}},
        {"type": ADDED, "output_index": 0, "item": {"type": "message"}},
    ],
    ids=["in_progress", "output_item.added"],
)
def test_a_stream_must_start_with_response_created(first: dict[str, Any]) -> None:
    with pytest.raises(InputFormatError, match=r"must start with response\.created"):
        OpenAIResponsesAdapter("s1", {}, None, max_calls=10).feed(first)


def test_an_added_function_call_needs_its_arguments_string() -> None:
    events = stream()
    del events[at(events, ADDED)]["item"]["arguments"]  # the SDK would fail on the first delta
    (record,) = assemble(RESPONSES, encode(events))
    assert "'arguments' must be a string" in (record.assembly_detail or "")


def test_open_calls_names_finished_calls_until_the_final_response() -> None:
    adapter = OpenAIResponsesAdapter("s1", {}, None, max_calls=10)
    events = stream()
    for event in events[:-1]:
        adapter.feed(event)
    assert (adapter.open_calls(), adapter.held) == (["call_weather_1"], 1)
    adapter.feed(events[-1])
    assert (adapter.finished, adapter.open_calls(), adapter.held) == (True, [], 0)


def test_a_stream_past_its_bound_of_calls_is_broken() -> None:
    adapter = OpenAIResponsesAdapter("s1", {}, None, max_calls=1)
    events = stream([streamgen.WEATHER, streamgen.SHELL], parallel=False)
    second = [i for i, e in enumerate(events) if e["type"] == ADDED][1]
    for event in events[:second]:
        adapter.feed(event)
    with pytest.raises(InputFormatError, match="more than 1 calls"):
        adapter.feed(events[second])


def test_a_stream_of_more_other_items_than_its_bound_is_broken() -> None:
    adapter = OpenAIResponsesAdapter("s1", {}, None, max_calls=1)
    adapter.feed({"type": "response.created", "response": {"id": "r", "output": []}})
    adapter.feed({"type": ADDED, "output_index": 0, "item": {"type": "message"}})
    with pytest.raises(InputFormatError, match="more than 1 other items"):
        adapter.feed({"type": ADDED, "output_index": 1, "item": {"type": "reasoning"}})


def _programmatic(status_done: str = "in_progress", *, caller: bool = True) -> list[Any]:
    events = stream()
    for kind in (ADDED, ITEM_DONE):
        item = events[at(events, kind)]["item"]
        item["status"] = "in_progress" if kind == ADDED else status_done
        if caller:
            item["caller"] = {"type": "program", "caller_id": "call_program_1"}
    final = events[-1]["response"]["output"][0]
    final["status"] = status_done
    if caller:
        final["caller"] = {"type": "program", "caller_id": "call_program_1"}
    return events


def test_a_programmatic_call_is_finished_by_its_arguments_done_while_its_item_runs() -> None:
    events = _programmatic()
    assert outcomes(events) == {"call_weather_1": "complete"}
    (call,) = assemble(RESPONSES, encode(events))
    assert call.arguments.decode() == sdk_calls(RESPONSES, events).calls["call_weather_1"].arguments
    assert orjson.loads(call.caller or "") == {"type": "program", "caller_id": "call_program_1"}


def test_an_in_progress_item_is_finished_only_for_a_program_and_after_the_done() -> None:
    assert outcomes(_programmatic(caller=False))["call_weather_1"] == (
        IncompleteReason.STREAM_CORRUPT
    )
    events = _programmatic()
    del events[at(events, ARGS_DONE)]  # the item ends in_progress with no final text yet
    assert outcomes(events[:-1])["call_weather_1"] == IncompleteReason.STREAM_ENDED
    # ...and a response that says it completed with that call unfinished contradicts itself
    assert outcomes(events)["call_weather_1"] == IncompleteReason.STREAM_CORRUPT
    events = _programmatic()
    events[at(events, ITEM_DONE)]["item"]["arguments"] = '{"city":"Elsewhere"}'
    assert outcomes(events)["call_weather_1"] == IncompleteReason.STREAM_CORRUPT


#: recorded streams with a call of a kind the client runs besides function calls: its kind, call
#: id, tool and text
CLIENT_KINDS = {
    "vercel_custom_tool_call.jsonl": (
        "custom_tool_call",
        "call_custom_sql_001",
        "write_sql",
        "SELECT * FROM users WHERE age > 25",
    ),
    "vercel_apply_patch_call.jsonl": (
        "apply_patch_call",
        "call_kA46f91ZwocQyMCKyyZqRyC5",
        "apply_patch",
        '{"type":"create_file","diff":"+## Shopping Checklist\\n+\\n+- [ ] Milk\\n+- [ ] Bread'
        '\\n+- [ ] Eggs\\n+- [ ] Fresh fruit\\n+- [ ] Coffee\\n","path":"shopping-checklist.md"}',
    ),
    "vercel_local_shell_call.jsonl": (
        "local_shell_call",
        "call_h3nm8hUG0KO9tVNuRACkL1ri",
        "local_shell",
        '{"type":"exec","command":["ls","-a","~"],"env":{}}',
    ),
    "vercel_mcp_approval_request.jsonl": (
        "mcp_approval_request",
        "mcpr_04a97b4fce127879006949a83ac9308195a7f7b69ea82e91fe#approval",
        "zip1.create_short_url",
        '{"alias":"","description":"Shortened link for ai-sdk.dev","max_clicks":100,'
        '"password":"","url":"https://ai-sdk.dev/"}',
    ),
}
#: recorded streams whose only items beside function calls are run by the vendor
VENDOR_RUN = [
    "vercel_hosted_shell_call.jsonl",
    "vercel_server_tool_search_then_function_call.jsonl",
    "vercel_image_generation_call.jsonl",
    "vercel_programmatic_call_after_a_program.jsonl",
]


def _recorded(name: str) -> list[bytes]:
    with (RECORDED / "openai_responses" / name).open("rb") as fp:
        return list(read_records(fp, RESPONSES))


@pytest.mark.parametrize("name", CLIENT_KINDS)
def test_a_call_the_client_runs_is_assembled_with_its_kind(name: str) -> None:
    kind, call_id, tool, text = CLIENT_KINDS[name]
    (call,) = assemble(RESPONSES, _recorded(name))
    assert (call.call_id, call.call_kind, call.tool, call.incomplete) == (call_id, kind, tool, None)
    assert call.assembly_error is None
    assert call.arguments.decode() == text


def test_a_calls_text_that_differs_from_its_final_item_breaks_it() -> None:
    for name in CLIENT_KINDS:
        events = [orjson.loads(value) for value in _recorded(name)]
        final = events[-1]["response"]["output"]
        item = next(i for i in final if i["type"] == CLIENT_KINDS[name][0])
        field = {"custom_tool_call": "input", "mcp_approval_request": "arguments"}.get(
            item["type"], "operation" if "operation" in item else "action"
        )
        item[field] = item[field] + " " if isinstance(item[field], str) else {**item[field], "x": 1}
        calls = assemble(RESPONSES, encode(events))
        (call,) = [c for c in calls if c.call_id == CLIENT_KINDS[name][1]]
        assert call.incomplete == IncompleteReason.STREAM_CORRUPT, name


@pytest.mark.parametrize(
    "item",
    [
        {"type": "computer_call", "id": "cu_1", "call_id": "call_c"},
        {"type": "tool_search_call", "call_id": "call_t", "execution": "client"},
        {"type": "browser_call", "id": "bc_1", "call_id": "call_b"},
    ],
    ids=lambda item: item["type"],
)
def test_a_call_kind_no_contract_kind_exists_for_is_rejected_never_ignored(
    item: dict[str, Any],
) -> None:
    events = stream()
    done = {**item, "status": "completed"}
    events.insert(1, {"type": ITEM_DONE, "output_index": 5, "item": done})
    calls = {c.call_id: c for c in assemble(RESPONSES, encode(events))}
    (rejected,) = [c for c in calls.values() if c.assembly_error == Code.UNSUPPORTED_CALL_KIND]
    detail = rejected.assembly_detail or ""
    known = item["type"] in UNJUDGED_KINDS  # named; any other kind's type is the stream's text
    assert (f"of a kind {item['type']}," in detail) is known
    assert ("of a kind that callgate does not know," in detail) is not known
    assert item["call_id"] not in detail
    assert rejected.call_id == item["call_id"]  # the agent waiting for the call hears of it
    assert calls["call_weather_1"].incomplete is None  # the stream's other calls go on


_STREAM_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=24)
_ENDS = st.sampled_from(["_call", "_request"])


@settings(derandomize=True, deadline=None, max_examples=150)
@given(
    kind=st.sampled_from(sorted(UNJUDGED_KINDS)) | st.builds("zq{}{}".format, _STREAM_TEXT, _ENDS),
    call_id=st.builds("cid{}".format, _STREAM_TEXT),
)
def test_the_feedback_of_an_unjudged_kind_holds_nothing_of_the_stream(
    kind: str, call_id: str
) -> None:
    """Whatever type and call id a client-run item has, its rejection's retry feedback (and its
    event's violation, the same text) names the kind only when callgate knows it, and never the
    call id (the issue: `item <id> is of kind <type>` echoed both, any text ending in `_call`)."""
    item = {"type": kind, "id": "it_1", "call_id": call_id, "execution": "client"}
    events = stream()
    events.insert(1, {"type": ITEM_DONE, "output_index": 5, "item": {**item, "status": "done"}})
    (rejected,) = [c for c in assemble(RESPONSES, encode(events)) if c.assembly_error is not None]
    verdict = GATE.judge(rejected)
    assert verdict.code == Code.UNSUPPORTED_CALL_KIND
    feedback = verdict.retry_feedback
    assert feedback is not None
    (shown,) = feedback["violations"]
    (violation,) = verdict.violations
    assert shown["message"] == violation.message
    assert call_id not in violation.message
    assert (kind in violation.message) is (kind in UNJUDGED_KINDS)
    assert call_id not in feedback["instruction"]
    assert kind not in feedback["instruction"]


@pytest.mark.parametrize("name", VENDOR_RUN)
def test_items_the_vendor_runs_are_not_judged(name: str) -> None:
    assert all(c.assembly_error is None for c in assemble(RESPONSES, _recorded(name)))


@pytest.mark.parametrize(
    ("item", "judged"),
    [
        ({"type": "browser_call", "id": "bc_1", "call_id": "call_b"}, True),
        ({"type": "tool_search_call", "call_id": "call_t", "execution": "client"}, True),
        ({"type": "tool_search_call", "call_id": "call_t", "execution": "server"}, False),
        (
            {
                "type": "shell_call",
                "call_id": "call_s",
                "environment": {"type": "local"},
                "action": {"commands": ["ls"]},
            },
            True,
        ),
        (
            {"type": "shell_call", "call_id": "call_s", "environment": {"type": "container_auto"}},
            False,
        ),
        ({"type": "computer_call", "call_id": "call_c"}, True),
        ({"type": "browser_call_output", "call_id": "call_b"}, False),
    ],
    ids=lambda v: (
        str(v)
        if isinstance(v, bool)
        else f"{v['type']}:{v.get('execution') or v.get('environment')}"
    ),
)
def test_which_items_are_calls_the_client_runs(item: dict[str, Any], judged: bool) -> None:
    events = stream()
    item = {**item, "status": "completed"}
    events.insert(1, {"type": ITEM_DONE, "output_index": 5, "item": item})
    events[-1]["response"]["output"].append(item)
    calls = {c.call_id: c for c in assemble(RESPONSES, encode(events))}
    seen = [c for c in calls.values() if c.call_id != "call_weather_1"]
    assert len(seen) == judged
    assert calls["call_weather_1"].incomplete is None  # the stream's other calls go on
