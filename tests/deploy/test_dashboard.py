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

DECLARED = Metrics(frozenset({"any_tool"})).series_names()
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


def test_the_panels_the_operators_need_are_there() -> None:
    titles = {panel["title"] for panel in data_panels()}
    for wanted in (
        "Calls/s by outcome",
        "Acceptance ratio",
        "Rejections/s by phase and code",
        "Incomplete/s by reason",
        "Repairs/s by kind",
        "p50 phase duration",
        "p99 phase duration",
        "Open calls",
        "Buffered bytes",
        "Consumer lag by partition",
        "Rebalances",
    ):
        assert wanted in titles
    used = set().union(*(metric_names(q.expr) for q in panel_queries()))
    # every declared series is on the dashboard somewhere
    assert {name.removesuffix("_count").removesuffix("_sum") for name in DECLARED} - used <= {
        "callgate_phase_duration_seconds"
    }


def test_templated_by_worker_and_tool() -> None:
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert {"datasource", "instance", "tool"} <= set(variables)
    for named in panel_queries():
        assert 'instance=~"$instance"' in named.expr, named.source
        if "callgate_calls_total" in named.expr:
            assert named.expr.count('tool=~"$tool"') == named.expr.count("callgate_calls_total")


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
