"""Vendor records to chunks: the `content-format` of a record picks its adapter.

The native reassembler decodes canonical envelopes itself and calls `Decoder.decode` for every
record with a `content-format` header. Vendor adapters are incremental decoders (one vendor
event in, zero or more chunks out) kept per (topic, partition, format, stream), so a revoked
partition's adapters go with it (`drop`), and a partition's adapters are written and restored
with its checkpoint (`state`, `restore`).

The rules every format follows, kept here once:

- A stream ends once. When its adapter makes the END chunk the adapter is forgotten and the
  stream is remembered as ended: a later event of it is one the stream cannot place (below),
  except the few a format sends after its end that carry nothing (`after_end`, such as Chat
  Completions' usage chunk), which are dropped.
- Failing closed: when a record cannot be placed (not strict JSON, not an object, an event the
  adapter refuses, an event after the end, a chunk whose identifier is longer than
  `max_id_bytes`), the record is `malformed` and every call of every stream it could belong to
  is aborted (`stream_corrupt`): those still streaming and those complete but held for the
  stream's END (see `worker.adapters._base`). The streams it could belong to: its own (its
  format, its key); with no usable key, every stream of its format in the partition; with a
  format callgate does not read, the streams of its key in every format (every stream, with
  no key either). Those streams are then corrupt: their later records are dropped and counted.
  A stream broken at its first record (broken JSON, before any record of it was read) still
  ends each call it can be seen to make: a call one of its later records opens (its adapter's
  `announced`: a function call's item, a tool block's start, ...) is opened and at once aborted,
  so it gets its `stream_corrupt` event. The log line of the broken record says which calls it
  ended, or that none of its stream had been read yet.
  A bug in an adapter is the record's `internal_error`, with the same effect, and is logged
  once with the record's position. A format whose every record is a whole call (`mcp.result`)
  has nothing else a bad record could belong to: the record alone is rejected, and the stream's
  next records are judged as usual.
- A key names one stream, in one format: a record that would open a stream under a key whose
  stream of another format is live or remembered (ended or broken) is one it cannot place (the
  reassembler holds calls by key and call id: the two streams' calls would merge).
- A stream is made for one principal: its first record's `principal` header (none: none). A
  later record naming another (or none, or one that is not UTF-8) is one the stream cannot
  place, so a call is never judged for a principal that some of its records did not name.
- Every vendor record is parsed strictly, nesting at most `MAX_DEPTH` levels (the one bound of
  every parser and encoder: `worker.model.MAX_DEPTH`).

A record's `content-format` may name a dialect (`openai.chat; dialect=ollama`), and an input
topic may have one (`dialects`, from the settings): a stream is read in its dialect from its
first record on (the adapter finds it in its headers, kept with its checkpoint), and a record
that names another is one the stream cannot place (`worker.adapters.dialects`).

A partition keeps at most `max_streams_per_partition` streams, holding at most that many calls
together (the reassembler's own bound): past either, the least recently active stream is
aborted, so the reassembler never has to evict a call that a stream would close later. It
remembers the last `closed_streams_per_partition` streams that ended or broke.

A partition's state (`state`, `restore`) is a full one or the changes since the last: the live
streams' adapters in their order of activity, and the streams that ended or broke in the order
they did, so that a restored partition decides, evicts and forgets exactly as the original
would have.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from worker._native import Chunk, ParseError, parse_json
from worker.adapters import (
    anthropic,
    bedrock,
    dialects,
    gemini,
    mcp,
    openai_chat,
    openai_responses,
)
from worker.errors import InputFormatError
from worker.logs import record_fields
from worker.model import MAX_DEPTH, ChunkKind, Code, longer_than

log = logging.getLogger("callgate.decoder")

ENVELOPE = "callgate.envelope"


class StreamAdapter(Protocol):
    """Incremental decoder of one vendor stream."""

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        """One vendor event in; the chunks it completes out. Raises `InputFormatError`."""
        ...

    def open_calls(self) -> list[str]:
        """The ids of the calls this stream holds (what an abort must end)."""
        ...

    @property
    def held(self) -> int:
        """How many ids `open_calls()` would name (without building the list)."""
        ...

    def state(self) -> Any:
        """The adapter's state as a JSON value, for a checkpoint."""
        ...

    @property
    def finished(self) -> bool:
        """True once the stream has ended (its END chunk made)."""
        ...


