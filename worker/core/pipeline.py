"""The chain: one assembled call in, one verdict out, phase after phase.

Execute(x) holds only when every phase holds; the first phase that fails decides the outcome:
`assembly` -> `response_classification` -> `limits` -> `repair` -> `json_parse` ->
`schema_validation` -> `business_validation` -> `authorization` -> `idempotency` ->
`normalization`, and MCP results `tool_output_validation` after parsing.

Authorization: the contract's `allowed_principals` (the call's principal must be on it; a call
naming none is refused), then the tool's authorizers (`worker.plugins`); a contract with
neither lets every principal through, and the phase does not run. A refusal is `unauthorized`
(an authorizer that fails is `authorizer_error`), never retryable, and its feedback names no
rule (`worker.core.feedback`): the model learns that the call is not permitted, not why.

Each phase's duration is read from a monotonic counter (measurement, not logic) and reported in
microseconds.

Nothing here raises for bad input, and nothing a call holds can stop the worker: a plugin that
raises is `rule_error`, `authorizer_error` or `adapter_error`, and any other exception while
judging one call is that call's `internal_error` rejection, in the phase that was running
(`Gate.judge`).

Idempotency is decided in two steps. Here: the effective key (from the envelope, or from the
argument the contract names; both present and different is `idempotency_key_mismatch`, in its
phase, after the business rules), which every verdict carries from the moment the contract is
known, a key for every side-effecting tool (`idempotency_key_missing`), and the request's
canonical digest, of the arguments the accepted event carries (after the version's adapter,
so that the key's owner, the approval and the executor compare one request).
A call that passed every phase and carries a key is accepted *pending* its key: the worker that
owns the key decides duplicate or conflict (`worker.core.idempotency`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from time import perf_counter_ns
from typing import Any

import orjson

from worker._native import AssembledCall, EarlyRejection, ParseError, depth_over, parse_json
from worker.core.canonical import request_digest
from worker.core.feedback import (
    MALFORMED_RECORD_MESSAGE,
    NO_ARGUMENTS,
    Names,
    Scoped,
    arguments_of_path,
    build_feedback,
)
from worker.core.repair import decode_double, strip_fence
from worker.core.tool_output import RESULT_MEMBERS, check_tool_result
from worker.logs import call_fields
from worker.model import (
    CallKind,
    ChunkKind,
    Code,
    IncompleteReason,
    Outcome,
    Phase,
    RepairKind,
    Verdict,
    Violation,
    longer_than,
)
from worker.plugins import AuthorizationContext, Plugins, RuleContext
from worker.schemas.contract import (
    JUDGED_BY,
    Contract,
    IdempotencyPolicy,
    LookupFailure,
    ViolationLimits,
    principal_refusal,
)
from worker.schemas.messages import describe
from worker.schemas.registry import SchemaRegistry
from worker.schemas.report import bounded, bounded_violation

log = logging.getLogger("callgate.gate")

#: Codes a model can fix by sending the call again, corrected. All others are final.
RETRYABLE = frozenset(
    {
        Code.INVALID_JSON,
        Code.DUPLICATE_KEY,
        Code.NON_FINITE_NUMBER,
        Code.INEXACT_NUMBER,
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
        Code.IDEMPOTENCY_KEY_MISMATCH,
        Code.UNEXPECTED_CHANNEL,
        Code.MALFORMED_TOOL_CALL,
    }
)
RETRYABLE_INCOMPLETE = frozenset(
    {
        IncompleteReason.MAX_TOKENS,
        IncompleteReason.STREAM_ENDED,
        IncompleteReason.TIMEOUT,
        IncompleteReason.EVICTED,
        IncompleteReason.SEQUENCE_GAP,
        IncompleteReason.STREAM_CORRUPT,
        IncompleteReason.MAX_LIFETIME,
    }
)
#: Assembly errors that are bounds (phase `limits`), or the vendor's own verdict on a call it
#: could not make (phase `response_classification`); the others are phase `assembly`.
_ASSEMBLY_PHASES: Mapping[str, Phase] = {
    Code.TOO_LARGE: Phase.LIMITS,
    Code.TOO_MANY_CHUNKS: Phase.LIMITS,
    Code.MALFORMED_TOOL_CALL: Phase.RESPONSE_CLASSIFICATION,
    Code.UNEXPECTED_TOOL_CALL: Phase.RESPONSE_CLASSIFICATION,
    Code.UNSUPPORTED_CALL_KIND: Phase.RESPONSE_CLASSIFICATION,
}
_CHANNEL_CODES: Mapping[str, Code] = {
    ChunkKind.REFUSAL: Code.REFUSAL,
    ChunkKind.ERROR: Code.MODEL_ERROR,
    ChunkKind.TEXT: Code.UNEXPECTED_CHANNEL,
}
_PARSE_PHASES: Mapping[str, Phase] = {Code.TOO_DEEP: Phase.LIMITS}
ROOT_NOT_OBJECT_MESSAGE = "the arguments must be a JSON object"
#: what the text of an integer past 2^53 holds in any spelling: 16 digits in a row (its digits, or
#: those before its fraction or a negative exponent), or an exponent of at least 0
_MAY_HOLD_A_LARGE_INTEGER = re.compile(rb"[0-9]{16}|[eE]\+?[0-9]")
#: every integer up to this magnitude is a double whose shortest form is its digits
_DOUBLE_EXACT = 2**53


# The enum members the chain names, as module names: on Python 3.11 `Phase.LIMITS` is looked up
# through EnumType.__getattr__'s hook, about 900 instructions each (more than most phases' own
# work, and a call passes a dozen); a module name is a plain global lookup.
_ASSEMBLY = Phase.ASSEMBLY
_CLASSIFICATION = Phase.RESPONSE_CLASSIFICATION
_LIMITS = Phase.LIMITS
_REPAIR = Phase.REPAIR
_JSON_PARSE = Phase.JSON_PARSE
_SCHEMA_VALIDATION = Phase.SCHEMA_VALIDATION
_BUSINESS_VALIDATION = Phase.BUSINESS_VALIDATION
_AUTHORIZATION = Phase.AUTHORIZATION
_IDEMPOTENCY = Phase.IDEMPOTENCY
_NORMALIZATION = Phase.NORMALIZATION
_TOOL_OUTPUT_VALIDATION = Phase.TOOL_OUTPUT_VALIDATION
_ACCEPTED = Outcome.ACCEPTED
_REJECTED = Outcome.REJECTED
_INCOMPLETE = Outcome.INCOMPLETE
_MCP_RESULT = ChunkKind.MCP_RESULT
_NO_KEY = IdempotencyPolicy.NONE
_FUNCTION_CALL = CallKind.FUNCTION_CALL
_CUSTOM = CallKind.CUSTOM_TOOL_CALL.value
_APPROVAL_REQUEST = CallKind.MCP_APPROVAL_REQUEST.value
_STRUCTURED_CONTENT = ("result", "structuredContent")


def _violations(found: Iterable[Any]) -> Iterator[Violation]:
    """What a rule returned, each item checked: it goes into the event and the feedback
    (bounded as every violation is, `Gate._rejected`), so anything but a `Violation` of strings
    is the rule's bug (raised here: `rule_error`)."""
    for item in found:
        if type(item) is not Violation or not all(
            type(text) is str for text in (item.path, item.keyword, item.message)
        ):
            raise TypeError(f"a rule returned {type(item).__name__}, not a Violation of strings")
        yield item


