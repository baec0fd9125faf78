"""Type stubs of the native core (`native/`, built by maturin into `worker._native`)."""

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Protocol, final

from worker.model import (
    Code,
    Feedback,
    IncompleteReason,
    Outcome,
    Phase,
    RepairKind,
    SchemaRef,
    Violation,
)

# -- strict JSON (native/core/src/json.rs, native/python/src/json.rs) ------------------------------

#: the deepest nesting any JSON callgate reads or writes (`worker.model.MAX_DEPTH`)
MAX_DEPTH: Final[int]

@final
class ParseError:
    """Why a text is not strict JSON; returned by `parse_json`, never raised."""

    code: Final[str]
    message: Final[str]
    path: Final[str]
    def __init__(self, code: str, message: str, path: str = "") -> None: ...

def parse_json(text: bytes, max_depth: int) -> Any:
    """The JSON value of `text`, or a `ParseError` (a returned value, never raised)."""

def depth_over(text: bytes, limit: int) -> int | None:
    """The nesting depth of `text` outside strings when it exceeds `limit`, else None."""

# -- Kafka's default partitioner (native/core/src/partition.rs) ------------------------------------

def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition index a record with this key goes to, as the Java client decides it."""

# -- the reassembler (native/python/src/assembler.rs, call.rs) -------------------------------------

#: the call kinds' wire names (native/core/src/origin.rs), held by `worker.model.CallKind`
CALL_KINDS: Final[tuple[str, ...]]

class _Record(Protocol):
    """What `Assembler.feed_records` reads of each record (an aiokafka ConsumerRecord fits)."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int | None: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...

@final
class Chunk:
    """One piece of model output for one stream, as an adapter makes it (see chunk.rs)."""

    stream_id: Final[str]
    kind: Final[str]
    call_id: Final[str | None]
    seq: Final[int | None]
    tool: Final[str | None]
    tool_version: Final[str | None]
    delta: Final[str]
    final: Final[bool]
    finish_reason: Final[str | None]
    idempotency_key: Final[str | None]
    principal: Final[str | None]
    trace_id: Final[str | None]
    run_id: Final[str | None]
    step_id: Final[str | None]
    traceparent: Final[str | None]
    attempt: Final[int | None]
    expected: Final[str | None]
    error: Final[str | None]
    call_kind: Final[str | None]
    caller: Final[str | None]
    double_encoded: Final[bool]
    def __init__(
        self,
        stream_id: str,
        kind: str,
        call_id: str | None = None,
        *,
        seq: int | None = None,
        tool: str | None = None,
        tool_version: str | None = None,
        delta: str = "",
        final: bool = False,
        finish_reason: str | None = None,
        idempotency_key: str | None = None,
        principal: str | None = None,
        trace_id: str | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        traceparent: str | None = None,
        attempt: int | None = None,
        expected: str | None = None,
        error: str | None = None,
        call_kind: str | None = None,
        caller: str | None = None,
        double_encoded: bool = False,
    ) -> None: ...

@final
class AssembledCall:
    """Everything the chain needs to judge one call, as the reassembler closed it."""

    stream_id: Final[str]
    call_id: Final[str]
    tool: Final[str | None]
    arguments: Final[bytes]
    channel: Final[str]
    tool_version: Final[str | None]
    idempotency_key: Final[str | None]
    principal: Final[str | None]
    trace_id: Final[str | None]
    run_id: Final[str | None]
    step_id: Final[str | None]
    traceparent: Final[str | None]
    attempt: Final[int | None]
    topic: Final[str]
    partition: Final[int]
    first_offset: Final[int]
    last_offset: Final[int]
    chunks: Final[int]
    duplicate_chunks: Final[int]
    nbytes: Final[int]
    incomplete: Final[str | None]
    assembly_error: Final[str | None]
    assembly_detail: Final[str | None]
    assembly_us: Final[int]
    event_id: Final[str]
    call_kind: Final[str]
    caller: Final[str | None]
    double_encoded: Final[bool]
    early: Final[EarlyRejection | None]
    early_offset: Final[int | None]
    def __init__(
        self,
        stream_id: str,
        call_id: str,
        tool: str | None = None,
        arguments: bytes | None = None,
        *,
        channel: str = "tool_call",
        tool_version: str | None = None,
        idempotency_key: str | None = None,
        trace_id: str | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        traceparent: str | None = None,
        attempt: int | None = None,
        topic: str = "",
        partition: int = 0,
        first_offset: int = 0,
        last_offset: int | None = None,
        chunks: int = 1,
        duplicate_chunks: int = 0,
        nbytes: int | None = None,
        incomplete: str | None = None,
        assembly_error: str | None = None,
        assembly_detail: str | None = None,
        assembly_us: int = 0,
        call_kind: str = "function_call",
        caller: str | None = None,
        double_encoded: bool = False,
        principal: str | None = None,
        early: EarlyRejection | None = None,
        early_offset: int | None = None,
    ) -> None: ...

