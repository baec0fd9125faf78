"""`callgate schemas ...` through the real entry point (`python -m worker`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.datafiles import REPO

WEATHER = REPO / "schemas/weather"


def callgate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "schemas", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_lint_clean_and_dirty(tmp_path: Path) -> None:
    assert callgate("lint", REPO / "schemas").returncode == 0
    (tmp_path / "d").mkdir()
    (tmp_path / "d/t.v1.schema.json").write_text(
        json.dumps({"properties": {"price": {"type": "number"}}})
    )
    dirty = callgate("lint", tmp_path)
    assert dirty.returncode == 1
    assert f"{tmp_path / 'd/t.v1.schema.json'}#/properties/price: money-as-number:" in dirty.stdout
    assert callgate("lint", tmp_path / "missing").returncode == 2


def test_compat_exit_status_and_report() -> None:
    v1, v2 = WEATHER / "get_weather.v1.schema.json", WEATHER / "get_weather.v2.schema.json"
    same = callgate("compat", v1, v1, "--mode", "full")
    assert same.returncode == 0
    assert "compatible (full)" in same.stdout
    assert callgate("compat", v1, v2).returncode == 0
    breaking = callgate("compat", v1, v2, "--mode", "full")
    assert breaking.returncode == 1
    assert "[forward] /properties/days: property-removed" in breaking.stdout
    mcp = REPO / "schemas/mcp/weather.v1.tools.json"
    assert callgate("compat", mcp, mcp).returncode == 0


def test_test_runs_every_example_on_both_engines(tmp_path: Path) -> None:
    ok = callgate("test", REPO / "schemas")
    assert ok.returncode == 0, ok.stdout
    assert "fastjsonschema: " in ok.stdout
    assert "jsonschema-rs: " in ok.stdout
    (tmp_path / "d/examples/t.v1/valid").mkdir(parents=True)
    (tmp_path / "d/examples/t.v1/invalid").mkdir(parents=True)
    (tmp_path / "d/t.v1.schema.json").write_text(json.dumps({"required": ["a"]}))
    (tmp_path / "d/examples/t.v1/valid/x.json").write_text("{}")
    (tmp_path / "d/examples/t.v1/invalid/y.json").write_text("{}")
    bad = callgate("test", tmp_path, "--engine", "jsonschema-rs")
    assert bad.returncode == 1
    assert "FAIL" in bad.stdout
    assert "/a required" in bad.stdout


def test_lint_and_test_refuse_a_directory_without_contracts(tmp_path: Path) -> None:
    empty = tmp_path / "contracts"
    empty.mkdir()
    (empty / "d").mkdir()
    (empty / "d" / "notes.json").write_text("{}")  # not a contract by its name
    for directory, says in ((empty, "no contracts in"), (tmp_path / "absent", "does not exist")):
        for command in ("lint", "test"):
            result = callgate(command, directory)
            assert result.returncode == 2, (command, directory, result.stdout)
            assert says in result.stderr, (command, result.stderr)
            assert "passed" not in result.stdout
            assert "finding(s)" not in result.stdout