def passed_on(text: bytes, value: Any) -> bytes:
    """The arguments' text an accepted event carries: as the call spelt them, or written again
    from `value` (what was judged) when it holds an integer past 2^53.

    The gate judges such a number as its exact integer, and digests it so; spelt with a
    fraction or an exponent (`9007199254740993.0`, `1.8446744073709551615e19`), every ordinary
    reader of the event (orjson in the approval path, pydantic in the executor, `json`) reads it
    as a double, another number (9007199254740992): what ran would not be what was judged, and
    the executor's digest and the approval's fingerprint would not be the gate's. Written
    again, each integer is its digits, which every such reader reads exactly; any other number
    is the shortest form of its double, which it reads as that double."""
    if _MAY_HOLD_A_LARGE_INTEGER.search(text) is None or not _beyond_doubles(value):
        return text
    return orjson.dumps(value)


def _beyond_doubles(value: Any) -> bool:
    """Whether `value` holds an integer past 2^53 (a double may not hold it, or not as its
    digits)."""
    pending = [value]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is int:
            if not -_DOUBLE_EXACT <= node <= _DOUBLE_EXACT:
                return True
        elif kind is dict:
            pending.extend(node.values())
        elif kind is list:
            pending.extend(node)
    return False


def _shown_names(contract: Contract, channel: str) -> Names:
    """The names a feedback path may show (`worker.core.feedback`): a tool result's are the
    result's own members, and below `/result/structuredContent` only those its output schema
    declares (every key there is the tool's); a call's, its input schema's."""
    if channel == _MCP_RESULT:
        return Scoped(RESULT_MEMBERS, _STRUCTURED_CONTENT, contract.output_declared_names)
    return contract.declared_names


