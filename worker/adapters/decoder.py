"""Record to chunks, for every inbound format, with the per-stream state vendor formats need.

The `content-format` header picks the format; without it a record is a canonical envelope. Vendor
adapters are incremental decoders (one vendor event in, zero or more chunks out) kept per stream
and per partition scope, so a revoked partition's state is dropped with `drop_scope`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Protocol

from worker.adapters import anthropic, mcp, openai_chat, openai_responses
from worker.adapters.envelope import decode_envelope
from worker.core.strict_json import ParseError, parse
from worker.errors import InputFormatError
from worker.model import Chunk

ENVELOPE = "callgate.envelope"


class StreamAdapter(Protocol):
    """Incremental decoder of one vendor stream."""

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        """One vendor event in; the chunks it completes out. Raises `InputFormatError`."""
        ...

    @property
    def finished(self) -> bool:
        """True once the stream has ended and this adapter's state can be forgotten."""
        ...


#: format name -> factory(stream_id, headers) of a fresh adapter for one stream.
AdapterFactory = Callable[[str, Mapping[str, str]], StreamAdapter]
ADAPTERS: dict[str, AdapterFactory] = {
    openai_chat.FORMAT: openai_chat.OpenAIChatAdapter,
    openai_responses.FORMAT: openai_responses.OpenAIResponsesAdapter,
    anthropic.FORMAT: anthropic.AnthropicAdapter,
    mcp.FORMAT: mcp.MCPResultAdapter,
}


def formats() -> list[str]:
    """Every accepted `content-format` value."""
    return sorted({ENVELOPE, *ADAPTERS})


class _Open:
    """One vendor stream's adapter, where the stream began and when it was last heard."""

    __slots__ = ("adapter", "first_offset", "last_seen")

    def __init__(self, adapter: StreamAdapter, first_offset: int, now: float) -> None:
        self.adapter = adapter
        self.first_offset = first_offset
        self.last_seen = now


_Slot = tuple[Hashable, str, str]  # (scope, format, stream id)


class Decoder:
    """Decodes records of any supported format, keeping vendor streams' state, bounded.

    A vendor stream's state is as much part of an unfinished response as an open call: a replay
    that starts after the stream's first record could not decode the rest. So `safe_offset`
    answers the first record of the oldest stream still open in a scope, and the commit must not
    pass it. Streams are forgotten when they finish, when idle past `idle_timeout_s` (`expire`,
    with the caller's `now`), oldest first past `max_streams`, and with their scope.
    """

    def __init__(self, max_streams: int = 100_000, idle_timeout_s: float = 60.0) -> None:
        self._max_streams = max_streams
        self._idle_timeout_s = idle_timeout_s
        self._by_activity: OrderedDict[_Slot, _Open] = OrderedDict()
        # per scope, in first-offset order: the first entry is the oldest open stream
        self._by_scope: dict[Hashable, OrderedDict[_Slot, None]] = {}

    def decode(
        self,
        value: bytes,
        *,
        fmt: str | None = None,
        key: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        scope: Hashable = None,
        offset: int = 0,
        now: float = 0.0,
    ) -> list[Chunk]:
        headers = headers or {}
        if fmt is None or fmt == ENVELOPE:
            return [decode_envelope(value, headers.get("traceparent"))]
        factory = ADAPTERS.get(fmt)
        if factory is None:
            raise InputFormatError(f"unknown content-format {fmt!r}; supported: {formats()}")
        if not key:
            raise InputFormatError(f"a {fmt} record needs the stream id as its key")
        try:
            stream_id = key.decode()
        except UnicodeDecodeError:
            raise InputFormatError("record key is not UTF-8") from None
        # strict, like the arguments: orjson alone would merge a duplicate key silently, and a
        # vendor event (an MCP result above all) must not smuggle a second value past the gate
        event = parse(value)
        if isinstance(event, ParseError):
            where = f" at {event.path}" if event.path else ""
            raise InputFormatError(
                f"{fmt} event is not strict JSON ({event.code}{where}): {event.message}"
            )
        if not isinstance(event, dict):
            raise InputFormatError(f"{fmt} event must be a JSON object")
        slot = (scope, fmt, stream_id)
        stream = self._by_activity.get(slot)
        if stream is None:
            stream = _Open(factory(stream_id, headers), offset, now)
            self._by_activity[slot] = stream
            self._by_scope.setdefault(scope, OrderedDict())[slot] = None
            if len(self._by_activity) > self._max_streams:
                self._forget(next(iter(self._by_activity)))
        else:
            stream.last_seen = now
            self._by_activity.move_to_end(slot)
        try:
            chunks = stream.adapter.feed(event)
        finally:
            if stream.adapter.finished:
                self._forget(slot)
        return chunks

    def expire(self, now: float) -> int:
        """Forget streams idle past the timeout (their calls time out in the reassembler)."""
        deadline = now - self._idle_timeout_s
        expired = 0
        while self._by_activity:
            slot, stream = next(iter(self._by_activity.items()))
            if stream.last_seen > deadline:
                break
            self._forget(slot)
            expired += 1
        return expired

    def safe_offset(self, scope: Hashable) -> int | None:
        """The first record of the scope's oldest open vendor stream, or None."""
        slots = self._by_scope.get(scope)
        if not slots:
            return None
        return self._by_activity[next(iter(slots))].first_offset

    def drop_scope(self, scope: Hashable) -> None:
        for slot in list(self._by_scope.get(scope, ())):
            self._forget(slot)

    @property
    def open_streams(self) -> int:
        return len(self._by_activity)

    def _forget(self, slot: _Slot) -> None:
        del self._by_activity[slot]
        slots = self._by_scope[slot[0]]
        del slots[slot]
        if not slots:
            del self._by_scope[slot[0]]
