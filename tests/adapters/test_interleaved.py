"""Many streams in one partition: thousands of interleaved streams of every format; one response
with more calls than a partition may hold; calls of many streams past that bound. Whatever the
load, every call gets exactly one event, and the work grows linearly with the calls."""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.adapters import streamgen
from tests.adapters.oracles import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    Gate,
    Record,
    assembler,
    decoder,
    permissive_contracts,
    records,
)
from worker.adapters.decoder import ENVELOPE
from worker.core.processor import Emission
from worker.model import IncompleteReason, Outcome


@dataclass
class Stream:
    stream_id: str
    fmt: str
    events: list[dict[str, Any]]
    expected: dict[str, tuple[str, str, str | None]]  # call id -> (tool, text, incomplete)


def make_stream(n: int, rng: random.Random) -> Stream:
    sid = f"stream-{n}"
    calls = [
        (f"call_{n}_{i}", f"tool_{i}", streamgen.arguments(rng)) for i in range(rng.randint(1, 3))
    ]
    whole = {c: (t, a, None) for c, t, a in calls}
    kind = rng.randrange(5)
    if kind == 0:
        return Stream(sid, CHAT, streamgen.chat_stream(f"cc{n}", [calls], rng), whole)
    if kind == 1:
        numbered = rng.random() < 0.5
        events = streamgen.responses_stream(f"r{n}", calls, rng, numbered=numbered)
        return Stream(sid, RESPONSES, events, whole)
    if kind == 2:  # cut mid-way through the last call
        events = streamgen.anthropic_stream(
            f"m{n}", calls, rng, stop_reason="max_tokens", cut_last_after=2
        )
        last_id, last_tool, _ = calls[-1]
        return Stream(
            sid, ANTHROPIC, events, {**whole, last_id: (last_tool, "", IncompleteReason.MAX_TOKENS)}
        )
    if kind == 3:
        events = streamgen.anthropic_stream(f"m{n}", calls, rng, server_tool=rng.random() < 0.5)
        return Stream(sid, ANTHROPIC, events, whole)
    events = [e for call in calls for e in streamgen.envelope_call(sid, call, rng)]
    return Stream(sid, ENVELOPE, events, whole)


def test_three_thousand_interleaved_streams_of_every_format() -> None:
    rng = random.Random(2026)
    streams = [make_stream(n, rng) for n in range(3000)]
    assert {s.fmt for s in streams} == {ENVELOPE, CHAT, RESPONSES, ANTHROPIC}
    batch: list[Record] = []
    for offset, (i, event) in enumerate(streamgen.interleave([s.events for s in streams], rng)):
        stream = streams[i]
        value = orjson.dumps(event)
        # streams that are all live at once: their records come within the idle timeout
        (record,) = records(stream.fmt, [value], stream.stream_id, start=offset, step_ms=0)
        batch.append(record)
    dec, asm = decoder(), assembler()
    done = list(asm.feed_records("in", 0, batch, dec.decode))
    got = {(c.stream_id, c.call_id): (c.tool, c.arguments.decode(), c.incomplete) for c in done}
    want = {(s.stream_id, cid): v for s in streams for cid, v in s.expected.items()}
    assert len(got) == len(done)  # every call reported once
    assert got == want
    assert sum(1 for v in want.values() if v[2] == IncompleteReason.MAX_TOKENS) > 300
    # every stream ended, so nothing is left behind
    state = dec.state("in", 0, full=True)
    assert state["streams"] == []
    assert {how for _, _, how in state["closed"]} == {"ended"}
    assert (asm.open_calls, asm.buffered_bytes) == (0, 0)


def chat_response(calls: int, stream_id: str = "s1", start: int = 0) -> list[Record]:
    """One Chat Completion with `calls` parallel tool calls (one chunk opens each, one carries
    its arguments), then its finish."""
    events: list[dict[str, Any]] = []
    for i in range(calls):
        opening = {"index": i, "id": f"{stream_id}_call_{i}", "type": "function"}
        events.append(_chunk([{**opening, "function": {"name": "t", "arguments": ""}}]))
        events.append(_chunk([{"index": i, "function": {"arguments": f'{{"n":{i}}}'}}]))
    events.append(_chunk(None, "tool_calls"))
    return records(CHAT, [orjson.dumps(e) for e in events], stream_id, start=start, step_ms=0)


