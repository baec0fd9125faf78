"""The per-stream state and chunk building that every vendor adapter shares.

A vendor adapter decodes one stream: it knows the stream id, the `traceparent` header its
records carry, and whether the stream has ended. `VendorAdapter` holds those and builds the
chunks that carry them; each format's subclass adds its own event handling (`feed`), names the
calls it has open (`open_calls`, what an abort ends) and writes its state as a JSON value
(`state`, read back by its constructor) for a partition's checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker._native import Chunk
from worker.model import ChunkKind, FinishReason


class VendorAdapter:
    """Base of one vendor stream's incremental decoder."""

    def __init__(self, stream_id: str, headers: Mapping[str, str]) -> None:
        self._stream = stream_id
        self._traceparent = headers.get("traceparent") or None
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

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
    ) -> Chunk:
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
            expected=expected,
        )

    def _end(self, finish: FinishReason | None) -> Chunk:
        """The stream's END chunk; the stream is finished."""
        self._finished = True
        return Chunk(
            self._stream, ChunkKind.END, finish_reason=finish, traceparent=self._traceparent
        )

    def _error(self, code: str) -> list[Chunk]:
        """A vendor error ends the stream: its ERROR chunk (only `code`), then END (ERROR)."""
        error = self._chunk(ChunkKind.ERROR, f"{self._stream}:error", delta=code, final=True)
        return [error, self._end(FinishReason.ERROR)]

    def _base_state(self) -> dict[str, Any]:
        return {"finished": self._finished}

    def _restore_base(self, state: Mapping[str, Any]) -> None:
        self._finished = bool(state["finished"])
