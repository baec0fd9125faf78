"""`callgate schemas lint|compat|test`: the schema author's commands (wired into `worker.cli`).

Exit status: 0 clean / compatible / every example right; 1 findings / breaking changes / a wrong
example; 2 the input could not be read at all, or a contracts directory is missing or holds no
contract (nothing checked is never a pass). Findings go to stdout, one a line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from worker.compose import violation_limits
from worker.errors import SchemaLoadError
from worker.schemas import compat, examples, lint
from worker.schemas.registry import contract_files, mcp_tools, read_json
from worker.schemas.vetting import ENGINES
from worker.settings import load_settings

OK, FOUND, UNREADABLE = 0, 1, 2


def add_schemas_command(subparsers: Any) -> None:
    """Add `schemas` with its `lint`, `compat` and `test` sub-commands."""
    schemas = subparsers.add_parser("schemas", help="lint, compare and test tool contracts")
    commands = schemas.add_subparsers(dest="schemas_command", required=True)

    lint_parser = commands.add_parser("lint", help="strict-mode and contract-quality findings")
    lint_parser.add_argument("dir", type=Path, help="schema directory (or one schema file)")
    lint_parser.set_defaults(func=run_lint)

    compat_parser = commands.add_parser("compat", help="breaking changes between two versions")
    compat_parser.add_argument("old", type=Path)
    compat_parser.add_argument("new", type=Path)
    compat_parser.add_argument(
        "--mode", choices=[m.value for m in compat.Mode], default=compat.Mode.BACKWARD.value
    )
    compat_parser.add_argument(
        "--tool", help="in a tools/list file, the tool to compare (default: the only one)"
    )
    compat_parser.set_defaults(func=run_compat)

    test_parser = commands.add_parser("test", help="run every example against its schema")
    test_parser.add_argument("dir", type=Path)
    test_parser.add_argument("--engine", choices=[*ENGINES, "all"], default="all")
    test_parser.set_defaults(func=run_test)


def _require_contracts(directory: Path) -> None:
    """Raises `SchemaLoadError` for a contracts directory that is missing or holds none."""
    if not contract_files(directory):
        raise SchemaLoadError(
            f"no contracts in {directory} (expected <domain>/<tool>.v<N>.schema.json or "
            "<server>.tools.json files)"
        )


def run_lint(args: argparse.Namespace) -> int:
    try:
        if not args.dir.is_file():
            _require_contracts(args.dir)
        findings = lint.lint_path(args.dir)
    except SchemaLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return UNREADABLE
    for finding in findings:
        print(finding)
    print(f"{len(findings)} finding(s) in {args.dir}")
    return FOUND if findings else OK


def _schema_of(path: Path, tool: str | None) -> Any:
    document = read_json(path)
    if not path.name.endswith(".tools.json"):
        return document
    tools = mcp_tools(document) or []
    chosen = [t for t in tools if isinstance(t, dict) and (tool is None or t.get("name") == tool)]
    if len(chosen) != 1:
        names = [t.get("name") for t in tools if isinstance(t, dict)]
        raise SchemaLoadError(f"name one tool with --tool (tools: {names})", file=str(path))
    return chosen[0].get("inputSchema")


def run_compat(args: argparse.Namespace) -> int:
    mode = compat.Mode(args.mode)
    try:
        changes = compat.compare(
            _schema_of(args.old, args.tool), _schema_of(args.new, args.tool), mode
        )
    except SchemaLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return UNREADABLE
    if not changes:
        print(f"compatible ({mode}): {args.new} against {args.old}")
        return OK
    print(
        f"incompatible ({mode}): {len(changes)} breaking change(s), {args.new} against {args.old}"
    )
    for change in changes:
        print(f"  {change}")
    return FOUND


def run_test(args: argparse.Namespace) -> int:
    try:
        _require_contracts(args.dir)
    except SchemaLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return UNREADABLE
    engines = ENGINES if args.engine == "all" else (args.engine,)
    status = OK
    for engine in engines:
        run = examples.run(args.dir, engine, violation_limits(load_settings().limits))
        for problem in run.problems:
            print(f"{engine}: problem: {problem}")
        wrong = [r for r in run.results if not r.passed]
        for result in wrong:
            expected = "valid" if result.example.expect_valid else "invalid"
            detail = "; ".join(
                f"{v.path or '/'} {v.keyword}: {v.message}" for v in result.violations
            )
            print(
                f"{engine}: FAIL {result.example.file}: expected {expected} against "
                f"{result.example.schema_file}" + (f" ({detail})" if detail else " (accepted)")
            )
        print(f"{engine}: {len(run.results) - len(wrong)} passed, {len(wrong)} failed")
        if not run.ok:
            status = FOUND
    return status
