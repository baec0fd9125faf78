"""The reassembler without a broker: ordering, duplicates, gaps, truncation, bounds, offsets."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.assembly.reassembler import AssemblyLimits, Reassembler
from worker.model import (
    AssembledCall,
    Chunk,
    ChunkKind,
    Code,
    FinishReason,
    Fragment,
    IncompleteReason,
)


def call_chunk(stream: str, call: str, seq: int | None, delta: str, **kw: object) -> Chunk:
    return Chunk(stream, ChunkKind.TOOL_CALL, call_id=call, seq=seq, delta=delta, **kw)  # type: ignore[arg-type]


class Feeder:
    """Feeds chunks as consecutive records of one partition."""

    def __init__(self, limits: AssemblyLimits | None = None) -> None:
        self.r = Reassembler(limits)
        self.offset = 0

    def __call__(self, chunk: Chunk, now: float = 0.0, partition: int = 0) -> list[AssembledCall]:
        out = self.r.feed(chunk, topic="t", partition=partition, offset=self.offset, now=now)
        self.offset += 1
        return out


def test_interleaved_parallel_calls_of_many_streams() -> None:
    feed = Feeder()
    done: list[AssembledCall] = []
    for i in range(3):
        done += feed(call_chunk(f"s{i}", "a", 0, '{"x":', tool="t1"))
        done += feed(call_chunk(f"s{i}", "b", 0, '{"y":', tool="t2"))
    for i in range(3):
        done += feed(call_chunk(f"s{i}", "b", 1, f"{i}}}", final=True))
        done += feed(call_chunk(f"s{i}", "a", 1, f"{i}}}", final=True))
    assert [(c.stream_id, c.call_id, c.tool, c.arguments) for c in done] == [
        (f"s{i}", cid, tool, f'{{"{k}":{i}}}'.encode())
        for i in range(3)
        for cid, tool, k in (("b", "t2", "y"), ("a", "t1", "x"))
    ]
    assert all(c.incomplete is None and c.chunks == 2 for c in done)
    assert feed.r.open_calls == 0
    assert feed.r.buffered_bytes == 0


def test_duplicate_chunks_are_dropped_and_counted() -> None:
    feed = Feeder()
    feed(call_chunk("s", "c", 0, '{"a":', tool="t"))
    feed(call_chunk("s", "c", 0, '{"a":', tool="t"))
    (done,) = feed(call_chunk("s", "c", 1, "1}", final=True))
    assert done.arguments == b'{"a":1}'
    assert done.duplicate_chunks == 1
    assert feed(call_chunk("s", "c", 1, "1}", final=True)) == []  # late duplicate after close
    assert feed.r.duplicates_dropped == 2
    assert feed.r.open_calls == 0


def test_a_gap_is_incomplete_and_never_reordered() -> None:
    feed = Feeder()
    feed(call_chunk("s", "c", 0, '{"a":', tool="t"))
    (done,) = feed(call_chunk("s", "c", 2, "}", final=True))
    assert done.incomplete is IncompleteReason.SEQUENCE_GAP
    assert feed(call_chunk("s", "c", 1, "1", final=False)) == []
    assert feed.r.open_calls == 0


def test_missing_first_chunk_is_a_gap() -> None:
    feed = Feeder()
    (done,) = feed(call_chunk("s", "c", 3, "}", final=True))
    assert done.incomplete is IncompleteReason.SEQUENCE_GAP


def test_stream_end_with_calls_open_is_incomplete_by_finish_reason() -> None:
    feed = Feeder()
    feed(call_chunk("s", "a", 0, '["ls","pwd"', tool="t"))
    feed(call_chunk("s", "b", 0, '{"x"', tool="t"))
    ended = feed(Chunk("s", ChunkKind.END, finish_reason=FinishReason.LENGTH))
    assert [(c.call_id, c.incomplete) for c in ended] == [
        ("a", IncompleteReason.MAX_TOKENS),
        ("b", IncompleteReason.MAX_TOKENS),
    ]
    feed(call_chunk("s2", "a", 0, "{", tool="t"))
    (stopped,) = feed(Chunk("s2", ChunkKind.END, finish_reason=FinishReason.TOOL_CALLS))
    assert stopped.incomplete is IncompleteReason.STREAM_ENDED
    feed(call_chunk("s3", "a", 0, "{", tool="t"))
    (filtered,) = feed(Chunk("s3", ChunkKind.END, finish_reason=FinishReason.CONTENT_FILTER))
    assert filtered.incomplete is IncompleteReason.CONTENT_FILTER


def test_idle_calls_expire_by_the_callers_clock() -> None:
    feed = Feeder(AssemblyLimits(idle_timeout_s=10))
    feed(call_chunk("s", "old", 0, "{", tool="t"), now=0.0)
    feed(call_chunk("s", "new", 0, "{", tool="t"), now=5.0)
    assert feed.r.expire(9.9) == []
    (expired,) = feed.r.expire(10.0)
    assert (expired.call_id, expired.incomplete) == ("old", IncompleteReason.TIMEOUT)
    feed(call_chunk("s", "new", 1, "", tool="t"), now=14.0)  # activity keeps it alive
    assert feed.r.expire(20.0) == []
    assert [c.call_id for c in feed.r.expire(24.0)] == ["new"]


def test_too_large_and_too_many_chunks_release_memory_and_reject_at_close() -> None:
    feed = Feeder(AssemblyLimits(max_call_bytes=10, max_call_chunks=3))
    feed(call_chunk("s", "big", 0, "x" * 8, tool="t"))
    feed(call_chunk("s", "big", 1, "杭州", tool="t"))  # 6 bytes in UTF-8: over the bound
    assert feed.r.buffered_bytes == 0
    (big,) = feed(call_chunk("s", "big", 2, "}", final=True))
    assert big.assembly_error is Code.TOO_LARGE
    assert big.arguments == b""
    for seq in range(3):
        feed(call_chunk("s", "many", seq, "", tool="t"))
    (many,) = feed(call_chunk("s", "many", 3, "", final=True))
    assert many.assembly_error is Code.TOO_MANY_CHUNKS


def test_open_calls_per_partition_are_bounded_oldest_evicted() -> None:
    feed = Feeder(AssemblyLimits(max_open_calls_per_partition=2))
    feed(call_chunk("s", "a", 0, "{", tool="t"))
    feed(call_chunk("s", "b", 0, "{", tool="t"))
    (evicted,) = feed(call_chunk("s", "c", 0, "{", tool="t"))
    assert (evicted.call_id, evicted.incomplete) == ("a", IncompleteReason.EVICTED)
    assert feed.r.open_calls == 2


def test_safe_offset_is_the_first_record_of_the_oldest_open_call() -> None:
    feed = Feeder()
    assert feed.r.safe_offset("t", 0) is None
    feed(call_chunk("s", "a", 0, "{", tool="t"))  # offset 0
    feed(call_chunk("s", "b", 0, "{", tool="t"))  # offset 1
    feed(call_chunk("s", "a", 1, "}", final=True))  # offset 2 closes a
    assert feed.r.safe_offset("t", 0) == 1
    feed(call_chunk("s", "b", 1, "}", final=True))
    assert feed.r.safe_offset("t", 0) is None


def test_drop_partition_forgets_only_that_partition() -> None:
    feed = Feeder()
    feed(call_chunk("s", "a", 0, "{", tool="t"), partition=0)
    feed(call_chunk("z", "a", 0, "{", tool="t"), partition=1)
    feed.r.drop_partition("t", 0)
    assert feed.r.open_calls == 1
    assert feed.r.buffered_bytes == 1
    assert feed.r.safe_offset("t", 0) is None
    assert [c.stream_id for c in feed.r.flush()] == ["z"]


def test_unnumbered_chunks_follow_record_order() -> None:
    feed = Feeder()
    feed(call_chunk("s", "a", None, '{"q":', tool="t", tool_version="2", idempotency_key="k"))
    (done,) = feed(call_chunk("s", "a", None, '"杭州"}', final=True))
    assert done.arguments == '{"q":"杭州"}'.encode()
    assert (done.tool, done.tool_version, done.idempotency_key) == ("t", "2", "k")
    assert done.source is not None
    assert (done.source.first_offset, done.source.last_offset) == (0, 1)


def test_many_interleaved_streams_keep_memory_bounded() -> None:
    feed = Feeder()
    streams = 3000
    for seq in range(3):
        for s in range(streams):
            feed(call_chunk(f"s{s}", "c", seq, '{"k":1' if seq == 0 else "", tool="t"))
    assert feed.r.open_calls == streams
    done = [c for s in range(streams) for c in feed(call_chunk(f"s{s}", "c", 3, "}", final=True))]
    assert len(done) == streams
    assert all(c.arguments == b'{"k":1}' for c in done)
    assert feed.r.open_calls == 0
    assert feed.r.buffered_bytes == 0


FRAGMENTS = st.lists(
    st.tuples(
        st.sampled_from(["s1", "s2"]),
        st.sampled_from(["a", "b", "c"]),
        st.none() | st.integers(0, 4),
        st.sampled_from(["", "{", '"x":1', "}", "é"]),
        st.booleans(),
    ),
    max_size=60,
)


def _timeless(calls: list[AssembledCall]) -> list[AssembledCall]:
    """The calls with their measured assembly time, the one field that may differ, zeroed."""
    return [replace(call, assembly_us=0) for call in calls]


@settings(max_examples=300, deadline=None)
@given(fragments=FRAGMENTS, ends=st.sets(st.integers(0, 59), max_size=4))
def test_a_bare_fragment_assembles_as_its_chunk_does(
    fragments: list[Fragment], ends: set[int]
) -> None:
    limits = AssemblyLimits(max_call_bytes=8, max_call_chunks=3, max_open_calls_per_partition=3)
    by_chunk, by_fragment = Reassembler(limits), Reassembler(limits)
    for offset, fragment in enumerate(fragments):
        stream_id, call_id, seq, delta, final = fragment
        chunk = Chunk(stream_id, ChunkKind.TOOL_CALL, call_id, seq, delta=delta, final=final)
        now = float(offset)
        closed = by_chunk.feed(chunk, topic="t", partition=0, offset=offset, now=now)
        assert _timeless(closed) == _timeless(
            by_fragment.feed_fragment(fragment, topic="t", partition=0, offset=offset, now=now)
        )
        if offset in ends:  # a stream's end between fragments closes what it holds
            end = Chunk(stream_id, ChunkKind.END, finish_reason=FinishReason.LENGTH)
            assert _timeless(
                by_chunk.feed(end, topic="t", partition=0, offset=offset, now=now)
            ) == (_timeless(by_fragment.feed(end, topic="t", partition=0, offset=offset, now=now)))
        assert by_fragment.safe_offset("t", 0) == by_chunk.safe_offset("t", 0)
    assert (by_chunk.open_calls, by_chunk.buffered_bytes, by_chunk.duplicates_dropped) == (
        by_fragment.open_calls,
        by_fragment.buffered_bytes,
        by_fragment.duplicates_dropped,
    )
    assert _timeless(by_chunk.flush()) == _timeless(by_fragment.flush())
