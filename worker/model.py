"""The values that flow through callgate: chunks in, assembled calls, verdicts out.

Everything here is a frozen, slotted dataclass or a `str` enum. The enums' values are the wire
names used in outcome events and as Prometheus label values, so they are shared, never re-spelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    INCOMPLETE = "incomplete"


class Phase(StrEnum):
    """The chain's phases, in the order they run. The first one that fails decides the outcome."""

    ASSEMBLY = "assembly"
    RESPONSE_CLASSIFICATION = "response_classification"
    LIMITS = "limits"
    REPAIR = "repair"
    JSON_PARSE = "json_parse"
    SCHEMA_VALIDATION = "schema_validation"
    BUSINESS_VALIDATION = "business_validation"
    IDEMPOTENCY = "idempotency"
    NORMALIZATION = "normalization"
    TOOL_OUTPUT_VALIDATION = "tool_output_validation"


class Code(StrEnum):
    """Why a phase failed (the `error_code` of an event, the `code` label of a metric)."""

    # assembly
    SEQUENCE_GAP = "sequence_gap"
    DUPLICATE_CHUNK = "duplicate_chunk"
    MALFORMED_RECORD = "malformed_record"
    UNKNOWN_FORMAT = "unknown_format"
    # response_classification
    REFUSAL = "refusal"
    MODEL_ERROR = "model_error"
    UNEXPECTED_CHANNEL = "unexpected_channel"
    # limits
    TOO_LARGE = "too_large"
    TOO_MANY_CHUNKS = "too_many_chunks"
    TOO_DEEP = "too_deep"
    # json_parse
    INVALID_JSON = "invalid_json"
    DUPLICATE_KEY = "duplicate_key"
    NON_FINITE_NUMBER = "non_finite_number"
    INVALID_UTF8 = "invalid_utf8"
    ROOT_NOT_OBJECT = "root_not_object"
    # schema_validation
    UNKNOWN_TOOL = "unknown_tool"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    SCHEMA_VIOLATION = "schema_violation"
    # business_validation
    BUSINESS_RULE = "business_rule"
    RULE_ERROR = "rule_error"
    # idempotency
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    DUPLICATE = "duplicate"
    IDEMPOTENCY_KEY_MISSING = "idempotency_key_missing"
    # normalization
    ADAPTER_ERROR = "adapter_error"
    # tool_output_validation
    OUTPUT_SCHEMA_VIOLATION = "output_schema_violation"
    OUTPUT_TEXT_MISMATCH = "output_text_mismatch"
    TOOL_ERROR = "tool_error"
    JSONRPC_ERROR = "jsonrpc_error"


class IncompleteReason(StrEnum):
    MAX_TOKENS = "max_tokens"
    CONTENT_FILTER = "content_filter"
    STREAM_ENDED = "stream_ended"
    TIMEOUT = "timeout"
    EVICTED = "evicted"
    SEQUENCE_GAP = "sequence_gap"
    INPUT_REQUIRED = "input_required"


class RepairKind(StrEnum):
    MARKDOWN_FENCE = "markdown_fence"


class ChunkKind(StrEnum):
    """The `kind` of a canonical envelope (and of every internal chunk an adapter makes)."""

    TOOL_CALL = "tool_call"
    TEXT = "text"
    REFUSAL = "refusal"
    ERROR = "error"
    END = "end"
    MCP_RESULT = "mcp_result"


class FinishReason(StrEnum):
    """A stream's finish signal, normalized from every vendor's spelling."""

    STOP = "stop"
    TOOL_CALLS = "tool_calls"
    LENGTH = "length"
    CONTENT_FILTER = "content_filter"
    REFUSAL = "refusal"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Trace:
    """Correlation fields copied from the input onto the event, never interpreted."""

    trace_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    traceparent: str | None = None
    attempt: int | None = None


NO_TRACE = Trace()


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of model output for one stream, in callgate's own terms.

    Adapters turn each vendor event (or canonical envelope) into zero or more chunks. `seq` is the
    chunk's number within its call when the producer numbers them; `None` means the adapter
    derived the order from the record order, which the partition guarantees.
    """

    stream_id: str
    kind: ChunkKind
    call_id: str | None = None
    seq: int | None = None
    tool: str | None = None
    tool_version: str | None = None
    delta: str = ""
    final: bool = False
    finish_reason: FinishReason | None = None
    idempotency_key: str | None = None
    trace: Trace = NO_TRACE


#: A tool-call chunk that carries nothing but its place and text: (stream_id, call_id, seq, delta,
#: final), every other field of `Chunk` at its default. Most chunks of a stream are such middle
#: fragments, and the hot path hands them from the envelope to the reassembler as this plain
#: tuple instead of a `Chunk`, whose construction would cost more than the rest of their way.
Fragment = tuple[str, str, int | None, str, bool]


@dataclass(frozen=True, slots=True)
class SourceSpan:
    """Where a call's records sit in Kafka (or in an input file: topic is the file name)."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class AssembledCall:
    """Everything the chain needs to judge one call, as the reassembler closed it.

    `incomplete` or `assembly_error` set means the reassembler already knows the verdict's first
    failing phase; the chain then only records it.
    """

    stream_id: str
    call_id: str
    tool: str | None
    arguments: bytes
    channel: ChunkKind = ChunkKind.TOOL_CALL
    tool_version: str | None = None
    idempotency_key: str | None = None
    trace: Trace = NO_TRACE
    source: SourceSpan | None = None
    chunks: int = 1
    incomplete: IncompleteReason | None = None
    assembly_error: Code | None = None
    assembly_detail: str | None = None
    duplicate_chunks: int = 0
    assembly_us: int = 0


@dataclass(frozen=True, slots=True)
class Violation:
    """One reported problem: where (JSON Pointer into the arguments), which rule, and why."""

    path: str
    keyword: str
    message: str


@dataclass(frozen=True, slots=True)
class Repair:
    kind: RepairKind


@dataclass(frozen=True, slots=True)
class SchemaRef:
    id: str
    version: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """The chain's decision for one call. `phase`/`code` name the first phase that failed."""

    outcome: Outcome
    phase: Phase | None = None
    code: Code | None = None
    reason: IncompleteReason | None = None
    schema: SchemaRef | None = None
    arguments: Any = None
    violations: tuple[Violation, ...] = ()
    repairs: tuple[Repair, ...] = ()
    retryable: bool = False
    retry_feedback: Mapping[str, Any] | None = None
    requires_approval: bool = False
    phases_us: Mapping[Phase, int] = field(default_factory=dict)
    nbytes: int = 0
