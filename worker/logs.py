"""The log's two formats, each defined here once: text (the default) and JSON lines.

`configure` sends the root logger to stderr at the settings' level, in `CALLGATE_LOG__FORMAT`:

- `text`: `<time> <LEVEL> <logger>: <message>`, a traceback after it when there is one;
- `json`: one JSON object per line: `time` (UTC, ISO 8601 with milliseconds), `level`,
  `logger`, `message`; `trace_id` and `span_id` (lowercase hex, as in a `traceparent`) when a
  span is active, which with tracing on is while a call is judged; the call's ids where the line
  is about a call (`call_id`, `stream_id`, `event_id`, `tool`, and where it was read: `topic`,
  `partition`, `offset`); `exception` with the traceback when there is one.

A line is about a call when its caller passes `extra=call_fields(call)` (or `record_fields` for
a record that is not yet a call); the text format shows those ids in its message as before.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any, Literal

import orjson

from worker._native import AssembledCall

#: (trace id, span id) of the active span, None when there is none
SpanIds = Callable[[], tuple[str, str] | None]

#: the ids a line about a call may carry, in the order a JSON line writes them
CALL_FIELDS = ("call_id", "stream_id", "event_id", "tool", "topic", "partition", "offset")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def call_fields(call: AssembledCall) -> dict[str, Any]:
    """A call's ids, for a log line about it (`extra=`); `offset` is its first record's."""
    return {
        "call_id": call.call_id,
        "stream_id": call.stream_id,
        "event_id": call.event_id,
        "tool": call.tool,
        "topic": call.topic,
        "partition": call.partition,
        "offset": call.first_offset,
    }


def record_fields(topic: str, partition: int, offset: int) -> dict[str, Any]:
    """Where a record was read, for a log line about it before it is a call (`extra=`)."""
    return {"topic": topic, "partition": partition, "offset": offset}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring)."""

    def __init__(self, span_ids: SpanIds | None = None) -> None:
        super().__init__()
        self._span_ids = span_ids

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ids = self._span_ids() if self._span_ids is not None else None
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        fields = record.__dict__
        for name in CALL_FIELDS:
            value = fields.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # default=str: an argument orjson cannot write is written as its text, never lost
        return orjson.dumps(line, default=str).decode()


def formatter(fmt: Literal["text", "json"], span_ids: SpanIds | None = None) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter(span_ids)
    return logging.Formatter(TEXT_FORMAT)


def configure(
    level: str,
    fmt: Literal["text", "json"],
    *,
    span_ids: SpanIds | None = None,
    stream: IO[str] | None = None,
) -> None:
    """The root logger at `level`, and (as `logging.basicConfig` does: unless the root logger
    has a handler already) one handler writing to `stream` (stderr) in `fmt`."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt, span_ids))
    logging.basicConfig(level=level, handlers=[handler])
