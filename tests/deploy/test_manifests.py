"""deploy/: compose, Kubernetes manifests and Dockerfile parse, agree with each other and with the
settings' defaults (no cluster and no docker here, so this is what can be checked)."""

from __future__ import annotations

import fnmatch
import itertools
import os
import re
import tomllib
from dataclasses import dataclass
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
    assert settings.topics.replication_factor == 1  # the one broker of compose
    assert settings.metrics.port == METRICS_PORT
    # the image's entrypoint is `callgate`: the command is its arguments
    assert worker["command"] == ["run"]
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


def test_compose_makes_the_topics_with_callgate_before_the_workers() -> None:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    topics, worker = services["topics"], services["worker"]
    assert topics["command"][:2] == ["topics", "create"]
    assert topics["environment"] == worker["environment"]  # the settings the workers read
    assert topics["build"] == worker["build"]
    assert topics["image"] == worker["image"]
    assert topics["depends_on"] == {"kafka": {"condition": "service_healthy"}}
    assert worker["depends_on"] == {"topics": {"condition": "service_completed_successfully"}}


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
    # the internal topics hold state: replicated as a production cluster's topics are
    assert settings.topics.replication_factor == 3
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


def test_the_topics_job_runs_callgate_topics_create_with_the_workers_settings() -> None:
    objects = k8s_objects()
    job = objects["Job"]["spec"]["template"]["spec"]
    (container,) = job["containers"]
    (worker,) = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][:2] == ["topics", "create"]
    assert container["image"] == worker["image"]
    assert container["envFrom"] == worker["envFrom"]
    assert job["restartPolicy"] == "OnFailure"
    assert job["securityContext"]["runAsNonRoot"] is True


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

DOCKERFILE = DEPLOY / "Dockerfile"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]]  # (INSTRUCTION, arguments), continuations joined

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]


def dockerfile_stages() -> tuple[list[str], list[Stage]]:
    """The Dockerfile's leading comment lines (parser directives) and its stages."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    head = list(itertools.takewhile(lambda line: line.startswith("#"), text.splitlines()))
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        if instruction == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif instruction == "FROM":
            base, _, name = rest.partition(" AS ")
            for arg, default in args.items():
                base = base.replace("${" + arg + "}", default)
            stages.append(Stage(name.strip(), base.strip(), []))
        else:
            stages[-1].instructions.append((instruction, rest))
    return head, stages


def stage(name: str) -> Stage:
    (found,) = [s for s in dockerfile_stages()[1] if s.name == name]
    return found


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_dockerfile_builds_the_wheel_in_a_stage_with_rust_and_maturin() -> None:
    head, stages = dockerfile_stages()
    assert head[0] == "# syntax=docker/dockerfile:1"  # RUN --mount needs it
    assert [s.name for s in stages] == ["rust", "build", "runtime"]  # runtime: the default target
    build, runtime = stage("build"), stage("runtime")
    # one Python for the wheel and for the image: the wheel's ABI is the runtime's
    assert build.base == runtime.base
    assert re.fullmatch(r"python:3\.11-slim-bookworm", runtime.base)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == ">=3.11"

    # the Rust toolchain: new enough for the crate, from the same Debian release
    rust = stage("rust").base
    match = re.fullmatch(r"rust:(\d+\.\d+)-slim-bookworm", rust)
    assert match, rust
    crate = tomllib.loads((ROOT / "native" / "Cargo.toml").read_text())
    assert version(match[1]) >= version(crate["package"]["rust-version"])
    copies = build.all("COPY")
    assert "--from=rust /usr/local/rustup /usr/local/rustup" in copies
    assert "--from=rust /usr/local/cargo /usr/local/cargo" in copies

    # maturin as pyproject's build system pins it; the lock file enforced; release profile
    (requirement,) = pyproject["build-system"]["requires"]
    runs = " ".join(build.all("RUN"))
    assert f'pip install "{requirement}"' in runs
    assert re.search(r"maturin build --release --locked .*--out /wheels", runs)
    assert "pip wheel --wheel-dir /wheels /wheels/callgate-*.whl" in runs

    # what the wheel is made of is copied, and exists (the context is the repository root)
    sources = {
        source for line in copies if not line.startswith("--from=") for source in line.split()[:-1]
    }
    maturin = pyproject["tool"]["maturin"]
    needed = {
        "pyproject.toml",
        "README.md",
        "Cargo.toml",
        "Cargo.lock",
        str(Path(maturin["manifest-path"]).parent),
        *maturin["python-packages"],
    }
    assert sources == needed
    for source in sources:
        assert (ROOT / source).exists(), source


def test_dockerfile_runtime_has_the_wheel_only_and_no_build_tools() -> None:
    runtime = stage("runtime")
    text = " ".join(args for _, args in runtime.instructions)
    for tool in ("apt-get", "gcc", "cargo", "rustup", "rustc", "maturin", "build-essential"):
        assert tool not in text, tool
    # nothing from the build context or from the build stage lands in a layer: the wheels are
    # mounted for the one install step
    assert not runtime.all("COPY")
    assert not runtime.all("ADD")
    (install,) = [line for line in runtime.all("RUN") if "pip install" in line]
    assert install.startswith("--mount=type=bind,from=build,source=/wheels,target=/wheels ")
    assert "pip install --no-index --find-links /wheels callgate " in install + " "
    # the worker's own dependencies only: no demo (embedded broker) or dev extra
    assert not re.search(r"callgate\[", install)
    assert 'python -c "import worker._native"' in install


def test_dockerfile_runtime_runs_callgate_as_a_user_with_a_health_check() -> None:
    runtime = stage("runtime")
    names = [name for name, _ in runtime.instructions]
    (user,) = runtime.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit()
    assert int(uid) != 0
    assert gid.isdigit()
    assert int(gid) != 0
    assert names.index("USER") > max(i for i, name in enumerate(names) if name == "RUN")
    pod = k8s_objects()["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["securityContext"]["runAsGroup"] == int(gid)

    env = " ".join(runtime.all("ENV"))
    assert f"CALLGATE_METRICS__PORT={METRICS_PORT}" in env
    assert "CALLGATE_SCHEMAS__DIR=/srv/callgate/schemas" in env
    assert runtime.all("EXPOSE") == [str(METRICS_PORT)]
    (healthcheck,) = runtime.all("HEALTHCHECK")
    # liveness only: a worker waiting for a failing topic is alive, not restarted
    assert f"http://127.0.0.1:{METRICS_PORT}/healthz" in healthcheck
    assert "--interval=" in healthcheck
    assert healthcheck.split(" CMD ", 1)[1].startswith('["python", "-c",')
    assert runtime.all("STOPSIGNAL") == ["SIGTERM"]
    assert runtime.all("ENTRYPOINT") == ['["callgate"]']
    assert runtime.all("CMD") == ['["run"]']
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["callgate"] == "worker.cli:main"


def test_dockerignore_keeps_the_context_to_the_sources() -> None:
    patterns = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        return any(
            fnmatch.fnmatch(path, pattern) or path.startswith(pattern.rstrip("/") + "/")
            for pattern in patterns
        )

    for local in (".venv", ".git", "target", "native/fuzz", "worker/_native.cpython-311.so"):
        assert ignored(local), local
    for line in stage("build").all("COPY"):
        if not line.startswith("--from="):
            for source in line.split()[:-1]:
                assert not ignored(source), source
