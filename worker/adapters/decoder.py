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
    module.FORMAT: module.factory for module in (openai_chat, openai_responses, anthropic, mcp)
}


def formats() -> list[str]:
    """Every accepted `content-format` value."""
    return sorted({ENVELOPE, *ADAPTERS})


class Decoder:
    """Decodes records of any supported format; bounded in the number of streams it remembers."""

    def __init__(self, max_streams: int = 100_000) -> None:
        self._max_streams = max_streams
        self._streams: OrderedDict[tuple[Hashable, str, str], StreamAdapter] = OrderedDict()

    def decode(
        self,
        value: bytes,
        *,
        fmt: str | None = None,
        key: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        scope: Hashable = None,
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
        adapter = self._streams.get(slot)
        if adapter is None:
            adapter = factory(stream_id, headers)
            self._streams[slot] = adapter
            if len(self._streams) > self._max_streams:
                self._streams.popitem(last=False)
        else:
            self._streams.move_to_end(slot)
        chunks = adapter.feed(event)
        if adapter.finished:
            del self._streams[slot]
        return chunks

    def drop_scope(self, scope: Hashable) -> None:
        for slot in [slot for slot in self._streams if slot[0] == scope]:
            del self._streams[slot]

    @property
    def open_streams(self) -> int:
        return len(self._streams)