def _chunk(tool_calls: list[dict[str, Any]] | None, finish: str | None = None) -> dict[str, Any]:
    delta = {"tool_calls": tool_calls} if tool_calls else {}
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def one_event_per_call(emissions: list[Emission]) -> collections.Counter[str]:
    """The outcomes, once every call has been shown to have exactly one event."""
    per_call = collections.Counter((e.call.stream_id, e.call.call_id) for e in emissions)
    assert max(per_call.values()) == 1
    assert len({e.call.event_id for e in emissions}) == len(emissions)
    return collections.Counter(
        e.verdict.outcome.value + ":" + (e.call.incomplete or e.verdict.code or "")
        for e in emissions
    )


#: a bound only a hang or work quadratic in the open calls reaches (20,000 calls of one
#: response take about a second on an idle machine; a busy CI machine must not fail them)
LINEAR_BOUND_S = 60


@pytest.mark.timeout(LINEAR_BOUND_S)
def test_a_response_with_more_calls_than_a_partition_holds_gets_one_event_per_call(
    tmp_path: Path,
) -> None:
    gate = Gate(permissive_contracts(tmp_path, ["t"]), max_open_calls_per_partition=10_000)
    batch = chat_response(20_000)
    emissions = gate.run([batch[i : i + 500] for i in range(0, len(batch), 500)])
    # the call past the bound breaks the stream: its record is rejected, the 10,000 calls it
    # held end stream_corrupt, and its later records (the other calls) are dropped
    assert one_event_per_call(emissions) == {
        "incomplete:stream_corrupt": 10_000,
        "rejected:malformed_record": 1,
    }


@pytest.mark.timeout(LINEAR_BOUND_S)
def test_twenty_thousand_calls_in_one_response_are_judged_in_linear_time(tmp_path: Path) -> None:
    gate = Gate(permissive_contracts(tmp_path, ["t"]), max_open_calls_per_partition=20_000)
    batch = chat_response(20_000)
    emissions = gate.run([batch[i : i + 500] for i in range(0, len(batch), 500)])
    assert one_event_per_call(emissions) == {"accepted:": 20_000}


def test_past_the_partitions_bound_the_least_recently_active_stream_is_aborted(
    tmp_path: Path,
) -> None:
    gate = Gate(permissive_contracts(tmp_path, ["t"]), max_open_calls_per_partition=100)
    first = chat_response(60, "a")
    second = chat_response(60, "b", start=len(first))
    # a holds 60 calls (no finish yet); b's 41st call would make 101: a is aborted
    finish = first[-1]._replace(offset=len(first) + len(second))
    emissions = gate.run([first[:-1], second, [finish]])
    outcomes = one_event_per_call(emissions)
    assert outcomes == {"incomplete:stream_corrupt": 60, "accepted:": 60}
    aborted = {e.call.stream_id for e in emissions if e.verdict.outcome is Outcome.INCOMPLETE}
    assert aborted == {"a"}


def test_a_call_held_past_the_idle_timeout_ends_timeout_once(tmp_path: Path) -> None:
    """A stopped tool block is held until its message's END; when the rest of the message takes
    longer than the idle timeout (record time), the reassembler ends the held call `timeout`,
    and the final chunk the END brings for it is a late piece, not a second verdict."""
    gate = Gate(permissive_contracts(tmp_path, ["t"]))
    rng = random.Random(5)
    calls = [("toolu_a", "t", '{"a":1}'), ("toolu_b", "t", '{"b":2}')]
    events = streamgen.anthropic_stream("m", calls, rng)
    values = [orjson.dumps(e) for e in events]
    second = next(i for i, e in enumerate(events) if e.get("index") == 2)
    head = records(ANTHROPIC, values[:second], step_ms=0)
    idle_ms = round(gate.settings.assembly.idle_timeout_s * 1000)
    tail = [
        r._replace(timestamp=idle_ms + r.offset)
        for r in records(ANTHROPIC, values[second:], start=second, step_ms=0)
    ]
    emissions = gate.run([head, tail])
    assert one_event_per_call(emissions) == {
        "incomplete:timeout": 1,  # toolu_a, stopped long before the message ended
        "accepted:": 1,  # toolu_b
    }
