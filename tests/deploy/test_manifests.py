"""deploy/: compose, Kubernetes manifests and Dockerfile parse, agree with each other and with the
settings' defaults (no cluster and no docker here, so this is what can be checked)."""

from __future__ import annotations

import fnmatch
import itertools
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from tests.deploy.prometheus_helpers import DEPLOY, ROOT
from worker.compose import build_registry, tool_labels
from worker.plugins import CONTRACT_PLUGINS
from worker.schemas.registry import contract_files
from worker.settings import MetricsSettings, Settings

K8S = DEPLOY / "k8s"
METRICS_PORT = MetricsSettings().port


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


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


KUSTOMIZE_TIMEOUT_S = 1500  # the first test to ask may build kustomize (see tests/conftest.py)


@pytest.fixture(scope="module")
def rendered(kustomize: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """`kustomize build deploy/k8s` as `kubectl apply -k` applies it: (kind, name) -> object."""
    result = subprocess.run(
        [str(kustomize), "build", str(K8S)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    objects = {}
    for doc in yaml.safe_load_all(result.stdout):
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in objects, key
        objects[key] = doc
    return objects


def one(rendered: dict[tuple[str, str], dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [doc for (k, _), doc in rendered.items() if k == kind]
    return found


def test_the_generated_manifests_are_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(K8S / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.timeout(KUSTOMIZE_TIMEOUT_S)
def test_kustomize_renders_every_manifest_into_the_namespace(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    patches = {patch["path"] for patch in kustomization["patches"]}
    assert set(kustomization["resources"]) | patches == present
    kinds = {kind for kind, _ in rendered}
    assert kinds == {
        "Namespace",
        "ConfigMap",
        "Job",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ServiceMonitor",
    }
    for (kind, name), doc in rendered.items():
        if kind != "Namespace":
            assert doc["metadata"]["namespace"] == "callgate", (kind, name)
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "callgate", (kind, name)


@pytest.mark.timeout(KUSTOMIZE_TIMEOUT_S)
def test_deployment_probes_ports_and_resources(
    rendered: dict[tuple[str, str], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = one(rendered, "Deployment")
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
    (env_from,) = container["envFrom"]
    settings_env = rendered[("ConfigMap", env_from["configMapRef"]["name"])]["data"]
    for extra in container.get("env", []):
        setting_field(extra["name"])
    settings = assert_valid_settings(settings_env, monkeypatch)
    assert settings.metrics.port == METRICS_PORT
    # the internal topics hold state: replicated as a production cluster's topics are
    assert settings.topics.replication_factor == 3
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.shutdown_grace_s
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "schemas"]
    assert mount["mountPath"] == str(settings.schemas.dir)


@pytest.mark.timeout(KUSTOMIZE_TIMEOUT_S)
def test_the_mounted_contracts_are_schemas_and_load_as_the_worker_loads_them(
    rendered: dict[tuple[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    """The pod's contracts directory, laid out as the kubelet would mount the rendered volume,
    holds every file of schemas/ the worker loads, byte for byte, and loads to the same tools
    and plugins; the pod template carries their digest, so a changed contract rolls the pods."""
    pod = one(rendered, "Deployment")["spec"]["template"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "schemas"]
    data = rendered[("ConfigMap", volume["configMap"]["name"])]["data"]
    items = {item["key"]: item["path"] for item in volume["configMap"]["items"]}
    assert set(items) == set(data)
    for key, path in items.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(data[key], encoding="utf-8")
    shipped = sorted(
        str(path.relative_to(ROOT / "schemas"))
        for path in [*contract_files(ROOT / "schemas"), ROOT / "schemas" / CONTRACT_PLUGINS]
    )
    assert sorted(items.values()) == shipped
    for path in shipped:
        assert (tmp_path / path).read_bytes() == (ROOT / "schemas" / path).read_bytes(), path
    mounted = build_registry(Settings(schemas={"dir": tmp_path}))
    repository = build_registry(Settings(schemas={"dir": ROOT / "schemas"}))
    assert tool_labels(mounted) == tool_labels(repository)
    assert len(tool_labels(mounted)) >= 4
    annotation = pod["metadata"]["annotations"]["callgate.dev/contracts-sha256"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotation)


@pytest.mark.timeout(KUSTOMIZE_TIMEOUT_S)
def test_the_topics_job_runs_callgate_topics_create_with_the_workers_settings(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    job = one(rendered, "Job")["spec"]["template"]["spec"]
    (container,) = job["containers"]
    (worker,) = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"][:2] == ["topics", "create"]
    assert container["image"] == worker["image"]
    assert container["envFrom"] == worker["envFrom"]
    assert job["restartPolicy"] == "OnFailure"
    assert job["securityContext"]["runAsNonRoot"] is True


@pytest.mark.timeout(KUSTOMIZE_TIMEOUT_S)
def test_service_servicemonitor_and_pdb_select_the_workers(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    pod_labels = one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service = one(rendered, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", METRICS_PORT, "metrics")
    monitor = one(rendered, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    # job label = the Service's app.kubernetes.io/name = "callgate", the job the alerts use
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "callgate"
    pdb = one(rendered, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


def test_one_kafka_version_named_once() -> None:
    """deploy/.env names it; compose's broker image and the tests' jars both read it there."""
    (line,) = [
        line for line in (DEPLOY / ".env").read_text().splitlines() if line.startswith("KAFKA_")
    ]
    version = line.removeprefix("KAFKA_VERSION=")
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), line
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert compose["services"]["kafka"]["image"] == "apache/kafka:${KAFKA_VERSION}"
    pom = (ROOT / "tools" / "kafka" / "pom.xml").read_text()
    assert "<kafka.version>" not in pom  # the fetch script passes it from deploy/.env
    named = [
        str(path.relative_to(ROOT))
        for path in [*DEPLOY.rglob("*"), *(ROOT / "tools").rglob("*")]
        if path.is_file() and path.name != ".env" and version in path.read_text(errors="ignore")
    ]
    assert named == [], f"{version} named again in {named}"


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


def _manifest(crate: Path) -> dict[str, Any]:
    """The Cargo manifest of the crate at `crate` (relative to the repository's root)."""
    return tomllib.loads((ROOT / crate / "Cargo.toml").read_text())


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
    maturin = pyproject["tool"]["maturin"]
    # the crate maturin builds (the Python face) and the crates it is made of (the pure core)
    face = Path(maturin["manifest-path"]).parent
    crates = [face] + [
        Path(os.path.normpath(face / dependency["path"]))
        for dependency in _manifest(face)["dependencies"].values()
        if isinstance(dependency, dict) and "path" in dependency
    ]
    assert len(crates) == 2, crates
    for crate in crates:
        assert version(match[1]) >= version(_manifest(crate)["package"]["rust-version"]), crate
    copies = build.all("COPY")
    assert "--from=rust /usr/local/rustup /usr/local/rustup" in copies
    assert "--from=rust /usr/local/cargo /usr/local/cargo" in copies

    # maturin as pyproject's build system pins it; the lock file enforced; release profile
    (requirement,) = pyproject["build-system"]["requires"]
    runs = " ".join(build.all("RUN"))
    assert f'pip install "{requirement}"' in runs
    assert re.search(r"maturin build --release --locked .*--out /wheels", runs)
    # the wheels of the worker's dependencies and of the `otel` extra's, which the image installs
    assert 'pip wheel --wheel-dir /wheels "$(echo /wheels/callgate-*.whl)[otel]"' in runs

    # what the wheel is made of is copied, and exists (the context is the repository root)
    sources = {
        source for line in copies if not line.startswith("--from=") for source in line.split()[:-1]
    }
    needed = {
        "pyproject.toml",
        "README.md",
        "Cargo.toml",
        "Cargo.lock",
        *(str(crate) for crate in crates),
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
    # the worker's own dependencies and tracing's, which is turned on by the environment alone:
    # no demo (embedded broker) or dev extra
    assert 'pip install --no-index --find-links /wheels "callgate[otel]" ' in install + " "
    assert re.findall(r"callgate\[[^\]]*\]", install) == ["callgate[otel]"]
    assert 'python -c "import worker._native"' in install


@pytest.mark.timeout(KUSTOMIZE_TIMEOUT_S)
def test_dockerfile_runtime_runs_callgate_as_a_user_with_a_health_check(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    runtime = stage("runtime")
    names = [name for name, _ in runtime.instructions]
    (user,) = runtime.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit()
    assert int(uid) != 0
    assert gid.isdigit()
    assert int(gid) != 0
    assert names.index("USER") > max(i for i, name in enumerate(names) if name == "RUN")
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]
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
