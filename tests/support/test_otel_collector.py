"""The OpenTelemetry Collector harness is real: what the OpenTelemetry SDK exports over OTLP
reaches the collector's file exporter, and the harness reads it back whole.

A trace of a parent and a child span (kinds, attributes of each type, an event, a link, an
error status, the resource) is exported by the SDK's own OTLP/HTTP exporter to the collector
on its loopback port; the spans read from the file carry every one of those, with the child's
parent id the parent's span id, in one trace. A collector stopped and started again writes to
the same file, so a test can read spans across a restart.
"""

from __future__ import annotations

import os

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tests.support.otel_collector import OtelCollector, Span

pytestmark = pytest.mark.integration

WAIT_S = 20.0


def export(collector: OtelCollector, service: str) -> tuple[int, int, int]:
    """One trace through the SDK: a CONSUMER parent linked to another trace, an INTERNAL child
    with an event and an error. Returns (trace id, parent span id, child span id)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=f"{collector.otlp_http}/v1/traces", timeout=10)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("callgate.tests")
    try:
        with tracer.start_as_current_span("linked elsewhere") as other:
            elsewhere = other.get_span_context()
        with tracer.start_as_current_span(
            "process model-output",
            kind=SpanKind.CONSUMER,
            links=[Link(elsewhere)],
            attributes={"messaging.system": "kafka", "messaging.destination.partition.id": "3"},
        ) as parent, tracer.start_as_current_span(
            "callgate gate",
            attributes={"gen_ai.tool.name": "get_weather", "callgate.chunks": 4,
                        "callgate.accepted": False, "callgate.ratio": 0.5},
        ) as child:  # fmt: skip
            child.add_event("phase", {"callgate.phase": "json_parse", "callgate.us": 12})
            child.set_status(Status(StatusCode.ERROR, "rejected"))
        ids = (
            parent.get_span_context().trace_id,
            parent.get_span_context().span_id,
            child.get_span_context().span_id,
        )
        assert provider.force_flush(10_000), "the SDK could not export within 10 s"
    finally:
        provider.shutdown()
    return ids


def test_a_span_the_sdk_exports_reaches_the_file_whole(otel_collector: OtelCollector) -> None:
    service = f"callgate-test-{os.getpid()}"
    trace_id, parent_id, child_id = export(otel_collector, service)
    trace = f"{trace_id:032x}"

    def complete(spans: list[Span]) -> bool:
        return len([s for s in spans if s.trace_id == trace]) == 2

    spans = otel_collector.wait_for_spans(complete, WAIT_S, "the trace's two spans")
    by_name = {span.name: span for span in spans if span.trace_id == trace}
    parent, child = by_name["process model-output"], by_name["callgate gate"]
    assert (parent.span_id, child.span_id) == (f"{parent_id:016x}", f"{child_id:016x}")
    assert child.parent_span_id == parent.span_id
    assert parent.parent_span_id == ""
    assert parent.kind == "SPAN_KIND_CONSUMER"
    assert child.kind == "SPAN_KIND_INTERNAL"
    assert parent.attributes == {
        "messaging.system": "kafka",
        "messaging.destination.partition.id": "3",
    }
    assert child.attributes == {
        "gen_ai.tool.name": "get_weather",
        "callgate.chunks": 4,
        "callgate.accepted": False,
        "callgate.ratio": 0.5,
    }
    assert child.events == (("phase", {"callgate.phase": "json_parse", "callgate.us": 12}),)
    assert child.status == "STATUS_CODE_ERROR"
    (link,) = parent.links
    linked = [span for span in spans if span.name == "linked elsewhere"]
    assert [(span.trace_id, span.span_id) for span in linked] == [link]
    assert link[0] != trace
    assert parent.resource["service.name"] == service
    assert parent.scope == "callgate.tests"


def test_spans_written_before_a_restart_are_still_read(otel_collector: OtelCollector) -> None:
    first, _, _ = export(otel_collector, "before")
    otel_collector.wait_for_spans(
        lambda spans: any(s.trace_id == f"{first:032x}" for s in spans), WAIT_S, "the first trace"
    )
    otel_collector.stop()
    otel_collector.start(timeout_s=30)
    second, _, _ = export(otel_collector, "after")
    found = otel_collector.wait_for_spans(
        lambda spans: any(s.trace_id == f"{second:032x}" for s in spans), WAIT_S, "the second"
    )
    assert {f"{first:032x}", f"{second:032x}"} <= {span.trace_id for span in found}
