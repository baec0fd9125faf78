"""deploy/: compose, Kubernetes manifests and Dockerfile parse, agree with each other and with the
settings' defaults (no cluster and no docker here, so this is what can be checked)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from tests.deploy.prometheus_helpers import DEPLOY, ROOT
from worker.settings import MetricsSettings, Settings

K8S = DEPLOY / "k8s"
METRICS_PORT = MetricsSettings().port


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def k8s_objects() -> dict[str, dict[str, Any]]:
    objects = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in load_all(path):
            objects[doc["kind"]] = doc
    return objects


def setting_field(env_name: str) -> Any:
    """The Settings field an environment name sets; raises KeyError for a name that sets nothing."""
    assert env_name.startswith("CALLGATE_"), env_name
    model: type[BaseModel] = Settings
    parts = env_name.removeprefix("CALLGATE_").lower().split("__")
    for i, part in enumerate(parts):
        info = model.model_fields[part]
        if i < len(parts) - 1:
            annotation = info.annotation
            assert isinstance(annotation, type), env_name
            assert issubclass(annotation, BaseModel), env_name
            model = annotation
    return info


def assert_valid_settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in env:
        setting_field(name)  # a misspelt name would silently set nothing
    with monkeypatch.context() as patch:
        for name in list(os.environ):
            if name.startswith("CALLGATE_"):
                patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        return Settings()


# -- settings names ------------------------------------------------------------------------------


def test_setting_field_rejects_unknown_names() -> None:
    with pytest.raises(KeyError):
        setting_field("CALLGATE_KAFKA__BOOTSTRAP_SERVER")
    assert setting_field("CALLGATE_METRICS__PORT").default == METRICS_PORT


def test_compose_worker_env_is_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    worker = compose["services"]["worker"]
    settings = assert_valid_settings(worker["environment"], monkeypatch)
    assert settings.kafka.bootstrap_servers == ["kafka:9092"]
    assert settings.metrics.port == METRICS_PORT
    assert worker["command"] == ["callgate", "run"]
    assert str(METRICS_PORT) in worker["expose"]
    assert "/srv/callgate/schemas:ro" in worker["volumes"][0]
    assert str(settings.schemas.dir) == "/srv/callgate/schemas"
    assert re.fullmatch(r"\$\{CALLGATE_WORKERS:-\d+\}", str(worker["deploy"]["replicas"]))
    assert "127.0.0.1:9464/readyz" in " ".join(worker["healthcheck"]["test"])


def test_compose_services_and_kafka_kraft() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"kafka", "worker", "prometheus", "grafana"} <= set(services)
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert services["worker"]["environment"]["CALLGATE_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"
    # the files compose mounts exist
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), volume
    prometheus = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "callgate"]
    assert job["dns_sd_configs"][0]["names"] == ["worker"]
    assert job["dns_sd_configs"][0]["port"] == METRICS_PORT


# -- kubernetes ----------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    for path in K8S.glob("*.yaml"):
        for doc in load_all(path):
            if path.name != "kustomization.yaml":
                assert {"apiVersion", "kind", "metadata"} <= set(doc), path.name
                assert doc["metadata"]["name"], path.name


def test_deployment_probes_ports_and_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = k8s_objects()
    deployment = objects["Deployment"]
    assert deployment["apiVersion"] == "apps/v1"
    spec = deployment["spec"]
    pod = spec["template"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": METRICS_PORT}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True

    # settings: the ConfigMap's variables are real settings that validate together
    configmaps = {
        doc["metadata"]["name"]: doc
        for path in K8S.glob("configmap-*.yaml")
        for doc in load_all(path)
    }
    (env_from,) = container["envFrom"]
    settings_env = configmaps[env_from["configMapRef"]["name"]]["data"]
    for extra in container.get("env", []):
        setting_field(extra["name"])
    settings = assert_valid_settings(settings_env, monkeypatch)
    assert settings.metrics.port == METRICS_PORT
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.shutdown_grace_s

    # schemas: the volume maps every ConfigMap key to <domain>/<file> under the schemas dir
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "schemas"]
    assert mount["mountPath"] == str(settings.schemas.dir)
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "schemas"]
    schema_map = configmaps[volume["configMap"]["name"]]["data"]
    items = {item["key"]: item["path"] for item in volume["configMap"]["items"]}
    assert set(items) == set(schema_map)
    for key, path in items.items():
        domain, file = key.split("__", 1)
        assert path == f"{domain}/{file}"
        assert re.fullmatch(r"[A-Za-z0-9_\-]+\.v[0-9]+(\.output)?\.schema\.json", file)
        assert yaml.safe_load(schema_map[key])["type"] == "object"  # JSON is YAML


def test_service_servicemonitor_and_pdb_select_the_workers() -> None:
    objects = k8s_objects()
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service = objects["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", METRICS_PORT, "metrics")
    monitor = objects["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    # job label = the Service's app.kubernetes.io/name = "callgate", the job the alerts use
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "callgate"
    pdb = objects["PodDisruptionBudget"]
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


# -- dockerfile ----------------------------------------------------------------------------------


def test_dockerfile() -> None:
    lines = [
        line.strip()
        for line in (DEPLOY / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    instructions = [line.split()[0] for line in lines if line.split()[0].isupper()]
    assert lines[0] == "FROM python:3.11-slim"
    assert any(line.startswith("RUN pip install .") for line in lines)
    # the worker's own dependencies only: no demo (embedded broker) or dev extra
    assert not [line for line in lines if line.startswith("RUN pip install") and "[" in line]
    user = next(line for line in lines if line.startswith("USER "))
    assert not user.split()[1].startswith(("0", "root"))
    assert instructions.index("USER") > max(i for i, v in enumerate(instructions) if v == "RUN")
    assert f"EXPOSE {METRICS_PORT}" in lines
    assert 'ENTRYPOINT ["callgate"]' in lines
    assert 'CMD ["run"]' in lines
    # what it copies exists (the build context is the repository root)
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    env = " ".join(lines)
    assert f"CALLGATE_METRICS__PORT={METRICS_PORT}" in env
