"""Every contract's examples, run against it: valid ones must pass, invalid ones must fail.

Layout, beside the contracts of a domain: `<domain>/examples/<tool>.v<N>/{valid,invalid}/*.json`
for the input schema and `<domain>/examples/<tool>.v<N>.output/{valid,invalid}/*.json` for an
output schema (MCP tools: `<tool>` is `<server>.<name>`). Each example file holds one instance.
A contract without both a valid and an invalid example, or an examples folder that names no
contract, is a problem too: examples only protect a contract when they are there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.errors import SchemaLoadError
from worker.model import Violation
from worker.schemas.contract import CompiledCheck, ViolationLimits
from worker.schemas.engines import compile_check
from worker.schemas.registry import SchemaSource, discover, read_json


@dataclass(frozen=True, slots=True)
class Example:
    file: Path
    schema_file: str
    expect_valid: bool


@dataclass(frozen=True, slots=True)
class ExampleResult:
    example: Example
    violations: tuple[Violation, ...]

    @property
    def passed(self) -> bool:
        return (not self.violations) == self.example.expect_valid


@dataclass(frozen=True, slots=True)
class ExampleRun:
    results: tuple[ExampleResult, ...]
    problems: tuple[str, ...]  # "file: why" for what could not be run or is missing

    @property
    def ok(self) -> bool:
        return not self.problems and all(result.passed for result in self.results)


def _domain_dir(source: SchemaSource) -> Path:
    return Path(source.file.split("#", 1)[0]).parent


def _targets(source: SchemaSource) -> list[tuple[str, Any, str]]:
    """(examples folder name, schema, schema file) for a source's input and output schemas."""
    name = f"{source.tool}.v{source.version}"
    targets = [(name, source.schema, source.file)]
    if source.output_schema is not None:
        targets.append((name + ".output", source.output_schema, source.output_file or source.file))
    return targets


def collect(directory: Path) -> tuple[list[tuple[Example, Any]], list[str]]:
    """Every example with its schema, and the problems found on the way (no compiling)."""
    examples: list[tuple[Example, Any]] = []
    problems: list[str] = []
    claimed: set[Path] = set()
    for source in discover(directory):
        for name, schema, schema_file in _targets(source):
            folder = _domain_dir(source) / "examples" / name
            claimed.add(folder)
            for kind in ("valid", "invalid"):
                files = sorted((folder / kind).glob("*.json"))
                if not files:
                    problems.append(f"{folder / kind}: no {kind} example for {schema_file}")
                examples.extend((Example(f, schema_file, kind == "valid"), schema) for f in files)
    for folder in sorted(directory.glob("*/examples/*")):
        if folder.is_dir() and folder not in claimed:
            problems.append(f"{folder}: names no contract (expected <tool>.v<N>[.output])")
    return examples, problems


def run(directory: Path, engine: str, limits: ViolationLimits) -> ExampleRun:
    """Compile each schema once with `engine` and check every example against it."""
    try:
        examples, problems = collect(directory)
    except SchemaLoadError as exc:
        return ExampleRun((), (str(exc),))
    checks: dict[str, CompiledCheck] = {}
    results: list[ExampleResult] = []
    for example, schema in examples:
        try:
            if example.schema_file not in checks:
                checks[example.schema_file] = compile_check(
                    schema, file=example.schema_file, engine=engine, limits=limits
                )
            instance = read_json(example.file)
        except SchemaLoadError as exc:
            if str(exc) not in problems:
                problems.append(str(exc))
            continue
        results.append(ExampleResult(example, checks[example.schema_file](instance)))
    return ExampleRun(tuple(results), tuple(problems))
