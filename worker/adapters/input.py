"""Input files for `callgate check`: a byte stream in, one record value per event out.

Four layouts are recognised from the start of the input, whatever the format:

- JSON lines: one JSON object per line (the canonical envelopes, or one vendor event per line);
  a line that is not valid JSON is still yielded on its own, so the decoder rejects that record
  and nothing around it is lost;
- a sequence of JSON documents spread over several lines (a pretty-printed MCP response as the
  specification prints it), split at the end of each top-level value;
- server-sent events as recorded (`event:` / `data:` lines): every event's data is one record,
  and `data: [DONE]` ends the stream (no record); an event after it is a `RecordFault`, never
  judged and never dropped unsaid;
- the AWS event stream (`application/vnd.amazon.eventstream`, a Bedrock `ConverseStream`
  body as recorded), recognised by its first prelude's CRC: every message is one record,
  `{"<its :event-type>": <its JSON payload>}` (an exception message is named by its
  `:exception-type`), the form boto3 yields.

A record's bytes are yielded as they are, never decoded: whatever is wrong with them (not
UTF-8, not JSON) is for the record's own strict parse to say, and that record alone is
rejected. A record longer than `max_record_bytes` is yielded as a `RecordFault` in its place,
and the records after it are read as usual: memory stays bounded and nothing else is lost. An
event-stream frame that fails its CRC, or is longer than that, is a `RecordFault` too and the
next frame is read; a frame whose prelude is damaged, or that the input ends inside, is the
input's last record, a `RecordFault` (no later frame could be found with certainty).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from worker.adapters.decoder import ENVELOPE, formats
from worker.adapters.dialects import split_format
from worker.adapters.sse import SSEDecoder, SSEEvent
from worker.errors import InputFormatError

DONE = b"[DONE]"
_WHITESPACE = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"
_BLOCK = 64 * 1024


class RecordFault(NamedTuple):
    """A record of the input that could not be read (it is its own malformed record)."""

    detail: str


Read = bytes | RecordFault


def read_records(
    fp: BinaryIO, fmt: str | None = None, *, max_record_bytes: int = 16 * 1024 * 1024
) -> Iterator[Read]:
    """Every record value in `fp`, in order (a `RecordFault` for one that cannot be read).
    Raises `InputFormatError` for an unknown format."""
    fmt = split_format(fmt)[0] if fmt is not None else None
    if fmt is not None and fmt != ENVELOPE and fmt not in formats():
        raise InputFormatError(f"unknown format {fmt!r}; supported: {formats()}")
    head = b""
    while True:
        block = fp.read(_BLOCK)
        head += block
        if not block or b"\n" in head.lstrip(_BOM + _WHITESPACE) or len(head) > max_record_bytes:
            break
    if _eventstream_prelude(head):
        yield from _eventstream(head, fp, max_record_bytes)
        return
    body = head.removeprefix(_BOM)
    first = body.lstrip(_WHITESPACE)
    if not first:
        return
    if first[:1] not in (b"{", b"["):
        yield from _sse(body, fp, max_record_bytes)
        return
    first_line = first.split(b"\n", 1)[0]
    if _splitter_depth(first_line) > 0:
        yield from _documents(body, fp, max_record_bytes)
    else:
        for line in read_lines(body, fp, max_record_bytes):
            if isinstance(line, RecordFault) or line.strip(_WHITESPACE):
                yield line


def _blocks(head: bytes, fp: BinaryIO) -> Iterator[bytes]:
    yield head
    while block := fp.read(_BLOCK):
        yield block


def read_lines(head: bytes, fp: BinaryIO, limit: int) -> Iterator[Read]:
    """Every line of `head` and then of `fp` (blank ones too, without their line break), or a
    `RecordFault` for a line longer than `limit`, whose bytes are skipped."""
    pending = b""
    skipping = False  # in a line past the bound: its bytes are dropped up to its end
    for block in _blocks(head, fp):
        pending += block
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if skipping or len(line) > limit:
                skipping = False
                yield RecordFault(f"a line is longer than {limit} bytes")
            else:
                yield line.removesuffix(b"\r")
        if len(pending) > limit:
            skipping, pending = True, b""
    if skipping:
        yield RecordFault(f"a line is longer than {limit} bytes")
    elif pending:
        yield pending.removesuffix(b"\r")


def _sse(head: bytes, fp: BinaryIO, limit: int) -> Iterator[Read]:
    decoder = SSEDecoder(max_event_bytes=limit)
    done = False

    def read(event: SSEEvent) -> Iterator[Read]:
        nonlocal done
        if done:
            yield RecordFault("an event after data: [DONE], the end of the server's events")
        elif event.data == DONE:
            done = True
        else:
            yield RecordFault(event.fault) if event.fault else event.data

    for block in _blocks(head, fp):
        for event in decoder.feed(block):
            yield from read(event)
    for event in decoder.flush():
        yield from read(event)


_PRELUDE = 12  # total length, headers length, prelude CRC (4 bytes each, big-endian)
_EVENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,63}$")
#: the sizes of the AWS event stream's header value types that have a fixed size
_FIXED = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}


def _eventstream_prelude(data: bytes) -> bool:
    return len(data) >= 16 and zlib.crc32(data[:8]) == int.from_bytes(data[8:12], "big")


def _eventstream(head: bytes, fp: BinaryIO, limit: int) -> Iterator[Read]:
    pending = bytearray()
    offset = 0  # of the frame at the start of `pending`
    skip = 0  # bytes of an over-long frame still to pass over
    for block in _blocks(head, fp):
        pending += block
        if skip:
            passed = min(skip, len(pending))
            del pending[:passed]
            skip -= passed
            offset += passed
        while not skip and len(pending) >= _PRELUDE:
            total = int.from_bytes(pending[:4], "big")
            if not _eventstream_prelude(bytes(pending[:16])) or total < 16:
                yield RecordFault(f"event stream: the frame at byte {offset} is damaged")
                return
            if total > limit:
                yield RecordFault(f"event stream: the frame at byte {offset} is over {limit} bytes")
                passed = min(total, len(pending))
                del pending[:passed]
                skip, offset = total - passed, offset + passed
                continue
            if len(pending) < total:
                break
            frame = bytes(pending[:total])
            del pending[:total]
            yield _event_record(frame, offset)
            offset += total
    if pending or skip:
        yield RecordFault(f"event stream: the input ends inside the frame at byte {offset}")


def _event_record(frame: bytes, offset: int) -> Read:
    """One event-stream message as `{"<type>": <payload>}` (the payload's bytes kept), or the
    fault that keeps it from being read."""
    if zlib.crc32(frame[:-4]) != int.from_bytes(frame[-4:], "big"):
        return RecordFault(f"event stream: the frame at byte {offset} fails its CRC")
    headers_end = _PRELUDE + int.from_bytes(frame[4:8], "big")
    if headers_end > len(frame) - 4:
        return RecordFault(f"event stream: the frame at byte {offset} is damaged")
    headers: dict[str, object] = {}
    at = _PRELUDE
    try:
        while at < headers_end:
            size = frame[at]
            key = frame[at + 1 : at + 1 + size].decode()
            kind = frame[at + 1 + size]
            at += 2 + size
            if kind in (6, 7):  # bytes, string: a 2-byte length first
                length = int.from_bytes(frame[at : at + 2], "big")
                raw = frame[at + 2 : at + 2 + length]
                headers[key] = raw.decode() if kind == 7 else raw
                at += 2 + length
            else:
                at += _FIXED[kind]
    except (IndexError, KeyError, UnicodeDecodeError):
        return RecordFault(f"event stream: the headers of the frame at byte {offset} are damaged")
    message_type = headers.get(":message-type", "event")
    name: object = {
        "event": headers.get(":event-type"),
        "exception": headers.get(":exception-type"),
        "error": headers.get(":error-code"),
    }.get(str(message_type))
    if not isinstance(name, str) or not _EVENT_NAME.match(name):
        return RecordFault(f"event stream: the frame at byte {offset} names no event type")
    payload = frame[headers_end:-4]
    if message_type == "error":  # its message is a header; the payload is empty
        payload = b"{}"
    return b'{"' + name.encode() + b'":' + (payload or b"{}") + b"}"


def _splitter_depth(text: bytes) -> int:
    splitter = _ValueSplitter(len(text))
    splitter.feed(text)
    return splitter.depth


def _documents(head: bytes, fp: BinaryIO, limit: int) -> Iterator[Read]:
    splitter = _ValueSplitter(limit)
    for block in _blocks(head, fp):
        yield from splitter.feed(block)
    rest = splitter.flush()
    if rest:
        yield rest


class _ValueSplitter:
    """Cuts concatenated JSON texts at the end of each top-level object or array.

    It only tracks strings and bracket depth; whether each piece is valid JSON is for the
    decoder to say. Anything that does not open with a bracket is yielded up to its line end.
    A piece longer than `limit` is a `RecordFault` (its bytes dropped as they come).
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._size = 0
        self.depth = 0
        self._in_string = False
        self._escape = False
        self._scalar = False  # reading a stray non-bracket value up to its line end

    def feed(self, data: bytes) -> list[Read]:
        out: list[Read] = []
        for byte in data:
            if not self._size and not self._scalar:
                if byte in _WHITESPACE:
                    continue
                if byte not in b"{[":
                    self._scalar = True
            self._size += 1
            if self._size <= self._limit:
                self._buf.append(byte)
            if self._scalar:
                if byte == 0x0A:
                    self._emit(out)
                continue
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif byte == 0x5C:  # backslash
                    self._escape = True
                elif byte == 0x22:  # quote
                    self._in_string = False
            elif byte == 0x22:
                self._in_string = True
            elif byte in b"{[":
                self.depth += 1
            elif byte in b"}]":
                self.depth -= 1
                if self.depth <= 0:
                    self._emit(out)
        return out

    def _emit(self, out: list[Read]) -> None:
        if self._size > self._limit:
            out.append(RecordFault(f"a JSON document is longer than {self._limit} bytes"))
        else:
            piece = bytes(self._buf).strip(_WHITESPACE)
            if piece:
                out.append(piece)
        self._buf.clear()
        self._size = 0
        self.depth = 0
        self._scalar = False
        self._in_string = self._escape = False

    def flush(self) -> Read | None:
        if self._size > self._limit:
            fault = RecordFault(f"a JSON document is longer than {self._limit} bytes")
            self._buf.clear()
            self._size = 0
            return fault
        rest = bytes(self._buf).strip(_WHITESPACE)
        self._buf.clear()
        self._size = 0
        return rest or None
