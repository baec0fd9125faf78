"""Dialects of OpenAI-compatible servers: named by the content-format header's parameter or per
input topic, never guessed; each relaxes only its server's known habit, and a cut call is
never accepted whatever the finish reason says."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from tests.adapters import streamgen
from tests.adapters.mutations import mutated
from tests.adapters.oracles import (
    CHAT,
    RECORDED,
    RESPONSES,
    Gate,
    assemble,
    decoder,
    encode,
    permissive_contracts,
    records,
    sdk_calls,
)
from worker.adapters.input import read_records
from worker.cli import main
from worker.model import ChunkKind, Code, IncompleteReason, Outcome

CALLS = [streamgen.WEATHER, streamgen.STOCK, streamgen.SHELL]


def outcomes(fmt: str, events: list[dict[str, Any]]) -> dict[str, str]:
    return {
        call.call_id: call.incomplete or call.assembly_error or "complete"
        for call in assemble(fmt, encode(events))
    }


# -- a turn's every call at index 0 (Ollama, Dynamo) -------------------------------------------


def reused_index(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Chat stream as Ollama sends it: every tool call delta at index 0."""
    out = copy.deepcopy(events)
    for event in out:
        for choice in event.get("choices", []):
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                call["index"] = 0
    return out


def normalized(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stream with each call's index restored from the order of its ids (the oracle: what
    the SDK accumulates from the calls the server meant)."""
    out = copy.deepcopy(events)
    seen: dict[int, int] = {}
    for event in out:
        for choice in event.get("choices", []):
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                k = choice["index"]
                if call.get("id"):
                    seen[k] = seen.get(k, -1) + 1
                call["index"] = seen.get(k, 0)
    return out


@pytest.mark.parametrize("dialect", ["ollama", "dynamo"])
def test_calls_all_at_index_0_are_separate_calls_in_their_servers_dialect(dialect: str) -> None:
    events = reused_index(streamgen.chat_stream("c1", [CALLS], random.Random(1)))
    strict = outcomes(CHAT, events)
    assert IncompleteReason.STREAM_CORRUPT in strict.values()  # the strict default refuses it
    fmt = f"{CHAT}; dialect={dialect}"
    ours = assemble(fmt, encode(events))
    sdk = sdk_calls(CHAT, normalized(events))
    assert sorted((c.call_id, c.tool, c.arguments.decode()) for c in ours) == sorted(sdk.triples())
    assert all(c.incomplete is None for c in ours)


def test_the_dialect_never_merges_what_the_sdk_would_merge() -> None:
    # the SDK itself concatenates the calls' texts into one: the failure the dialect avoids
    events = reused_index(streamgen.chat_stream("c1", [CALLS[:2]], random.Random(2)))
    merged = sdk_calls(CHAT, events).calls
    assert len(merged) == 1
    assert len(assemble(f"{CHAT}; dialect=ollama", encode(events))) == 2


def test_a_later_delta_naming_another_id_without_a_name_still_breaks_the_stream() -> None:
    events = reused_index(streamgen.chat_stream("c1", [CALLS[:2]], random.Random(3)))
    first_piece = next(
        i
        for i, e in enumerate(events)
        if e["choices"]
        and "id" not in ((e["choices"][0]["delta"].get("tool_calls") or [{}])[0])
        and e["choices"][0]["delta"].get("tool_calls")
    )
    events[first_piece]["choices"][0]["delta"]["tool_calls"][0]["id"] = "call_other"
    assert IncompleteReason.STREAM_CORRUPT in outcomes(f"{CHAT}; dialect=ollama", events).values()


# -- finish_reason tool_calls on a cut call (vLLM) ----------------------------------------------


def cut(events: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """The stream with its last call's argument pieces cut to `keep`, still finishing
    `tool_calls` (what vLLM's streaming server reports)."""
    pieces = [
        i
        for i, e in enumerate(events)
        if e["choices"]
        and (e["choices"][0]["delta"].get("tool_calls") or [{}])[0]
        .get("function", {})
        .get("arguments")
    ]
    drop = pieces[-(len(pieces) - keep) :] if keep < len(pieces) else []
    return [e for i, e in enumerate(events) if i not in drop]


def test_vllm_a_cut_call_finishing_tool_calls_is_never_accepted(tmp_path: Path) -> None:
    events = streamgen.chat_stream("c1", [[streamgen.WEATHER]], random.Random(4))
    truncated = cut(events, 2)
    assert truncated[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert outcomes(f"{CHAT}; dialect=vllm", truncated) == {
        "call_weather_1": IncompleteReason.MAX_TOKENS
    }
    # the strict default releases it: the gate rejects the text (never accepted either)
    gate = Gate(permissive_contracts(tmp_path, ["get_weather"]))
    (emission,) = gate.run([records(CHAT, encode(truncated))])
    assert (emission.verdict.outcome, emission.verdict.code) == (
        Outcome.REJECTED,
        Code.INVALID_JSON,
    )
    # a whole call in the same dialect passes as usual
    assert outcomes(f"{CHAT}; dialect=vllm", events) == {"call_weather_1": "complete"}


# -- rotating item ids (GitHub Copilot) ---------------------------------------------------------


def rotated(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Responses stream with every response and item id new on each event (Copilot's)."""
    out = copy.deepcopy(events)
    for number, event in enumerate(out):
        if "item_id" in event:
            event["item_id"] = f"rot-{number}"
        if isinstance(event.get("item"), dict):
            event["item"]["id"] = f"rot-{number}"
        if isinstance(event.get("response"), dict):
            event["response"]["id"] = f"resp-{number}"
            for n, item in enumerate(event["response"].get("output") or []):
                item["id"] = f"rot-{number}-{n}"
    return out


def test_copilot_rotating_ids_are_placed_by_output_index() -> None:
    events = streamgen.responses_stream("r1", CALLS, random.Random(5))
    changed = rotated(events)
    assert "complete" not in outcomes(RESPONSES, changed).values()  # strict: never accepted
    ours = assemble(f"{RESPONSES}; dialect=copilot", encode(changed))
    sdk = sdk_calls(RESPONSES, events)  # the oracle: the stream before its ids rotated
    assert sorted((c.call_id, c.tool, c.arguments.decode()) for c in ours) == sorted(sdk.triples())
    assert all(c.incomplete is None for c in ours)


def test_the_recorded_copilot_stream_reads_in_its_dialect_only() -> None:
    path = RECORDED / "openai_responses_copilot" / "vercel_copilot_rotating_ids.jsonl"
    with path.open("rb") as fp:
        values = list(read_records(fp, RESPONSES))
    strict = assemble(RESPONSES, values)
    assert any(c.assembly_error == Code.MALFORMED_RECORD for c in strict)
    assert assemble(f"{RESPONSES}; dialect=copilot", values) == []


def test_copilot_still_refuses_a_delta_for_an_index_that_is_no_call() -> None:
    events = rotated(streamgen.responses_stream("r1", CALLS[:1], random.Random(6)))
    delta = next(e for e in events if e["type"] == "response.function_call_arguments.delta")
    delta["output_index"] = 7
    assert (
        IncompleteReason.STREAM_CORRUPT
        in outcomes(f"{RESPONSES}; dialect=copilot", events).values()
    )


# -- a final response without its output (9router, new-api) ------------------------------------


def without_output(events: list[dict[str, Any]], empty: bool) -> list[dict[str, Any]]:
    """The stream with its final response's output left out (9router's) or empty (new-api's)."""
    out = copy.deepcopy(events)
    response = out[-1]["response"]
    if empty:
        response["output"] = []
    else:
        del response["output"]
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("dialect", "empty"), [("9router", False), ("new-api", True)])
def test_a_final_response_without_output_releases_the_calls_from_their_items(
    dialect: str, empty: bool, seed: int
) -> None:
    rng = random.Random(seed)
    calls = rng.sample(CALLS, rng.randint(1, 3))
    events = streamgen.responses_stream("r1", calls, rng)
    changed = without_output(events, empty)
    strict = outcomes(RESPONSES, changed)
    assert "complete" not in strict.values()  # strict: released by no final output, never
    ours = assemble(f"{RESPONSES}; dialect={dialect}", encode(changed))
    sdk = sdk_calls(RESPONSES, events)  # the oracle: the stream with its output
    assert sorted((c.call_id, c.tool, c.arguments.decode()) for c in ours) == sorted(sdk.triples())
    assert all(c.incomplete is None for c in ours)


@pytest.mark.parametrize("what", ["no item done", "another text", "cut deltas"])
def test_a_call_without_its_item_done_or_with_another_text_is_never_released(what: str) -> None:
    events = without_output(streamgen.responses_stream("r1", CALLS[:1], random.Random(3)), False)
    done = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.done")
    if what == "no item done":
        del events[done]
    elif what == "another text":
        events[done]["item"]["arguments"] = '{"city":"Elsewhere"}'
    else:
        delta = next(i for i, e in enumerate(events) if e["type"].endswith("arguments.delta"))
        del events[delta]
        for event in events[delta:]:
            if "sequence_number" in event:
                event["sequence_number"] -= 1
    found = outcomes(f"{RESPONSES}; dialect=9router", events)
    assert found["call_weather_1"] == IncompleteReason.STREAM_CORRUPT


def test_the_recorded_stream_without_output_reads_in_its_dialect_only() -> None:
    path = (
        RECORDED
        / "openai_responses_without_output"
        / "rustgenai_tools_completed_no_output_field.sse"
    )
    with path.open("rb") as fp:
        values = list(read_records(fp, RESPONSES))
    (strict,) = assemble(RESPONSES, values)
    assert strict.incomplete == IncompleteReason.STREAM_ENDED  # released by nothing: never accepted
    events = [orjson.loads(value) for value in values]
    # the oracle: the SDK's calls once the final response holds the items the stream finished
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    whole = copy.deepcopy(events)
    whole[-1]["response"]["output"] = done
    sdk = sdk_calls(RESPONSES, whole)
    for dialect in ("9router", "new-api"):
        ours = assemble(f"{RESPONSES}; dialect={dialect}", values)
        assert [(c.call_id, c.tool, c.arguments.decode(), c.incomplete) for c in ours] == [
            (*triple, None) for triple in sdk.triples()
        ]


# -- double-encoded arguments (vLLM) ------------------------------------------------------------


def double_encoded(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Chat stream whose arguments are a JSON string holding their text (vLLM's hermes parser
    on a model that writes them as a string), in one delta as that parser sends them."""
    out = copy.deepcopy(events)
    texts: dict[int, str] = {}
    for event in out:
        for choice in event.get("choices", []):
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                function = call.get("function") or {}
                texts[call["index"]] = texts.get(call["index"], "") + function.get("arguments", "")
    for event in out:
        for choice in event.get("choices", []):
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                function = call.get("function") or {}
                if function.get("name"):
                    function["arguments"] = orjson.dumps(texts[call["index"]]).decode()
                elif "arguments" in function:
                    function["arguments"] = ""
    return out


def test_vllm_double_encoded_arguments_are_one_recorded_repair(tmp_path: Path) -> None:
    events = streamgen.chat_stream("c1", [CALLS], random.Random(8))
    changed = double_encoded(events)
    gate = Gate(permissive_contracts(tmp_path, [c[1] for c in CALLS]))
    sdk = sdk_calls(CHAT, events)  # the oracle: the arguments as meant
    emissions = gate.run([records(f"{CHAT}; dialect=vllm", encode(changed))])
    assert len(emissions) == len(CALLS)
    for emission in emissions:
        written = orjson.loads(emission.value)
        assert written["outcome"] == "accepted"
        assert written["repairs"] == [{"kind": "double_encoded"}]
        held = sdk.calls[emission.call.call_id]
        assert written["arguments"] == orjson.loads(held.arguments)
    # the strict default never decodes them: each is a string, not an object
    strict = gate.run([records(CHAT, encode(changed))])
    assert {e.verdict.code for e in strict} == {Code.ROOT_NOT_OBJECT}


# -- naming a dialect -------------------------------------------------------------------------


def _decode(fmt: str, events: list[dict[str, Any]], **options: Any) -> list[Any]:
    dec = decoder(**options)
    return [c for r in records(fmt, encode(events)) for c in dec.decode(r, fmt)]


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        (f"{CHAT}; dialect=nobody", "has no dialect 'nobody'"),
        (f"{CHAT}; dialect=copilot", "has no dialect 'copilot'"),
        (f"{CHAT}; charset=utf-8", "takes one parameter"),
    ],
)
def test_a_dialect_that_is_not_known_is_a_malformed_record(fmt: str, message: str) -> None:
    events = streamgen.chat_stream("c1", [[streamgen.WEATHER]], random.Random(7))
    (first, *_) = _decode(fmt, events)
    assert first.kind == ChunkKind.MALFORMED
    assert message in first.delta


def test_a_topic_names_the_dialect_of_its_records() -> None:
    events = reused_index(streamgen.chat_stream("c1", [CALLS[:2]], random.Random(8)))
    chunks = _decode(CHAT, events, dialects={"in": "ollama"})
    assert not any(c.kind == ChunkKind.MALFORMED for c in chunks)
    assert sum(1 for c in chunks if c.final) == 2
    # a record naming another dialect on that topic is refused
    mixed = _decode(f"{CHAT}; dialect=vllm", events, dialects={"in": "ollama"})
    assert mixed[0].kind == ChunkKind.MALFORMED
    # the topic's dialect is for its format only: Responses records there are read strictly
    responses = streamgen.responses_stream("r1", CALLS[:1], random.Random(9))
    assert not any(
        c.kind == ChunkKind.MALFORMED
        for c in _decode(RESPONSES, responses, dialects={"in": "ollama"})
    )


def test_a_stream_keeps_the_dialect_of_its_first_record() -> None:
    events = streamgen.chat_stream("c1", [[streamgen.WEATHER]], random.Random(10))
    dec = decoder()
    first, *rest = records(CHAT, encode(events))
    dec.decode(first, f"{CHAT}; dialect=vllm")
    out = dec.decode(rest[0], CHAT)
    assert out[0].kind == ChunkKind.MALFORMED
    assert "another dialect" in out[0].delta
    assert orjson.loads(orjson.dumps(dec.state("in", 0, full=True)))  # checkpointable


def test_check_takes_a_dialect_in_its_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = reused_index(streamgen.chat_stream("c1", [CALLS[:2]], random.Random(11)))
    source = tmp_path / "ollama.sse"
    source.write_bytes(streamgen.to_sse(events, named=False, done=True))
    contracts = permissive_contracts(tmp_path / "contracts", [c[1] for c in CALLS])
    args = ["check", "--schemas", str(contracts), str(source)]
    assert main([*args, "--format", f"{CHAT}; dialect=ollama"]) == 0
    out = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [event["outcome"] for event in out] == ["accepted", "accepted"]
    with pytest.raises(SystemExit):
        main([*args, "--format", f"{CHAT}; dialect=copilot"])
    assert "has no dialect 'copilot'" in capsys.readouterr().err


def test_check_reads_a_recorded_stream_in_a_responses_dialect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = (
        RECORDED
        / "openai_responses_without_output"
        / ("rustgenai_tools_completed_no_output_field.sse")
    )
    contracts = permissive_contracts(tmp_path / "contracts", ["get_weather"])
    args = ["check", "--schemas", str(contracts), str(source)]
    assert main([*args, "--format", f"{RESPONSES}; dialect=9router"]) == 0
    out = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["outcome"], e["arguments"]) for e in out] == [
        ("accepted", {"city": "Paris", "country": "France", "unit": "C"})
    ]
    assert main([*args, "--format", RESPONSES]) == 0  # strict: the call is never released
    out = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["outcome"], e["reason"]) for e in out] == [("incomplete", "stream_ended")]


# -- the mutation tests, in the dialects that read more than the strict default --------------

MUTATED = settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _restored(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stream with its final response's output made of the items it finished (what the
    dialect takes the calls from), for the SDK to read."""
    out = copy.deepcopy(events)
    done = [e["item"] for e in out if isinstance(e, dict) and e.get("type") == DONE_ITEM]
    for event in out:
        response = event.get("response") if isinstance(event, dict) else None
        if event.get("type") == "response.completed" and isinstance(response, dict):
            response["output"] = done
    return out


DONE_ITEM = "response.output_item.done"


def test_no_mutation_of_a_stream_without_output_makes_an_accepted_call_lie(tmp_path: Path) -> None:
    path = (
        RECORDED
        / "openai_responses_without_output"
        / ("rustgenai_tools_completed_no_output_field.sse")
    )
    with path.open("rb") as fp:
        events = [orjson.loads(value) for value in read_records(fp, RESPONSES)]
    gate = Gate(permissive_contracts(tmp_path, ["get_weather"]))
    fmt = f"{RESPONSES}; dialect=9router"

    @MUTATED
    @given(mutated(events, len(events) - 1))
    def check(change: tuple[str, list[dict[str, Any]]]) -> None:
        what, changed = change
        sdk = sdk_calls(RESPONSES, _restored(changed))
        for emission in gate.run([records(fmt, encode(changed))]):
            if emission.verdict.outcome is Outcome.ACCEPTED:
                call = emission.call
                assert sdk.raised_at is None or call.last_offset < sdk.raised_at, what
                assert sdk.holds(RESPONSES, call.call_id, call.tool, call.arguments.decode()), what

    check()


def test_no_mutation_of_a_double_encoded_stream_makes_an_accepted_call_lie(tmp_path: Path) -> None:
    events = double_encoded(streamgen.chat_stream("c1", [CALLS], random.Random(12)))
    gate = Gate(permissive_contracts(tmp_path, [c[1] for c in CALLS]))
    fmt = f"{CHAT}; dialect=vllm"

    @MUTATED
    @given(mutated(events, len(events) - 1))
    def check(change: tuple[str, list[dict[str, Any]]]) -> None:
        what, changed = change
        sdk = sdk_calls(CHAT, changed)
        for emission in gate.run([records(fmt, encode(changed))]):
            if emission.verdict.outcome is not Outcome.ACCEPTED:
                continue
            call = emission.call
            assert sdk.raised_at is None or call.last_offset < sdk.raised_at, what
            held = sdk.calls[call.call_id]
            assert held.name == call.tool, what
            sent = orjson.loads(held.arguments)  # the server's text, decoded once if a string
            meant = orjson.loads(sent) if isinstance(sent, str) else sent
            assert orjson.loads(emission.value)["arguments"] == meant, what

    check()
