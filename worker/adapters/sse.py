"""An incremental server-sent-events decoder (WHATWG event-stream grammar): bytes in, events out.

`feed(data)` takes any split of the byte stream (a line, a CR/LF pair or a UTF-8 sequence may be cut
anywhere) and returns the events it completed; `flush()` ends the input. Only `event`, `data` and
`id` matter to callgate; `retry` and comment lines are read and dropped. An event is dispatched only
when it has at least one `data` line, as the standard says. Two deliberate differences:

- an event's data is its bytes as they are, never decoded: bytes that are not UTF-8 reach the
  record's own strict parse, which rejects that record alone (the standard would replace them
  with U+FFFD, and a payload would pass that was never sent);
- `flush()` dispatches an event still waiting for its blank line, because recorded files often
  end right after the last `data:` line (the end of the file is the end of that event; a cut-off
  payload then fails its own JSON parse instead of vanishing).

An event whose data lines pass `max_event_bytes` is dispatched as a fault (`SSEEvent.fault`, no
data) and its later lines skipped: memory stays bounded and the events after it are read.
"""

from __future__ import annotations

from dataclasses import dataclass

_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: its type (`None` when the stream gave no `event:` line), its data,
    its last event id, and why it could not be read (`fault`; its data is then empty)."""

    event: str | None
    data: bytes
    id: str | None = None
    fault: str | None = None


class SSEDecoder:
    """Decodes one event stream. Memory is bounded by `max_event_bytes` (one event's lines)."""

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._max = max_event_bytes
        self._pending = bytearray()  # bytes of the line being read
        self._skip_lf = False  # the last byte fed was a CR: a following LF belongs to it
        self._started = False  # the first line (which may start with a BOM) has been read
        self._line_no = 0
        self._event: str | None = None
        self._data: list[bytes] = []
        self._size = 0
        self._too_large: str | None = None  # the event's lines passed the bound
        self._dropped = False  # the line being read had bytes, dropped past the bound
        self._last_id: str | None = None

    def feed(self, data: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        start = 0
        if self._skip_lf and data[:1] == b"\n":
            start = 1
        self._skip_lf = False
        end = len(data)
        while start < end:
            cr = data.find(b"\r", start)
            lf = data.find(b"\n", start)
            if cr < 0 and lf < 0:
                self._take(data[start:])
                break
            if cr < 0 or (0 <= lf < cr):
                stop, nxt = lf, lf + 1
            else:
                stop, nxt = cr, cr + 1
                if nxt < end and data[nxt : nxt + 1] == b"\n":
                    nxt += 1
                elif nxt == end:
                    self._skip_lf = True
            self._take(data[start:stop])
            self._line(bytes(self._pending), events)
            self._pending.clear()
            start = nxt
        return events

    def flush(self) -> list[SSEEvent]:
        """End of input: the last line and the last event are read even without their breaks."""
        events: list[SSEEvent] = []
        if self._pending or self._dropped:
            self._line(bytes(self._pending), events)
            self._pending.clear()
        self._line(b"", events)
        return events

    def _take(self, piece: bytes) -> None:
        """Part of the line being read; past the event's bound only its length is kept."""
        if self._too_large is None and self._size + len(self._pending) + len(piece) > self._max:
            line = self._line_no + 1
            self._too_large = f"the SSE event at line {line} is larger than {self._max} bytes"
            self._data.clear()
        if self._too_large is None:
            self._pending += piece
        else:
            self._dropped = self._dropped or bool(piece) or bool(self._pending)
            self._pending.clear()

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        self._line_no += 1
        if self._dropped:  # a line of the event past the bound: not a blank line
            self._dropped = False
            return
        if not self._started:
            self._started = True
            raw = raw.removeprefix(_BOM)
        if not raw and not self._too_large:
            if self._data:
                events.append(SSEEvent(self._event, b"\n".join(self._data), self._last_id))
            self._event, self._data, self._size = None, [], 0
            return
        if not raw:  # the end of an event that was too large
            events.append(SSEEvent(self._event, b"", self._last_id, fault=self._too_large))
            self._event, self._data, self._size, self._too_large = None, [], 0, None
            return
        if raw.startswith(b":") or self._too_large:
            return
        name, colon, value = raw.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._size += len(raw)
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id" and b"\0" not in value:
            self._last_id = value.decode("utf-8", "replace")
