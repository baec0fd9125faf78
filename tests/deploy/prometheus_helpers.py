"""Test helpers for deploy/: the dashboard's and alerts' PromQL, and a real Prometheus to run it on.

- `panel_queries()`, `variable_queries()`, `alert_expressions()` read the checked-in artifacts.
- `metric_names(expr)` is every `callgate_*` name an expression refers to.
- `check_against(base_url)` runs every panel query and alert expression through a Prometheus
  HTTP API (`/api/v1/query`): each must parse, each panel query must return data.
- `PrometheusProcess` runs the Debian `prometheus` binary on a free loopback port with a temp
  config and TSDB; it owns exactly that one child process (started, awaited and stopped with
  `callgate_demo.processes`' child helpers, like the embedded broker).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import yaml

from callgate_demo.processes import ChildWait, free_port, stop_child, wait_for_child
from tests.datafiles import REPO

ROOT = REPO
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "callgate.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"

_METRIC = re.compile(r"\b((?:callgate|process)_[A-Za-z0-9_]+)\b")
_LABEL_VALUES = re.compile(r"^label_values\((?P<metric>[^,]+),\s*(?P<label>\w+)\)$")


@dataclass(frozen=True)
class NamedQuery:
    source: str  # "panel <title> [A]", "alert <name>", "variable <name>"
    expr: str


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(_panels(panel.get("panels", [])))
    return out


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def data_panels(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    return [p for p in _panels(load_dashboard(path)["panels"]) if p["type"] != "row"]


def panel_queries(path: Path = DASHBOARD) -> list[NamedQuery]:
    return [
        NamedQuery(f"panel {panel['title']!r} [{target['refId']}]", target["expr"])
        for panel in data_panels(path)
        for target in panel.get("targets", [])
    ]


def variable_queries(path: Path = DASHBOARD) -> list[NamedQuery]:
    out = []
    for variable in load_dashboard(path)["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            out.append(
                NamedQuery(
                    f"variable {variable['name']}",
                    query["query"] if isinstance(query, dict) else query,
                )
            )
    return out


def alert_rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"] if "alert" in rule]


def alert_expressions(path: Path = ALERTS) -> list[NamedQuery]:
    return [NamedQuery(f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules(path)]


def metric_names(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def substitute(expr: str, rate_interval: str = "30s") -> str:
    """What Grafana would send with every variable set to All."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
    return re.sub(r"\$\{?(instance|tool)\}?", ".*", expr)


class PrometheusQueryError(AssertionError):
    pass


class PrometheusAPI:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def get(self, path: str, **params: str | list[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        url = f"{self.base_url}{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400/422 carry the parse error as JSON
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusQueryError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, metric: str) -> list[str]:
        values: list[str] = self.get(f"/api/v1/label/{label}/values", **{"match[]": [metric]})
        return values


def check_against(
    base_url: str, *, deadline_s: float = 30.0, rate_interval: str = "30s"
) -> dict[str, int]:
    """Run every panel query, variable and alert expression; return result sizes by source.

    Panel queries and variables are retried until they return data or the deadline passes
    (a rate needs two scrapes in its window); alert expressions only need to parse, since a
    healthy worker fires none. Raises AssertionError naming every query that failed.
    """
    api = PrometheusAPI(base_url)
    deadline = time.monotonic() + deadline_s
    sizes: dict[str, int] = {}
    failures: list[str] = []
    for named in alert_expressions():
        try:
            sizes[named.source] = len(api.query(named.expr))
        except PrometheusQueryError as exc:
            failures.append(f"{named.source}: {exc}\n    {named.expr}")
    pending = list(panel_queries()) + list(variable_queries())
    while True:
        still: list[NamedQuery] = []
        for named in pending:
            try:
                match = _LABEL_VALUES.match(named.expr)
                if match:
                    size = len(api.label_values(match["label"], match["metric"].strip()))
                else:
                    size = len(api.query(substitute(named.expr, rate_interval)))
            except PrometheusQueryError as exc:
                failures.append(f"{named.source}: {exc}\n    {named.expr}")
                continue
            sizes[named.source] = size
            if size == 0:
                still.append(named)
        pending = still
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    failures.extend(f"{n.source}: no data\n    {substitute(n.expr)}" for n in pending)
    if failures:
        raise AssertionError("queries failed against Prometheus:\n" + "\n".join(failures))
    return sizes


# -- a real Prometheus --------------------------------------------------------------------------


def prometheus_binary() -> str:
    """The `prometheus` binary; missing fails under CI=true and skips elsewhere."""
    path = shutil.which("prometheus")
    if path is None:
        message = "the prometheus binary is missing (apt-get install prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def promtool_binary() -> str:
    path = shutil.which("promtool")
    if path is None:
        message = "promtool is missing (apt-get install prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def scrape_config(targets: list[str], *, rule_files: list[Path], interval: str = "1s") -> str:
    """A Prometheus config scraping `targets` as job `callgate`, as deploy/prometheus does."""
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": "callgate",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": targets}],
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


class PrometheusProcess:
    """One `prometheus` child on 127.0.0.1 with its own config and TSDB under `workdir`."""

    def __init__(self, config_text: str, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "prometheus.yml"
        self.config.write_text(config_text, encoding="utf-8")
        self.port = free_port()
        self.log = workdir / "prometheus.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        command = [
            prometheus_binary(),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
        ]
        with self.log.open("wb") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._until(timeout_s, "to become ready", self._ready)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/-/ready", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_for_scrapes(self, job: str = "callgate", timeout_s: float = 30.0) -> None:
        """Return once every target of `job` has been scraped successfully at least once."""
        api = PrometheusAPI(self.base_url)

        def scraped() -> bool:
            targets = [
                t for t in api.get("/api/v1/targets")["activeTargets"] if t["labels"]["job"] == job
            ]
            return bool(targets) and all(t["health"] == "up" for t in targets)

        self._until(timeout_s, f"to scrape job {job}", scraped)

    def _until(self, timeout_s: float, what: str, condition: Callable[[], bool]) -> None:
        process = self._process
        waited = wait_for_child(process, condition, timeout_s, interval_s=0.2)
        if waited is ChildWait.EXITED:
            assert process is not None
            raise AssertionError(f"prometheus exited with {process.returncode}: {self.log_tail()}")
        if waited is ChildWait.TIMED_OUT:
            raise AssertionError(f"prometheus did not manage {what} in {timeout_s} s")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        process, self._process = self._process, None
        stop_child(process, timeout_s)

    def __enter__(self) -> PrometheusProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
