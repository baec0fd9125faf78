"""worker/metrics.py: names, bounded label sets, the counts of generated verdicts against an
oracle, series present before their first event, histogram shape, scrapes during updates."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from worker._native import AssembledCall
from worker.core.flips import Comparison, Kind
from worker.core.idempotency import Decision
from worker.metrics import (
    CHECKPOINT_KINDS,
    EXECUTOR_OUTCOMES,
    INTERNAL_ERROR_PHASES,
    NO_LABEL,
    NO_TOOL,
    PHASE_BUCKETS_S,
    PHASE_BUCKETS_US,
    POISON_CODES,
    UNKNOWN_TOOL,
    Metrics,
    series_names,
)
from worker.model import Code, IncompleteReason, Outcome, Phase, RepairKind, SchemaRef, Verdict
from worker.settings import SchemaSettings

FIXED = settings(derandomize=True, deadline=None, print_blob=True)

#: every name a call may give a tool -> its label: the tool's name and its schema id
TOOL_LABELS = {
    "get_weather": "get_weather",
    "weather.get_weather": "get_weather",
    "search": "crm.search",
    "crm.search": "crm.search",
}
LABELS = frozenset(TOOL_LABELS.values())
DIGEST = b"\x01" * 32

Sample = tuple[str, frozenset[tuple[str, str]]]


def scrape(metrics: Metrics) -> dict[Sample, float]:
    """Scrape the registry as Prometheus would and index every sample by name and labels."""
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return scrape(metrics)[(name, frozenset(labels.items()))]


def series(scraped: dict[Sample, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (sample, labels), v in scraped.items() if sample == name}


def label_values(scraped: dict[Sample, float], name: str, label: str) -> set[str]:
    return {dict(labels)[label] for labels in series(scraped, name)}


def new_metrics(**kwargs: object) -> Metrics:
    return Metrics(TOOL_LABELS, engine="fastjsonschema", **kwargs)


# -- names -------------------------------------------------------------------------------------


def test_the_series_operators_query_exist() -> None:
    names = new_metrics(max_idempotency_keys=10).series_names()
    assert names == {
        "callgate_records_total",
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
        "callgate_assigned_partitions",
        "callgate_commit_errors_total",
        "callgate_produce_errors_total",
        "callgate_rebalances_total",
        "callgate_duplicate_chunks_total",
        "callgate_late_chunks_total",
        "callgate_early_dropped_chunks_total",
        "callgate_poison_records_total",
        "callgate_checkpoints_total",
        "callgate_checkpoint_bytes_total",
        "callgate_idempotency_decisions_total",
        "callgate_idempotency_keys",
        "callgate_idempotency_keys_limit",
        "callgate_approvals_total",
        "callgate_pending_approvals",
        "callgate_executor_calls_total",
        "callgate_events_substituted_total",
        "callgate_events_dropped_total",
        "callgate_input_records_deleted_total",
        "callgate_kafka_client_log_records_total",
        "callgate_shadow_calls_total",
        "callgate_build_info",
        # the process collector's (prometheus-client's, on the worker's own registry)
        "process_cpu_seconds_total",
        "process_virtual_memory_bytes",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_open_fds",
        "process_max_fds",
    }
    # the limit is exposed only when known: a made-up one would make its alert lie
    assert "callgate_idempotency_keys_limit" not in new_metrics().series_names()


def test_series_names_covers_unobserved_labelled_families() -> None:
    assert "callgate_consumer_lag" in series_names(new_metrics().registry)
    assert series_names(CollectorRegistry()) == frozenset()


def test_each_instance_has_its_own_registry() -> None:
    first, second = new_metrics(), new_metrics()
    first.observe(Verdict(Outcome.ACCEPTED), "get_weather")
    assert value(first, "callgate_calls_total", outcome="accepted", tool="get_weather") == 1
    assert value(second, "callgate_calls_total", outcome="accepted", tool="get_weather") == 0


def test_build_info_names_version_and_engine() -> None:
    metrics = Metrics(TOOL_LABELS, engine="jsonschema-rs", version="9.9.9")
    assert value(metrics, "callgate_build_info", version="9.9.9", engine="jsonschema-rs") == 1
    # without an engine: the settings' default, defined there only
    default = Metrics(TOOL_LABELS, version="1")
    engine = SchemaSettings().engine
    assert value(default, "callgate_build_info", version="1", engine=engine) == 1


# -- series before their first event -----------------------------------------------------------


def test_series_exist_at_zero_before_their_first_event() -> None:
    # rate() and increase() miss the increment that creates a series: an alert on "any internal
    # error" would never see the first one
    scraped = scrape(new_metrics())
    calls = series(scraped, "callgate_calls_total")
    assert set(calls) == {
        frozenset({("outcome", outcome.value), ("tool", tool)})
        for outcome in Outcome
        for tool in LABELS | {UNKNOWN_TOOL, NO_TOOL}
    }
    assert set(calls.values()) == {0}
    assert series(scraped, "callgate_executor_calls_total") == {
        frozenset({("outcome", outcome), ("tool", tool)}): 0
        for outcome in EXECUTOR_OUTCOMES
        for tool in LABELS | {UNKNOWN_TOOL, NO_TOOL}
    }
    assert series(scraped, "callgate_rejections_total") == {
        frozenset({("phase", phase.value), ("code", "internal_error")}): 0
        for phase in INTERNAL_ERROR_PHASES
    }
    assert Phase.DELIVERY not in INTERNAL_ERROR_PHASES
    for name, label, values in (
        ("callgate_incomplete_total", "reason", IncompleteReason),
        ("callgate_repairs_total", "kind", RepairKind),
        ("callgate_phase_duration_seconds_count", "phase", Phase),
        ("callgate_poison_records_total", "code", POISON_CODES),
        ("callgate_idempotency_decisions_total", "decision", Decision),
        ("callgate_checkpoints_total", "kind", CHECKPOINT_KINDS),
        ("callgate_checkpoint_bytes_total", "kind", CHECKPOINT_KINDS),
    ):
        found = series(scraped, name)
        assert set(found) == {frozenset({(label, str(v))}) for v in values}, name
        assert set(found.values()) == {0}, name
    for name in (
        "callgate_records_total",
        "callgate_duplicate_chunks_total",
        "callgate_late_chunks_total",
        "callgate_events_substituted_total",
        "callgate_events_dropped_total",
        "callgate_commit_errors_total",
        "callgate_produce_errors_total",
        "callgate_rebalances_total",
    ):
        assert scraped[(name, frozenset())] == 0, name


# -- the hot path against an oracle --------------------------------------------------------------

phases_us = st.dictionaries(
    st.sampled_from(list(Phase)),
    st.one_of(st.integers(0, 2_000_000), st.sampled_from(PHASE_BUCKETS_US)),
    max_size=4,
)
repairs = st.lists(st.sampled_from(list(RepairKind)), max_size=2).map(tuple)


@st.composite
def verdicts(draw: st.DrawFn) -> Verdict:
    outcome = draw(st.sampled_from(list(Outcome)))
    common = {"repairs": draw(repairs), "phases_us": draw(phases_us)}
    if outcome is Outcome.REJECTED:
        return Verdict(
            outcome,
            phase=draw(st.sampled_from(list(Phase))),
            code=draw(st.sampled_from(list(Code))),
            **common,
        )
    if outcome is Outcome.INCOMPLETE:
        reason = draw(st.sampled_from(list(IncompleteReason)))
        return Verdict(outcome, phase=Phase.ASSEMBLY, reason=reason, **common)
    pending = draw(st.booleans())
    return Verdict(
        outcome,
        idempotency_key="k" if pending else None,
        idempotency_digest=DIGEST if pending else None,
        **common,
    )


#: names a call may give: registered names and schema ids, anything else, or none
tools = st.one_of(st.none(), st.sampled_from(sorted(TOOL_LABELS)), st.text(max_size=20))
decisions = st.tuples(
    st.sampled_from(list(Decision)),
    tools,
    st.sampled_from([Code.DUPLICATE, Code.IDEMPOTENCY_CONFLICT]),
)


def label_of(tool: str | None) -> str:
    return NO_TOOL if tool is None else TOOL_LABELS.get(tool, UNKNOWN_TOOL)


def expected(
    observed: Iterable[tuple[Verdict, str | None]],
    decided: Iterable[tuple[Outcome, str | None, Code | None]],
) -> dict[str, Counter[tuple[str, ...]]]:
    """What the counters must say, computed from the inputs alone."""
    out: dict[str, Counter[tuple[str, ...]]] = {
        name: Counter() for name in ("calls", "rejections", "incomplete", "repairs", "poison")
    }
    for verdict, tool in observed:
        pending = verdict.outcome is Outcome.ACCEPTED and verdict.idempotency_digest is not None
        if not pending:
            out["calls"][(verdict.outcome.value, label_of(tool))] += 1
        if verdict.outcome is Outcome.REJECTED:
            assert verdict.phase is not None
            assert verdict.code is not None
            out["rejections"][(verdict.phase.value, verdict.code.value)] += 1
            if verdict.phase is Phase.ASSEMBLY and verdict.code in POISON_CODES:
                out["poison"][(verdict.code.value,)] += 1
        if verdict.outcome is Outcome.INCOMPLETE:
            assert verdict.reason is not None
            out["incomplete"][(verdict.reason.value,)] += 1
        for repair in verdict.repairs:
            out["repairs"][(repair.value,)] += 1
    for outcome, tool, code in decided:
        out["calls"][(outcome.value, label_of(tool))] += 1
        if code is not None:
            out["rejections"][(Phase.IDEMPOTENCY.value, code.value)] += 1
    return out


def nonzero(
    scraped: dict[Sample, float], name: str, labels: tuple[str, ...]
) -> Counter[tuple[str, ...]]:
    return Counter(
        {
            tuple(dict(found)[label] for label in labels): int(v)
            for found, v in series(scraped, name).items()
            if v
        }
    )


@settings(FIXED, max_examples=200)
@given(st.lists(st.tuples(verdicts(), tools), max_size=40), st.lists(decisions, max_size=10))
def test_counts_match_an_oracle_and_label_values_stay_bounded(
    observed: list[tuple[Verdict, str | None]],
    decided: list[tuple[Decision, str | None, Code]],
) -> None:
    metrics = new_metrics()
    owner_decided: list[tuple[Outcome, str | None, Code | None]] = []
    for verdict, tool in observed:
        metrics.observe(verdict, tool)
    for decision, tool, code in decided:
        rejected = decision in (Decision.DUPLICATE, Decision.CONFLICT)
        outcome = Outcome.REJECTED if rejected else Outcome.ACCEPTED
        metrics.idempotency_decision(decision)
        metrics.decided(
            outcome, tool, Phase.IDEMPOTENCY if rejected else None, code if rejected else None
        )
        owner_decided.append((outcome, tool, code if rejected else None))
    scraped = scrape(metrics)
    want = expected(observed, owner_decided)

    assert nonzero(scraped, "callgate_calls_total", ("outcome", "tool")) == want["calls"]
    assert nonzero(scraped, "callgate_rejections_total", ("phase", "code")) == want["rejections"]
    assert nonzero(scraped, "callgate_incomplete_total", ("reason",)) == want["incomplete"]
    assert nonzero(scraped, "callgate_repairs_total", ("kind",)) == want["repairs"]
    assert nonzero(scraped, "callgate_poison_records_total", ("code",)) == want["poison"]
    assert nonzero(scraped, "callgate_idempotency_decisions_total", ("decision",)) == Counter(
        (decision.value,) for decision, _, _ in decided
    )

    # bounded: whatever name a call gives, the label is a registered one or a placeholder
    assert label_values(scraped, "callgate_calls_total", "tool") == LABELS | {
        UNKNOWN_TOOL,
        NO_TOOL,
    }
    assert label_values(scraped, "callgate_rejections_total", "phase") <= set(Phase)
    assert label_values(scraped, "callgate_rejections_total", "code") <= set(Code)
    assert len(series(scraped, "callgate_calls_total")) == len(Outcome) * (len(LABELS) + 2)

    # the histogram: one observation per phase a verdict timed, sums in seconds
    for phase in Phase:
        timed = [v.phases_us[phase] for v, _ in observed if phase in v.phases_us]
        labels = frozenset({("phase", phase.value)})
        assert scraped[("callgate_phase_duration_seconds_count", labels)] == len(timed)
        assert scraped[("callgate_phase_duration_seconds_sum", labels)] == pytest.approx(
            sum(timed) / 1e6
        )
        for bound_us, bound_s in zip(PHASE_BUCKETS_US, PHASE_BUCKETS_S, strict=True):
            in_bucket = sum(1 for micros in timed if micros <= bound_us)
            assert bucket(scraped, phase, bound_s) == in_bucket
        assert bucket(scraped, phase, math.inf) == len(timed)


def bucket(scraped: dict[Sample, float], phase: str, le: float) -> float:
    for labels, count in series(scraped, "callgate_phase_duration_seconds_bucket").items():
        found = dict(labels)
        if found["phase"] == phase and math.isclose(float(found["le"]), le):
            return count
    raise AssertionError(f"no bucket le={le} for {phase}")


def test_tool_names_and_schema_ids_share_one_label() -> None:
    metrics = new_metrics()
    metrics.observe(Verdict(Outcome.ACCEPTED), "get_weather")
    metrics.observe(Verdict(Outcome.ACCEPTED), "weather.get_weather")
    metrics.observe(Verdict(Outcome.ACCEPTED), "search")
    for i in range(50):
        metrics.observe(
            Verdict(Outcome.REJECTED, phase=Phase.SCHEMA_VALIDATION, code=Code.UNKNOWN_TOOL),
            f"t{i}",
        )
    metrics.observe(
        Verdict(Outcome.REJECTED, phase=Phase.RESPONSE_CLASSIFICATION, code=Code.REFUSAL), None
    )
    assert value(metrics, "callgate_calls_total", outcome="accepted", tool="get_weather") == 2
    assert value(metrics, "callgate_calls_total", outcome="accepted", tool="crm.search") == 1
    assert value(metrics, "callgate_calls_total", outcome="rejected", tool=UNKNOWN_TOOL) == 50
    assert value(metrics, "callgate_calls_total", outcome="rejected", tool=NO_TOOL) == 1


def test_a_keyed_call_is_counted_once_when_its_owner_decides() -> None:
    metrics = new_metrics()
    pending = Verdict(
        Outcome.ACCEPTED,
        idempotency_key="order-1",
        idempotency_digest=DIGEST,
        repairs=(RepairKind.MARKDOWN_FENCE,),
        phases_us={Phase.JSON_PARSE: 3, Phase.IDEMPOTENCY: 2},
    )
    metrics.observe(pending, "get_weather")
    # judged: its phases and repairs are recorded, its outcome is not known yet
    assert value(metrics, "callgate_calls_total", outcome="accepted", tool="get_weather") == 0
    assert value(metrics, "callgate_repairs_total", kind="markdown_fence") == 1
    assert value(metrics, "callgate_phase_duration_seconds_count", phase="idempotency") == 1
    metrics.decided(Outcome.ACCEPTED, "get_weather", None, None)
    metrics.decided(Outcome.REJECTED, "weather.get_weather", Phase.IDEMPOTENCY, Code.DUPLICATE)
    assert value(metrics, "callgate_calls_total", outcome="accepted", tool="get_weather") == 1
    assert value(metrics, "callgate_calls_total", outcome="rejected", tool="get_weather") == 1
    assert value(metrics, "callgate_rejections_total", phase="idempotency", code="duplicate") == 1


def test_poison_records_are_assembly_rejections_of_unreadable_records() -> None:
    metrics = new_metrics()
    for phase, code in (
        (Phase.ASSEMBLY, Code.MALFORMED_RECORD),
        (Phase.ASSEMBLY, Code.INTERNAL_ERROR),  # a decoder's bug on one record
        (Phase.ASSEMBLY, Code.CALL_ID_REUSED),  # readable: not poison
        (Phase.SCHEMA_VALIDATION, Code.INTERNAL_ERROR),  # the gate's bug on a read call
    ):
        metrics.observe(Verdict(Outcome.REJECTED, phase=phase, code=code), None)
    assert value(metrics, "callgate_poison_records_total", code="malformed_record") == 1
    assert value(metrics, "callgate_poison_records_total", code="internal_error") == 1
    internal = {
        dict(labels)["phase"]: v
        for labels, v in series(scrape(metrics), "callgate_rejections_total").items()
        if dict(labels)["code"] == "internal_error"
    }
    assert internal["assembly"] == internal["schema_validation"] == 1


def test_a_rejection_without_phase_or_code_is_still_bounded() -> None:
    metrics = new_metrics()
    metrics.observe(Verdict(Outcome.REJECTED), "get_weather")
    metrics.observe(Verdict(Outcome.INCOMPLETE), "get_weather")
    assert value(metrics, "callgate_rejections_total", phase=NO_LABEL, code=NO_LABEL) == 1
    assert value(metrics, "callgate_incomplete_total", reason=NO_LABEL) == 1


def test_phase_buckets_span_a_microsecond_to_a_second() -> None:
    assert PHASE_BUCKETS_S[0] <= 1e-6
    assert PHASE_BUCKETS_S[-1] >= 1.0
    assert list(PHASE_BUCKETS_US) == sorted(set(PHASE_BUCKETS_US))
    metrics = new_metrics()
    # a duration on a bound belongs to that bucket (le is inclusive); past the last, to +Inf
    metrics.observe(
        Verdict(Outcome.ACCEPTED, phases_us={Phase.JSON_PARSE: 25, Phase.LIMITS: 1_000_001}), None
    )
    scraped = scrape(metrics)
    assert bucket(scraped, "json_parse", 1e-5) == 0
    assert bucket(scraped, "json_parse", 2.5e-5) == 1
    assert bucket(scraped, "limits", 1.0) == 0
    assert bucket(scraped, "limits", math.inf) == 1


# -- the shell's setters -------------------------------------------------------------------------


def test_gauges_and_infrastructure_counters() -> None:
    metrics = new_metrics(max_idempotency_keys=6_000_000)
    metrics.add_records(7)
    metrics.add_records(1)
    metrics.set_open_calls(4)
    metrics.set_buffered_bytes(1024)
    metrics.set_assigned_partitions(3)
    metrics.set_lag("model-output", 0, 12)
    metrics.set_lag("model-output", 1, 5)
    metrics.commit_error()
    metrics.produce_error()
    metrics.produce_error(2)
    metrics.produce_error(0)
    metrics.rebalance()
    metrics.add_dropped_chunks(3, 0)
    metrics.add_dropped_chunks(0, 2)
    metrics.add_dropped_chunks(-1, -1)  # never raises on the hot path, never goes down
    metrics.checkpoint(100, full=True)
    metrics.checkpoint(10, full=False)
    metrics.checkpoint(0, full=False)
    metrics.set_idempotency_keys(42)
    metrics.event_substituted()
    metrics.event_dropped()
    metrics.event_dropped()
    metrics.input_records_deleted(5)
    metrics.input_records_deleted(0)
    for name, labels, want in (
        ("callgate_records_total", {}, 8),
        ("callgate_open_calls", {}, 4),
        ("callgate_buffered_bytes", {}, 1024),
        ("callgate_assigned_partitions", {}, 3),
        ("callgate_consumer_lag", {"topic": "model-output", "partition": "0"}, 12),
        ("callgate_commit_errors_total", {}, 1),
        ("callgate_produce_errors_total", {}, 3),
        ("callgate_rebalances_total", {}, 1),
        ("callgate_duplicate_chunks_total", {}, 3),
        ("callgate_late_chunks_total", {}, 2),
        ("callgate_checkpoints_total", {"kind": "full"}, 1),
        ("callgate_checkpoints_total", {"kind": "delta"}, 2),
        ("callgate_checkpoint_bytes_total", {"kind": "full"}, 100),
        ("callgate_checkpoint_bytes_total", {"kind": "delta"}, 10),
        ("callgate_idempotency_keys", {}, 42),
        ("callgate_idempotency_keys_limit", {}, 6_000_000),
        ("callgate_events_substituted_total", {}, 1),
        ("callgate_events_dropped_total", {}, 2),
        ("callgate_input_records_deleted_total", {}, 5),
    ):
        assert value(metrics, name, **labels) == want, name

    metrics.forget_partition("model-output", 0)
    metrics.forget_partition("model-output", 99)  # never assigned: nothing to forget, no error
    lag = series(scrape(metrics), "callgate_consumer_lag")
    assert set(lag) == {frozenset({("topic", "model-output"), ("partition", "1")})}


def test_idempotency_decisions_are_the_owners_enum_only() -> None:
    metrics = new_metrics()
    for decision in Decision:
        metrics.idempotency_decision(decision)
    with pytest.raises(KeyError):
        metrics.idempotency_decision("made-up")
    scraped = scrape(metrics)
    assert label_values(scraped, "callgate_idempotency_decisions_total", "decision") == set(
        Decision
    )


def test_executor_calls_are_counted_by_tool_label_and_outcome() -> None:
    metrics = new_metrics()
    metrics.executor_call("weather.get_weather", "succeeded")
    metrics.executor_call("get_weather", "refused")
    metrics.executor_call("get_weather", "refused")
    metrics.executor_call("nobody-knows", "conflict")
    metrics.executor_call(None, "redelivered")
    with pytest.raises(KeyError):
        metrics.executor_call("get_weather", "made-up")
    counted = {
        labels: count
        for labels, count in series(scrape(metrics), "callgate_executor_calls_total").items()
        if count
    }
    assert counted == {
        frozenset({("tool", "get_weather"), ("outcome", "succeeded")}): 1,
        frozenset({("tool", "get_weather"), ("outcome", "refused")}): 2,
        frozenset({("tool", UNKNOWN_TOOL), ("outcome", "conflict")}): 1,
        frozenset({("tool", NO_TOOL), ("outcome", "redelivered")}): 1,
    }


# -- scrapes while the event loop writes ---------------------------------------------------------


def test_a_scrape_during_updates_sees_consistent_series() -> None:
    metrics = new_metrics()
    verdict = Verdict(
        Outcome.REJECTED,
        phase=Phase.JSON_PARSE,
        code=Code.INVALID_JSON,
        phases_us={Phase.ASSEMBLY: 3, Phase.JSON_PARSE: 40},
    )
    total = 20_000
    done = threading.Event()

    def write() -> None:
        for _ in range(total):
            metrics.observe(verdict, "get_weather")
            metrics.add_records(1)
        done.set()

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    previous: dict[Sample, float] = {}
    scrapes = 0
    while not done.is_set() or scrapes == 0:
        scraped = scrape(metrics)
        scrapes += 1
        for key, was in previous.items():
            if key[0].endswith(("_total", "_count", "_bucket", "_sum")):
                assert scraped[key] >= was, key  # counters never go backwards
        for phase in ("assembly", "json_parse"):
            labels = frozenset({("phase", phase)})
            assert scraped[("callgate_phase_duration_seconds_count", labels)] == bucket(
                scraped, phase, math.inf
            )
        previous = scraped
    writer.join()
    final = scrape(metrics)
    assert final[("callgate_records_total", frozenset())] == total
    labels = frozenset({("outcome", "rejected"), ("tool", "get_weather")})
    assert final[("callgate_calls_total", labels)] == total


# -- shadow mode ----------------------------------------------------------------------------------


def comparison(tool: str | None, kind: Kind, version: str | None = "1") -> Comparison:
    schema = SchemaRef("weather.get_weather", version) if version is not None else None
    verdict = Verdict(Outcome.ACCEPTED, schema=schema, arguments_json=b"{}")
    call = AssembledCall("stream", "call", tool, b"{}")
    return Comparison(call, verdict, verdict, kind)


def test_shadow_calls_are_counted_by_tool_version_and_kind() -> None:
    metrics = new_metrics(shadow_series=[("get_weather", "1"), ("get_weather", "2")])
    before = series(scrape(metrics), "callgate_shadow_calls_total")
    # every (tool, version) of both contract sets, every kind: at zero from the start
    assert len(before) == 2 * len(Kind)
    assert set(before.values()) == {0.0}
    metrics.shadow(comparison("get_weather", Kind.ACCEPTED_TO_REJECTED))
    metrics.shadow(comparison("weather.get_weather", Kind.ACCEPTED_TO_REJECTED))
    metrics.shadow(comparison("get_weather", Kind.ACCEPTED_UNCHANGED, "2"))
    metrics.shadow(comparison("made-up tool name", Kind.REJECTED_UNCHANGED, None))
    metrics.shadow(comparison(None, Kind.INCOMPLETE_UNCHANGED, None))
    after = series(scrape(metrics), "callgate_shadow_calls_total")
    counted = {tuple(sorted(labels)): v for labels, v in after.items() if v}
    assert counted == {
        (("kind", "accepted_to_rejected"), ("tool", "get_weather"), ("version", "1")): 2.0,
        (("kind", "accepted_unchanged"), ("tool", "get_weather"), ("version", "2")): 1.0,
        (("kind", "rejected_unchanged"), ("tool", UNKNOWN_TOOL), ("version", NO_LABEL)): 1.0,
        (("kind", "incomplete_unchanged"), ("tool", NO_TOOL), ("version", NO_LABEL)): 1.0,
    }


def test_without_shadow_mode_the_family_is_declared_and_empty() -> None:
    metrics = new_metrics()
    assert "callgate_shadow_calls_total" in metrics.series_names()
    assert series(scrape(metrics), "callgate_shadow_calls_total") == {}


def test_the_process_series_describe_this_process() -> None:
    scraped = scrape(new_metrics())
    assert scraped[("process_open_fds", frozenset())] >= 3  # stdin, stdout, stderr at least
    assert scraped[("process_resident_memory_bytes", frozenset())] > 0
    assert scraped[("process_cpu_seconds_total", frozenset())] > 0