class AdapterFactory(Protocol):
    """A format's adapter class: one stream's adapter, new (`state` None) or restored."""

    def __call__(
        self, stream_id: str, headers: Mapping[str, str], state: Any, *, max_calls: int
    ) -> StreamAdapter: ...

    def after_end(self, event: Mapping[str, Any]) -> bool:
        """Whether `event` may follow the stream's end (it carries nothing): dropped."""
        ...

    def announced(self, event: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The calls `event` opens, (call id, tool), read without its stream's state."""
        ...


#: format name -> its adapter class
ADAPTERS: dict[str, AdapterFactory] = {
    openai_chat.FORMAT: openai_chat.OpenAIChatAdapter,
    openai_responses.FORMAT: openai_responses.OpenAIResponsesAdapter,
    anthropic.FORMAT: anthropic.AnthropicAdapter,
    gemini.FORMAT: gemini.GeminiAdapter,
    bedrock.FORMAT: bedrock.BedrockAdapter,
    mcp.FORMAT: mcp.MCPResultAdapter,
}

#: Formats whose every record is a whole call: a bad record breaks that call only.
WHOLE_RECORDS = frozenset({mcp.FORMAT})

#: The layout of the adapters' checkpoint state: raise it whenever any adapter's `state()`
#: changes shape, so that a worker never restores a state it would misread.
STATE_VERSION = 4

#: Formats whose record may be a bare event payload with its type in a header (the AWS event
#: stream's `:event-type`): such a record is read as `{type: payload}`.
TYPED_BY_HEADER = {bedrock.FORMAT: bedrock.EVENT_TYPE_HEADER}

#: The record header naming who a call is made for (an envelope may name it in its `principal`).
PRINCIPAL_HEADER = "principal"

#: The record headers an adapter sees (and a checkpoint keeps).
ADAPTER_HEADERS = ("traceparent", "tool", "tool-version", "call-id", PRINCIPAL_HEADER)

#: A chunk's identifiers, each at most `max_id_bytes` long.
_CHUNK_IDS = ("stream_id", "call_id", "tool", "tool_version", "traceparent", "principal")

_Slot = tuple[str, str]  # (format, stream id)
# how a stream closed: it ended; it broke; it broke at its first record, before any was read
_ENDED, _CORRUPT, _UNREAD = "ended", "corrupt", "unread"


def formats() -> list[str]:
    """Every accepted `content-format` value."""
    return sorted({ENVELOPE, *ADAPTERS})


class _Stream:
    __slots__ = ("adapter", "headers", "held")

    def __init__(self, adapter: StreamAdapter, headers: dict[str, str]) -> None:
        self.adapter = adapter
        self.headers = headers
        self.held = adapter.held  # what the partition's count holds of this stream


class _Partition:
    __slots__ = ("changed", "closed", "closings", "held", "streams")

    def __init__(self) -> None:
        # live streams, least recently active first
        self.streams: dict[_Slot, _Stream] = {}
        # streams that ended or broke (the newest remembered): their later records are refused
        # (ended) or dropped (corrupt)
        self.closed: OrderedDict[_Slot, str] = OrderedDict()
        # since the last checkpoint state: the live streams changed, in the order they last
        # changed, and every stream closed, in order (replayed, it forgets what the original did)
        self.changed: dict[_Slot, None] = {}
        self.closings: list[tuple[_Slot, str]] = []
        # the calls the live streams hold, together
        self.held = 0

    def drop_stream(self, slot: _Slot) -> _Stream | None:
        stream = self.streams.pop(slot, None)
        if stream is not None:
            self.held -= stream.held
        self.changed.pop(slot, None)
        return stream

    def touch(self, slot: _Slot) -> None:
        self.changed.pop(slot, None)
        self.changed[slot] = None

    def close(self, slot: _Slot, how: str, bound: int) -> None:
        self.closings.append((slot, how))
        self.closed.pop(slot, None)
        self.closed[slot] = how
        if len(self.closed) > bound:
            self.closed.popitem(last=False)


class Decoder:
    """Decodes vendor records, keeping each stream's adapter, per partition.

    `max_streams_per_partition` (the reassembler's bound on a partition's open calls) bounds
    both the streams a partition keeps and the calls they hold together, each stream's own
    included: past it the least recently active stream is aborted (`stream_corrupt`), before the
    reassembler would have to evict a call a stream still holds and later closes. A stream that
    alone would hold more is broken by the adapter itself. `closed_streams_per_partition`
    streams that ended or broke are remembered; `max_id_bytes` bounds each chunk's identifiers.
    """

    def __init__(
        self,
        *,
        max_streams_per_partition: int,
        closed_streams_per_partition: int,
        max_id_bytes: int,
        dialects: Mapping[str, str] | None = None,
    ) -> None:
        self._max = max_streams_per_partition
        self._max_closed = closed_streams_per_partition
        self._max_id_bytes = max_id_bytes
        self._dialects = dict(dialects or {})  # input topic -> the dialect of its records
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self.dropped_records = 0

    def decode(self, record: Any, content_format: str) -> list[Chunk]:
        """The chunks of one vendor record (the native reassembler's callback). Never raises."""
        stream_id = _stream_id(record)
        fmt, parameters = dialects.split_format(content_format)
        try:
            return self._decode(record, fmt, parameters, stream_id)
        except InputFormatError as exc:
            return self._fail(record, fmt, stream_id, Code.MALFORMED_RECORD, str(exc))
        except Exception as exc:  # an adapter's bug is this record's fault, not the worker's
            log.exception(
                "internal error decoding %s record %s[%s]@%s",
                fmt,
                record.topic,
                record.partition,
                record.offset,
                extra=record_fields(record.topic, record.partition, record.offset),
            )
            detail = f"{fmt}: callgate failed to decode this record ({type(exc).__name__})"
            return self._fail(record, fmt, stream_id, Code.INTERNAL_ERROR, detail)

    def _decode(self, record: Any, fmt: str, parameters: str, stream_id: str | None) -> list[Chunk]:
        factory = ADAPTERS.get(fmt)
        if factory is None:
            raise InputFormatError(f"unknown content-format {fmt!r}; supported: {formats()}")
        dialect = self._dialect(record, fmt, parameters)
        if stream_id is None:
            raise InputFormatError(f"a {fmt} record needs its stream id (UTF-8) as its key")
        if self._too_long(stream_id):
            raise InputFormatError(f"the record's key is longer than {self._max_id_bytes} bytes")
        part = self._partition(record)
        slot = (fmt, stream_id)
        closed = part.closed.get(slot)
        if closed in (_CORRUPT, _UNREAD):
            self.dropped_records += 1
            return self._seen_unread(record, factory, stream_id) if closed == _UNREAD else []
        event = parse_json(record.value, MAX_DEPTH)
        if isinstance(event, ParseError):
            where = f" at {event.path}" if event.path else ""
            raise InputFormatError(
                f"{fmt} event is not strict JSON ({event.code}{where}): {event.message}"
            )
        if type(event) is not dict:
            raise InputFormatError(f"{fmt} event must be a JSON object")
        typed = _header(record, TYPED_BY_HEADER[fmt]) if fmt in TYPED_BY_HEADER else None
        if typed is not None:
            event = {typed: event}
        if closed == _ENDED:
            if factory.after_end(event):
                return []
            raise InputFormatError(f"{fmt}: an event after the end of its stream")
        principal = _principal(record)
        if closed is None and slot not in part.streams:
            self._one_format(part, fmt, stream_id)
        stream = part.streams.pop(slot, None)
        if stream is None:
            headers = _adapter_headers(record)
            if principal is not None:
                headers[PRINCIPAL_HEADER] = principal
            if dialect is not None:
                headers[dialects.HEADER] = dialect
            stream = _Stream(factory(stream_id, headers, None, max_calls=self._max), headers)
        elif stream.headers.get(dialects.HEADER) != dialect:
            part.streams[slot] = stream
            raise InputFormatError(f"{fmt}: a record of another dialect than its stream's")
        elif stream.headers.get(PRINCIPAL_HEADER) != principal:
            part.streams[slot] = stream
            raise InputFormatError(f"{fmt}: a record naming another principal than its stream's")
        part.streams[slot] = stream  # the most recently active now
        part.touch(slot)
        chunks = stream.adapter.feed(event)
        self._check_ids(chunks)
        held = stream.adapter.held
        part.held += held - stream.held
        stream.held = held
        if stream.adapter.finished:
            part.drop_stream(slot)
            if fmt not in WHOLE_RECORDS:
                part.close(slot, _ENDED, self._max_closed)
        evicted: list[Chunk] = []
        while len(part.streams) > self._max or part.held > self._max:
            oldest = next(iter(part.streams))
            if oldest == slot:
                break  # cannot happen: the adapter bounds its own stream
            evicted += self._abort(part, oldest)
        return [*evicted, *chunks] if evicted else chunks

    def _one_format(self, part: _Partition, fmt: str, stream_id: str) -> None:
        """Refuse a new stream under a key that names a stream of another format (live, or
        remembered as ended or broken): the reassembler holds a stream's calls by its key, so
        the two streams' calls would be one stream's, a piece of either taken into a call of
        the other and one's end ending the other's calls."""
        if fmt in WHOLE_RECORDS:
            return
        for other in sorted(ADAPTERS.keys() - WHOLE_RECORDS - {fmt}):
            if (other, stream_id) in part.streams or (other, stream_id) in part.closed:
                raise InputFormatError(f"{fmt}: the record's key names a stream of {other}")

    def _seen_unread(self, record: Any, factory: AdapterFactory, stream_id: str) -> list[Chunk]:
        """The calls a record of a stream broken at its first record opens, each opened and
        aborted at once (its event says `stream_corrupt`; a call named again is a late piece of
        it, dropped by the reassembler); the record is dropped otherwise."""
        event = parse_json(record.value, MAX_DEPTH)
        if type(event) is not dict:
            return []
        fmt = next(name for name, adapter in ADAPTERS.items() if adapter is factory)
        typed = _header(record, TYPED_BY_HEADER[fmt]) if fmt in TYPED_BY_HEADER else None
        if typed is not None:
            event = {typed: event}
        out: list[Chunk] = []
        for call_id, tool in factory.announced(event):
            if self._too_long(call_id) or self._too_long(tool):
                continue
            out.append(Chunk(stream_id, ChunkKind.TOOL_CALL, call_id, tool=tool))
            out.append(Chunk(stream_id, ChunkKind.ABORT, call_id))
        return out

    def _check_ids(self, chunks: Iterable[Chunk]) -> None:
        """Every identifier a chunk carries is at most `max_id_bytes` long, or the event that
        made it cannot be placed."""
        for chunk in chunks:
            for name in _CHUNK_IDS:
                if self._too_long(getattr(chunk, name)):
                    raise InputFormatError(
                        f"a chunk's {name} is longer than {self._max_id_bytes} bytes"
                    )

    def _too_long(self, identifier: str | None) -> bool:
        return longer_than(identifier, self._max_id_bytes)

    def _dialect(self, record: Any, fmt: str, parameters: str) -> str | None:
        """The dialect a record is read in: its header's, or its topic's (both: the same)."""
        named = dialects.dialect_of(fmt, parameters)
        by_topic = self._dialects.get(record.topic)
        if by_topic is not None and dialects.DIALECTS[by_topic].format == fmt:
            if named is not None and named.name != by_topic:
                raise InputFormatError(
                    f"{fmt}: the record names dialect {named.name!r}, its topic {by_topic!r}"
                )
            return by_topic
        return named.name if named is not None else None

    def _fail(
        self, record: Any, fmt: str, stream_id: str | None, code: Code, detail: str
    ) -> list[Chunk]:
        malformed = Chunk(stream_id or "", ChunkKind.MALFORMED, delta=detail, error=code.value)
        part = self._partition(record)
        if fmt in WHOLE_RECORDS:  # the record was its only call: the stream goes on
            if stream_id is not None:
                part.drop_stream((fmt, stream_id))
            return [malformed]
        out = [malformed]
        unread = (fmt, stream_id) not in part.streams and (fmt, stream_id) not in part.closed
        for slot in self._suspects(part, fmt, stream_id):
            out += self._abort(part, slot, _UNREAD if unread and slot[1] == stream_id else _CORRUPT)
        ended = [chunk.call_id for chunk in out[1:]]
        log.warning(
            "%s record %s[%s]@%s cannot be placed; %s",
            fmt,
            record.topic,
            record.partition,
            record.offset,
            f"it ends the calls {ended} stream_corrupt"
            if ended
            else "no call of its stream was read before it (those its later records open end "
            "stream_corrupt)"
            if unread
            else "its stream holds no call it could end (those before it were judged)",
        )
        return out

    def _suspects(self, part: _Partition, fmt: str, stream_id: str | None) -> list[_Slot]:
        """The streams a record that cannot be placed could belong to (see the module
        docstring)."""
        if self._too_long(stream_id):
            return []  # a key no stream can have
        if fmt in ADAPTERS and stream_id is not None:
            return [(fmt, stream_id)]
        return [
            slot
            for slot in part.streams
            if (stream_id is None or slot[1] == stream_id)
            and (fmt not in ADAPTERS or slot[0] == fmt)
        ]

    def _abort(self, part: _Partition, slot: _Slot, how: str = _CORRUPT) -> list[Chunk]:
        """End the stream: the calls it holds are aborted, its later records dropped."""
        stream = part.drop_stream(slot)
        part.close(slot, how, self._max_closed)
        if stream is None:
            return []
        # a call whose id is past the bound never reached the reassembler: nothing to abort
        return [
            Chunk(slot[1], ChunkKind.ABORT, call_id)
            for call_id in stream.adapter.open_calls()
            if not self._too_long(call_id)
        ]

    def _partition(self, record: Any) -> _Partition:
        scope = (record.topic, record.partition)
        part = self._partitions.get(scope)
        if part is None:
            part = self._partitions[scope] = _Partition()
        return part

    # -- partitions: revoke, checkpoint, restore --------------------------------------------------

    def drop(self, topic: str, partition: int) -> None:
        self._partitions.pop((topic, partition), None)

    def state(self, topic: str, partition: int, *, full: bool) -> dict[str, Any]:
        """The partition's streams for a checkpoint: all of them (`full`), or what changed since
        the last call. `streams` lists live streams (in the order that rebuilds their order of
        activity); `closed` the streams that ended or broke, each with how (in a full state
        those remembered, oldest first; in a delta each closing since, in order)."""
        part = self._partitions.get((topic, partition)) or _Partition()
        slots = list(part.streams) if full else list(part.changed)
        streams: list[list[Any]] = []
        for fmt, stream_id in slots:
            stream = part.streams[(fmt, stream_id)]
            streams.append([fmt, stream_id, [stream.headers, stream.adapter.state()]])
        closings = list(part.closed.items()) if full else part.closings
        state = {
            "version": STATE_VERSION,
            "streams": streams,
            "closed": [[fmt, stream_id, how] for (fmt, stream_id), how in closings],
            "full": full,
        }
        part.changed.clear()
        part.closings = []
        return state

    def restore(self, topic: str, partition: int, states: list[dict[str, Any]]) -> None:
        """Rebuild a partition's streams from its checkpoints' states, oldest first. Raises
        ValueError for a state of another layout (written by another version of callgate)."""
        part = _Partition()
        for state in states:
            version = state.get("version")
            if version != STATE_VERSION:
                raise ValueError(
                    f"the adapters' checkpoint state has layout {version!r}; this worker reads "
                    f"layout {STATE_VERSION}"
                )
            if state["full"]:
                part = _Partition()
            for fmt, stream_id, how in state["closed"]:
                part.drop_stream((fmt, stream_id))
                part.close((fmt, stream_id), how, self._max_closed)
            for fmt, stream_id, (headers, adapter_state) in state["streams"]:
                slot = (fmt, stream_id)
                part.drop_stream(slot)
                part.closed.pop(slot, None)  # live again: it was forgotten before it started
                adapter = ADAPTERS[fmt](stream_id, headers, adapter_state, max_calls=self._max)
                stream = part.streams[slot] = _Stream(adapter, headers)
                part.held += stream.held
        part.changed.clear()
        part.closings = []
        self._partitions[(topic, partition)] = part


def _stream_id(record: Any) -> str | None:
    key = record.key
    if not key:
        return None
    try:
        text: str = key.decode()
    except UnicodeDecodeError:
        return None
    return text


def _header(record: Any, name: str) -> str | None:
    for key, value in record.headers or ():
        if key == name:
            return (value or b"").decode("utf-8", "replace")
    return None


def _adapter_headers(record: Any) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in record.headers or ():
        if name in ADAPTER_HEADERS and name != PRINCIPAL_HEADER:
            headers[name] = (value or b"").decode("utf-8", "replace")
    return headers


def _principal(record: Any) -> str | None:
    """The record's `principal` header, exactly (a principal is never guessed at: one that is
    not UTF-8 is a record the stream cannot place); None when it has none, or an empty one."""
    for name, value in record.headers or ():
        if name == PRINCIPAL_HEADER:
            try:
                return value.decode("utf-8") or None if value else None
            except UnicodeDecodeError:
                raise InputFormatError("the record's principal header is not UTF-8") from None
    return None
