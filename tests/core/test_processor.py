"""The record processor: records in, events out, poison records isolated, commit offsets safe."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.datafiles import SCHEMAS
from worker.core.processor import InboundRecord, Processor
from worker.settings import load_settings


@pytest.fixture
def processor() -> Processor:
    return Processor.from_settings(load_settings(schemas={"dir": SCHEMAS}))


def envelope(**fields: Any) -> bytes:
    return orjson.dumps({"stream_id": "r1", "kind": "tool_call", **fields})


def complete_call(call_id: str) -> bytes:
    """A whole valid get_weather call in one envelope."""
    return envelope(
        call_id=call_id,
        seq=0,
        tool="get_weather",
        final=True,
        delta='{"city":"Oslo","units":"celsius"}',
    )


class Records:
    def __init__(self) -> None:
        self.offset = 0

    def __call__(self, value: bytes | None, key: bytes = b"r1", **headers: str) -> InboundRecord:
        record = InboundRecord("in", 0, self.offset, key, value, headers)
        self.offset += 1
        return record


def test_a_call_in_chunks_becomes_one_accepted_event(processor: Processor) -> None:
    rec = Records()
    assert (
        processor.feed(
            rec(
                envelope(
                    call_id="c1", seq=0, tool="get_weather", tool_version="1", delta='{"city":"Hang'
                )
            ),
            now=0,
        )
        == []
    )
    (emission,) = processor.feed(
        rec(
            envelope(
                call_id="c1",
                seq=1,
                delta='zhou","units":"celsius"}',
                final=True,
                trace_id="t-1",
                attempt=1,
            )
        ),
        now=0,
    )
    event = orjson.loads(emission.value)
    assert event["outcome"] == "accepted"
    assert event["arguments"] == {"city": "Hangzhou", "units": "celsius", "days": 1}
    assert event["schema"] == {"id": "weather.get_weather", "version": "1"}
    assert event["source"] == {"topic": "in", "partition": 0, "first_offset": 0, "last_offset": 1}
    assert event["metrics"]["chunks"] == 2
    assert set(event["metrics"]["phases_us"]) >= {"assembly", "json_parse", "schema_validation"}
    assert event["trace_id"] == "t-1"
    assert emission.key == b"c1"
    assert dict(emission.headers)["outcome"] == b"accepted"
    assert processor.commit_offset("in", 0) == 2


def test_poison_records_are_rejected_and_the_partition_moves_on(processor: Processor) -> None:
    rec = Records()
    bad = [b"not json", b"[]", orjson.dumps({"kind": "tool_call"}), None]
    emissions = [e for value in bad for e in processor.feed(rec(value), now=0)]
    unknown = processor.feed(rec(b"{}", **{"content-format": "gemini.stream"}), now=0)
    events = [orjson.loads(e.value) for e in emissions + unknown]
    assert [(e["outcome"], e["phase"], e["error_code"]) for e in events] == [
        ("rejected", "assembly", "malformed_record")
    ] * 5
    assert "gemini.stream" in events[-1]["violations"][0]["message"]
    (good,) = processor.feed(
        rec(complete_call("c")),
        now=0,
    )
    assert orjson.loads(good.value)["outcome"] == "accepted"
    assert processor.commit_offset("in", 0) == rec.offset
    assert processor.poison_records == 5


def test_commit_offset_never_passes_an_open_call(processor: Processor) -> None:
    rec = Records()
    processor.feed(rec(envelope(call_id="open", seq=0, tool="get_weather", delta="{")), now=0)
    for i in range(5):
        processor.feed(rec(complete_call(f"c{i}")), now=0)
    assert processor.commit_offset("in", 0) == 0
    processor.feed(rec(envelope(call_id="open", seq=1, delta="}", final=True)), now=0)
    assert processor.commit_offset("in", 0) == rec.offset
    assert processor.commit_offset("in", 7) is None


def test_replayed_input_emits_the_same_event_ids(processor: Processor) -> None:
    def run(p: Processor) -> list[str]:
        rec = Records()
        values = [
            envelope(call_id="a", seq=0, tool="get_weather", delta='{"city":"Oslo",'),
            envelope(call_id="b", seq=0, tool="get_weather", delta="{", final=True),
            envelope(call_id="a", seq=1, delta='"units":"celsius"}', final=True),
        ]
        return [orjson.loads(e.value)["event_id"] for v in values for e in p.feed(rec(v), now=0)]

    first = run(processor)
    assert len(first) == 2
    assert run(Processor.from_settings(load_settings(schemas={"dir": SCHEMAS}))) == first


def test_revoke_drops_open_calls_and_expire_times_out(processor: Processor) -> None:
    rec = Records()
    processor.feed(rec(envelope(call_id="a", seq=0, tool="get_weather", delta="{")), now=0)
    processor.revoke("in", 0)
    assert processor.open_calls == 0
    assert processor.commit_offset("in", 0) is None
    processor.feed(rec(envelope(call_id="b", seq=0, tool="get_weather", delta="{")), now=100)
    (expired,) = processor.expire(now=100 + 3600)
    assert orjson.loads(expired.value)["reason"] == "timeout"


def test_stream_end_marks_open_calls_incomplete(processor: Processor) -> None:
    rec = Records()
    processor.feed(
        rec(envelope(call_id="a", seq=0, tool="get_weather", delta='["ls","pwd"')), now=0
    )
    (emission,) = processor.feed(
        rec(orjson.dumps({"stream_id": "r1", "kind": "end", "finish_reason": "length"})), now=0
    )
    event = orjson.loads(emission.value)
    assert (event["outcome"], event["reason"]) == ("incomplete", "max_tokens")


def test_a_replay_inside_a_judged_call_names_the_same_event(processor: Processor) -> None:
    """Commit stops at an open call; a judged call's tail fed again keeps the original id."""
    rec = Records()
    values = [
        envelope(call_id="b", seq=0, tool="get_weather", delta='{"city":"Oslo",'),  # 0
        envelope(call_id="a", seq=0, tool="get_weather", delta="{"),  # 1: stays open
        envelope(call_id="b", seq=1, delta='"units":"celsius"}', final=True),  # 2
    ]
    (judged,) = [e for v in values for e in processor.feed(rec(v), now=0)]
    assert processor.commit_offset("in", 0) == 1
    replay = Processor.from_settings(load_settings(schemas={"dir": SCHEMAS}))
    tail = [
        e
        for offset in (1, 2)
        for e in replay.feed(InboundRecord("in", 0, offset, b"r1", values[offset]), now=0)
    ]
    (fragment,) = tail
    assert orjson.loads(fragment.value)["reason"] == "sequence_gap"
    assert orjson.loads(fragment.value)["event_id"] == orjson.loads(judged.value)["event_id"]


