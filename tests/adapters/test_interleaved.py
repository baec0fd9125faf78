"""Thousands of interleaved streams of every format in one partition; envelope dups and gaps."""

from __future__ import annotations

import random
from dataclasses import dataclass

import orjson
import pytest

from tests.adapters import streamgen
from worker.adapters.decoder import ENVELOPE, Decoder
from worker.assembly.reassembler import AssemblyLimits, Reassembler
from worker.model import AssembledCall, IncompleteReason


@dataclass
class Stream:
    stream_id: str
    fmt: str
    events: list[dict[str, object]]
    expected: dict[str, tuple[str, str, IncompleteReason | None]]  # call id -> (tool, text, why)


def make_stream(n: int, rng: random.Random) -> Stream:
    sid = f"stream-{n}"
    calls = [
        (f"call_{n}_{i}", f"tool_{i}", streamgen.arguments(rng)) for i in range(rng.randint(1, 3))
    ]
    kind = rng.randrange(5)
    if kind == 0:
        events = streamgen.chat_stream(f"cc{n}", [calls], rng)
        return Stream(sid, "openai.chat", events, {c: (t, a, None) for c, t, a in calls})
    if kind == 1:
        events = streamgen.responses_stream(f"r{n}", calls, rng, numbered=rng.random() < 0.5)
        return Stream(sid, "openai.responses", events, {c: (t, a, None) for c, t, a in calls})
    if kind == 2:
        # cut mid-way through the last call
        events = streamgen.anthropic_stream(
            f"m{n}", calls, rng, stop_reason="max_tokens", cut_last_after=2
        )
        expected = {c: (t, a, None) for c, t, a in calls}
        last_id, last_tool, _ = calls[-1]
        cut = "".join(
            e["delta"]["partial_json"]  # type: ignore[index]
            for e in events
            if e["type"] == "content_block_delta" and e["index"] == len(calls)
        )
        expected[last_id] = (last_tool, cut, IncompleteReason.MAX_TOKENS)
        return Stream(sid, "anthropic.messages", events, expected)
    if kind == 3:
        events = streamgen.anthropic_stream(f"m{n}", calls, rng, server_tool=rng.random() < 0.5)
        return Stream(sid, "anthropic.messages", events, {c: (t, a, None) for c, t, a in calls})
    events = [e for call in calls for e in streamgen.envelope_call(sid, call, rng)]
    return Stream(sid, ENVELOPE, events, {c: (t, a, None) for c, t, a in calls})


def run(
    streams: list[Stream], rng: random.Random
) -> tuple[list[AssembledCall], Decoder, Reassembler]:
    decoder = Decoder()
    reassembler = Reassembler(AssemblyLimits())
    done: list[AssembledCall] = []
    for offset, (i, event) in enumerate(
        interleaved := streamgen.interleave([s.events for s in streams], rng)
    ):
        stream = streams[i]
        chunks = decoder.decode(
            orjson.dumps(event),
            fmt=stream.fmt,
            key=stream.stream_id.encode(),
            headers={"content-format": stream.fmt},
            scope=("t", 0),
        )
        for chunk in chunks:
            done += reassembler.feed(chunk, topic="t", partition=0, offset=offset, now=0.0)
    assert len(interleaved) == sum(len(s.events) for s in streams)
    return done, decoder, reassembler


def test_three_thousand_interleaved_streams_of_every_format() -> None:
    rng = random.Random(2026)
    streams = [make_stream(n, rng) for n in range(3000)]
    assert {s.fmt for s in streams} == {
        ENVELOPE,
        "openai.chat",
        "openai.responses",
        "anthropic.messages",
    }
    done, decoder, reassembler = run(streams, rng)
    got = {(c.stream_id, c.call_id): (c.tool, c.arguments.decode(), c.incomplete) for c in done}
    want = {(s.stream_id, cid): v for s in streams for cid, v in s.expected.items()}
    assert len(got) == len(done)  # every call reported once
    assert got == want
    assert sum(1 for v in want.values() if v[2] is IncompleteReason.MAX_TOKENS) > 300
    # every stream ended, so nothing is left behind
    assert decoder.open_streams == 0
    assert reassembler.open_calls == 0
    assert reassembler.buffered_bytes == 0
    assert reassembler.safe_offset("t", 0) is None


@pytest.mark.parametrize("seed", range(5))
def test_envelope_duplicates_are_dropped_and_counted_and_gaps_make_calls_incomplete(
    seed: int,
) -> None:
    rng = random.Random(seed)
    records: list[tuple[str, list[dict[str, object]]]] = []
    expected: dict[str, tuple[bytes, IncompleteReason | None, int]] = {}
    for n in range(200):
        call = (f"c{n}", "t", streamgen.arguments(rng))
        envelopes = streamgen.envelope_call(f"s{n}", call, rng)
        fate = rng.randrange(3)
        if fate == 1 and len(envelopes) > 1:  # a chunk sent twice (a producer retry)
            k = rng.randrange(len(envelopes) - 1)
            envelopes.insert(k + 1, dict(envelopes[k]))
            expected[f"c{n}"] = (call[2].encode(), None, 1)
        elif fate == 2 and len(envelopes) > 2:  # a chunk lost
            k = rng.randrange(1, len(envelopes) - 1)
            del envelopes[k]
            expected[f"c{n}"] = (b"", IncompleteReason.SEQUENCE_GAP, 0)
        else:
            expected[f"c{n}"] = (call[2].encode(), None, 0)
        records.append((f"s{n}", envelopes))
    decoder = Decoder()
    reassembler = Reassembler(AssemblyLimits())
    done: list[AssembledCall] = []
    for offset, (i, envelope) in enumerate(streamgen.interleave([r[1] for r in records], rng)):
        (chunk,) = decoder.decode(orjson.dumps(envelope), key=records[i][0].encode())
        done += reassembler.feed(chunk, topic="t", partition=0, offset=offset, now=0.0)
    done += reassembler.flush()
    by_id = {c.call_id: c for c in done}
    assert len(by_id) == len(done) == 200
    for call_id, (text, incomplete, duplicates) in expected.items():
        call = by_id[call_id]
        assert call.incomplete is incomplete, call_id
        assert call.duplicate_chunks == duplicates, call_id
        if incomplete is None:
            assert call.arguments == text, call_id
    assert any(v[1] is IncompleteReason.SEQUENCE_GAP for v in expected.values())
    assert any(v[2] for v in expected.values())
