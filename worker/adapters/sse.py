"""An incremental server-sent-events decoder (WHATWG event-stream grammar): bytes in, events out.

`feed(data)` takes any split of the byte stream (a line, a CR/LF pair or a UTF-8 sequence may be cut
anywhere) and returns the events it completed; `flush()` ends the input. Only `event`, `data` and
`id` matter to callgate; `retry` and comment lines are read and dropped. An event is dispatched only
when it has at least one `data` line, as the standard says. One deliberate difference: `flush()`
dispatches an event still waiting for its blank line, because recorded files often end right after
the last `data:` line (the end of the file is the end of that event; a cut-off payload then fails
its own JSON parse instead of vanishing).
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.errors import InputFormatError

_BOM = "\ufeff"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: its type (`None` when the stream gave no `event:` line) and data."""

    event: str | None
    data: str
    id: str | None = None


class SSEDecoder:
    """Decodes one event stream. Memory is bounded by `max_event_bytes` (one event's lines)."""

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._max = max_event_bytes
        self._pending = bytearray()  # bytes of the line being read
        self._skip_lf = False  # the last byte fed was a CR: a following LF belongs to it
        self._started = False  # the first line (which may start with a BOM) has been read
        self._line_no = 0
        self._event: str | None = None
        self._data: list[str] = []
        self._size = 0
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
                self._pending += data[start:]
                self._check_size(len(self._pending))
                break
            if cr < 0 or (0 <= lf < cr):
                stop, nxt = lf, lf + 1
            else:
                stop, nxt = cr, cr + 1
                if nxt < end and data[nxt : nxt + 1] == b"\n":
                    nxt += 1
                elif nxt == end:
                    self._skip_lf = True
            self._pending += data[start:stop]
            self._line(bytes(self._pending), events)
            self._pending.clear()
            start = nxt
        return events

    def flush(self) -> list[SSEEvent]:
        """End of input: the last line and the last event are read even without their breaks."""
        events: list[SSEEvent] = []
        if self._pending:
            self._line(bytes(self._pending), events)
            self._pending.clear()
        self._line(b"", events)
        return events

    def _check_size(self, extra: int) -> None:
        if self._size + extra > self._max:
            raise InputFormatError(
                f"SSE event at line {self._line_no + 1} is larger than {self._max} bytes"
            )

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        self._line_no += 1
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputFormatError(f"SSE line {self._line_no} is not valid UTF-8") from None
        if not self._started:
            self._started = True
            line = line.removeprefix(_BOM)
        if not line:
            if self._data:
                events.append(SSEEvent(self._event, "\n".join(self._data), self._last_id))
            self._event, self._data, self._size = None, [], 0
            return
        if line.startswith(":"):
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._check_size(len(raw))
            self._size += len(raw)
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
