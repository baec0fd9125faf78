"""Checkpointed adapters decide as the originals would: an adapter restored from its `state()` at
any point of any stream, and a partition's decoder restored from its full and incremental
states, make exactly the chunks for the rest of the stream that the originals make."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.adapters import streamgen
from tests.adapters.mutations import mutated
from tests.adapters.oracles import MCP, Record, decoder, encode, records
from tests.adapters.test_integrity import STREAMS, _random_stream
from worker._native import Chunk
from worker.adapters.decoder import ADAPTERS, ENVELOPE, Decoder
from worker.errors import InputFormatError

Event = dict[str, Any]
HEADERS = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def key(chunk: Chunk) -> tuple[Any, ...]:
    return (
        chunk.stream_id,
        chunk.kind,
        chunk.call_id,
        chunk.seq,
        chunk.tool,
        chunk.tool_version,
        chunk.delta,
        chunk.final,
        chunk.finish_reason,
        chunk.traceparent,
        chunk.expected,
        chunk.error,
    )


def run(adapter: Any, events: Sequence[Event]) -> list[Any]:
    """What the adapter makes of each event: its chunks, or the error that stops the stream."""
    out: list[Any] = []
    for event in events:
        try:
            out.append([key(chunk) for chunk in adapter.feed(event)])
        except InputFormatError as exc:
            out.append(str(exc))
            break
    return out


def assert_restorable(fmt: str, events: Sequence[Event]) -> None:
    factory = ADAPTERS[fmt]
    for cut in range(len(events) + 1):
        original = factory("s1", HEADERS, None, max_calls=8)
        head = run(original, events[:cut])
        if head and isinstance(head[-1], str):
            return  # the stream broke: the decoder drops it, nothing is restored
        state = orjson.loads(orjson.dumps(original.state()))
        restored = factory("s1", HEADERS, state, max_calls=8)
        assert (restored.open_calls(), restored.held) == (original.open_calls(), original.held)
        assert run(restored, events[cut:]) == run(original, events[cut:]), f"cut at {cut}"


def test_every_recorded_and_generated_stream_restores_at_every_event() -> None:
    for _, fmt, events in STREAMS:
        assert_restorable(fmt, events)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_random_generated_streams_restore_at_every_event(seed: int) -> None:
    fmt, events = _random_stream(seed)
    assert_restorable(fmt, events)


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.sampled_from(range(len(STREAMS))).flatmap(
        lambda i: st.tuples(st.just(i), mutated(STREAMS[i][2]))
    )
)
def test_changed_streams_restore_at_every_event_up_to_where_they_break(
    change: tuple[int, tuple[str, list[Event]]],
) -> None:
    index, (_, events) = change
    assert_restorable(STREAMS[index][1], events)


# -- a partition's decoder --------------------------------------------------------------------


def partition_records(seed: int) -> list[Record]:
    """Many streams of every vendor format interleaved in one partition, some of them broken,
    and envelopes between them; offsets in order."""
    rng = random.Random(seed)
    streams: list[tuple[str, str, list[bytes]]] = []
    for n in range(rng.randint(3, 9)):
        fmt, events = _random_stream(rng.randrange(2**32))
        values = encode(events)
        if rng.random() < 0.25:  # a broken event somewhere
            values[rng.randrange(len(values))] = b'{"type":"nonsense","choices":7}'
        streams.append((f"stream-{n}", fmt, values))
        if rng.random() < 0.3:
            result = {"jsonrpc": "2.0", "id": n, "result": {"content": []}}
            streams.append((f"mcp-{n}", MCP, [orjson.dumps(result)]))
    envelope = orjson.dumps(
        {"stream_id": "env", "call_id": "e1", "kind": "tool_call", "delta": "{}", "final": True}
    )
    streams.append(("env", ENVELOPE, [envelope]))
    out: list[Record] = []
    for offset, (i, value) in enumerate(streamgen.interleave([s[2] for s in streams], rng)):
        stream_id, fmt, _ = streams[i]
        (record,) = records(fmt, [value], stream_id, start=offset, headers={"tool": "t"})
        out.append(record)
    return out


def decode_all(decoder: Decoder, batch: Sequence[Record]) -> list[tuple[Any, ...]]:
    out = []
    for record in batch:
        fmt = dict(record.headers).get("content-format")
        if fmt is not None:
            out += [key(chunk) for chunk in decoder.decode(record, fmt.decode())]
    return out


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = orjson.loads(orjson.dumps(state))
    return result


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    bound=st.integers(min_value=2, max_value=12),
    cuts=st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=5),
)
def test_a_partition_restored_from_its_checkpoints_decodes_the_rest_as_the_original(
    seed: int, bound: int, cuts: list[float]
) -> None:
    """A full state, then the changes since each checkpoint: restored from the first k of them
    (and from one full state of that restored decoder), a decoder makes the original's chunks."""
    batch = partition_records(seed)
    points = sorted({round(c * len(batch)) for c in cuts})
    for k in range(1, len(points) + 1):
        original = decoder(bound)
        states: list[dict[str, Any]] = []
        done = 0
        for n, point in enumerate(points[:k]):
            decode_all(original, batch[done:point])
            done = point
            states.append(roundtrip(original.state("in", 0, full=n == 0)))
        restored = decoder(bound)
        restored.restore("in", 0, states)
        again = decoder(bound)
        again.restore("in", 0, [roundtrip(restored.state("in", 0, full=True))])
        expected = decode_all(original, batch[done:])
        assert decode_all(restored, batch[done:]) == expected, f"{k} states, at {done}"
        assert decode_all(again, batch[done:]) == expected, f"one full state, at {done}"
