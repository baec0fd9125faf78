"""The canonical chunk envelope (DESIGN.md): one JSON object per record, one chunk each."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import orjson

from worker.errors import InputFormatError
from worker.model import NO_TRACE, Chunk, ChunkKind, FinishReason, Fragment, Trace

_KINDS = {kind.value: kind for kind in ChunkKind if kind is not ChunkKind.MCP_RESULT}
_FINISH = {reason.value: reason for reason in FinishReason}


# Building a Chunk is most of the cost of decoding an envelope: the frozen dataclass's __init__
# goes through object.__setattr__ by name for each of its 11 fields. Setting the slots through
# their descriptors builds the very same object in about half the time. The field list is checked
# once here, so a new field in the model falls back to the constructor instead of going unset.
_CHUNK_FIELDS = (
    "stream_id",
    "kind",
    "call_id",
    "seq",
    "tool",
    "tool_version",
    "delta",
    "final",
    "finish_reason",
    "idempotency_key",
    "trace",
)
_new = object.__new__
_setters: list[Any] = [getattr(Chunk.__dict__.get(n), "__set__", None) for n in _CHUNK_FIELDS]
(
    _set_stream_id,
    _set_kind,
    _set_call_id,
    _set_seq,
    _set_tool,
    _set_tool_version,
    _set_delta,
    _set_final,
    _set_finish_reason,
    _set_idempotency_key,
    _set_trace,
) = _setters
_BY_SLOTS = tuple(f.name for f in fields(Chunk)) == _CHUNK_FIELDS


def _chunk(stream_id: str, call_id: str, seq: int | None, delta: str, final: bool) -> Chunk:
    """A tool-call chunk with no tool, version, key or trace: most chunks of a stream."""
    if not _BY_SLOTS:
        return Chunk(
            stream_id=stream_id,
            kind=ChunkKind.TOOL_CALL,
            call_id=call_id,
            seq=seq,
            delta=delta,
            final=final,
        )
    chunk: Chunk = _new(Chunk)
    _set_stream_id(chunk, stream_id)
    _set_kind(chunk, ChunkKind.TOOL_CALL)
    _set_call_id(chunk, call_id)
    _set_seq(chunk, seq)
    _set_tool(chunk, None)
    _set_tool_version(chunk, None)
    _set_delta(chunk, delta)
    _set_final(chunk, final)
    _set_finish_reason(chunk, None)
    _set_idempotency_key(chunk, None)
    _set_trace(chunk, NO_TRACE)
    return chunk


def _optional_str(obj: Mapping[str, Any], name: str) -> str | None:
    value = obj.get(name)
    if value is None or isinstance(value, str):
        return value
    raise InputFormatError(f"envelope field {name!r} must be a string or null")


def trace_of(obj: Mapping[str, Any], traceparent: str | None) -> Trace:
    """The correlation fields of one envelope (or vendor event wrapper)."""
    attempt = obj.get("attempt")
    if attempt is not None and (type(attempt) is not int or attempt < 1):
        raise InputFormatError("envelope field 'attempt' must be an integer >= 1")
    trace_id = _optional_str(obj, "trace_id")
    run_id = _optional_str(obj, "run_id")
    step_id = _optional_str(obj, "step_id")
    if trace_id is None and run_id is None and step_id is None and attempt is None:
        # one shared, immutable empty trace: most chunks carry none, and building one is not free
        return Trace(traceparent=traceparent) if traceparent else NO_TRACE
    return Trace(trace_id, run_id, step_id, traceparent, attempt)


def decode_envelope(value: bytes, traceparent: str | None = None) -> Chunk:
    """Parse one envelope record. Raises `InputFormatError` naming what is wrong."""
    obj = parse_envelope(value)
    fragment = bare_fragment(obj) if traceparent is None else None
    return _chunk(*fragment) if fragment else chunk_from_envelope(obj, traceparent)


def parse_envelope(value: bytes) -> dict[str, Any]:
    """The record's JSON object, not yet checked as an envelope. Raises `InputFormatError`."""
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise InputFormatError(f"record is not JSON: {exc}") from None
    if type(obj) is not dict:
        raise InputFormatError("envelope must be a JSON object")
    return obj


