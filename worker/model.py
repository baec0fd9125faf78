"""The values that flow through callgate: chunks in, assembled calls, verdicts out.

`Chunk`, `AssembledCall` and `Verdict` are the native core's own types (`worker._native`),
re-exported here: the outcome event is written from a verdict's fields by the native core.
The enums are `str` enums whose values are the wire names used in outcome events and as
Prometheus label values, so they are shared, never re-spelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# MAX_DEPTH: the deepest nesting any JSON callgate reads or writes may have (254): every parser
# (arguments, envelopes, vendor records, tool results) stops there with its own rejection, and
# every encoder writes that deep (orjson's own limit is 254 levels). Defined once, in the native
# core (`json::MAX_DEPTH`), which parses them all.
from worker._native import MAX_DEPTH, AssembledCall, Chunk, Verdict

__all__ = [
    "MAX_DEPTH",
    "AssembledCall",
    "CallKind",
    "Chunk",
    "ChunkKind",
    "Code",
    "Feedback",
    "FinishReason",
    "IncompleteReason",
    "Outcome",
    "Phase",
    "RepairKind",
    "SchemaRef",
    "Verdict",
    "Violation",
    "longer_than",
]


def longer_than(identifier: str | None, max_id_bytes: int) -> bool:
    """Whether `identifier` is past the identifier bound (`CALLGATE_LIMITS__MAX_ID_BYTES`): its
    UTF-8 longer than `max_id_bytes`, as the native core measures an envelope's. The one test of
    an identifier callgate takes or derives outside the native core."""
    return (
        identifier is not None
        and len(identifier) * 4 > max_id_bytes
        and len(identifier.encode("utf-8", "surrogatepass")) > max_id_bytes
    )


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
    AUTHORIZATION = "authorization"
    IDEMPOTENCY = "idempotency"
    NORMALIZATION = "normalization"
    #: a call whose contract requires approval waits here for a person's decision
    APPROVAL = "approval"
    TOOL_OUTPUT_VALIDATION = "tool_output_validation"
    DELIVERY = "delivery"


class Code(StrEnum):
    """Why a phase failed (the `error_code` of an event, the `code` label of a metric)."""

    # assembly
    MALFORMED_RECORD = "malformed_record"
    CALL_ID_REUSED = "call_id_reused"
    # response_classification
    REFUSAL = "refusal"
    MODEL_ERROR = "model_error"
    UNEXPECTED_CHANNEL = "unexpected_channel"
    MALFORMED_TOOL_CALL = "malformed_tool_call"
    UNEXPECTED_TOOL_CALL = "unexpected_tool_call"
    UNSUPPORTED_CALL_KIND = "unsupported_call_kind"
    # limits
    TOO_LARGE = "too_large"
    TOO_MANY_CHUNKS = "too_many_chunks"
    TOO_DEEP = "too_deep"
    # json_parse
    INVALID_JSON = "invalid_json"
    DUPLICATE_KEY = "duplicate_key"
    NON_FINITE_NUMBER = "non_finite_number"
    INEXACT_NUMBER = "inexact_number"
    INVALID_UTF8 = "invalid_utf8"
    ROOT_NOT_OBJECT = "root_not_object"
    # schema_validation
    UNKNOWN_TOOL = "unknown_tool"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    SCHEMA_VIOLATION = "schema_violation"
    # business_validation
    BUSINESS_RULE = "business_rule"
    RULE_ERROR = "rule_error"
    # authorization
    UNAUTHORIZED = "unauthorized"
    AUTHORIZER_ERROR = "authorizer_error"
    # idempotency
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    DUPLICATE = "duplicate"
    IDEMPOTENCY_KEY_MISSING = "idempotency_key_missing"
    IDEMPOTENCY_KEY_MISMATCH = "idempotency_key_mismatch"
    # normalization
    ADAPTER_ERROR = "adapter_error"
    # approval
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_EXPIRED = "approval_expired"
    # tool_output_validation
    OUTPUT_SCHEMA_VIOLATION = "output_schema_violation"
    OUTPUT_TEXT_MISMATCH = "output_text_mismatch"
    TOOL_ERROR = "tool_error"
    JSONRPC_ERROR = "jsonrpc_error"
    # any phase: callgate itself failed on this call (logged, counted)
    INTERNAL_ERROR = "internal_error"
    # delivery: the event could not be written as judged (its substitute says why)
    EVENT_TOO_LARGE = "event_too_large"
    OUTPUT_REFUSED = "output_refused"


class IncompleteReason(StrEnum):
    MAX_TOKENS = "max_tokens"
    CONTENT_FILTER = "content_filter"
    STREAM_ENDED = "stream_ended"
    TIMEOUT = "timeout"
    EVICTED = "evicted"
    SEQUENCE_GAP = "sequence_gap"
    STREAM_CORRUPT = "stream_corrupt"
    MAX_LIFETIME = "max_lifetime"
    INPUT_REQUIRED = "input_required"


class RepairKind(StrEnum):
    MARKDOWN_FENCE = "markdown_fence"
    #: a JSON string holding the arguments' JSON text, decoded once (only from a server whose
    #: dialect is known to send it so: `worker.adapters.dialects`)
    DOUBLE_ENCODED = "double_encoded"


class CallKind(StrEnum):
    """The kind of call a vendor made (`AssembledCall.call_kind`), as OpenAI Responses names its
    output items: what kind of contract judges it. Every format's tool call, and an envelope's,
    is a plain `function_call`; the names are the native core's (`worker._native.CALL_KINDS`)."""

    FUNCTION_CALL = "function_call"
    CUSTOM_TOOL_CALL = "custom_tool_call"
    APPLY_PATCH_CALL = "apply_patch_call"
    SHELL_CALL = "shell_call"
    LOCAL_SHELL_CALL = "local_shell_call"
    MCP_APPROVAL_REQUEST = "mcp_approval_request"


#: The kinds of call the client runs itself, the only ones an executor runs: a remote MCP tool's
#: approval request is approved by the client and run by OpenAI (the remote MCP server), never by
#: the client (a kind not named here, one callgate does not know, is not the client's either).
CLIENT_RUN_KINDS: frozenset[str] = frozenset(CallKind) - {CallKind.MCP_APPROVAL_REQUEST}


class ChunkKind(StrEnum):
    """The `kind` of a chunk: an envelope's kinds, and those only adapters make."""

    TOOL_CALL = "tool_call"
    TEXT = "text"
    REFUSAL = "refusal"
    ERROR = "error"
    END = "end"
    # made by adapters only
    MCP_RESULT = "mcp_result"
    ABORT = "abort"
    MALFORMED = "malformed"


class FinishReason(StrEnum):
    """A stream's finish signal, normalized from every vendor's spelling."""

    STOP = "stop"
    TOOL_CALLS = "tool_calls"
    LENGTH = "length"
    CONTENT_FILTER = "content_filter"
    REFUSAL = "refusal"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Violation:
    """One reported problem: where (JSON Pointer into the arguments), which rule, and why."""

    path: str
    keyword: str
    message: str


@dataclass(frozen=True, slots=True)
class SchemaRef:
    id: str
    version: str


@dataclass(frozen=True, slots=True)
class Feedback:
    """A rejection's retry feedback: its fields, and the JSON text of them the event embeds
    (encoded once, by `worker.core.feedback.build_feedback`, which bounds its size)."""

    fields: dict[str, Any]
    json: bytes
