"""The canonical chunk envelope (DESIGN.md): one JSON object per record, one chunk each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from worker.errors import InputFormatError
from worker.model import NO_TRACE, Chunk, ChunkKind, FinishReason, Trace

_KINDS = {kind.value: kind for kind in ChunkKind if kind is not ChunkKind.MCP_RESULT}
_FINISH = {reason.value: reason for reason in FinishReason}


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
        return Trace(traceparent=traceparent) if traceparent else NO_TRACE
    return Trace(trace_id, run_id, step_id, traceparent, attempt)


def decode_envelope(value: bytes, traceparent: str | None = None) -> Chunk:
    """Parse one envelope record. Raises `InputFormatError` naming what is wrong."""
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise InputFormatError(f"record is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InputFormatError("envelope must be a JSON object")
    return chunk_from_envelope(obj, traceparent)


def chunk_from_envelope(obj: Mapping[str, Any], traceparent: str | None = None) -> Chunk:
    stream_id = obj.get("stream_id")
    if not isinstance(stream_id, str) or not stream_id:
        raise InputFormatError("envelope needs a non-empty string 'stream_id'")
    kind = _KINDS.get(obj.get("kind"))  # type: ignore[arg-type]
    if kind is None:
        raise InputFormatError(f"envelope 'kind' must be one of {sorted(_KINDS)}")
    trace = trace_of(obj, traceparent)
    if kind is ChunkKind.END:
        raw_reason = obj.get("finish_reason")
        finish = _FINISH.get(raw_reason) if isinstance(raw_reason, str) else None
        if raw_reason is not None and finish is None:
            raise InputFormatError(f"'finish_reason' must be one of {sorted(_FINISH)}")
        return Chunk(stream_id=stream_id, kind=kind, finish_reason=finish, trace=trace)

    call_id = obj.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InputFormatError(f"a {kind.value!r} envelope needs a non-empty string 'call_id'")
    seq = obj.get("seq")
    if seq is not None and (type(seq) is not int or seq < 0):
        raise InputFormatError("envelope field 'seq' must be an integer >= 0")
    delta = obj.get("delta", "")
    if delta is None:
        delta = ""
    if not isinstance(delta, str):
        raise InputFormatError("envelope field 'delta' must be a string")
    final = obj.get("final", False)
    if not isinstance(final, bool):
        raise InputFormatError("envelope field 'final' must be true or false")
    version = obj.get("tool_version")
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    return Chunk(
        stream_id=stream_id,
        kind=kind,
        call_id=call_id,
        seq=seq,
        tool=_optional_str(obj, "tool"),
        tool_version=_optional_str({"tool_version": version}, "tool_version"),
        delta=delta,
        final=final,
        idempotency_key=_optional_str(obj, "idempotency_key"),
        trace=trace,
    )
