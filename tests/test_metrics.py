"""worker/metrics.py: names, labels, bounded label sets, histogram shape, the no-op twin."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from worker.metrics import (
    NO_TOOL,
    PHASE_BUCKETS_S,
    UNKNOWN_TOOL,
    Metrics,
    NullMetrics,
    build_metrics,
    series_names,
)
from worker.model import Code, IncompleteReason, Outcome, Phase, Repair, RepairKind, Verdict

TOOLS = frozenset({"get_weather", "crm.search"})


def samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Scrape the registry as Prometheus would and index every sample by name and labels."""
    text = generate_latest(metrics.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return samples(metrics)[(name, frozenset(labels.items()))]


def test_names_match_the_design() -> None:
    names = Metrics(TOOLS).series_names()
    for required in (
        "callgate_chunks_total",
        "callgate_calls_total",
        "callgate_rejections_total",
        "callgate_incomplete_total",
        "callgate_repairs_total",
        "callgate_phase_duration_seconds_bucket",
        "callgate_phase_duration_seconds_sum",
        "callgate_phase_duration_seconds_count",
        "callgate_open_calls",
        "callgate_buffered_bytes",
        "callgate_consumer_lag",
        "callgate_commit_errors_total",
        "callgate_produce_errors_total",
        "callgate_rebalances_total",
        "callgate_duplicate_chunks_total",
        "callgate_poison_records_total",
        "callgate_build_info",
    ):
        assert required in names
    assert all(name.startswith("callgate_") for name in names)


def test_each_instance_has_its_own_registry() -> None:
    first, second = Metrics(TOOLS), Metrics(TOOLS)
    first.observe(Verdict(Outcome.ACCEPTED), "get_weather")
    assert value(first, "callgate_calls_total", outcome="accepted", tool="get_weather") == 1
    assert value(second, "callgate_calls_total", outcome="accepted", tool="get_weather") == 0


def test_observe_counts_outcome_rejection_incomplete_and_repairs() -> None:
    metrics = Metrics(TOOLS)
    metrics.observe(
        Verdict(Outcome.ACCEPTED, repairs=(Repair(RepairKind.MARKDOWN_FENCE),)), "get_weather"
    )
    metrics.observe(
        Verdict(Outcome.REJECTED, phase=Phase.SCHEMA_VALIDATION, code=Code.SCHEMA_VIOLATION),
        "get_weather",
    )
    metrics.observe(
        Verdict(Outcome.REJECTED, phase=Phase.SCHEMA_VALIDATION, code=Code.SCHEMA_VIOLATION),
        "crm.search",
    )
    metrics.observe(
        Verdict(Outcome.INCOMPLETE, phase=Phase.ASSEMBLY, reason=IncompleteReason.MAX_TOKENS),
        "crm.search",
    )
    assert value(metrics, "callgate_calls_total", outcome="accepted", tool="get_weather") == 1
    assert value(metrics, "callgate_calls_total", outcome="rejected", tool="get_weather") == 1
    assert value(metrics, "callgate_calls_total", outcome="rejected", tool="crm.search") == 1
    assert value(metrics, "callgate_calls_total", outcome="incomplete", tool="crm.search") == 1
    assert (
        value(
            metrics, "callgate_rejections_total", phase="schema_validation", code="schema_violation"
        )
        == 2
    )
    assert value(metrics, "callgate_incomplete_total", reason="max_tokens") == 1
    assert value(metrics, "callgate_incomplete_total", reason="timeout") == 0
    assert value(metrics, "callgate_repairs_total", kind="markdown_fence") == 1


def test_series_exist_before_the_first_event() -> None:
    # rate() over a series that appears only at its first increment misses that increment.
    scraped = samples(Metrics(TOOLS))
    for outcome in Outcome:
        for tool in TOOLS:
            key = ("callgate_calls_total", frozenset({("outcome", outcome), ("tool", tool)}))
            assert scraped[key] == 0
    for reason in IncompleteReason:
        assert scraped[("callgate_incomplete_total", frozenset({("reason", reason)}))] == 0
    for phase in Phase:
        assert (
            scraped[("callgate_phase_duration_seconds_count", frozenset({("phase", phase)}))] == 0
        )


def test_tool_label_is_bounded_by_the_registry() -> None:
    metrics = Metrics(TOOLS)
    for i in range(50):
        metrics.observe(
            Verdict(Outcome.REJECTED, Phase.SCHEMA_VALIDATION, Code.UNKNOWN_TOOL), f"t{i}"
        )
    metrics.observe(Verdict(Outcome.REJECTED, Phase.RESPONSE_CLASSIFICATION, Code.REFUSAL), None)
    tools = {
        dict(labels)["tool"] for name, labels in samples(metrics) if name == "callgate_calls_total"
    }
    assert tools == TOOLS | {UNKNOWN_TOOL, NO_TOOL}
    assert value(metrics, "callgate_calls_total", outcome="rejected", tool=UNKNOWN_TOOL) == 50
    assert value(metrics, "callgate_calls_total", outcome="rejected", tool=NO_TOOL) == 1


def test_phase_histogram_resolves_microseconds() -> None:
    metrics = Metrics(TOOLS)
    metrics.observe(
        Verdict(
            Outcome.ACCEPTED,
            phases_us={Phase.ASSEMBLY: 3, Phase.JSON_PARSE: 12, Phase.SCHEMA_VALIDATION: 2_000_000},
        ),
        "get_weather",
    )
    metrics.observe(Verdict(Outcome.ACCEPTED, phases_us={Phase.JSON_PARSE: 40}), "get_weather")
    scraped = samples(metrics)

    def bucket(phase: str, le: float) -> float:
        for (name, labels), count in scraped.items():
            labels_d = dict(labels)
            if (
                name == "callgate_phase_duration_seconds_bucket"
                and labels_d["phase"] == phase
                and math.isclose(float(labels_d["le"]), le)
            ):
                return count
        raise AssertionError(f"no bucket le={le} for {phase}")

    assert PHASE_BUCKETS_S[0] <= 5e-6
    assert PHASE_BUCKETS_S[-1] >= 1.0
    assert bucket("assembly", 2e-6) == 0
    assert bucket("assembly", 5e-6) == 1
    assert bucket("json_parse", 1e-5) == 0
    assert bucket("json_parse", 2.5e-5) == 1
    assert bucket("json_parse", 5e-5) == 2
    assert bucket("schema_validation", 1.0) == 0
    assert bucket("schema_validation", math.inf) == 1
    assert value(metrics, "callgate_phase_duration_seconds_count", phase="json_parse") == 2
    assert value(metrics, "callgate_phase_duration_seconds_sum", phase="json_parse") == (
        pytest.approx(52e-6)
    )
    # cumulative buckets never decrease
    for phase in Phase:
        counts = [bucket(phase, le) for le in (*PHASE_BUCKETS_S, math.inf)]
        assert counts == sorted(counts)


def test_gauges_and_infrastructure_counters() -> None:
    metrics = Metrics(TOOLS, engine="jsonschema-rs", version="9.9.9")
    metrics.add_chunks(7)
    metrics.add_chunks()
    metrics.set_open_calls(4)
    metrics.set_buffered_bytes(1024)
    metrics.set_assigned_partitions(3)
    metrics.set_lag("model-output", 0, 12)
    metrics.set_lag("model-output", 1, 5)
    metrics.commit_error()
    metrics.produce_error(2)
    metrics.rebalance()
    metrics.add_duplicate_chunks(3)
    metrics.add_duplicate_chunks(0)
    metrics.poison_record(Code.UNKNOWN_FORMAT)
    metrics.poison_record()
    assert value(metrics, "callgate_chunks_total") == 8
    assert value(metrics, "callgate_open_calls") == 4
    assert value(metrics, "callgate_buffered_bytes") == 1024
    assert value(metrics, "callgate_assigned_partitions") == 3
    assert value(metrics, "callgate_consumer_lag", topic="model-output", partition="0") == 12
    assert value(metrics, "callgate_commit_errors_total") == 1
    assert value(metrics, "callgate_produce_errors_total") == 2
    assert value(metrics, "callgate_rebalances_total") == 1
    assert value(metrics, "callgate_duplicate_chunks_total") == 3
    assert value(metrics, "callgate_poison_records_total", code="unknown_format") == 1
    assert value(metrics, "callgate_poison_records_total", code="malformed_record") == 1
    assert value(metrics, "callgate_build_info", version="9.9.9", engine="jsonschema-rs") == 1

    metrics.forget_partition("model-output", 0)
    metrics.forget_partition("model-output", 99)  # never assigned: nothing to forget, no error
    lag = {labels for name, labels in samples(metrics) if name == "callgate_consumer_lag"}
    assert lag == {frozenset({("topic", "model-output"), ("partition", "1")})}


def test_null_metrics_has_every_method_and_exposes_nothing() -> None:
    public = {
        name for name in vars(Metrics) if not name.startswith("_") and callable(vars(Metrics)[name])
    }
    overridden = {name for name in vars(NullMetrics) if not name.startswith("_")}
    assert public - {"series_names"} <= overridden
    null = build_metrics(False, TOOLS, engine="fastjsonschema")
    assert isinstance(null, NullMetrics)
    null.observe(Verdict(Outcome.ACCEPTED, phases_us={Phase.ASSEMBLY: 1}), "get_weather")
    null.set_lag("t", 0, 1)
    null.poison_record()
    assert generate_latest(null.registry) == b""
    assert type(build_metrics(True, TOOLS, engine="fastjsonschema")) is Metrics


def test_series_names_covers_unobserved_labelled_families() -> None:
    metrics = Metrics(TOOLS)
    assert "callgate_rejections_total" in series_names(metrics.registry)
    assert series_names(CollectorRegistry()) == frozenset()
