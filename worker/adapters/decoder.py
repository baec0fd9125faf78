"""Vendor records to chunks: the `content-format` of a record picks its adapter.

The native reassembler decodes canonical envelopes itself and calls `Decoder.decode` for every
record with a `content-format` header. Vendor adapters are incremental decoders (one vendor
event in, zero or more chunks out) kept per (topic, partition, format, stream), so a revoked
partition's adapters go with it (`drop`), and a partition's adapters are written and restored
with its checkpoint (`state`, `restore`).

Failing closed: when an adapter cannot place an event, the record is `malformed` and every
call of that stream still open is aborted (`stream_corrupt`); the stream is finished, and its
later records are dropped and counted. A bug in an adapter is the record's `internal_error`,
with the same effect on the stream, and is logged once with the record's position.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from worker._native import Chunk, ParseError, parse_json
from worker.adapters import anthropic, mcp, openai_chat, openai_responses
from worker.errors import InputFormatError
from worker.model import ChunkKind, Code

log = logging.getLogger("callgate.decoder")

ENVELOPE = "callgate.envelope"


class StreamAdapter(Protocol):
    """Incremental decoder of one vendor stream."""

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        """One vendor event in; the chunks it completes out. Raises `InputFormatError`."""
        ...

    def open_calls(self) -> list[str]:
        """The ids of the calls this stream has open (what an abort must end)."""
        ...

    def state(self) -> Any:
        """The adapter's state as a JSON value, for a checkpoint."""
        ...

    @property
    def finished(self) -> bool:
        """True once the stream has ended and this adapter's state can be forgotten."""
        ...


AdapterFactory = Callable[[str, Mapping[str, str], Any], StreamAdapter]
#: format name -> factory(stream_id, headers, state or None) of one stream's adapter
ADAPTERS: dict[str, AdapterFactory] = {
    openai_chat.FORMAT: openai_chat.OpenAIChatAdapter,
    openai_responses.FORMAT: openai_responses.OpenAIResponsesAdapter,
    anthropic.FORMAT: anthropic.AnthropicAdapter,
    mcp.FORMAT: mcp.MCPResultAdapter,
}

#: The record headers an adapter sees (and a checkpoint keeps).
ADAPTER_HEADERS = ("traceparent", "tool", "tool-version", "call-id")

_Slot = tuple[str, str]  # (format, stream id)
_GONE, _CORRUPT = "gone", "corrupt"  # a stream's state in a checkpoint, when it has no adapter


def formats() -> list[str]:
    """Every accepted `content-format` value."""
    return sorted({ENVELOPE, *ADAPTERS})


class _Stream:
    __slots__ = ("adapter", "headers")

    def __init__(self, adapter: StreamAdapter, headers: dict[str, str]) -> None:
        self.adapter = adapter
        self.headers = headers


class _Partition:
    __slots__ = ("changed", "corrupt", "streams")

    def __init__(self) -> None:
        self.streams: dict[_Slot, _Stream] = {}
        # streams that failed: their later records are dropped (the newest remembered)
        self.corrupt: OrderedDict[_Slot, None] = OrderedDict()
        # streams changed since the last checkpoint state
        self.changed: set[_Slot] = set()


