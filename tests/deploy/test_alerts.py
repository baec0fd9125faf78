"""deploy/prometheus: promtool accepts config and rules, the rule unit tests pass, names exist."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.deploy.prometheus_helpers import (
    ALERTS,
    DEPLOY,
    alert_rules,
    metric_names,
    promtool_binary,
)
from worker.metrics import Metrics

DECLARED = Metrics().series_names()
PROMETHEUS_DIR = DEPLOY / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool_binary(), *args],
        check=False,
        cwd=PROMETHEUS_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", "alerts.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_check_config() -> None:
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is valid prometheus config file syntax" in result.stdout


def test_promtool_rule_unit_tests() -> None:
    result = promtool("test", "rules", "alerts.test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_alerts_the_operators_need_exist_and_are_unit_tested() -> None:
    names = {rule["alert"] for rule in alert_rules()}
    for wanted in (
        "CallgateWorkerDown",
        "CallgateRejectionRatioHigh",
        "CallgateIncompleteRatioHigh",
        "CallgateConsumerLagGrowing",
        "CallgateNoProgress",
    ):
        assert wanted in names
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts.test.yaml").read_text())
    tested = {
        case["alertname"]
        for test in tests["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert tested == names, f"alerts never shown firing: {sorted(names - tested)}"


def test_every_metric_an_alert_names_is_declared() -> None:
    for rule in alert_rules():
        undeclared = metric_names(rule["expr"]) - DECLARED
        assert not undeclared, f"{rule['alert']} uses undeclared {sorted(undeclared)}"


def test_up_refers_to_the_scrape_job() -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    for rule in alert_rules():
        for job in re.findall(r'up\{job="([^"]+)"', rule["expr"]):
            assert job in jobs
    assert config["rule_files"] == [ALERTS.name]


def test_every_alert_has_a_severity_and_a_runbook_section() -> None:
    operations = (DEPLOY / "OPERATIONS.md").read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in operations.splitlines()
        if line.startswith("#")
    }
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"page", "ticket", "info"}
        anchor = rule["annotations"]["runbook"].split("#", 1)[1]
        assert anchor in headings, f"{rule['alert']}: no section #{anchor} in OPERATIONS.md"