@dataclass(frozen=True, slots=True)
class GateLimits:
    """The bounds the chain applies; all of them come from the settings."""

    max_depth: int
    max_feedback_bytes: int
    retry_budget: int
    #: the bound of an idempotency key, wherever it comes from (`CALLGATE_LIMITS__MAX_ID_BYTES`)
    max_id_bytes: int
    #: how much a violation may say (an early one is bounded as the engines bound theirs)
    violations: ViolationLimits


class Gate:
    """Judges assembled calls against a registry and its plugins."""

    def __init__(self, registry: SchemaRegistry, plugins: Plugins, limits: GateLimits) -> None:
        self.registry = registry
        self._plugins = plugins
        self._limits = limits
        # what the call being judged has reached: the phase running and its effective key
        self._phase = _ASSEMBLY
        self._key: str | None = None

    def judge(self, call: AssembledCall) -> Verdict:
        """The verdict on one call. Never raises: a bug judging it is its own rejection."""
        self._phase = _ASSEMBLY
        self._key = call.idempotency_key
        try:
            return self._judge(call)
        except Exception as exc:  # one call's fault never leaves that call
            log.exception(
                "internal error judging call %r of stream %r (event %s) in phase %s",
                call.call_id,
                call.stream_id,
                call.event_id,
                self._phase,
                extra=call_fields(call),
            )
            message = f"callgate failed while judging this call ({type(exc).__name__})"
            return self._rejected(
                call,
                self._phase,
                Code.INTERNAL_ERROR,
                (Violation("", "internal_error", message),),
                {_ASSEMBLY: call.assembly_us},
            )

    def _assembly_rejection(
        self, call: AssembledCall, code: Code, phase: Phase, phases: dict[str, int]
    ) -> Verdict:
        """The rejection of an error the reassembler found, in the phase its code belongs to."""
        detail = call.assembly_detail or code.value
        if code is Code.MALFORMED_RECORD:
            # why a record is unreadable is the producer's text: the operator's log keeps it
            # (bounded where it was made); the event and its feedback say a fixed thing
            log.warning(
                "malformed record %s[%s]@%s (stream %r, event %s): %s",
                call.topic,
                call.partition,
                call.first_offset,
                call.stream_id,
                call.event_id,
                detail,
                extra=call_fields(call),
            )
            detail = MALFORMED_RECORD_MESSAGE
        return self._rejected(call, phase, code, (Violation("", code, detail),), phases)

    def _judge(self, call: AssembledCall) -> Verdict:
        phases: dict[str, int] = {_ASSEMBLY: call.assembly_us}
        if call.incomplete is not None:
            return Verdict(
                _INCOMPLETE,
                phase=_ASSEMBLY,
                reason=IncompleteReason(call.incomplete),
                retryable=call.incomplete in RETRYABLE_INCOMPLETE,
                idempotency_key=call.idempotency_key,
                phases_us=phases,
            )
        bound = None  # a bound the call passed while it was assembled: judged in `limits`
        if call.early is not None:
            return self._early(call, call.early, phases)
        if call.assembly_error is not None:
            code = Code(call.assembly_error)
            phase = _ASSEMBLY_PHASES.get(code, _ASSEMBLY)
            if phase is _LIMITS:
                bound = code
            else:
                return self._assembly_rejection(call, code, phase, phases)

        started = perf_counter_ns()
        self._phase = _CLASSIFICATION
        channel_code = _CHANNEL_CODES.get(call.channel)
        now = perf_counter_ns()
        phases[_CLASSIFICATION] = (now - started) // 1000
        if channel_code is not None:
            return self._rejected(call, _CLASSIFICATION, channel_code, (), phases)

        # a custom tool's call is free-form text, judged as {"input": <the text>}; every other
        # kind's text is JSON
        kind = call.call_kind
        custom = kind == _CUSTOM
        self._phase = _LIMITS
        if bound is not None:
            phases[_LIMITS] = 0  # decided while the call was assembled
            return self._assembly_rejection(call, bound, _LIMITS, phases)
        limits = self._limits
        text = call.arguments
        depth = None if custom else depth_over(text, limits.max_depth)
        started, now = now, perf_counter_ns()
        phases[_LIMITS] = (now - started) // 1000
        if depth is not None:
            message = f"the arguments nest {depth} levels deep; the limit is {limits.max_depth}"
            violation = Violation("", "maxDepth", message)
            return self._rejected(call, _LIMITS, Code.TOO_DEEP, (violation,), phases)

        self._phase = _REPAIR
        repairs: tuple[RepairKind, ...] = ()
        if not custom:
            text, repair = strip_fence(text)
            repairs = (repair,) if repair is not None else ()
            if call.double_encoded:
                text, repair = decode_double(text, limits.max_depth)
                repairs = (*repairs, repair) if repair is not None else repairs
        started, now = now, perf_counter_ns()
        phases[_REPAIR] = (now - started) // 1000

        self._phase = _JSON_PARSE
        value: Any
        if custom:
            try:
                value = {"input": text.decode()}
            except UnicodeDecodeError:
                value = ParseError(Code.INVALID_UTF8.value, "the input is not UTF-8 text")
        else:
            value = parse_json(text, limits.max_depth)
        started, now = now, perf_counter_ns()
        phases[_JSON_PARSE] = (now - started) // 1000
        if type(value) is not dict:
            if isinstance(value, ParseError):
                code = Code(value.code)
                violation = Violation(value.path, value.code, value.message)
                phase = _PARSE_PHASES.get(code, _JSON_PARSE)
                return self._rejected(
                    call,
                    phase,
                    code,
                    (violation,),
                    phases,
                    declared=self._declared_names(call),
                    repairs=repairs,
                )
            violation = Violation("", "type", ROOT_NOT_OBJECT_MESSAGE)
            return self._rejected(
                call, _JSON_PARSE, Code.ROOT_NOT_OBJECT, (violation,), phases, repairs=repairs
            )

        self._phase = _SCHEMA_VALIDATION
        tool = call.tool
        contract = self.registry.resolve(tool, call.tool_version) if tool else None
        judged_by = JUDGED_BY[kind]
        if isinstance(contract, Contract) and contract.meta.call_kind is not judged_by:
            contract = LookupFailure(
                Code.UNSUPPORTED_CALL_KIND,
                f"this tool's contract judges {contract.meta.call_kind} calls; this call is a "
                f"{kind}",
            )
        if not isinstance(contract, Contract):
            started, now = now, perf_counter_ns()
            phases[_SCHEMA_VALIDATION] = (now - started) // 1000
            failure = contract or LookupFailure(Code.UNKNOWN_TOOL, "the call names no tool")
            if judged_by is not _FUNCTION_CALL and failure.code is Code.UNKNOWN_TOOL:
                failure = LookupFailure(
                    Code.UNSUPPORTED_CALL_KIND,
                    f"no contract of call_kind {kind} is registered for this tool",
                )
            violation = Violation("", failure.code, failure.message)
            return self._rejected(
                call, _SCHEMA_VALIDATION, failure.code, (violation,), phases, repairs=repairs
            )
        schema = contract.ref
        if call.channel == _MCP_RESULT:
            return self._judge_tool_result(
                call, message=value, contract=contract, phases=phases, started=now, repairs=repairs
            )
        # the effective key, which every verdict from here on carries: the envelope's, or the
        # argument the contract names (both there and different is a mismatch, decided in its
        # phase; the envelope's key stands till then)
        meta = contract.meta
        key = call.idempotency_key
        named = meta.idempotency_key_argument
        mismatch = overlong = False
        if meta.idempotency is _NO_KEY:
            key = None  # the contract takes no key: none is checked, none is carried
        elif named is not None:
            argument_key = value.get(named)
            if type(argument_key) is str:
                if longer_than(argument_key, self._limits.max_id_bytes):
                    # a key past the identifier bound, as an envelope's is: no key, carried
                    # by no verdict; the call is refused in its phase
                    overlong = True
                elif key is not None and key != argument_key:
                    mismatch = True
                else:
                    key = argument_key
        self._key = key

        violations = contract.check(value)
        if not violations and contract.input_check is not None:
            wrong = contract.input_check(value["input"])
            violations = (wrong,) if wrong is not None else ()
        started, now = now, perf_counter_ns()
        phases[_SCHEMA_VALIDATION] = (now - started) // 1000
        if violations:
            return self._rejected(
                call,
                _SCHEMA_VALIDATION,
                Code.SCHEMA_VIOLATION,
                violations,
                phases,
                contract=contract,
                arguments=value,
                repairs=repairs,
            )

        self._phase = _BUSINESS_VALIDATION
        rules = self._plugins.rules_for(schema.id)
        if rules:
            context = RuleContext(schema, key)
            found: list[Violation] = []
            most = self._limits.violations.max_violations
            for rule in rules:
                try:
                    room = most - len(found)
                    found.extend(islice(_violations(rule(value, context)), room))
                except Exception as exc:  # a plugin's bug is this call's rule_error
                    started, now = now, perf_counter_ns()
                    phases[_BUSINESS_VALIDATION] = (now - started) // 1000
                    name = getattr(rule, "__name__", "rule")
                    message = f"rule {name} failed: {type(exc).__name__}"
                    return self._rejected(
                        call,
                        _BUSINESS_VALIDATION,
                        Code.RULE_ERROR,
                        (Violation("", "rule_error", message),),
                        phases,
                        contract=contract,
                        arguments=value,
                        repairs=repairs,
                    )
            started, now = now, perf_counter_ns()
            phases[_BUSINESS_VALIDATION] = (now - started) // 1000
            if found:
                return self._rejected(
                    call,
                    _BUSINESS_VALIDATION,
                    Code.BUSINESS_RULE,
                    tuple(found),
                    phases,
                    contract=contract,
                    arguments=value,
                    repairs=repairs,
                )

        self._phase = _AUTHORIZATION
        authorizers = self._plugins.authorizers_for(schema.id)
        if meta.allowed_principals is not None or authorizers:
            refusal = self._authorize(call, contract, value, key, authorizers)
            started, now = now, perf_counter_ns()
            phases[_AUTHORIZATION] = (now - started) // 1000
            if refusal is not None:
                code, violation = refusal
                return self._rejected(
                    call,
                    _AUTHORIZATION,
                    code,
                    (violation,),
                    phases,
                    contract=contract,
                    arguments=value,
                    repairs=repairs,
                )

        self._phase = _IDEMPOTENCY
        refused: tuple[Code, str, str] | None = None  # why the key is refused: code, path, message
        if overlong:
            most = self._limits.max_id_bytes
            message = f"the idempotency key is longer than {most} bytes"
            refused = (Code.MALFORMED_RECORD, f"/{named}", message)
        elif mismatch:
            message = f"the envelope's idempotency key differs from argument {named!r}"
            refused = (Code.IDEMPOTENCY_KEY_MISMATCH, f"/{named}", message)
        elif key is None and meta.needs_key:
            message = "this tool has side effects and needs an idempotency key"
            refused = (Code.IDEMPOTENCY_KEY_MISSING, "", message)
        if refused is not None:
            code, path, message = refused
            started, now = now, perf_counter_ns()
            phases[_IDEMPOTENCY] = (now - started) // 1000
            return self._rejected(
                call,
                _IDEMPOTENCY,
                code,
                (Violation(path, "idempotency_key", message),),
                phases,
                contract=contract,
                arguments=value,
                repairs=repairs,
            )
        if key is not None:
            phases[_IDEMPOTENCY] = 0  # in the chain's order; timed with the digest, below

        self._phase = _NORMALIZATION
        arguments_json = orjson.dumps(value) if custom else passed_on(text, value)
        passed: Any = value  # the arguments every reader of the accepted event reads
        adapter = self._plugins.adapter_for(schema)
        if adapter is not None:
            try:
                arguments_json = orjson.dumps(adapter(value))
                passed = orjson.loads(arguments_json)
            except Exception as exc:  # a plugin's bug is this call's adapter_error
                started, now = now, perf_counter_ns()
                phases[_NORMALIZATION] = (now - started) // 1000
                message = f"adapter for version {schema.version} failed: {type(exc).__name__}"
                return self._rejected(
                    call,
                    _NORMALIZATION,
                    Code.ADAPTER_ERROR,
                    (Violation("", "adapter_error", message),),
                    phases,
                    contract=contract,
                    arguments=value,
                    repairs=repairs,
                )
            started, now = now, perf_counter_ns()
            phases[_NORMALIZATION] = (now - started) // 1000
        # a remote MCP tool's approval request is, by its kind, a call that needs approval
        requires_approval = meta.requires_approval or kind == _APPROVAL_REQUEST

        # the request a key is compared by is what runs: the arguments the accepted event
        # carries (after the version's adapter), as the executor and the approval digest them
        digest = None
        if key is not None:
            self._phase = _IDEMPOTENCY
            started = perf_counter_ns()
            digest = request_digest(schema, passed)
            phases[_IDEMPOTENCY] = (perf_counter_ns() - started) // 1000
        return Verdict(
            _ACCEPTED,
            schema=schema,
            arguments_json=arguments_json,
            repairs=repairs,
            requires_approval=requires_approval,
            idempotency_key=key,
            idempotency_digest=digest,
            phases_us=phases,
        )

    @staticmethod
    def _authorize(
        call: AssembledCall,
        contract: Contract,
        arguments: dict[str, Any],
        key: str | None,
        authorizers: tuple[Any, ...],
    ) -> tuple[Code, Violation] | None:
        """Why the call's principal may not make this call (None: it may). The violation is
        the operator's, on the event; the feedback shows none of it."""
        principal = call.principal
        message = principal_refusal(contract.meta.allowed_principals, principal)
        if message is not None:
            return Code.UNAUTHORIZED, Violation("", "allowed_principals", message)
        context = AuthorizationContext(contract.ref, contract.tool, principal, key)
        for authorizer in authorizers:
            name = getattr(authorizer, "__name__", "authorizer")
            try:
                allows = authorizer(arguments, context)
            except Exception as exc:  # a plugin's bug refuses this call, never the worker
                message = f"authorizer {name} failed: {type(exc).__name__}"
                return Code.AUTHORIZER_ERROR, Violation("", "authorizer_error", message)
            if type(allows) is not bool:
                message = f"authorizer {name} returned {type(allows).__name__}, not a bool"
                return Code.AUTHORIZER_ERROR, Violation("", "authorizer_error", message)
            if not allows:
                return Code.UNAUTHORIZED, Violation("", "authorizer", f"{name} refused the call")
        return None

    def _early(self, call: AssembledCall, early: EarlyRejection, phases: dict[str, int]) -> Verdict:
        """The verdict the reassembler's early judge reached: the violation said as the final
        judgement says it (`describe`, bounded like the engines' own)."""
        if early.kind == "root":
            violation = Violation("", "type", ROOT_NOT_OBJECT_MESSAGE)
            return self._rejected(call, _JSON_PARSE, Code.ROOT_NOT_OBJECT, (violation,), phases)
        if early.kind == "json":
            code = Code(early.keyword)
            violation = Violation(early.pointer, early.keyword, early.detail or code.value)
            phase = _PARSE_PHASES.get(code, _JSON_PARSE)
            return self._rejected(
                call, phase, code, (violation,), phases, declared=self._declared_names(call)
            )
        self._phase = _SCHEMA_VALIDATION
        contract = self.registry.resolve(call.tool, call.tool_version) if call.tool else None
        assert isinstance(contract, Contract), "early rules exist only for a resolved contract"
        param = orjson.loads(early.detail) if early.detail is not None else None
        message = describe(early.keyword, param)
        violation = bounded(list(early.path), early.keyword, message, self._limits.violations)
        # the path tells an index from a key: the feedback shows it as the final judgement would
        return self._rejected(
            call,
            _SCHEMA_VALIDATION,
            Code.SCHEMA_VIOLATION,
            (violation,),
            phases,
            contract=contract,
            arguments=arguments_of_path(early.path),
        )

    def _judge_tool_result(
        self,
        call: AssembledCall,
        *,
        message: dict[str, Any],
        contract: Contract,
        phases: dict[str, int],
        started: int,
        repairs: tuple[RepairKind, ...],
    ) -> Verdict:
        self._phase = _TOOL_OUTPUT_VALIDATION
        finding = check_tool_result(message, contract.output_check, self._limits.max_depth)
        phases[_TOOL_OUTPUT_VALIDATION] = (perf_counter_ns() - started) // 1000
        schema = contract.ref
        if finding is None:
            return Verdict(
                _ACCEPTED,
                schema=schema,
                arguments_json=orjson.dumps(message.get("result")),
                repairs=repairs,
                idempotency_key=call.idempotency_key,
                phases_us=phases,
            )
        if finding.outcome is _INCOMPLETE:
            return Verdict(
                _INCOMPLETE,
                phase=_TOOL_OUTPUT_VALIDATION,
                reason=finding.reason,
                schema=schema,
                repairs=repairs,
                idempotency_key=call.idempotency_key,
                phases_us=phases,
            )
        assert finding.code is not None
        return self._rejected(
            call,
            _TOOL_OUTPUT_VALIDATION,
            finding.code,
            finding.violations,
            phases,
            contract=contract,
            arguments=message,
            declared=_shown_names(contract, call.channel),
            repairs=repairs,
        )

    def _declared_names(self, call: AssembledCall) -> Names:
        """The names a feedback path may show for a call judged before its contract was looked
        up (its text failed to parse): those of the contract its tool and version resolve to,
        as a later phase's violation shows them; none when they resolve to none."""
        contract = self.registry.resolve(call.tool, call.tool_version) if call.tool else None
        if not isinstance(contract, Contract):
            return frozenset()
        return _shown_names(contract, call.channel)

    def _rejected(
        self,
        call: AssembledCall,
        phase: Phase,
        code: Code,
        violations: tuple[Violation, ...],
        phases: dict[str, int],
        *,
        contract: Contract | None = None,
        arguments: Any = NO_ARGUMENTS,
        declared: Names | None = None,
        repairs: tuple[RepairKind, ...] = (),
    ) -> Verdict:
        """A rejection with its retry feedback (naming only what the contract declares), and
        the retry budget applied. Every rejection's violations pass here, bounded as the
        engines bound theirs whoever made them (a rule, the parser, the tool-output check)."""
        schema = contract.ref if contract is not None else None
        if declared is None:
            declared = contract.declared_names if contract is not None else frozenset()
        limits = self._limits
        violations = tuple(bounded_violation(v, limits.violations) for v in violations)
        retryable = code in RETRYABLE
        exhausted = retryable and call.attempt is not None and call.attempt >= limits.retry_budget
        if exhausted:
            retryable = False
        feedback = build_feedback(
            code,
            schema,
            violations,
            retryable=retryable,
            budget_exhausted=exhausted,
            max_bytes=limits.max_feedback_bytes,
            declared=declared,
            arguments=arguments,
        )
        return Verdict(
            _REJECTED,
            phase=phase,
            code=code,
            schema=schema,
            violations=violations,
            repairs=repairs,
            retryable=retryable,
            feedback=feedback,
            idempotency_key=self._key,
            phases_us=phases,
        )