class Decoder:
    """Decodes vendor records, keeping each stream's adapter, per partition."""

    def __init__(self, max_streams_per_partition: int) -> None:
        self._max_streams = max_streams_per_partition
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self.dropped_records = 0

    def decode(self, record: Any, fmt: str) -> list[Chunk]:
        """The chunks of one vendor record (the native reassembler's callback). Never raises."""
        stream_id = _stream_id(record)
        try:
            return self._decode(record, fmt, stream_id)
        except InputFormatError as exc:
            return self._fail(record, fmt, stream_id, Code.MALFORMED_RECORD, str(exc))
        except Exception as exc:  # an adapter's bug is this record's fault, not the worker's
            log.exception(
                "internal error decoding %s record %s[%s]@%s",
                fmt,
                record.topic,
                record.partition,
                record.offset,
            )
            detail = f"{fmt}: callgate failed to decode this record ({type(exc).__name__})"
            return self._fail(record, fmt, stream_id, Code.INTERNAL_ERROR, detail)

    def _decode(self, record: Any, fmt: str, stream_id: str | None) -> list[Chunk]:
        factory = ADAPTERS.get(fmt)
        if factory is None:
            raise InputFormatError(f"unknown content-format {fmt!r}; supported: {formats()}")
        if stream_id is None:
            raise InputFormatError(f"a {fmt} record needs its stream id (UTF-8) as its key")
        part = self._partition(record)
        slot = (fmt, stream_id)
        if slot in part.corrupt:
            self.dropped_records += 1
            return []
        event = parse_json(record.value, 512)
        if isinstance(event, ParseError):
            where = f" at {event.path}" if event.path else ""
            raise InputFormatError(
                f"{fmt} event is not strict JSON ({event.code}{where}): {event.message}"
            )
        if type(event) is not dict:
            raise InputFormatError(f"{fmt} event must be a JSON object")
        stream = part.streams.get(slot)
        if stream is None:
            headers = _adapter_headers(record)
            stream = _Stream(factory(stream_id, headers, None), headers)
            part.streams[slot] = stream
            if len(part.streams) > self._max_streams:
                oldest = next(iter(part.streams))
                return [*self._abort(part, oldest), *self._feed(part, slot, stream, event)]
        return self._feed(part, slot, stream, event)

    def _feed(
        self, part: _Partition, slot: _Slot, stream: _Stream, event: dict[str, Any]
    ) -> list[Chunk]:
        part.changed.add(slot)
        chunks = stream.adapter.feed(event)
        if stream.adapter.finished:
            del part.streams[slot]
        return chunks

    def _fail(
        self, record: Any, fmt: str, stream_id: str | None, code: Code, detail: str
    ) -> list[Chunk]:
        malformed = Chunk(stream_id or "", ChunkKind.MALFORMED, delta=detail, error=code.value)
        if stream_id is None:
            return [malformed]
        part = self._partition(record)
        return [malformed, *self._abort(part, (fmt, stream_id))]

    def _abort(self, part: _Partition, slot: _Slot) -> list[Chunk]:
        """End the stream: its open calls are aborted, its later records dropped."""
        stream = part.streams.pop(slot, None)
        part.corrupt[slot] = None
        if len(part.corrupt) > self._max_streams:
            part.corrupt.popitem(last=False)
        part.changed.add(slot)
        if stream is None:
            return []
        return [Chunk(slot[1], ChunkKind.ABORT, call_id) for call_id in stream.adapter.open_calls()]

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
        """The partition's streams for a checkpoint: all of them (`full`), or those changed
        since the last call (with `None` for a stream that finished)."""
        part = self._partitions.get((topic, partition)) or _Partition()
        slots = [*part.streams, *part.corrupt] if full else sorted(part.changed)
        streams: list[list[Any]] = []
        for fmt, stream_id in slots:
            stream = part.streams.get((fmt, stream_id))
            if stream is not None:
                streams.append([fmt, stream_id, [stream.headers, stream.adapter.state()]])
            else:
                corrupt = (fmt, stream_id) in part.corrupt
                streams.append([fmt, stream_id, _CORRUPT if corrupt else _GONE])
        part.changed.clear()
        return {"streams": streams, "full": full}

    def restore(self, topic: str, partition: int, states: list[dict[str, Any]]) -> None:
        """Rebuild a partition's streams from its checkpoints' states, oldest first."""
        part = _Partition()
        for state in states:
            if state["full"]:
                part = _Partition()
            for fmt, stream_id, body in state["streams"]:
                slot = (fmt, stream_id)
                part.streams.pop(slot, None)
                if body == _CORRUPT:
                    part.corrupt[slot] = None
                    if len(part.corrupt) > self._max_streams:
                        part.corrupt.popitem(last=False)
                if not isinstance(body, list):
                    continue
                headers, adapter_state = body
                adapter = ADAPTERS[fmt](stream_id, headers, adapter_state)
                part.streams[slot] = _Stream(adapter, headers)
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


def _adapter_headers(record: Any) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in record.headers or ():
        if name in ADAPTER_HEADERS:
            headers[name] = (value or b"").decode("utf-8", "replace")
    return headers
