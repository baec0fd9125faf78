"""deploy/prometheus: promtool accepts config and rules, the rule unit tests pass, names exist."""

from __future__ import annotations

import re
import subprocess

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.prometheus_helpers import (
    ALERTS,
    DEPLOY,
    ROOT,
    alert_rules,
    metric_names,
    promtool_binary,
)
from worker.metrics import Metrics

DECLARED = Metrics({"any_tool": "any_tool"}, max_idempotency_keys=1).series_names()
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
    assert names == {
        "CallgateWorkerDown",
        "CallgateNoWorkerUp",
        "CallgateInternalErrors",
        "CallgateRejectionRatioHigh",
        "CallgateIncompleteRatioHigh",
        "CallgatePoisonRecords",
        "CallgateEventsDropped",
        "CallgateEventsSubstituted",
        "CallgateInputDeleted",
        "CallgateTopicFailing",
        "CallgateCommitErrors",
        "CallgateCheckpointsStalled",
        "CallgateIdempotencyKeysNearLimit",
        "CallgateConsumerLagGrowing",
        "CallgateNoProgress",
        "CallgateFrequentRebalances",
    }
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts.test.yaml").read_text())
    tested = {
        case["alertname"]
        for test in tests["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert tested == names, f"alerts never shown firing: {sorted(names - tested)}"
    silent = {
        case["alertname"]
        for test in tests["tests"]
        for case in test["alert_rule_test"]
        if not case["exp_alerts"]
    }
    # the operators' tools for the new failure modes are shown silent on healthy traffic too
    assert silent >= names - {"CallgateConsumerLagGrowing", "CallgateIncompleteRatioHigh"}


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


def test_alerts_on_first_increments_watch_series_that_exist_from_the_start() -> None:
    # increase() misses the increment that creates a series: these alerts fire on "any", so
    # what they watch must exist at zero before the first event (worker/metrics.py)
    text = generate_latest(Metrics({"any_tool": "any_tool"}).registry).decode()
    at_start = {
        (sample.name, frozenset(sample.labels.items()))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    for alert, name, labels in (
        ("CallgateInternalErrors", "callgate_rejections_total", {"code": "internal_error"}),
        ("CallgatePoisonRecords", "callgate_poison_records_total", {"code": "malformed_record"}),
        ("CallgateEventsDropped", "callgate_events_dropped_total", {}),
        ("CallgateEventsSubstituted", "callgate_events_substituted_total", {}),
        ("CallgateInputDeleted", "callgate_input_records_deleted_total", {}),
        ("CallgateTopicFailing", "callgate_produce_errors_total", {}),
        ("CallgateCheckpointsStalled", "callgate_checkpoints_total", {"kind": "delta"}),
        ("CallgateCheckpointsStalled", "callgate_checkpoints_total", {"kind": "full"}),
    ):
        rule = next(r for r in alert_rules() if r["alert"] == alert)
        assert name in metric_names(rule["expr"]), alert
        assert any(
            found == name and set(labels.items()) <= found_labels
            for found, found_labels in at_start
        ), (alert, name, labels)


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


def test_the_readme_lists_every_alert() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Operating it", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| Callgate")]
    listed = " ".join(line.split("|")[1] for line in table)
    for rule in alert_rules():
        name = rule["alert"]
        assert name in listed or f"/ {name.removeprefix('Callgate')}" in listed, name