def test_commit_offset_waits_for_an_open_vendor_stream(processor: Processor) -> None:
    rec = Records()
    start = (
        b'{"type":"message_start","message":{"id":"m","type":"message","role":"assistant",'
        b'"model":"m","content":[],"stop_reason":null,"usage":{"input_tokens":1,"output_tokens":1}}}'
    )
    processor.feed(rec(start, key=b"anthropic-1", **{"content-format": "anthropic.messages"}), 0)
    processor.feed(
        rec(complete_call("c")),
        now=0,
    )
    assert processor.commit_offset("in", 0) == 0
    stop = b'{"type":"message_stop"}'
    processor.feed(rec(stop, key=b"anthropic-1", **{"content-format": "anthropic.messages"}), 0)
    assert processor.commit_offset("in", 0) == rec.offset


def test_tool_names_by_alias(processor: Processor) -> None:
    assert processor.tool_name("weather.get_weather") == "get_weather"
    assert processor.tool_name("get_weather") == "get_weather"
    assert processor.tool_name("rm_rf") == "rm_rf"
    assert processor.tool_name(None) is None


def test_bare_middle_fragments_judge_as_full_envelopes_do() -> None:
    """Middle chunks with only their six fields skip the Chunk; the events must not show it."""
    pieces = ['{"city":', '"Oslo",', '"units":', '"kelvin"}']

    def events(extra: dict[str, Any]) -> list[dict[str, Any]]:
        processor = Processor.from_settings(load_settings(schemas={"dir": SCHEMAS}))
        rec = Records()
        records = [rec(envelope(call_id="c", seq=0, tool="get_weather", delta=pieces[0]))]
        for seq, delta in enumerate(pieces[1:], start=1):
            fields = {"call_id": "c", "seq": seq, "delta": delta, "final": seq == 3, **extra}
            records.append(rec(envelope(**fields)))
        out = [orjson.loads(e.value) for e in processor.feed_many(records, now=0)]
        for event in out:
            event["metrics"]["phases_us"] = sorted(event["metrics"]["phases_us"])
        return out

    # a seventh field (null, so it changes nothing) sends every middle chunk down the general path
    bare, general = events({}), events({"idempotency_key": None})
    assert bare == general
    assert [(e["outcome"], e["error_code"], e["metrics"]["chunks"]) for e in bare] == [
        ("rejected", "schema_violation", 4)
    ]
