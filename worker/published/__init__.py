"""What callgate publishes: the JSON Schemas of the records it writes for others to read, and a
typed, frozen model of them (`worker.published.model`).

- `outcome-event.v1`: the event of a call (`accepted`, `rejected`, `incomplete`, and
  `pending_approval`), on the outcome and pending-approval topics;
- `approval-decision.v1`: a decision on a call pending approval (`approve`, `deny`, `expire`);
- `tool-result.v1`: what an executor made of an accepted call, on the tool-results topic.

Each is versioned by its major version in its file name. Within a major version a document only
grows: members are added, never removed, retyped or made optional, and readers ignore members
they do not know. CI holds each against its last released copy with
`callgate schemas compat RELEASED CURRENT --mode forward` (a reader of the released version reads
every record the current one allows).
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

import orjson

DIRECTORY = Path(__file__).parent


class Document(StrEnum):
    """A published schema, by the file name it ships under."""

    OUTCOME_EVENT = "outcome-event.v1"
    APPROVAL_DECISION = "approval-decision.v1"
    TOOL_RESULT = "tool-result.v1"

    @property
    def path(self) -> Path:
        return DIRECTORY / f"{self.value}.schema.json"


@cache
def load(document: Document) -> Any:
    """The schema document, parsed (shared: do not change it)."""
    return orjson.loads(document.path.read_bytes())


__all__ = ["DIRECTORY", "Document", "load"]
