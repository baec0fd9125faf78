"""The chain: one assembled call in, one verdict out, phase after phase (DESIGN.md).

Execute(x) holds only when every phase holds; the first phase that fails decides the outcome.
Each phase's duration is measured with a monotonic counter (measurement, not logic) and reported
in microseconds on the verdict. Nothing here raises for bad input: a plugin that raises is a
`rule_error` or `adapter_error`, everything else is a return value.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from worker.core.feedback import build_feedback
from worker.core.idempotency import IdempotencyStore, Seen, canonical_digest
from worker.core.repair import strip_fence
from worker.core.strict_json import ParseError, depth_over, parse
from worker.core.tool_output import check_tool_result
from worker.model import (
    AssembledCall,
    ChunkKind,
    Code,
    IncompleteReason,
    Outcome,
    Phase,
    Repair,
    SchemaRef,
    Verdict,
    Violation,
)
from worker.plugins import Plugins, RuleContext, load_plugins
from worker.schemas.contract import Contract, IdempotencyPolicy, LookupFailure
from worker.schemas.registry import SchemaRegistry
from worker.settings import Settings

#: Codes a model can fix by sending the call again, corrected. All others are final.
_RETRYABLE = frozenset(
    {
        Code.INVALID_JSON,
        Code.DUPLICATE_KEY,
        Code.NON_FINITE_NUMBER,
        Code.INVALID_UTF8,
        Code.ROOT_NOT_OBJECT,
        Code.TOO_LARGE,
        Code.TOO_DEEP,
        Code.TOO_MANY_CHUNKS,
        Code.UNKNOWN_TOOL,
        Code.UNKNOWN_SCHEMA_VERSION,
        Code.SCHEMA_VIOLATION,
        Code.BUSINESS_RULE,
        Code.IDEMPOTENCY_KEY_MISSING,
        Code.UNEXPECTED_CHANNEL,
    }
)
_RETRYABLE_INCOMPLETE = frozenset(
    {
        IncompleteReason.MAX_TOKENS,
        IncompleteReason.STREAM_ENDED,
        IncompleteReason.TIMEOUT,
        IncompleteReason.EVICTED,
        IncompleteReason.SEQUENCE_GAP,
    }
)
_ASSEMBLY_LIMIT_CODES = frozenset({Code.TOO_LARGE, Code.TOO_MANY_CHUNKS})
_CHANNEL_CODES: Mapping[ChunkKind, Code] = {
    ChunkKind.REFUSAL: Code.REFUSAL,
    ChunkKind.ERROR: Code.MODEL_ERROR,
    ChunkKind.TEXT: Code.UNEXPECTED_CHANNEL,
    ChunkKind.END: Code.UNEXPECTED_CHANNEL,
}


@dataclass(frozen=True, slots=True)
class GateLimits:
    max_bytes: int = 256 * 1024
    max_depth: int = 32
    max_feedback_bytes: int = 4096
    max_violations: int = 32
    retry_budget: int = 3


class _Clock:
    """Phase durations in microseconds, read from a monotonic counter."""

    __slots__ = ("mark", "phases")

    def __init__(self, phases: dict[Phase, int]) -> None:
        self.phases = phases
        self.mark = perf_counter_ns()

    def lap(self, phase: Phase) -> None:
        now = perf_counter_ns()
        self.phases[phase] = (now - self.mark) // 1000
        self.mark = now


class Gate:
    """Judges assembled calls against a registry, plugins and an idempotency store."""

    def __init__(
        self,
        registry: SchemaRegistry,
        plugins: Plugins | None = None,
        limits: GateLimits | None = None,
        idempotency: IdempotencyStore | None = None,
    ) -> None:
        self.registry = registry
        self._plugins = plugins or Plugins()
        self._limits = limits or GateLimits()
        self._idempotency = idempotency or IdempotencyStore(100_000)

    @classmethod
    def from_settings(cls, settings: Settings) -> Gate:
        limits = settings.limits
        return cls(
            SchemaRegistry.load(settings.schemas.dir, settings.schemas.engine),
            load_plugins(settings.plugins),
            GateLimits(
                max_bytes=limits.max_bytes,
                max_depth=limits.max_depth,
                max_feedback_bytes=limits.max_feedback_bytes,
                max_violations=limits.max_violations,
                retry_budget=settings.retry.budget,
            ),
            IdempotencyStore(settings.idempotency.max_keys),
        )

    def judge(self, call: AssembledCall) -> Verdict:
        phases: dict[Phase, int] = {Phase.ASSEMBLY: call.assembly_us}
        size = len(call.arguments)
        if call.incomplete is not None:
            return Verdict(
                Outcome.INCOMPLETE,
                phase=Phase.ASSEMBLY,
                reason=call.incomplete,
                retryable=call.incomplete in _RETRYABLE_INCOMPLETE,
                phases_us=phases,
                nbytes=size,
            )
        reject = _Rejector(self._limits, call, phases, size)
        if call.assembly_error is not None:
            phase = Phase.LIMITS if call.assembly_error in _ASSEMBLY_LIMIT_CODES else Phase.ASSEMBLY
            detail = call.assembly_detail or call.assembly_error.value
            return reject(phase, call.assembly_error, (Violation("", call.assembly_error, detail),))

        clock = _Clock(phases)
        channel_code = _CHANNEL_CODES.get(call.channel)
        clock.lap(Phase.RESPONSE_CLASSIFICATION)
        if channel_code is not None:
            return reject(Phase.RESPONSE_CLASSIFICATION, channel_code, ())

        limits = self._limits
        if size > limits.max_bytes:
            clock.lap(Phase.LIMITS)
            message = f"the arguments are {size} bytes; the limit is {limits.max_bytes}"
            return reject(Phase.LIMITS, Code.TOO_LARGE, (Violation("", "maxBytes", message),))
        depth = depth_over(call.arguments, limits.max_depth)
        clock.lap(Phase.LIMITS)
        if depth is not None:
            message = f"the arguments nest {depth} levels deep; the limit is {limits.max_depth}"
            return reject(Phase.LIMITS, Code.TOO_DEEP, (Violation("", "maxDepth", message),))

        text, repair = strip_fence(call.arguments)
        repairs: tuple[Repair, ...] = ()
        if repair is not None:
            repairs = (repair,)
            reject.repairs = repairs
        clock.lap(Phase.REPAIR)

        value = parse(text)
        clock.lap(Phase.JSON_PARSE)
        if isinstance(value, ParseError):
            violation = Violation(value.path, value.code.value, value.message)
            return reject(Phase.JSON_PARSE, value.code, (violation,))
        if type(value) is not dict:
            message = "the arguments must be a JSON object"
            return reject(Phase.JSON_PARSE, Code.ROOT_NOT_OBJECT, (Violation("", "type", message),))

        contract = self.registry.resolve(call.tool, call.tool_version) if call.tool else None
        if not isinstance(contract, Contract):
            clock.lap(Phase.SCHEMA_VALIDATION)
            failure = contract or LookupFailure(Code.UNKNOWN_TOOL, "the call names no tool")
            return reject(
                Phase.SCHEMA_VALIDATION,
                failure.code,
                (Violation("", failure.code.value, failure.message),),
            )
        reject.schema = contract.ref
        if call.channel is ChunkKind.MCP_RESULT:
            return self._judge_tool_result(
                value, contract=contract, clock=clock, reject=reject, repairs=repairs, size=size
            )

        violations = contract.check(value)
        clock.lap(Phase.SCHEMA_VALIDATION)
        if violations:
            return reject(Phase.SCHEMA_VALIDATION, Code.SCHEMA_VIOLATION, violations)

        key = call.idempotency_key
        if key is None and type(value.get("idempotency_key")) is str:
            key = value["idempotency_key"]
        rules = self._plugins.rules_for(contract.ref.id)
        if rules:
            context = RuleContext(contract.ref, key)
            found: list[Violation] = []
            for rule in rules:
                try:
                    found.extend(rule(value, context))
                except Exception as exc:  # a plugin's bug must not stop the partition
                    clock.lap(Phase.BUSINESS_VALIDATION)
                    message = (
                        f"rule {getattr(rule, '__name__', 'rule')} failed: {type(exc).__name__}"
                    )
                    return reject(
                        Phase.BUSINESS_VALIDATION,
                        Code.RULE_ERROR,
                        (Violation("", "rule_error", message),),
                    )
            clock.lap(Phase.BUSINESS_VALIDATION)
            if found:
                return reject(Phase.BUSINESS_VALIDATION, Code.BUSINESS_RULE, tuple(found))

        meta = contract.meta
        digest = b""
        origin: Hashable = None
        if key is None:
            if meta.side_effects or meta.idempotency is IdempotencyPolicy.REQUIRED:
                clock.lap(Phase.IDEMPOTENCY)
                message = "this tool has side effects and needs an idempotency key"
                return reject(
                    Phase.IDEMPOTENCY,
                    Code.IDEMPOTENCY_KEY_MISSING,
                    (Violation("", "idempotency_key", message),),
                )
        else:
            digest = canonical_digest(contract.ref, value)
            origin = _origin(call)
            seen = self._idempotency.lookup(key, digest, origin)
            clock.lap(Phase.IDEMPOTENCY)
            if seen is Seen.CONFLICT:
                message = "this idempotency key was used for a different call"
                return reject(
                    Phase.IDEMPOTENCY,
                    Code.IDEMPOTENCY_CONFLICT,
                    (Violation("", "idempotency_key", message),),
                )
            if seen is Seen.DUPLICATE:
                message = "a call with this idempotency key was already accepted"
                return reject(
                    Phase.IDEMPOTENCY, Code.DUPLICATE, (Violation("", "idempotency_key", message),)
                )

        arguments: Any = value
        adapter = self._plugins.adapter_for(contract.ref)
        if adapter is not None:
            try:
                arguments = adapter(value)
            except Exception as exc:  # a plugin's bug must not stop the partition
                clock.lap(Phase.NORMALIZATION)
                message = f"adapter for version {contract.ref.version} failed: {type(exc).__name__}"
                return reject(
                    Phase.NORMALIZATION,
                    Code.ADAPTER_ERROR,
                    (Violation("", "adapter_error", message),),
                )
        clock.lap(Phase.NORMALIZATION)
        if key is not None:
            self._idempotency.remember(key, digest, origin)
        return Verdict(
            Outcome.ACCEPTED,
            schema=contract.ref,
            arguments=arguments,
            repairs=repairs,
            requires_approval=meta.requires_approval,
            phases_us=clock.phases,
            nbytes=size,
        )

    def _judge_tool_result(
        self,
        message: dict[str, Any],
        *,
        contract: Contract,
        clock: _Clock,
        reject: _Rejector,
        repairs: tuple[Repair, ...],
        size: int,
    ) -> Verdict:
        finding = check_tool_result(message, contract.output_check)
        clock.lap(Phase.TOOL_OUTPUT_VALIDATION)
        if finding is None:
            return Verdict(
                Outcome.ACCEPTED,
                schema=contract.ref,
                arguments=message.get("result"),
                repairs=repairs,
                phases_us=clock.phases,
                nbytes=size,
            )
        if finding.outcome is Outcome.INCOMPLETE:
            return Verdict(
                Outcome.INCOMPLETE,
                phase=Phase.TOOL_OUTPUT_VALIDATION,
                reason=finding.reason,
                schema=contract.ref,
                repairs=repairs,
                phases_us=clock.phases,
                nbytes=size,
            )
        assert finding.code is not None
        return reject(Phase.TOOL_OUTPUT_VALIDATION, finding.code, finding.violations)


def _origin(call: AssembledCall) -> Hashable:
    """Where a call came from: equal for a replay of the same input, different otherwise."""
    if call.source is None:
        return (call.stream_id, call.call_id)
    source = call.source
    return (source.topic, source.partition, source.first_offset, call.call_id)


class _Rejector:
    """Builds a rejected verdict with feedback, retryability and the retry budget applied."""

    __slots__ = ("_call", "_limits", "_phases", "_size", "repairs", "schema")

    def __init__(
        self, limits: GateLimits, call: AssembledCall, phases: dict[Phase, int], size: int
    ) -> None:
        self._limits = limits
        self._call = call
        self._phases = phases
        self._size = size
        self.schema: SchemaRef | None = None
        self.repairs: tuple[Repair, ...] = ()

    def __call__(self, phase: Phase, code: Code, violations: tuple[Violation, ...]) -> Verdict:
        limits = self._limits
        violations = violations[: limits.max_violations]
        retryable = code in _RETRYABLE
        attempt = self._call.trace.attempt
        exhausted = retryable and attempt is not None and attempt >= limits.retry_budget
        if exhausted:
            retryable = False
        return Verdict(
            Outcome.REJECTED,
            phase=phase,
            code=code,
            schema=self.schema,
            violations=violations,
            repairs=self.repairs,
            retryable=retryable,
            retry_feedback=build_feedback(
                code,
                self.schema,
                violations,
                retryable=retryable,
                budget_exhausted=exhausted,
                max_bytes=limits.max_feedback_bytes,
            ),
            phases_us=self._phases,
            nbytes=self._size,
        )
