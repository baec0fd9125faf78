"""`callgate schemas lint`: what a schema author should fix before a model ever sees the contract.

Rules (each finding names file, JSON Pointer into that file, rule and why):

* `strict-additional-properties`, `strict-required`: OpenAI strict mode (structured outputs)
  needs every object closed (`additionalProperties: false`) and every property required, an
  optional one said as `"type": ["T", "null"]`. Input schemas only: the model writes those.
* `enum-in-description`: allowed values listed in prose (`description`) but not in `enum`, so
  nothing enforces them.
* `money-as-number`: an amount, price or fee typed `number` (floats round); use an integer in
  minor units.
* `bare-timestamp`: a time-like field as a string with no `pattern` (callgate does not assert
  `format`) or as a number with no unit in its name (`_ms`, `_s`, ...).
* `no-version`: a tool whose file name carries no `.v<N>`.
* `unenforceable`: the schema would be refused at load by an engine (the reason says which).
* `no-changelog`: a domain folder without `CHANGELOG.md`.
* `idempotency-key-argument`: `x-callgate.idempotency_key_argument` names an argument the
  schema does not declare at its top level, or one that may be something else than a string
  (only a string is taken as the call's key: any other value leaves the call without one).
* `allowed-principals`: `x-callgate.allowed_principals` is not a list of distinct principal
  names (the contract would not load), or names none (every call of the tool is refused).
* `call-kind`: `x-callgate.call_kind` or a custom tool's `x-callgate.format` would be refused
  at load (an unknown kind, a Lark or unknown grammar syntax, a regex RE2 cannot compile).

A schema may silence rules on purpose with a root annotation
`"x-lint": {"ignore": ["<rule>", ...], "why": "<reason>"}`; `why` is required, and the
`unenforceable` rule cannot be silenced (`bad-suppression` otherwise).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.errors import SchemaLoadError
from worker.model import CallKind
from worker.schemas.drafts import Draft, draft_of, pointer, walk
from worker.schemas.grammars import input_check
from worker.schemas.registry import (
    OUTPUT_FILE,
    SCHEMA_FILE,
    TOOLS_FILE,
    call_kind_of,
    principals_problem,
    read_json,
)
from worker.schemas.vetting import ENGINES, vet

_MONEY = re.compile(r"(amount|price|cost|fee|total|balance|salary|payment)", re.IGNORECASE)
_TIME = re.compile(r"(^|_)(at|time|timestamp|date|datetime|on|ts|until|since|deadline)$|^when$")
_TIME_UNIT = re.compile(r"_(ms|s|sec|secs|seconds|us|ns|millis|epoch|minutes|min|hours|days)$")
_CHOICES = re.compile(
    r"\b(one of|either|possible values|allowed values|valid values|must be|can be)\b.*"
    r"(['\"`][^'\"`]+['\"`].*(,| or |\|).*['\"`][^'\"`]+['\"`])",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Finding:
    file: str
    pointer: str
    rule: str
    why: str

    def __str__(self) -> str:
        return f"{self.file}#{self.pointer or '/'}: {self.rule}: {self.why}"


def lint_path(target: Path) -> list[Finding]:
    """Every finding for a schema directory (or one schema / tools file)."""
    if target.is_file():
        return list(_lint_file(target))
    if not target.is_dir():
        raise SchemaLoadError(f"{target} is neither a schema directory nor a file")
    findings: list[Finding] = []
    for domain in sorted(p for p in target.iterdir() if p.is_dir()):
        files = sorted(domain.glob("*.json"))
        if files and not (domain / "CHANGELOG.md").is_file():
            findings.append(
                Finding(
                    str(domain), "", "no-changelog", "a domain records its versions in CHANGELOG.md"
                )
            )
        for path in files:
            findings.extend(_lint_file(path))
    for path in sorted(target.glob("*.tools.json")):
        findings.extend(_lint_file(path))
    return findings


def _lint_file(path: Path) -> Iterator[Finding]:
    file = str(path)
    name = path.name
    try:
        document = read_json(path)
    except SchemaLoadError as exc:
        yield Finding(file, "", "unreadable", str(exc).removeprefix(f"{file}: "))
        return
    if name.endswith(".tools.json"):
        match = TOOLS_FILE.match(name)
        if match is None or match["version"] is None:
            yield Finding(
                file,
                "",
                "no-version",
                "name the file <server>.v<N>.tools.json to version its tools",
            )
        tools = document.get("tools") if isinstance(document, dict) else document
        if isinstance(document, dict) and isinstance(document.get("result"), dict):
            tools = document["result"].get("tools")
        if isinstance(document, dict) and "inputSchema" in document:
            tools, base = [document], ""
        else:
            base = "/tools"
        for index, tool in enumerate(tools if isinstance(tools, list) else []):
            if not isinstance(tool, dict):
                continue
            at = f"{base}/{index}" if base else ""
            if isinstance(tool.get("inputSchema"), dict):
                yield from lint_schema(
                    tool["inputSchema"], file, f"{at}/inputSchema", model_input=True
                )
            if isinstance(tool.get("outputSchema"), dict):
                yield from lint_schema(
                    tool["outputSchema"], file, f"{at}/outputSchema", model_input=False
                )
        return
    if not name.endswith(".schema.json"):
        return
    if OUTPUT_FILE.match(name):
        yield from lint_schema(document, file, "", model_input=False)
        return
    if not SCHEMA_FILE.match(name):
        yield Finding(file, "", "no-version", "name the file <tool>.v<N>.schema.json")
    yield from lint_schema(document, file, "", model_input=True)


def lint_schema(schema: Any, file: str, base: str, *, model_input: bool) -> Iterator[Finding]:
    """The findings for one schema; `base` is its JSON Pointer inside `file`."""
    ignored, problem = _suppressed(schema)
    if problem:
        yield Finding(file, f"{base}/x-lint", "bad-suppression", problem)
    for finding in _findings(schema, file, base, model_input=model_input):
        if finding.rule not in ignored:
            yield finding


def _suppressed(schema: Any) -> tuple[frozenset[str], str | None]:
    raw = schema.get("x-lint") if isinstance(schema, dict) else None
    if raw is None:
        return frozenset(), None
    if not isinstance(raw, dict) or not isinstance(raw.get("ignore"), list):
        return frozenset(), 'x-lint must be {"ignore": [rules], "why": "..."}'
    if not isinstance(raw.get("why"), str) or not raw["why"].strip():
        return frozenset(), "x-lint needs a `why` saying why the rules do not apply"
    rules = frozenset(str(rule) for rule in raw["ignore"])
    if "unenforceable" in rules:
        return rules - {"unenforceable"}, "`unenforceable` cannot be ignored"
    return rules, None


def _key_argument(schema: dict[str, Any], file: str, base: str) -> Iterator[Finding]:
    meta = schema.get("x-callgate")
    named = meta.get("idempotency_key_argument") if isinstance(meta, dict) else None
    if not isinstance(named, str):
        return  # absent, or refused at load (`contract_meta`)
    at = f"{base}/x-callgate/idempotency_key_argument"
    properties = schema.get("properties")
    declared = properties.get(named) if isinstance(properties, dict) else None
    if declared is None:
        yield Finding(
            file,
            at,
            "idempotency-key-argument",
            f"names {named!r}, which the schema does not declare in its top-level `properties`: "
            "no call would carry a key from it",
        )
    elif isinstance(declared, dict) and not _string_only(declared):
        yield Finding(
            file,
            at,
            "idempotency-key-argument",
            f"names {named!r}, which may be something else than a string or null (only a "
            "string is taken as the key)",
        )


def _allowed_principals(schema: dict[str, Any], file: str, base: str) -> Iterator[Finding]:
    meta = schema.get("x-callgate")
    if not isinstance(meta, dict) or "allowed_principals" not in meta:
        return
    named = meta["allowed_principals"]
    at = f"{base}/x-callgate/allowed_principals"
    problem = principals_problem(named)
    if problem is not None:
        yield Finding(file, at, "allowed-principals", f"{problem}: the contract would not load")
    elif not named:
        yield Finding(
            file,
            at,
            "allowed-principals",
            "names no principal: every call of this tool is refused (remove the list to let "
            "every principal call it)",
        )


def _call_kind(schema: dict[str, Any], file: str, base: str) -> Iterator[Finding]:
    meta = schema.get("x-callgate")
    if not isinstance(meta, dict) or not {"call_kind", "format"} & set(meta):
        return
    try:
        if call_kind_of(meta, file) is CallKind.CUSTOM_TOOL_CALL:
            input_check(meta.get("format"), file)
    except SchemaLoadError as exc:
        reason = str(exc).removeprefix(f"{file}: ")
        yield Finding(file, f"{base}/x-callgate", "call-kind", f"{reason}; it would not load")


def _string_only(node: dict[str, Any]) -> bool:
    """Whether a property admits only strings (or null: a strict-mode optional one)."""
    types = _types(node)
    if types:
        return types <= {"string", "null"}
    return any(keyword in node for keyword in ("enum", "const", "$ref"))


def _findings(schema: Any, file: str, base: str, *, model_input: bool) -> Iterator[Finding]:
    if model_input and isinstance(schema, dict):
        yield from _key_argument(schema, file, base)
        yield from _allowed_principals(schema, file, base)
        yield from _call_kind(schema, file, base)
    for engine in ENGINES:
        try:
            vet(schema, file=file, engine=engine)
        except SchemaLoadError as exc:
            reason = str(exc).removeprefix(f"{file}: ")
            yield Finding(file, base, "unenforceable", f"{engine} would refuse it: {reason}")
    draft = draft_of(schema) or Draft.DRAFT2020_12
    for path, node in walk(schema, draft):
        at = base + pointer(path)
        if model_input and _is_object(node):
            yield from _strict(node, file, at)
        description = node.get("description")
        if (
            isinstance(description, str)
            and "enum" not in node
            and "const" not in node
            and _CHOICES.search(description)
        ):
            yield Finding(
                file,
                at,
                "enum-in-description",
                "the description lists allowed values that no `enum` enforces",
            )
        for prop, sub in (node.get("properties") or {}).items():
            if isinstance(sub, dict):
                yield from _field_rules(prop, sub, file, f"{at}/properties/{_esc(prop)}")


def _esc(token: str) -> str:
    return pointer([token])[1:]


def _types(node: dict[str, Any]) -> set[str]:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    return set(declared) if isinstance(declared, list) else set()


def _is_object(node: dict[str, Any]) -> bool:
    return "object" in _types(node) or "properties" in node


def _strict(node: dict[str, Any], file: str, at: str) -> Iterator[Finding]:
    if node.get("additionalProperties") is not False:
        yield Finding(
            file,
            at,
            "strict-additional-properties",
            "strict mode needs `additionalProperties: false` on every object",
        )
    required = set(node.get("required") or [])
    for prop in node.get("properties") or {}:
        if prop not in required:
            yield Finding(
                file,
                f"{at}/properties/{_esc(prop)}",
                "strict-required",
                f"property {prop!r} is not required; strict mode needs every property in "
                '`required`, an optional one typed ["T", "null"]',
            )


def _field_rules(name: str, node: dict[str, Any], file: str, at: str) -> Iterator[Finding]:
    types = _types(node)
    if _MONEY.search(name) and "number" in types:
        yield Finding(
            file,
            at,
            "money-as-number",
            "money as `number` rounds; use an integer amount in minor units (e.g. amount_minor)",
        )
    if _TIME.search(name.lower()):
        if "string" in types and "pattern" not in node:
            yield Finding(
                file,
                at,
                "bare-timestamp",
                "a timestamp string without `pattern` accepts any text (`format` is not "
                "asserted); add an RFC 3339 pattern with a time zone",
            )
        if types & {"integer", "number"} and not _TIME_UNIT.search(name):
            yield Finding(
                file,
                at,
                "bare-timestamp",
                "a numeric timestamp needs its unit in the name (e.g. created_at_ms)",
            )
