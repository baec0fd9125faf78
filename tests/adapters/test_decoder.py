"""The decoder: format dispatch, strict parsing of vendor events, failing closed per stream, the
per-partition bounds on streams and on the calls they hold."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.adapters import streamgen
from tests.adapters.oracles import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    GEMINI,
    MCP,
    RESPONSES,
    Gate,
    Record,
    decoder,
    encode,
    permissive_contracts,
    records,
)
from worker._native import Chunk
from worker.adapters import decoder as decoder_module
from worker.adapters.decoder import ENVELOPE, Decoder, formats
from worker.model import ChunkKind, Code, Outcome

RESULT = b'{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":false}}'


def one(value: bytes, fmt: str = MCP, key: bytes | None = b"s", **headers: str) -> list[Chunk]:
    (record,) = records(fmt, [value], headers={"tool": "t", **headers})
    return decoder(10).decode(record._replace(key=key), fmt)


def kinds(chunks: list[Chunk]) -> list[tuple[str, str | None]]:
    return [(c.kind, c.call_id) for c in chunks]


def test_every_format_is_listed() -> None:
    assert formats() == [
        "anthropic.messages",
        "bedrock.converse",
        "callgate.envelope",
        "google.gemini",
        "mcp.result",
        "openai.chat",
        "openai.responses",
    ]


def test_a_vendor_event_with_a_duplicate_key_is_refused_not_merged() -> None:
    smuggled = b'{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":true,"isError":false}}'
    (chunk,) = one(smuggled)
    assert (chunk.kind, chunk.error) == (ChunkKind.MALFORMED, "malformed_record")
    assert "duplicate_key at /result/isError" in chunk.delta


def test_a_vendor_event_with_a_huge_integer_is_refused() -> None:
    (chunk,) = one(b'{"jsonrpc":"2.0","id":123456789012345678901234,"result":{}}')
    assert "not strict JSON" in chunk.delta


def test_an_event_that_is_not_an_object_is_refused() -> None:
    (chunk,) = one(b"[1]")
    assert "must be a JSON object" in chunk.delta


def test_vendor_records_need_a_key_and_a_known_format() -> None:
    (chunk,) = one(RESULT, key=None)
    assert (chunk.kind, chunk.stream_id) == (ChunkKind.MALFORMED, "")
    assert "stream id (UTF-8) as its key" in chunk.delta
    (chunk,) = one(RESULT, fmt="x.y")
    assert "unknown content-format 'x.y'" in chunk.delta


def _anthropic(stream_id: str, calls: int = 1, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    tools = [(f"toolu_{stream_id}_{i}", "t", streamgen.arguments(rng)) for i in range(calls)]
    return encode(streamgen.anthropic_stream(f"m_{stream_id}", tools, rng))


def _tool_starts(values: list[bytes]) -> list[int]:
    return [i for i, v in enumerate(values) if b'"tool_use"' in v and b"block_start" in v]


def test_a_bad_event_aborts_every_call_the_stream_holds_and_drops_its_later_records() -> None:
    values = _anthropic("a", calls=2)
    bad = _tool_starts(values)[1] + 1  # the second block is open, the first stopped and held
    values[bad] = b'{"type":"content_block_delta","index":2,"delta":{"type":"text_delta"}}'
    dec = decoder(10)
    out = [
        chunk for record in records(ANTHROPIC, values) for chunk in dec.decode(record, ANTHROPIC)
    ]
    malformed = next(i for i, c in enumerate(out) if c.kind == ChunkKind.MALFORMED)
    assert kinds(out[malformed + 1 :]) == [
        (ChunkKind.ABORT, "toolu_a_0"),
        (ChunkKind.ABORT, "toolu_a_1"),
    ]
    assert dec.dropped_records == len(values) - bad - 1


class _Buggy:
    """An adapter with a bug: it holds one call, then fails on its second event."""

    def __init__(self, stream_id: str, headers: Mapping[str, str], state: Any, *, max_calls: int):
        self.events = 0

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        self.events += 1
        if self.events == 2:
            raise KeyError("bug")
        return [Chunk("s", ChunkKind.TOOL_CALL, "c1", tool="t")]

    def open_calls(self) -> list[str]:
        return ["c1"]

    held = 1
    finished = False

    def state(self) -> Any:
        return None


def test_an_adapter_bug_is_the_records_internal_error_and_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(decoder_module.ADAPTERS, CHAT, _Buggy)
    dec = decoder(10)
    first, second = records(CHAT, [b"{}", b"{}"], "s")
    dec.decode(first, CHAT)
    with caplog.at_level(logging.ERROR, logger="callgate.decoder"):
        out = dec.decode(second, CHAT)
    assert kinds(out) == [(ChunkKind.MALFORMED, None), (ChunkKind.ABORT, "c1")]
    assert (out[0].error, out[0].delta) == (
        "internal_error",
        "openai.chat: callgate failed to decode this record (KeyError)",
    )
    assert "internal error decoding openai.chat record in[0]@1" in caplog.text


def test_streams_are_kept_per_partition_and_dropped_with_it() -> None:
    dec = decoder(10)
    start = _anthropic("a")[:2]
    for partition in (0, 1):
        for record in records(ANTHROPIC, start, "a", partition=partition):
            dec.decode(record, ANTHROPIC)
    assert len(dec.state("in", 0, full=True)["streams"]) == 1
    dec.drop("in", 0)
    assert dec.state("in", 0, full=True)["streams"] == []
    assert len(dec.state("in", 1, full=True)["streams"]) == 1


def _feed(dec: Decoder, stream: str, values: list[bytes], offset: int) -> list[Chunk]:
    out: list[Chunk] = []
    for record in records(ANTHROPIC, values, stream, start=offset):
        out += dec.decode(record, ANTHROPIC)
    return out


def test_past_the_bound_of_streams_the_least_recently_active_one_is_aborted() -> None:
    dec = decoder(2)
    start = _tool_starts(_anthropic("a"))[0]
    head = {name: _anthropic(name)[: start + 1] for name in "abc"}  # the tool block open
    _feed(dec, "a", head["a"], 0)
    _feed(dec, "b", head["b"], 10)
    _feed(dec, "a", _anthropic("a")[start + 1 : start + 2], 20)  # a is more recent than b
    out = _feed(dec, "c", head["c"], 30)
    assert (ChunkKind.ABORT, "toolu_b_0") in kinds(out)
    state = dec.state("in", 0, full=True)
    assert [s[1] for s in state["streams"]] == ["a", "c"]
    assert state["closed"] == [[ANTHROPIC, "b", "corrupt"]]


def test_past_the_bound_of_calls_held_the_least_recently_active_stream_is_aborted() -> None:
    dec = decoder(4)
    a = _anthropic("a", calls=3)
    b = _anthropic("b", calls=2)
    third_start = _tool_starts(a)[2]
    _feed(dec, "a", a[:third_start], 0)  # a holds 2 calls
    out = _feed(dec, "b", b, 100)  # b's second call makes 4 ... and b's end releases them
    assert not [c for c in out if c.kind == ChunkKind.ABORT]
    out = _feed(dec, "a", a[third_start:], 200)  # a holds 3 again: fits
    assert not [c for c in out if c.kind == ChunkKind.ABORT]
    c = _anthropic("c", calls=3)
    out = _feed(dec, "c", c[:-1], 300)  # a finished; c's 3 calls fit
    assert not [c for c in out if c.kind == ChunkKind.ABORT]
    d = _anthropic("d", calls=2)
    out = _feed(dec, "d", d, 400)  # d's second call makes 5 held: c is aborted
    assert [x for x in kinds(out) if x[0] == ChunkKind.ABORT] == [
        (ChunkKind.ABORT, f"toolu_c_{i}") for i in range(3)
    ]


def test_a_record_of_a_corrupt_stream_is_dropped_before_it_is_parsed() -> None:
    dec = decoder(10)
    bad, later = records(ANTHROPIC, [b'{"type":"content_block_stop","index":0}', b"not json"], "s")
    assert [c.kind for c in dec.decode(bad, ANTHROPIC)] == [ChunkKind.MALFORMED]
    assert dec.decode(later, ANTHROPIC) == []
    assert dec.dropped_records == 1


def test_a_stream_ends_once_and_an_event_after_its_end_breaks_it() -> None:
    dec = decoder(10)
    values = _anthropic("a")
    out = _feed(dec, "a", values, 0)
    assert out[-1].kind == ChunkKind.END
    state = dec.state("in", 0, full=True)
    assert (state["streams"], state["closed"]) == ([], [[ANTHROPIC, "a", "ended"]])
    again = _feed(dec, "a", values, 100)  # the same message again: its first event breaks it
    assert [c.kind for c in again] == [ChunkKind.MALFORMED]
    assert "after the end of its stream" in again[0].delta
    assert dec.dropped_records == len(values) - 1
    assert dec.state("in", 0, full=True)["closed"] == [[ANTHROPIC, "a", "corrupt"]]


def test_headers_of_the_streams_first_record_reach_its_adapter() -> None:
    dec = decoder(10)
    record = Record("in", 0, 0, 1, b"s", RESULT, (("content-format", b"mcp.result"),))
    with_tool = record._replace(headers=(*record.headers, ("tool", b"t"), ("traceparent", b"tp")))
    (chunk,) = dec.decode(with_tool, MCP)
    assert (chunk.tool, chunk.traceparent, orjson.loads(chunk.delta)["id"]) == ("t", "tp", 7)


def test_a_bad_mcp_result_breaks_only_itself() -> None:
    dec = decoder(10)
    bad, good = records(MCP, [b'{"jsonrpc":"1.0"}', RESULT], "s", headers={"tool": "t"})
    assert [c.kind for c in dec.decode(bad, MCP)] == [ChunkKind.MALFORMED]
    (chunk,) = dec.decode(good, MCP)
    assert (chunk.kind, chunk.call_id) == (ChunkKind.MCP_RESULT, "7")
    assert dec.dropped_records == 0


def test_a_vendor_streams_principal_header_reaches_every_chunk_of_it() -> None:
    dec = decoder(10)
    values = _anthropic("a")
    chunks: list[Chunk] = []
    for record in records(ANTHROPIC, values, "a", headers={"principal": "team-a"}):
        chunks += dec.decode(record, ANTHROPIC)
    calls = [c for c in chunks if c.kind == ChunkKind.TOOL_CALL]
    assert calls
    assert {c.principal for c in calls} == {"team-a"}


@pytest.mark.parametrize("later", [{"principal": "team-b"}, {}])
def test_a_record_naming_another_principal_than_its_stream_breaks_it(
    later: dict[str, str],
) -> None:
    dec = decoder(10)
    first, *rest = records(ANTHROPIC, _anthropic("a"), "a", headers={"principal": "team-a"})
    dec.decode(first, ANTHROPIC)
    head = tuple(h for h in rest[0].headers if h[0] != "principal")
    other = rest[0]._replace(headers=(*head, *((k, v.encode()) for k, v in later.items())))
    out = dec.decode(other, ANTHROPIC)
    assert [c.kind for c in out][-1] == ChunkKind.MALFORMED
    assert "another principal than its stream's" in out[-1].delta


def test_a_principal_header_that_is_not_utf8_is_refused_not_guessed() -> None:
    (record,) = records(MCP, [RESULT], headers={"tool": "t"})
    bad = record._replace(headers=(*record.headers, ("principal", b"\xff")))
    (chunk,) = decoder(10).decode(bad, MCP)
    assert chunk.kind == ChunkKind.MALFORMED
    assert "principal header is not UTF-8" in chunk.delta


#: a stream of one format holding one call, each under the key `k`
_ONE_CALL: dict[str, Callable[[streamgen.Call, random.Random], list[dict[str, Any]]]] = {
    CHAT: lambda call, rng: streamgen.chat_stream("k", [[call]], rng),
    ANTHROPIC: lambda call, rng: streamgen.anthropic_stream("k", [call], rng),
    BEDROCK: lambda call, rng: streamgen.bedrock_stream([call], rng),
}


@pytest.fixture(scope="module")
def any_object(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return permissive_contracts(tmp_path_factory.mktemp("contracts"), ["tool_0"])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), ended=st.booleans(), data=st.data())
def test_a_key_names_one_stream_in_one_format(
    any_object: Path, seed: int, ended: bool, data: st.DataObject
) -> None:
    # a call's head streamed in one format and its tail in another under the same key and call
    # id: the reassembler holds calls by key and call id, so the tail's stream finished the
    # head's call, which its own stream never finished, and the two were accepted as one call
    first, second = data.draw(st.permutations(sorted(_ONE_CALL)))[:2]
    rng = random.Random(seed)
    text = streamgen.arguments(rng)
    cut = data.draw(st.integers(1, len(text) - 1))
    head = _ONE_CALL[first](("c1", "tool_0", text[:cut]), rng)
    if not ended:
        head = head[: _end(first, head)]
    tail = _ONE_CALL[second](("c1", "tool_0", text[cut:]), rng)
    batch = [
        *records(first, encode(head), "k"),
        *records(second, encode(tail), "k", start=len(head)),
    ]
    emissions = Gate(any_object).run([batch])
    assert [e.call.call_id for e in emissions if e.verdict.outcome is Outcome.ACCEPTED] == []
    refused = [e for e in emissions if e.verdict.code == Code.MALFORMED_RECORD]
    assert [e.call.first_offset for e in refused] == [len(head)]
    assert "names a stream of" in (refused[0].call.assembly_detail or "")


def _end(fmt: str, events: list[dict[str, Any]]) -> int:
    """The position of the event that ends the stream (its END chunk)."""
    dec = decoder()
    for index, record in enumerate(records(fmt, encode(events))):
        if any(chunk.kind == ChunkKind.END for chunk in dec.decode(record, fmt)):
            return index
    raise AssertionError("the stream never ends")


#: how a vendor stream of each format under key `key` carries `calls` (gemini: whole
#: arguments only, so a call cut in parts never has a part of it)
_STREAMS: dict[str, Callable[[str, list[streamgen.Call], random.Random], list[dict[str, Any]]]] = {
    CHAT: lambda key, calls, rng: streamgen.chat_stream(key, [calls], rng),
    RESPONSES: streamgen.responses_stream,
    ANTHROPIC: streamgen.anthropic_stream,
    GEMINI: lambda key, calls, rng: streamgen.gemini_stream(key, calls, rng, with_ids=True),
    BEDROCK: lambda key, calls, rng: streamgen.bedrock_stream(calls, rng),
}
_SOURCES = sorted([ENVELOPE, *_STREAMS])
_PART_SOURCES = [source for source in _SOURCES if source != GEMINI]


@st.composite
def _calls(draw: st.DrawFn) -> list[tuple[str, str, list[str]]]:
    """Up to four calls, each (stream id, call id, the source of each of its parts): a call in
    parts has each part streamed by a source of its own, the same or another."""
    calls = []
    for _ in range(draw(st.integers(1, 4))):
        stream_id = draw(st.sampled_from(["s", "t"]))
        call_id = draw(st.sampled_from(["c1", "c2"]))
        parts = draw(st.integers(1, 3))
        pool = _SOURCES if parts == 1 else _PART_SOURCES
        calls.append(
            (
                stream_id,
                call_id,
                draw(st.lists(st.sampled_from(pool), min_size=parts, max_size=parts)),
            )
        )
    return calls


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(calls=_calls(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_a_stream_is_one_source_envelopes_or_a_vendors(
    any_object: Path, calls: list[tuple[str, str, list[str]]], seed: int, data: st.DataObject
) -> None:
    # envelopes and vendor events of every format, keyed and unkeyed, naming the same streams
    # and calls in any order: the reassembler holds calls by stream and call id, so a chat call
    # left unfinished and an envelope naming its id with the rest of its text and `final` were
    # accepted as one call (and an envelope's head finished by a chat stream's tail)
    rng = random.Random(seed)
    texts = []
    vendor: dict[tuple[str, str], list[streamgen.Call]] = {}
    envelopes: list[list[tuple[bytes | None, dict[str, Any]]]] = []
    for index, (stream_id, call_id, sources) in enumerate(calls):
        text = orjson.dumps({"call": index, "at": streamgen.arguments(rng)}).decode()
        texts.append(text)
        cuts = sorted(
            data.draw(
                st.sets(
                    st.integers(1, len(text) - 1),
                    min_size=len(sources) - 1,
                    max_size=len(sources) - 1,
                )
            )
        )
        parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        for number, (source, part) in enumerate(zip(sources, parts, strict=True)):
            if source != ENVELOPE:
                held = vendor.setdefault((source, stream_id), [])
                if call_id not in [held_id for held_id, _, _ in held]:  # a stream names it once
                    held.append((call_id, "tool_0", part))
                continue
            key = stream_id.encode() if data.draw(st.booleans()) else None
            numbered = data.draw(st.booleans())
            pieces = streamgen.split_text(part, rng)
            envelopes.append(
                [
                    (
                        key,
                        {
                            "stream_id": stream_id,
                            "call_id": call_id,
                            **({"seq": seq} if numbered else {}),
                            "kind": "tool_call",
                            "tool": "tool_0",
                            "delta": piece,
                            "final": number == len(parts) - 1 and seq == len(pieces) - 1,
                        },
                    )
                    for seq, piece in enumerate(pieces)
                ]
            )
    streams: list[list[tuple[str, bytes | None, dict[str, Any]]]] = [
        [(ENVELOPE, key, envelope) for key, envelope in stream] for stream in envelopes
    ]
    for (fmt, stream_id), held in sorted(vendor.items()):
        events = _STREAMS[fmt](stream_id, held, rng)
        if not data.draw(st.booleans()):
            events = events[: _end(fmt, events)]  # left unfinished
        streams.append([(fmt, stream_id.encode(), event) for event in events])
    batch = [
        Record(
            "in",
            0,
            offset,
            offset * 10,
            key,
            orjson.dumps(event),
            () if fmt == ENVELOPE else (("content-format", fmt.encode()),),
        )
        for offset, (_, (fmt, key, event)) in enumerate(streamgen.interleave(streams, rng))
    ]
    emissions = Gate(any_object).run([batch])
    # a call is accepted only whole from one source, and with that source's text
    whole = {
        (stream_id, call_id, texts[index])
        for index, (stream_id, call_id, sources) in enumerate(calls)
        if len(set(sources)) == 1
    }
    for e in emissions:
        if e.verdict.outcome is Outcome.ACCEPTED:
            found = (e.call.stream_id, e.call.call_id, e.call.arguments.decode())
            assert found in whole, (found, calls)
    # one verdict per call
    ids = [e.call.event_id for e in emissions]
    assert len(ids) == len(set(ids)), calls
    # nothing else lost: a call in one envelope stream whose stream no other call names is
    # accepted (whatever the vendor streams beside it do, left unfinished or not)
    for index, (stream_id, call_id, sources) in enumerate(calls):
        alone = all(other == index or s != stream_id for other, (s, _, _) in enumerate(calls))
        if alone and sources == [ENVELOPE]:
            accepted = [
                e
                for e in emissions
                if (e.call.stream_id, e.call.call_id) == (stream_id, call_id)
                and e.verdict.outcome is Outcome.ACCEPTED
            ]
            assert [e.call.arguments.decode() for e in accepted] == [texts[index]], calls
