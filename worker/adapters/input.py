"""Input files for `callgate check`: a byte stream in, one record value per event out.

Three layouts are recognised from the first non-blank line, whatever the format:

- JSON lines: one JSON object per line (the canonical envelopes, or one vendor event per line);
  a line that is not valid JSON is still yielded on its own, so the decoder rejects that record
  and nothing around it is lost;
- a sequence of JSON documents spread over several lines (a pretty-printed MCP response as the
  specification prints it), split at the end of each top-level value;
- server-sent events as recorded (`event:` / `data:` lines): every event's data is one record,
  and `data: [DONE]` ends the stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from worker.adapters.decoder import ENVELOPE, formats
from worker.adapters.sse import SSEDecoder
from worker.errors import InputFormatError

DONE = "[DONE]"
_WHITESPACE = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"
_BLOCK = 64 * 1024


def read_records(
    fp: BinaryIO, fmt: str | None = None, *, max_record_bytes: int = 16 * 1024 * 1024
) -> Iterator[bytes]:
    """Every record value in `fp`, in order. Raises `InputFormatError` for an unknown format or
    a record larger than `max_record_bytes` (memory stays bounded)."""
    if fmt is not None and fmt != ENVELOPE and fmt not in formats():
        raise InputFormatError(f"unknown format {fmt!r}; supported: {formats()}")
    head = b""
    while True:
        block = fp.read(_BLOCK)
        head += block
        if not block or b"\n" in head.lstrip(_BOM + _WHITESPACE):
            break
        if len(head) > max_record_bytes:
            raise InputFormatError(f"the first line is longer than {max_record_bytes} bytes")
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
        yield from _lines(body, fp, max_record_bytes)


def _blocks(head: bytes, fp: BinaryIO) -> Iterator[bytes]:
    yield head
    while block := fp.read(_BLOCK):
        yield block


def _lines(head: bytes, fp: BinaryIO, limit: int) -> Iterator[bytes]:
    pending = b""
    for block in _blocks(head, fp):
        pending += block
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if len(line) > limit:
                raise InputFormatError(f"a JSON line is longer than {limit} bytes")
            if line.strip(_WHITESPACE):
                yield line.rstrip(b"\r")
        if len(pending) > limit:
            raise InputFormatError(f"a JSON line is longer than {limit} bytes")
    if pending.strip(_WHITESPACE):
        yield pending


def _sse(head: bytes, fp: BinaryIO, limit: int) -> Iterator[bytes]:
    decoder = SSEDecoder(max_event_bytes=limit)
    for block in _blocks(head, fp):
        for event in decoder.feed(block):
            if event.data == DONE:
                return
            yield event.data.encode()
    for event in decoder.flush():
        if event.data == DONE:
            return
        yield event.data.encode()


def _splitter_depth(text: bytes) -> int:
    splitter = _ValueSplitter()
    splitter.feed(text)
    return splitter.depth


def _documents(head: bytes, fp: BinaryIO, limit: int) -> Iterator[bytes]:
    splitter = _ValueSplitter()
    for block in _blocks(head, fp):
        yield from splitter.feed(block)
        if splitter.buffered > limit:
            raise InputFormatError(f"a JSON document is longer than {limit} bytes")
    rest = splitter.flush()
    if rest:
        yield rest


class _ValueSplitter:
    """Cuts concatenated JSON texts at the end of each top-level object or array.

    It only tracks strings and bracket depth; whether each piece is valid JSON is for the
    decoder to say. Anything that does not open with a bracket is yielded up to its line end.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.depth = 0
        self._in_string = False
        self._escape = False
        self._scalar = False  # reading a stray non-bracket value up to its line end

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        for byte in data:
            if not self._buf and not self._scalar:
                if byte in _WHITESPACE:
                    continue
                if byte not in b"{[":
                    self._scalar = True
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

    def _emit(self, out: list[bytes]) -> None:
        piece = bytes(self._buf).strip(_WHITESPACE)
        if piece:
            out.append(piece)
        self._buf.clear()
        self.depth = 0
        self._scalar = False
        self._in_string = self._escape = False

    def flush(self) -> bytes:
        rest = bytes(self._buf).strip(_WHITESPACE)
        self._buf.clear()
        return rest
