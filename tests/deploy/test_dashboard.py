"""deploy/grafana: the dashboard is generated, fresh, provisioned, names only declared metrics."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.deploy.prometheus_helpers import (
    DASHBOARD,
    DEPLOY,
    data_panels,
    load_dashboard,
    metric_names,
    panel_queries,
    variable_queries,
)
from worker.metrics import Metrics

DECLARED = Metrics({"any_tool": "any_tool"}, max_idempotency_keys=1).series_names()
GENERATOR = DEPLOY / "grafana" / "generate.py"


def test_checked_in_json_is_what_the_generator_makes() -> None:
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_every_metric_a_panel_or_variable_names_is_declared() -> None:
    queries = panel_queries() + variable_queries()
    assert queries
    for named in queries:
        names = metric_names(named.expr)
        assert names or "up{" in named.expr, f"{named.source} names no callgate metric"
        undeclared = names - DECLARED
        assert not undeclared, f"{named.source} uses undeclared {sorted(undeclared)}"


def test_the_panels_answer_the_operators_questions_top_to_bottom() -> None:
    # (panel title, a metric its queries name): the order operators read the dashboard in
    wanted = [
        ("Calls/s by outcome", "callgate_calls_total"),
        ("Acceptance ratio", "callgate_calls_total"),
        ("Rejections/s by phase and code", "callgate_rejections_total"),
        ("Internal errors/s by phase", "callgate_rejections_total"),
        ("Incomplete/s by reason", "callgate_incomplete_total"),
        ("Repairs/s by kind", "callgate_repairs_total"),
        ("p50 phase duration", "callgate_phase_duration_seconds_bucket"),
        ("p99 phase duration", "callgate_phase_duration_seconds_bucket"),
        ("Open calls", "callgate_open_calls"),
        ("Buffered bytes", "callgate_buffered_bytes"),
        ("Checkpoint bytes/s by kind", "callgate_checkpoint_bytes_total"),
        ("Checkpoints/s: full vs delta", "callgate_checkpoints_total"),
        ("Idempotency decisions/s", "callgate_idempotency_decisions_total"),
        ("Idempotency keys", "callgate_idempotency_keys"),
        ("Executor calls/s by tool and outcome", "callgate_executor_calls_total"),
        ("Events substituted and dropped/s", "callgate_events_dropped_total"),
        ("Dropped chunks/s", "callgate_late_chunks_total"),
        ("Shadow flips/s by tool, version and kind", "callgate_shadow_calls_total"),
        ("Shadow flip ratio", "callgate_shadow_calls_total"),
        ("Consumer lag by partition", "callgate_consumer_lag"),
        ("Rebalances", "callgate_rebalances_total"),
        ("Broker errors/s", "callgate_produce_errors_total"),
        ("CPU per worker", "process_cpu_seconds_total"),
        ("Memory per worker", "process_resident_memory_bytes"),
        ("Open file descriptors", "process_open_fds"),
        ("Uptime", "process_start_time_seconds"),
    ]
    panels = data_panels()
    position = {panel["title"]: (panel["gridPos"]["y"], panel["gridPos"]["x"]) for panel in panels}
    for title, metric in wanted:
        assert title in position, f"no panel {title!r}"
        (panel,) = [p for p in panels if p["title"] == title]
        assert metric in set().union(*(metric_names(t["expr"]) for t in panel["targets"])), title
    order = [position[title] for title, _ in wanted]
    assert order == sorted(order), "panels out of the order operators read them in"
    used = set().union(*(metric_names(q.expr) for q in panel_queries()))
    # every declared series is on the dashboard somewhere
    assert {name.removesuffix("_count").removesuffix("_sum") for name in DECLARED} - used <= {
        "callgate_phase_duration_seconds"
    }


def test_internal_errors_are_apart_from_the_other_rejections() -> None:
    (rejections,) = [p for p in data_panels() if p["title"] == "Rejections/s by phase and code"]
    (internal,) = [p for p in data_panels() if p["title"] == "Internal errors/s by phase"]
    assert all('code!="internal_error"' in t["expr"] for t in rejections["targets"])
    assert all('code="internal_error"' in t["expr"] for t in internal["targets"])


def test_templated_by_worker_and_tool() -> None:
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert {"datasource", "instance", "tool"} <= set(variables)
    for named in panel_queries():
        assert 'instance=~"$instance"' in named.expr, named.source
        for metric in ("callgate_calls_total", "callgate_shadow_calls_total"):
            if metric in named.expr:
                assert named.expr.count('tool=~"$tool"') == named.expr.count(metric)


def test_panels_are_well_formed() -> None:
    dashboard = load_dashboard()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in data_panels():
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        grid = panel["gridPos"]
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24
        assert panel["description"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))


def test_provisioning_points_at_the_dashboard_and_datasource() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    providers = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/dashboards/callgate.yaml").read_text()
    )["providers"]
    container_path = providers[0]["options"]["path"]
    assert f"./grafana/dashboards:{container_path}:ro" in mounts
    assert DASHBOARD.parent.name == "dashboards"
    datasources = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text()
    )["datasources"]
    (prometheus,) = datasources
    assert prometheus["type"] == "prometheus"
    variable = next(v for v in load_dashboard()["templating"]["list"] if v["name"] == "datasource")
    assert variable["current"]["value"] == prometheus["uid"]
    assert prometheus["url"] == "http://prometheus:9090"
    assert "prometheus" in compose["services"]


def test_the_shadow_panels_count_flips_only_against_every_call_judged() -> None:
    panels = {p["title"]: p for p in data_panels()}
    (flips,) = panels["Shadow flips/s by tool, version and kind"]["targets"]
    assert 'kind!~".*_unchanged"' in flips["expr"]
    assert "tool, version, kind" in flips["expr"]
    (ratio,) = panels["Shadow flip ratio"]["targets"]
    numerator, denominator = ratio["expr"].split(" / ")
    assert 'kind!~".*_unchanged"' in numerator
    assert "kind" not in denominator
