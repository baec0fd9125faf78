"""Which format a file for `callgate check` holds, told from its first records.

`callgate check` without `--format` reads the head of its input (`HEAD_BYTES`) and looks at the
first records that are JSON objects: the first that a format's rule recognises decides. A file
of canonical envelopes, or one that nothing recognises but that is laid out as JSON (lines or
documents), or that is neither JSON nor server-sent events, is read as envelopes, as it always
was: a line that is not an envelope is its own rejected record. Server-sent events that nothing
recognises cannot be envelopes at all: that is an error that names the formats, never a file of
rejections. So is an MCP result without its
JSON-RPC wrapping (it says how to wrap it).

Detection is for the offline command only: records on Kafka say their format in the
`content-format` header.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from worker.adapters import anthropic, bedrock, gemini, mcp, openai_chat, openai_responses
from worker.adapters.decoder import ENVELOPE, formats
from worker.adapters.input import RecordFault, read_records
from worker.errors import ConfigError, InputFormatError

#: How much of the input is read to tell its format.
HEAD_BYTES = 64 * 1024
#: How many records of the head are looked at.
HEAD_RECORDS = 16

_ANTHROPIC_EVENTS = frozenset(
    {
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    }
)


def _is_envelope(event: dict[str, Any]) -> bool:
    return "stream_id" in event and "kind" in event


def _is_openai_chat(event: dict[str, Any]) -> bool:
    return event.get("object") == openai_chat.OBJECT


def _is_openai_responses(event: dict[str, Any]) -> bool:
    kind = event.get("type")
    return isinstance(kind, str) and kind.startswith("response.")


def _is_anthropic(event: dict[str, Any]) -> bool:
    return event.get("type") in _ANTHROPIC_EVENTS


def _is_gemini(event: dict[str, Any]) -> bool:
    """A `GenerateContentResponse`: candidates, or a prompt's feedback, and no other format's
    `type` or `object`."""
    return ("candidates" in event or "promptFeedback" in event) and not (
        "type" in event or "object" in event
    )


def _is_bedrock(event: dict[str, Any]) -> bool:
    """A ConverseStream event as boto3 yields it: one member that names the event."""
    return len(event) == 1 and next(iter(event)) in bedrock.EVENTS


def _is_mcp_result(event: dict[str, Any]) -> bool:
    return event.get("jsonrpc") == "2.0" and ("result" in event or "error" in event)


#: format -> whether a record is one of that format's (the first rule that holds decides)
RULES: dict[str, Callable[[dict[str, Any]], bool]] = {
    ENVELOPE: _is_envelope,
    openai_chat.FORMAT: _is_openai_chat,
    openai_responses.FORMAT: _is_openai_responses,
    anthropic.FORMAT: _is_anthropic,
    gemini.FORMAT: _is_gemini,
    bedrock.FORMAT: _is_bedrock,
    mcp.FORMAT: _is_mcp_result,
}


def _is_bare_mcp_result(event: dict[str, Any]) -> bool:
    """A `CallToolResult` as the MCP specification prints it, without the JSON-RPC response."""
    return "jsonrpc" not in event and isinstance(event.get("content"), list)


@dataclass(frozen=True, slots=True)
class Detected:
    """The format found, and why (for the message the command prints)."""

    format: str
    reason: str


def detect(head: bytes, *, name: str) -> Detected:
    """The format of an input whose first bytes are `head`. Raises `ConfigError` when the input
    cannot be envelopes and no format's rule recognises it."""
    for event in _head_events(head):
        for fmt, rule in RULES.items():
            if rule(event):
                return Detected(fmt, f"its first records are {fmt} events")
        if _is_bare_mcp_result(event):
            raise ConfigError(
                f"{name} holds an MCP tool result without its JSON-RPC response around it; "
                'wrap it as {"jsonrpc": "2.0", "id": ..., "result": <the result>} and give '
                "--format mcp.result --header tool=<tool name>"
            )
    if _is_sse(head):
        raise ConfigError(
            f"{name} holds server-sent events of no format callgate knows; give --format "
            f"(one of {', '.join(f for f in formats() if f != ENVELOPE)})"
        )
    return Detected(ENVELOPE, "the default: chunk envelopes, one per line")


#: what the first line of server-sent events starts with (a field, or a comment)
_SSE_LINE = (b"data:", b"event:", b"id:", b"retry:", b":")


def _is_sse(head: bytes) -> bool:
    """Whether `head` is laid out as server-sent events: its first line that is not blank is
    an SSE field or comment (anything else that is not JSON is left to be rejected records)."""
    first = head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n").split(b"\n", 1)[0]
    return first.startswith(_SSE_LINE)


def _head_events(head: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects among the first records of `head` (a record cut off by the end of the
    head, or one that is not JSON, is passed over)."""
    records = read_records(io.BytesIO(head), max_record_bytes=HEAD_BYTES)
    try:
        for index, record in enumerate(records):
            if index >= HEAD_RECORDS:
                return
            if isinstance(record, RecordFault):
                continue
            try:
                event = orjson.loads(record)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                yield event
    except InputFormatError:
        return


class _Rejoined(io.RawIOBase):
    """The head already read, then the rest of the stream: the input as if never read."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self._head = memoryview(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def peek(source: BinaryIO) -> tuple[bytes, BinaryIO]:
    """The first `HEAD_BYTES` of `source`, and a stream that reads it all from its start
    (a pipe cannot seek back)."""
    head = source.read(HEAD_BYTES)
    return head, io.BufferedReader(_Rejoined(head, source))
