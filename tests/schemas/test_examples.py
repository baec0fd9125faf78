"""Every example shipped in schemas/ is run against its contract, on both engines."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from tests.datafiles import SCHEMAS
from tests.support.contracts import run_examples
from worker.schemas import examples

ENGINES = ["fastjsonschema", "jsonschema-rs"]
FOUND, PROBLEMS = examples.collect(SCHEMAS)


@cache
def shipped_run(engine: str) -> examples.ExampleRun:
    return run_examples(SCHEMAS, engine)


def test_every_contract_has_valid_and_invalid_examples() -> None:
    assert PROBLEMS == []
    assert len(FOUND) >= 20


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "example", [e for e, _ in FOUND], ids=[str(e.file.relative_to(SCHEMAS)) for e, _ in FOUND]
)
def test_example_gets_the_verdict_its_folder_says(engine: str, example: examples.Example) -> None:
    result = next(r for r in shipped_run(engine).results if r.example == example)
    assert result.passed, (example.file, result.violations)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_wrong_example_is_caught(engine: str, tmp_path: Path) -> None:
    domain = tmp_path / "d"
    (domain / "examples/t.v1/valid").mkdir(parents=True)
    (domain / "examples/t.v1/invalid").mkdir(parents=True)
    (domain / "t.v1.schema.json").write_text(json.dumps({"type": "object", "required": ["a"]}))
    (domain / "examples/t.v1/valid/wrong.json").write_text("{}")
    (domain / "examples/t.v1/invalid/right.json").write_text("{}")
    (domain / "examples/t.v2").mkdir()
    run = run_examples(tmp_path, engine)
    assert not run.ok
    assert [r.example.file.name for r in run.results if not r.passed] == ["wrong.json"]
    assert any("t.v2" in p and "names no contract" in p for p in run.problems)
