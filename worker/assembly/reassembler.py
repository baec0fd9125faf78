"""The reassembler: an incremental decoder from ordered chunks of many streams to complete calls.

Feed it one chunk at a time with its record's position; it returns the calls that chunk closed
(complete ones, and ones that will never complete, marked `incomplete`). Calls are keyed by
(stream, call) inside a (topic, partition); parallel calls and many streams interleave freely.

- `seq`: a repeated seq is a duplicate, dropped and counted; a jump is a `sequence_gap` (the
  partition keeps order, so out-of-order is a gap too, never silently reordered).
- Truncation needs two signals: a stream's end (or the vendor's finish reason) with the call still
  open. A call closed by `final` is structurally complete; the parser judges the rest.
- Bounds: bytes and chunks per call (past them the text is dropped and the call ends `rejected`
  `too_large` / `too_many_chunks` when it closes), open calls per partition (the oldest is
  `evicted`). `expire(now)` ends calls idle past the timeout; `now` is the caller's clock.
- `safe_offset` answers the lowest offset of a partition that must not be committed yet: the first
  record of its oldest open call.

Nothing here reads the clock for decisions; the monotonic counter only measures assembly time.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields
from time import perf_counter_ns
from typing import Any

from worker.model import (
    NO_TRACE,
    AssembledCall,
    Chunk,
    ChunkKind,
    Code,
    FinishReason,
    Fragment,
    IncompleteReason,
    SourceSpan,
)

_INCOMPLETE_BY_FINISH = {
    FinishReason.LENGTH: IncompleteReason.MAX_TOKENS,
    FinishReason.CONTENT_FILTER: IncompleteReason.CONTENT_FILTER,
}
_RECENTLY_CLOSED = 4096
# module globals: one lookup each on the hot path
_END, _TOOL_CALL, _NO_TRACE = ChunkKind.END, ChunkKind.TOOL_CALL, NO_TRACE


# A frozen dataclass's __init__ sets each field through object.__setattr__ by name; setting the
# slots through their descriptors builds the very same AssembledCall in about half the time. The
# field list is checked once, so a new field in the model falls back to the constructor.
_CALL_FIELDS = (
    "stream_id",
    "call_id",
    "tool",
    "arguments",
    "channel",
    "tool_version",
    "idempotency_key",
    "trace",
    "source",
    "chunks",
    "incomplete",
    "assembly_error",
    "assembly_detail",
    "duplicate_chunks",
    "assembly_us",
)
_new = object.__new__
_setters: list[Any] = [
    getattr(AssembledCall.__dict__.get(n), "__set__", None) for n in _CALL_FIELDS
]
(
    _set_stream_id,
    _set_call_id,
    _set_tool,
    _set_arguments,
    _set_channel,
    _set_tool_version,
    _set_idempotency_key,
    _set_trace,
    _set_source,
    _set_chunks,
    _set_incomplete,
    _set_assembly_error,
    _set_assembly_detail,
    _set_duplicate_chunks,
    _set_assembly_us,
) = _setters
_BY_SLOTS = tuple(f.name for f in fields(AssembledCall)) == _CALL_FIELDS


@dataclass(frozen=True, slots=True)
class AssemblyLimits:
    idle_timeout_s: float = 60.0
    max_call_bytes: int = 256 * 1024
    max_call_chunks: int = 4096
    max_open_calls_per_partition: int = 10_000


_Scope = tuple[str, int]  # (topic, partition)
_Key = tuple[str, str]  # (stream_id, call_id)


class _OpenCall:
    """The state of one open call: small, and its text as the list of deltas received."""

    __slots__ = (
        "busy_ns",
        "call_id",
        "channel",
        "chunks",
        "duplicates",
        "first_offset",
        "idempotency_key",
        "key",
        "last_offset",
        "last_seen",
        "nbytes",
        "next_seq",
        "overflow",
        "parts",
        "stream_id",
        "tool",
        "tool_version",
        "trace",
    )

    def __init__(self, key: _Key, chunk: Chunk | None, *, offset: int, now: float) -> None:
        self.stream_id, self.call_id = key
        if chunk is None:  # a bare fragment: a tool call that names nothing yet
            self.channel = _TOOL_CALL
            self.tool = self.tool_version = self.idempotency_key = None
            self.trace = _NO_TRACE
        else:
            self.channel = chunk.kind
            self.tool = chunk.tool
            self.tool_version = chunk.tool_version
            self.idempotency_key = chunk.idempotency_key
            self.trace = chunk.trace
        self.parts: list[str] = []
        self.nbytes = 0
        self.chunks = 0
        self.duplicates = 0
        self.next_seq = 0
        self.first_offset = offset
        self.last_offset = offset
        self.last_seen = now
        self.overflow: Code | None = None
        self.busy_ns = 0
        self.key = key  # (stream_id, call_id), the very tuple its partition is keyed by


class _Partition:
    __slots__ = ("calls", "closed", "scope", "streams")

    def __init__(self, scope: _Scope) -> None:
        self.scope = scope  # one tuple per partition, shared by everything that names it
        # insertion order is first-offset order: the first entry is the oldest open call
        self.calls: OrderedDict[_Key, _OpenCall] = OrderedDict()
        # call ids open per stream: a list, as a stream has one or a few calls open at a time
        self.streams: dict[str, list[str]] = {}
        # recently closed calls, so late duplicates are dropped, not reopened
        self.closed: OrderedDict[_Key, None] = OrderedDict()


class Reassembler:
    def __init__(self, limits: AssemblyLimits | None = None) -> None:
        self.limits = limits or AssemblyLimits()
        self._max_call_bytes = self.limits.max_call_bytes  # read per chunk: kept at hand
        self._max_call_chunks = self.limits.max_call_chunks
        self._partitions: dict[_Scope, _Partition] = {}
        # every open call, least recently fed first, with its partition's scope
        self._by_activity: OrderedDict[_OpenCall, _Scope] = OrderedDict()
        self._buffered = 0
        self.duplicates_dropped = 0

    @property
    def open_calls(self) -> int:
        return len(self._by_activity)

    @property
    def buffered_bytes(self) -> int:
        return self._buffered

    def feed(
        self, chunk: Chunk, *, topic: str, partition: int, offset: int, now: float
    ) -> list[AssembledCall]:
        """One chunk at its record's position; the calls it closed, if any."""
        if chunk.kind is _END:
            part = self._partition(topic, partition)
            return self._end_stream(part.scope, part, chunk, offset)
        stream_id = chunk.stream_id
        call_id = chunk.call_id or f"{stream_id}:{chunk.kind.value}"
        fragment = (stream_id, call_id, chunk.seq, chunk.delta, chunk.final)
        return self._add(fragment, chunk, topic=topic, partition=partition, offset=offset, now=now)

    def feed_fragment(
        self, fragment: Fragment, *, topic: str, partition: int, offset: int, now: float
    ) -> list[AssembledCall]:
        """`feed` for a bare tool-call fragment, with the same result as feeding its `Chunk`."""
        return self._add(fragment, None, topic=topic, partition=partition, offset=offset, now=now)

    def _partition(self, topic: str, partition: int) -> _Partition:
        part = self._partitions.get((topic, partition))
        if part is None:
            part = self._partitions[(topic, partition)] = _Partition((topic, partition))
        return part

    def _add(
        self,
        fragment: Fragment,
        chunk: Chunk | None,
        *,
        topic: str,
        partition: int,
        offset: int,
        now: float,
    ) -> list[AssembledCall]:
        """One call's next piece; `chunk` is None for a bare fragment, which names nothing."""
        started = perf_counter_ns()
        # per chunk: the dict lookup inline, the helper only for a partition's first chunk
        part = self._partitions.get((topic, partition)) or self._partition(topic, partition)
        scope = part.scope
        stream_id, call_id, seq, delta, final = fragment
        key = (stream_id, call_id)
        calls = part.calls
        state = calls.get(key)
        done: list[AssembledCall] = []
        if state is None:
            if key in part.closed:  # a late chunk of a call already closed: never reopened
                self.duplicates_dropped += 1
                return done
            state = _OpenCall(key, chunk, offset=offset, now=now)
            if len(calls) >= self.limits.max_open_calls_per_partition:
                _, oldest = calls.popitem(last=False)
                done.append(self._close(scope, part, oldest, IncompleteReason.EVICTED, popped=True))
            calls[key] = state
            siblings = part.streams.get(stream_id)
            if siblings is None:
                part.streams[stream_id] = [call_id]
            else:
                siblings.append(call_id)
            self._by_activity[state] = scope
        else:
            self._by_activity.move_to_end(state)

        if seq is not None and seq != state.next_seq:
            if seq < state.next_seq:
                state.duplicates += 1
                self.duplicates_dropped += 1
                state.last_seen = now
                return done
            state.last_offset = offset
            done.append(self._close(scope, part, state, IncompleteReason.SEQUENCE_GAP))
            return done
        state.next_seq += 1
        state.chunks += 1
        state.last_offset = offset
        state.last_seen = now
        if chunk is not None:
            if state.tool is None and chunk.tool is not None:
                state.tool, state.tool_version = chunk.tool, chunk.tool_version
            if state.idempotency_key is None:
                state.idempotency_key = chunk.idempotency_key
            if state.trace is _NO_TRACE:
                state.trace = chunk.trace
        if delta and state.overflow is None:
            size = len(delta) if delta.isascii() else len(delta.encode("utf-8", "surrogatepass"))
            if state.nbytes + size > self._max_call_bytes:
                self._overflow(state, Code.TOO_LARGE)
            else:
                state.parts.append(delta)
                state.nbytes += size
                self._buffered += size
        if state.chunks > self._max_call_chunks and state.overflow is None:
            self._overflow(state, Code.TOO_MANY_CHUNKS)
        state.busy_ns += perf_counter_ns() - started
        if final:
            done.append(self._close(scope, part, state, None))
        return done

    def expire(self, now: float) -> list[AssembledCall]:
        """Calls with no chunk for the idle timeout, ended `incomplete` `timeout`."""
        deadline = now - self.limits.idle_timeout_s
        done: list[AssembledCall] = []
        while self._by_activity:
            state, scope = next(iter(self._by_activity.items()))
            if state.last_seen > deadline:
                break
            part = self._partitions[scope]
            done.append(self._close(scope, part, state, IncompleteReason.TIMEOUT))
        return done

    def flush(self) -> list[AssembledCall]:
        """End of all input: every open call ends `incomplete` `stream_ended`."""
        done = []
        for state, scope in list(self._by_activity.items()):
            done.append(
                self._close(scope, self._partitions[scope], state, IncompleteReason.STREAM_ENDED)
            )
        return done

    def drop_partition(self, topic: str, partition: int) -> None:
        """Forget a revoked partition's open calls: its next owner replays them."""
        part = self._partitions.pop((topic, partition), None)
        if part is None:
            return
        for state in part.calls.values():
            self._buffered -= state.nbytes
            del self._by_activity[state]

    def safe_offset(self, topic: str, partition: int) -> int | None:
        """The first offset of the partition's oldest open call, or None when none is open."""
        part = self._partitions.get((topic, partition))
        if part is None or not part.calls:
            return None
        return next(iter(part.calls.values())).first_offset

    def _overflow(self, state: _OpenCall, code: Code) -> None:
        state.overflow = code
        self._buffered -= state.nbytes
        state.parts = []

    def _end_stream(
        self, scope: _Scope, part: _Partition, chunk: Chunk, offset: int
    ) -> list[AssembledCall]:
        call_ids = part.streams.get(chunk.stream_id)
        if not call_ids:
            return []
        reason = _INCOMPLETE_BY_FINISH.get(chunk.finish_reason, IncompleteReason.STREAM_ENDED)  # type: ignore[arg-type]
        done = []
        for call_id in sorted(
            call_ids, key=lambda c: part.calls[(chunk.stream_id, c)].first_offset
        ):
            state = part.calls[(chunk.stream_id, call_id)]
            state.last_offset = offset
            done.append(self._close(scope, part, state, reason))
        return done

    def _close(
        self,
        scope: _Scope,
        part: _Partition,
        state: _OpenCall,
        incomplete: IncompleteReason | None,
        *,
        popped: bool = False,
    ) -> AssembledCall:
        started = perf_counter_ns()
        key = state.key
        if not popped:
            del part.calls[key]
        del self._by_activity[state]
        stream_calls = part.streams.get(state.stream_id)
        if stream_calls is not None:
            if state.call_id in stream_calls:
                stream_calls.remove(state.call_id)
            if not stream_calls:
                del part.streams[state.stream_id]
        part.closed[key] = None
        if len(part.closed) > _RECENTLY_CLOSED:
            part.closed.popitem(last=False)
        self._buffered -= state.nbytes
        text = "".join(state.parts).encode("utf-8", "surrogatepass")
        error = state.overflow if incomplete is None else None
        detail = None
        if error is Code.TOO_LARGE:
            detail = f"the call exceeded {self.limits.max_call_bytes} bytes"
        elif error is Code.TOO_MANY_CHUNKS:
            detail = f"the call exceeded {self.limits.max_call_chunks} chunks"
        source = SourceSpan(scope[0], scope[1], state.first_offset, state.last_offset)
        assembly_us = (state.busy_ns + perf_counter_ns() - started) // 1000
        if not _BY_SLOTS:
            return AssembledCall(
                stream_id=state.stream_id,
                call_id=state.call_id,
                tool=state.tool,
                arguments=text,
                channel=state.channel,
                tool_version=state.tool_version,
                idempotency_key=state.idempotency_key,
                trace=state.trace,
                source=source,
                chunks=state.chunks,
                incomplete=incomplete,
                assembly_error=error,
                assembly_detail=detail,
                duplicate_chunks=state.duplicates,
                assembly_us=assembly_us,
            )
        call: AssembledCall = _new(AssembledCall)
        _set_stream_id(call, state.stream_id)
        _set_call_id(call, state.call_id)
        _set_tool(call, state.tool)
        _set_arguments(call, text)
        _set_channel(call, state.channel)
        _set_tool_version(call, state.tool_version)
        _set_idempotency_key(call, state.idempotency_key)
        _set_trace(call, state.trace)
        _set_source(call, source)
        _set_chunks(call, state.chunks)
        _set_incomplete(call, incomplete)
        _set_assembly_error(call, error)
        _set_assembly_detail(call, detail)
        _set_duplicate_chunks(call, state.duplicates)
        _set_assembly_us(call, assembly_us)
        return call
