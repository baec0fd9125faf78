"""What the chain needs from a loaded contract: its identity, its metadata and a compiled check.

The registry (`worker.schemas.registry`) builds these once at start-up; the chain only calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from worker.model import Code, SchemaRef, Violation

#: A compiled schema: returns every violation the engine reports; empty means valid.
#: It never rewrites the instance it is given.
CompiledCheck = Callable[[Any], tuple[Violation, ...]]


class IdempotencyPolicy(StrEnum):
    REQUIRED = "required"
    OPTIONAL = "optional"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class ContractMeta:
    """The `x-callgate` annotation of a schema."""

    side_effects: bool = False
    requires_approval: bool = False
    idempotency: IdempotencyPolicy = IdempotencyPolicy.OPTIONAL


@dataclass(frozen=True, slots=True)
class Contract:
    """One version of one tool's input contract (and, for MCP tools, its output contract)."""

    tool: str
    ref: SchemaRef
    meta: ContractMeta
    check: CompiledCheck
    file: str
    output_check: CompiledCheck | None = None


@dataclass(frozen=True, slots=True)
class LookupFailure:
    """Why no contract judges a call: `unknown_tool` or `unknown_schema_version`."""

    code: Code
    message: str
