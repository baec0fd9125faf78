"""The per-stream state and chunk building that every vendor adapter shares.

A vendor adapter decodes one stream: it knows the stream id, the trace taken from the record's
headers, and whether the stream has ended. `VendorAdapter` holds those and builds the chunks
that carry them; each format's subclass adds only its own event handling (`feed`).
"""

from __future__ import annotations

from collections.abc import Mapping

from worker.adapters.fields import trace_from_headers
from worker.model import Chunk, ChunkKind, FinishReason


class VendorAdapter:
    """Base of one vendor stream's incremental decoder; subclasses implement `feed`."""

    def __init__(self, stream_id: str, headers: Mapping[str, str]) -> None:
        self._stream = stream_id
        self._trace = trace_from_headers(headers)
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
    ) -> Chunk:
        return Chunk(
            self._stream,
            kind,
            call_id=call_id,
            seq=seq,
            tool=tool,
            tool_version=tool_version,
            delta=delta,
            final=final,
            trace=self._trace,
        )

    def _end(self, finish: FinishReason | None) -> Chunk:
        """The stream's END chunk; the stream is finished."""
        self._finished = True
        return Chunk(self._stream, ChunkKind.END, finish_reason=finish, trace=self._trace)

    def _error(self, code: str) -> list[Chunk]:
        """A vendor error ends the stream: its ERROR chunk (only `code`), then END (ERROR)."""
        error = self._chunk(ChunkKind.ERROR, f"{self._stream}:error", delta=code, final=True)
        return [error, self._end(FinishReason.ERROR)]
