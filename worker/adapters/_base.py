"""The per-stream state and chunk building that every vendor adapter shares.

A vendor adapter decodes one stream: it knows the stream id, the `traceparent` and `principal`
headers its records carry (the decoder holds every record of a stream to its first one's
principal), and whether the stream has ended. `VendorAdapter` holds those and builds the
chunks that carry them; each format's subclass adds its own event handling (`feed`), names the
calls it holds (`open_calls`, what an abort ends; `held`, how many) and writes its state as a
JSON value (`state`, read back by its constructor) for a partition's checkpoint.

The rules every streaming adapter keeps:

- An event the adapter cannot place (a field of the wrong type, a structure that contradicts the
  stream so far) raises `InputFormatError`; the decoder then ends every call in `open_calls()`
  as `stream_corrupt` and drops the stream's later records. Nothing is skipped silently: a piece
  of argument text is either taken, or its event breaks the stream.
- A stream ends once. The event that ends it (finish reasons, `message_stop`,
  `response.completed`, ...) makes the END chunk and the adapter `finished`; the decoder then
  forgets the adapter and remembers that the stream ended, so any later event of it is one the
  stream cannot place (`after_end` names the few a format sends after its end and that carry
  nothing, such as Chat Completions' usage chunk). The decoder applies that rule, for every
  format, in one place.
- A call's final chunk is released only with the stream's END, once every final form the vendor
  sends (its `.done` texts, the final response) has been checked against it. Until then the call
  is held: a later event that contradicts it breaks it like one that is still streaming. This
  costs no latency for a one-choice Chat Completion (its finish is its end); a Messages or
  Responses call waits for the end of its message (what the SDKs' final message waits for).
- A stream of several outputs (Chat Completions choices, Gemini candidates) decides each call
  by its own output's finish alone: at the END, a call its output did not release is ended
  first by that output's finish (`_end_call`), never by another output's.
- A stream holds at most `max_calls` calls; one more is an event it cannot place (each call held
  is a call the reassembler holds, so a stream never evicts its own calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker._native import Chunk
from worker.adapters import naming
from worker.errors import InputFormatError
from worker.model import CallKind, ChunkKind, FinishReason


class VendorAdapter:
    """Base of one vendor stream's incremental decoder."""

    def __init__(self, stream_id: str, headers: Mapping[str, str], max_calls: int) -> None:
        self._stream = stream_id
        self._traceparent = headers.get("traceparent") or None
        self._principal = headers.get("principal") or None
        self._max_calls = max_calls
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    @classmethod
    def after_end(cls, event: Mapping[str, Any]) -> bool:
        """Whether `event`, arriving after the stream's end, is one the format sends there and
        that carries nothing (dropped); any other event after the end breaks the stream."""
        return False

    @classmethod
    def announced(cls, event: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The calls `event` opens, as (call id, tool), read without the stream's state: what
        a stream already broken can still name (each then ends `stream_corrupt`)."""
        return []

    def _admit(self, held: int, where: str) -> None:
        """Refuse a call past the stream's bound (`held` counts it)."""
        if held > self._max_calls:
            raise InputFormatError(f"{where}: the stream holds more than {self._max_calls} calls")

    def _chunk(
        self,
        kind: ChunkKind,
        call_id: str,
        *,
        seq: int | None = None,
        tool: str | None = None,
        tool_version: str | None = None,
        delta: str = "",
        final: bool = False,
        expected: str | None = None,
        call_kind: CallKind | None = None,
        caller: str | None = None,
        double_encoded: bool = False,
    ) -> Chunk:
        """A chunk of this stream; `call_kind`, `caller` and `double_encoded` state a tool
        call's origin on its first chunk (`worker._native.Chunk`)."""
        return Chunk(
            self._stream,
            kind,
            call_id,
            seq=seq,
            tool=tool,
            tool_version=tool_version,
            delta=delta,
            final=final,
            traceparent=self._traceparent,
            principal=self._principal,
            expected=expected,
            call_kind=call_kind,
            caller=caller,
            double_encoded=double_encoded,
        )

    def _end(self, finish: FinishReason | None) -> Chunk:
        """The stream's END chunk; the stream is finished."""
        self._finished = True
        return Chunk(
            self._stream, ChunkKind.END, finish_reason=finish, traceparent=self._traceparent
        )

    def _end_call(self, call_id: str, finish: FinishReason | None) -> Chunk:
        """The end of one call its own output (a choice, a candidate) finished without
        releasing it: the call ends incomplete as the stream's END with `finish` would end it,
        whatever the stream's other outputs did."""
        return Chunk(
            self._stream,
            ChunkKind.END,
            call_id,
            finish_reason=finish,
            traceparent=self._traceparent,
        )

    @staticmethod
    def _shared(finishes: list[FinishReason | None]) -> FinishReason | None:
        """The stream's finish when its outputs all finished alike, else none (each call was
        ended by its own output's finish, `_end_call`)."""
        return finishes[0] if finishes and len(set(finishes)) == 1 else None

    def _error(self, code: str) -> list[Chunk]:
        """A vendor error ends the stream: its ERROR chunk (only `code`), then END (ERROR).
        Nothing held is released: every call still held ends incomplete."""
        error = self._chunk(ChunkKind.ERROR, naming.error(self._stream), delta=code, final=True)
        return [error, self._end(FinishReason.ERROR)]

    def _base_state(self) -> dict[str, Any]:
        return {"finished": self._finished}

    def _restore_base(self, state: Mapping[str, Any]) -> None:
        self._finished = bool(state["finished"])
