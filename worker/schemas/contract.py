"""What the chain needs from a loaded contract: its identity, its metadata and a compiled check.

The registry (`worker.schemas.registry`) builds these once at start-up; the chain only calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from worker._native import EarlySchema
from worker.model import CallKind, Code, SchemaRef, Violation

#: A compiled schema: returns the violations of an instance, at most `max_violations` of them,
#: each bounded in bytes (`ViolationLimits`); empty means valid. It never rewrites the instance.
CompiledCheck = Callable[[Any], tuple[Violation, ...]]

#: What ends a violation path that was cut to its byte bound.
CUT = "/\u2026"

#: How deep a schema document, or the JSON a schema asserts inside a string (draft 7
#: `contentMediaType`), may nest: the strict parser's own cap.
MAX_DOCUMENT_DEPTH = 1024


@dataclass(frozen=True, slots=True)
class ViolationLimits:
    """How much a compiled check may report about one instance. No defaults: whoever compiles a
    check passes them, from the settings (`worker.compose`)."""

    max_violations: int
    max_path_bytes: int  # a longer path is cut at a token boundary and ends in CUT
    max_message_bytes: int  # a longer message is cut and ends in "\u2026"

    def __post_init__(self) -> None:
        if self.max_violations < 1 or min(self.max_path_bytes, self.max_message_bytes) < 16:
            raise ValueError(f"violation limits too small: {self}")


#: The contract kind that judges each kind of call: its own, except a remote MCP tool's approval
#: request, which the tool's function contract judges (an MCP tools file's, or a schema's).
JUDGED_BY: dict[str, CallKind] = {
    **{kind.value: kind for kind in CallKind},
    CallKind.MCP_APPROVAL_REQUEST.value: CallKind.FUNCTION_CALL,
}
#: The kinds a contract may declare (`x-callgate.call_kind`).
CONTRACT_KINDS = frozenset(JUDGED_BY.values())

#: A custom tool's text input, checked against its declared grammar: the violation, or None.
InputCheck = Callable[[str], Violation | None]


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
    #: the top-level argument that carries the call's idempotency key, if the contract has one
    idempotency_key_argument: str | None = None
    #: the principals that may call this tool (None: the contract does not restrict who may;
    #: empty: nobody may). A call naming no principal is refused when there is a list.
    allowed_principals: frozenset[str] | None = None
    #: the kind of call the contract judges (`JUDGED_BY`); a custom tool's contract judges
    #: `{"input": <its text>}`
    call_kind: CallKind = CallKind.FUNCTION_CALL
    #: a call of this tool without an idempotency key is rejected (set once, read per call)
    needs_key: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        needs_key = self.side_effects or self.idempotency is IdempotencyPolicy.REQUIRED
        object.__setattr__(self, "needs_key", needs_key)


def principal_refusal(allowed: frozenset[str] | None, principal: str | None) -> str | None:
    """Why an allow list (`ContractMeta.allowed_principals`) refuses a call by `principal`, for
    operators (None: it does not). The one rule the gate's authorization phase and the executor
    both apply: without a list every call passes; with one, only a principal on it, never a
    call naming none."""
    if allowed is None or principal in allowed:
        return None
    if principal is None:
        return "the call names no principal and the contract has an allow list"
    return "the call's principal is not on the contract's allow list"


@dataclass(frozen=True, slots=True)
class Contract:
    """One version of one tool's input contract (and, for MCP tools, its output contract)."""

    tool: str
    ref: SchemaRef
    meta: ContractMeta
    check: CompiledCheck
    file: str
    output_check: CompiledCheck | None = None
    #: property names the input schema declares (`worker.schemas.drafts.declared_names`): the
    #: only object keys retry feedback may name
    declared_names: frozenset[str] = frozenset()
    #: the same for the output schema (MCP tools)
    output_declared_names: frozenset[str] = frozenset()
    #: a custom tool's grammar (`x-callgate.format`), checked after the schema
    input_check: InputCheck | None = None
    #: the input schema's keywords that decide a call before its stream ends
    #: (`worker._native.EarlySchema`, compiled with the contract)
    early: EarlySchema | None = None


@dataclass(frozen=True, slots=True)
class LookupFailure:
    """Why no contract judges a call: `unknown_tool` or `unknown_schema_version`."""

    code: Code
    message: str