#: the fields of a middle chunk, which carries nothing else (one C call fetches them all)
_MIDDLE = operator.itemgetter("stream_id", "call_id", "seq", "kind", "delta", "final")


def bare_fragment(obj: Mapping[str, Any]) -> Fragment | None:
    """The fields of a valid tool-call envelope with exactly the six fields of a middle chunk.

    None for any other envelope, valid or not: `chunk_from_envelope` then decides, and reports
    what is wrong. The hot path of every canonical record, so the checks are inline.
    """
    if len(obj) != 6:
        return None
    try:
        stream_id, call_id, seq, raw_kind, delta, final = _MIDDLE(obj)
    except KeyError:
        return None
    if (
        type(stream_id) is str
        and stream_id
        and type(call_id) is str
        and call_id
        and raw_kind == "tool_call"
        and (seq is None or (type(seq) is int and seq >= 0))
        and type(delta) is str
        and (final is True or final is False)
    ):
        return (stream_id, call_id, seq, delta, final)
    return None


def chunk_from_envelope(obj: Mapping[str, Any], traceparent: str | None = None) -> Chunk:
    """The chunk of any envelope object, field by field (`bare_fragment` is the fast path for
    middle chunks). Raises `InputFormatError` naming the first bad field, in report order."""
    get = obj.get
    stream_id = get("stream_id")
    if not isinstance(stream_id, str) or not stream_id:
        raise InputFormatError("envelope needs a non-empty string 'stream_id'")
    raw_kind = get("kind")
    kind = _KINDS.get(raw_kind) if isinstance(raw_kind, str) else None
    if kind is None:
        raise InputFormatError(f"envelope 'kind' must be one of {sorted(_KINDS)}")
    if (
        traceparent is None
        and get("trace_id") is None
        and get("run_id") is None
        and get("step_id") is None
        and get("attempt") is None
    ):
        trace = NO_TRACE
    else:
        trace = trace_of(obj, traceparent)
    if kind is ChunkKind.END:
        raw_reason = get("finish_reason")
        finish = _FINISH.get(raw_reason) if isinstance(raw_reason, str) else None
        if raw_reason is not None and finish is None:
            raise InputFormatError(f"'finish_reason' must be one of {sorted(_FINISH)}")
        return Chunk(stream_id=stream_id, kind=kind, finish_reason=finish, trace=trace)

    call_id = get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InputFormatError(f"a {kind.value!r} envelope needs a non-empty string 'call_id'")
    seq = get("seq")
    if seq is not None and (type(seq) is not int or seq < 0):
        raise InputFormatError("envelope field 'seq' must be an integer >= 0")
    delta = get("delta", "")
    if delta is None:
        delta = ""
    elif not isinstance(delta, str):
        raise InputFormatError("envelope field 'delta' must be a string")
    final = get("final", False)
    if final is not False and final is not True:
        raise InputFormatError("envelope field 'final' must be true or false")
    tool = get("tool")
    if tool is not None and not isinstance(tool, str):
        raise InputFormatError("envelope field 'tool' must be a string or null")
    version = get("tool_version")
    if version is not None and type(version) is not str:
        if type(version) is int:
            version = str(version)
        elif not isinstance(version, str):
            raise InputFormatError("envelope field 'tool_version' must be a string or null")
    key = get("idempotency_key")
    if key is not None and not isinstance(key, str):
        raise InputFormatError("envelope field 'idempotency_key' must be a string or null")
    if not _BY_SLOTS:
        return Chunk(
            stream_id=stream_id,
            kind=kind,
            call_id=call_id,
            seq=seq,
            tool=tool,
            tool_version=version,
            delta=delta,
            final=final,
            idempotency_key=key,
            trace=trace,
        )
    chunk: Chunk = _new(Chunk)
    _set_stream_id(chunk, stream_id)
    _set_kind(chunk, kind)
    _set_call_id(chunk, call_id)
    _set_seq(chunk, seq)
    _set_tool(chunk, tool)
    _set_tool_version(chunk, version)
    _set_delta(chunk, delta)
    _set_final(chunk, final)
    _set_finish_reason(chunk, None)
    _set_idempotency_key(chunk, key)
    _set_trace(chunk, trace)
    return chunk
