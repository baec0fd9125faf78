"""MCP `tools/call` JSON-RPC responses (`mcp.result`) to one internal chunk each.

A record is a whole response, so it is a whole, closed result: one `MCP_RESULT` chunk, final. The
tool name comes from the Kafka header `tool` (a JSON-RPC response does not name its method); the
call id from the header `call-id`, else the JSON-RPC `id`; `tool-version` is optional. The
chunk's text is the message re-serialized; the chain parses it strictly again and judges it
with `worker.core.tool_output.check_tool_result`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from worker._native import Chunk
from worker.adapters._base import VendorAdapter
from worker.errors import InputFormatError
from worker.model import ChunkKind

FORMAT = "mcp.result"


class MCPResultAdapter(VendorAdapter):
    """One MCP result record; finished after its only event."""

    def __init__(
        self,
        stream_id: str,
        headers: Mapping[str, str],
        state: Mapping[str, Any] | None,
        *,
        max_calls: int,
    ) -> None:
        super().__init__(stream_id, headers, max_calls)
        self._headers = headers
        if state is not None:
            self._restore_base(state)

    def state(self) -> dict[str, Any]:
        return self._base_state()

    @property
    def held(self) -> int:
        """None: a record is a whole result, closed in its own chunk."""
        return 0

    def open_calls(self) -> list[str]:
        """None: a record is a whole result."""
        return []

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        self._finished = True
        if event.get("jsonrpc") != "2.0":
            raise InputFormatError("mcp.result: not a JSON-RPC 2.0 message ('jsonrpc' != '2.0')")
        rpc_id = event.get("id")
        if isinstance(rpc_id, bool) or not isinstance(rpc_id, str | int):
            raise InputFormatError("mcp.result: JSON-RPC 'id' must be a string or an integer")
        if ("result" in event) == ("error" in event):
            raise InputFormatError("mcp.result: a response holds exactly one of result and error")
        if "method" in event:
            raise InputFormatError("mcp.result: a request or notification, not a response")
        tool = self._headers.get("tool")
        if not tool:
            raise InputFormatError("mcp.result: the record needs a 'tool' header naming the tool")
        call_id = self._headers.get("call-id") or str(rpc_id)
        return [
            self._chunk(
                ChunkKind.MCP_RESULT,
                call_id,
                tool=tool,
                tool_version=self._headers.get("tool-version") or None,
                delta=orjson.dumps(event).decode(),
                final=True,
            )
        ]
