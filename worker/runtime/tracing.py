"""Traces of the calls: OpenTelemetry spans the shell makes around the pure core.

Built by the composition root only when `CALLGATE_TRACING__ENABLED` is set (the `otel` extra
installed); with tracing off nothing of OpenTelemetry is imported and the rounds run the code
they ran before (`worker.runtime.judging`). Each call closed in a round gets two spans:

1. `process <input topic>` (kind CONSUMER; the messaging conventions: `messaging.system` kafka,
   `messaging.operation.type` / `.name` process, the topic, its partition, the offset of the
   record that closed the call, the consumer group, the client id). Its parent is the context
   in the call's `traceparent` (the record's header), so the producer's trace continues, and it
   links to that context too, as the conventions ask of a consumer; a call without a valid one
   starts a trace, sampled at `sample_ratio`.
2. `execute_tool <tool>`, its child (kind INTERNAL; the GenAI tool-execution conventions:
   `gen_ai.operation.name` execute_tool, `gen_ai.tool.name`, `gen_ai.tool.call.id`): the gate's
   verdict (`callgate.outcome`, `.phase`, `.error_code`, `error.type` and an error status when
   the call is not accepted), the contract (`callgate.schema.id`, `.version`), the repairs, and
   each phase's time as `callgate.phase_us.<phase>` (the core's own measures).

The call's outcome record carries, as its `traceparent` header, the context of the gate's span,
so an executor's span continues the trace (the event's `traceparent` field stays what the call
carried). A keyed call's request to its key's owner carries it too; the owner's span
`process <requests topic>` continues it with the decision, and the event's header names that
span. Both spans are current while the call is judged, so a log line about the call has their
trace and span ids (`worker.logs`). A record that could not be read is a call of its own with
none of its fields read: its spans continue its `traceparent` header.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from worker import __version__
from worker._native import AssembledCall
from worker.core.events import TRACEPARENT, Headers
from worker.core.idempotency import Resolution
from worker.core.processor import Emission
from worker.model import Outcome, Verdict
from worker.settings import Settings

_PROPAGATOR = TraceContextTextMapPropagator()
_EXECUTE_TOOL = "execute_tool"


def build_provider(settings: Settings) -> TracerProvider:
    """The SDK's provider: OTLP/HTTP to the endpoint in batches, parent-based ratio sampling."""
    tracing = settings.tracing
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": tracing.service_name, "service.version": __version__}
        ),
        sampler=ParentBased(TraceIdRatioBased(tracing.sample_ratio)),
    )
    exporter = OTLPSpanExporter(endpoint=tracing.traces_url, timeout=tracing.export_timeout_s)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def traceparent_of(span: Span) -> bytes:
    """The W3C `traceparent` naming `span` (version 00)."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}".encode()


def current_span_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the active span in lowercase hex, None when there is none (the
    log's JSON lines carry them: `worker.logs`)."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _record_at(fetched: Sequence[Any], offset: int) -> Sequence[tuple[str, bytes]]:
    """The headers of the fetched record at `offset` (none if it is not in the batch)."""
    if fetched:
        index = offset - fetched[0].offset
        if 0 <= index < len(fetched) and fetched[index].offset == offset:
            return fetched[index].headers or ()
    for record in fetched:  # offsets with gaps (compacted, transaction markers)
        if record.offset == offset:
            return record.headers or ()
    return ()


def header(headers: Sequence[tuple[str, bytes]], name: str) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


class CallTracing:
    """The spans of every call a worker judges; `shutdown` exports what is left."""

    def __init__(
        self,
        provider: trace.TracerProvider,
        *,
        group: str,
        client_id: str,
        shutdown: Callable[[], None] = lambda: None,
    ) -> None:
        self._tracer = provider.get_tracer("callgate", __version__)
        self._group = group
        self._client_id = client_id
        self._shutdown = shutdown

    @classmethod
    def from_settings(cls, settings: Settings) -> CallTracing:
        provider = build_provider(settings)
        kafka = settings.kafka
        return cls(
            provider, group=kafka.group_id, client_id=kafka.client_id, shutdown=provider.shutdown
        )

    def shutdown(self) -> None:
        """Export the spans still batched (bounded by the exporter's timeout)."""
        self._shutdown()

    # -- a call -------------------------------------------------------------------------------

    def judge(
        self,
        emit: Callable[[AssembledCall], Emission],
        call: AssembledCall,
        fed_ns: int,
        deliver: Callable[[Emission, Headers], int],
        fetched: Sequence[Any],
    ) -> int:
        """`emit(call)` inside the call's two spans, then `deliver` the emission with the
        headers its record carries (the gate span's `traceparent` added); what it returns.
        `fetched` is the batch the call closed in: a record that could not be read is a call
        of its own, with no fields read, and its `traceparent` header is found there."""
        traceparent = call.traceparent
        if traceparent is None and call.assembly_error is not None:
            traceparent = _text(header(_record_at(fetched, call.first_offset), TRACEPARENT))
        parent = self._parent(traceparent)
        process = self._tracer.start_span(
            f"process {call.topic}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=self._messaging(call.topic, call.partition, call.last_offset),
            links=self._links(parent),
            start_time=fed_ns,
        )
        in_process = trace.set_span_in_context(process, parent)
        token = otel_context.attach(in_process)
        try:
            gate = self._tracer.start_span(
                f"{_EXECUTE_TOOL} {call.tool}" if call.tool else _EXECUTE_TOOL,
                context=in_process,
                kind=SpanKind.INTERNAL,
                attributes=_call_attributes(call),
            )
            inner = otel_context.attach(trace.set_span_in_context(gate, in_process))
            try:
                emission = emit(call)
                _set_verdict(gate, emission)
            except BaseException as exc:  # a bug: the round fails as it would untraced
                gate.record_exception(exc)
                gate.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            finally:
                otel_context.detach(inner)
                gate.end()
            headers = [*emission.headers, (TRACEPARENT, traceparent_of(gate))]
            return deliver(emission, headers)
        finally:
            otel_context.detach(token)
            process.end()

    def decided(self, resolution: Resolution, request: Any, headers: Headers) -> Headers:
        """The owner's span for one idempotency request (`process <requests topic>`, continuing
        the request's `traceparent`), ended; the event's headers with its `traceparent`."""
        parent = self._parent(_text(header(request.headers, TRACEPARENT)))
        attributes = self._messaging(request.topic, request.partition, request.offset)
        attributes.update(
            {
                "gen_ai.tool.call.id": resolution.call_id,
                "callgate.idempotency.decision": resolution.decision.value,
                "callgate.outcome": resolution.outcome.value,
            }
        )
        if resolution.tool is not None:
            attributes["gen_ai.tool.name"] = resolution.tool
        span = self._tracer.start_span(
            f"process {request.topic}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=self._links(parent),
        )
        if resolution.code is not None:
            span.set_attribute("callgate.error_code", resolution.code.value)
            span.set_attribute("error.type", resolution.code.value)
            span.set_status(Status(StatusCode.ERROR, resolution.code.value))
        span.end()
        return [*headers, (TRACEPARENT, traceparent_of(span))]

    # -- parts --------------------------------------------------------------------------------

    @staticmethod
    def _parent(traceparent: str | None) -> otel_context.Context:
        """The context in a `traceparent` (an empty one when there is none, or it is invalid:
        the W3C propagator refuses what is not a valid traceparent)."""
        if not traceparent:
            return otel_context.Context()
        return _PROPAGATOR.extract({TRACEPARENT: traceparent}, otel_context.Context())

    @staticmethod
    def _links(parent: otel_context.Context) -> list[Link]:
        remote = trace.get_current_span(parent).get_span_context()
        return [Link(remote)] if remote.is_valid else []

    def _messaging(self, topic: str, partition: int, offset: int) -> dict[str, Any]:
        return {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": topic,
            "messaging.destination.partition.id": str(partition),
            "messaging.kafka.offset": offset,
            "messaging.consumer.group.name": self._group,
            "messaging.client.id": self._client_id,
        }


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


def _call_attributes(call: AssembledCall) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": _EXECUTE_TOOL,
        "gen_ai.tool.call.id": call.call_id,
        "callgate.stream_id": call.stream_id,
        "callgate.event_id": call.event_id,
        "callgate.call_kind": call.call_kind,
        "callgate.chunks": call.chunks,
        "callgate.first_offset": call.first_offset,
    }
    if call.tool is not None:
        attributes["gen_ai.tool.name"] = call.tool
    return attributes


def _set_verdict(span: Span, emission: Emission) -> None:
    """The verdict on the gate's span: outcome, phase, code, contract, repairs, timings."""
    verdict: Verdict = emission.verdict
    span.set_attribute("callgate.outcome", verdict.outcome.value)
    span.set_attribute("callgate.route", emission.route.value)
    if verdict.phase is not None:
        span.set_attribute("callgate.phase", verdict.phase.value)
    code = verdict.code or verdict.reason
    if code is not None:
        span.set_attribute("callgate.error_code", code.value)
    if verdict.outcome is not Outcome.ACCEPTED:
        span.set_attribute("callgate.retryable", verdict.retryable)
        kind = code.value if code is not None else verdict.outcome.value
        span.set_attribute("error.type", kind)
        span.set_status(Status(StatusCode.ERROR, kind))
    schema = verdict.schema
    if schema is not None:
        span.set_attribute("callgate.schema.id", schema.id)
        span.set_attribute("callgate.schema.version", schema.version)
    if verdict.repairs:
        span.set_attribute("callgate.repairs", [repair.value for repair in verdict.repairs])
    for phase, us in verdict.phases_us.items():
        span.set_attribute(f"callgate.phase_us.{phase}", us)