@final
class EarlySchema:
    """One contract's early rules (see native/core/src/early.rs)."""

    decides_anything: Final[bool]
    def __init__(self, schema: bytes, draft: str, judges: Sequence[str]) -> None: ...

@final
class EarlyRules:
    """The early rules of every (tool, version) a call may name; None: no version named."""

    def __init__(
        self, entries: Sequence[tuple[str, str | None, EarlySchema]], max_depth: int
    ) -> None: ...
    def agreeing(self, other: EarlyRules) -> EarlyRules: ...
    def __len__(self) -> int: ...

@final
class EarlyRejection:
    """Why a call was rejected before its stream ended: `kind` `schema` (`path`, `keyword`,
    `detail` the keyword's schema value as JSON), `root` (not an object) or `json` (`keyword`
    the parse error's code, `pointer`, `detail` its message)."""

    kind: Final[str]
    path: Final[tuple[str | int, ...]]
    pointer: Final[str]
    keyword: Final[str]
    detail: Final[str | None]
    def __init__(
        self,
        kind: str,
        keyword: str,
        *,
        path: tuple[str | int, ...] | None = None,
        pointer: str = "",
        detail: str | None = None,
    ) -> None: ...

@final
class Assembler:
    """The reassembler of every partition a worker holds (see native/core/src/assembler.rs)."""

    def __init__(
        self,
        *,
        max_call_bytes: int,
        max_call_chunks: int,
        max_open_calls_per_partition: int,
        max_id_bytes: int,
        max_detail_bytes: int,
        idle_timeout_ms: int,
        max_call_lifetime_ms: int,
        recently_closed_per_partition: int,
        early: EarlyRules | None = None,
    ) -> None: ...
    def feed_records(
        self,
        topic: str,
        partition: int,
        records: Iterable[_Record],
        decode_vendor: Callable[[Any, str], Iterable[Chunk]],
    ) -> list[AssembledCall]: ...
    def feed_chunks(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int | None,
        chunks: Sequence[Chunk],
    ) -> list[AssembledCall]: ...
    def flush(self) -> list[AssembledCall]: ...
    def drop_partition(self, topic: str, partition: int) -> None: ...
    def snapshot(self, topic: str, partition: int) -> bytes: ...
    def delta(self, topic: str, partition: int) -> bytes: ...
    def restore(self, topic: str, partition: int, frames: Sequence[bytes]) -> None: ...
    def clock(self, topic: str, partition: int) -> int | None: ...
    def next_offset(self, topic: str, partition: int) -> int | None: ...
    @property
    def open_calls(self) -> int: ...
    @property
    def buffered_bytes(self) -> int: ...
    @property
    def duplicate_chunks(self) -> int: ...
    @property
    def late_chunks(self) -> int: ...
    @property
    def stale_records(self) -> int: ...
    @property
    def early_dropped_chunks(self) -> int: ...

# -- the verdict and its outcome event (native/core/src/event.rs, native/python/src/verdict.rs) ----

@final
class Verdict:
    """The chain's decision for one call (`worker.model.Verdict`; documented there)."""

    outcome: Final[Outcome]
    phase: Final[Phase | None]
    code: Final[Code | None]
    reason: Final[IncompleteReason | None]
    schema: Final[SchemaRef | None]
    arguments_json: Final[bytes | None]
    violations: Final[tuple[Violation, ...]]
    repairs: Final[tuple[RepairKind, ...]]
    retryable: Final[bool]
    retry_feedback: Final[dict[str, Any] | None]
    feedback_json: Final[bytes | None]
    requires_approval: Final[bool]
    idempotency_key: Final[str | None]
    idempotency_digest: Final[bytes | None]
    duplicate_of: Final[str | None]
    phases_us: Final[dict[str, int]]
    def __init__(
        self,
        outcome: Outcome,
        *,
        phase: Phase | None = None,
        code: Code | None = None,
        reason: IncompleteReason | None = None,
        schema: SchemaRef | None = None,
        arguments_json: bytes | None = None,
        violations: tuple[Violation, ...] = (),
        repairs: tuple[RepairKind, ...] = (),
        retryable: bool = False,
        feedback: Feedback | None = None,
        requires_approval: bool = False,
        idempotency_key: str | None = None,
        idempotency_digest: bytes | None = None,
        duplicate_of: str | None = None,
        phases_us: dict[str, int] | None = None,
    ) -> None: ...
    @property
    def arguments(self) -> Any: ...

def encode_event(call: AssembledCall, verdict: Verdict, max_bytes: int) -> bytes | None:
    """The event of `call` judged as `verdict`, None past `max_bytes`."""

def event_members(event: bytes) -> list[tuple[str, int, int]]:
    """The members of the JSON object `event`, in order: each one's name and where its text
    starts (its name's quote) and ends (after its value). ValueError when `event` is not one
    JSON object or names a member twice."""
