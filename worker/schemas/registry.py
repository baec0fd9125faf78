"""The schema registry: every contract under a directory, compiled once, looked up per call.

Layout: `DIR/<domain>/<tool>.v<N>.schema.json` is version N of tool `<tool>` (schema id
`<domain>.<tool>`); an MCP tool's result schema sits beside it as `<tool>.v<N>.output.schema.json`.
MCP `tools/list` output loads too: `DIR/<domain>/<server>[.v<N>].tools.json` (or directly under
`DIR`, domain `mcp`) holds a `tools/list` result (`{"tools": [...]}`, the JSON-RPC response around
it, or one tool object); each tool `T` becomes tool `<server>.T`, schema id `<domain>.<server>.T`,
judged by its `inputSchema`, its results by its `outputSchema`; a file without `.v<N>` is version 1.

A call names its tool by bare name or by schema id; without a version the newest one judges it.
Versions, in file names and in calls alike, are read by `worker.schemas.versions.parse_version`:
a version it cannot read is a load error in a file name and `unknown_schema_version` in a call.
Tool names are unique: a collision is refused at load. Loading is all or nothing: the first bad
file raises `SchemaLoadError` (or `UnsupportedKeywordError`) naming it, and no registry exists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from worker._native import EarlyRules, EarlySchema, ParseError, parse_json
from worker.errors import SchemaLoadError
from worker.model import CallKind, Code, SchemaRef
from worker.schemas.contract import (
    CONTRACT_KINDS,
    JUDGED_BY,
    MAX_DOCUMENT_DEPTH,
    Contract,
    ContractMeta,
    IdempotencyPolicy,
    LookupFailure,
    ViolationLimits,
)
from worker.schemas.drafts import declared_names, draft_of
from worker.schemas.engines import compile_check
from worker.schemas.grammars import input_check
from worker.schemas.versions import MAX_VERSION_DIGITS, parse_version
from worker.schemas.vetting import ENGINES, FASTJSONSCHEMA

_NAME = r"[A-Za-z0-9_\-]+"
SCHEMA_FILE = re.compile(rf"^(?P<tool>{_NAME})\.v(?P<version>[0-9]+)\.schema\.json$")
OUTPUT_FILE = re.compile(rf"^(?P<tool>{_NAME})\.v(?P<version>[0-9]+)\.output\.schema\.json$")
TOOLS_FILE = re.compile(rf"^(?P<server>{_NAME})(?:\.v(?P<version>[0-9]+))?\.tools\.json$")
MCP_DOMAIN = "mcp"
_META_KEYS = {
    "side_effects",
    "requires_approval",
    "idempotency",
    "idempotency_key_argument",
    "allowed_principals",
    "call_kind",
    "format",
}
#: the argument a custom tool's contract judges its text as: `{"input": <the text>}`
CUSTOM_INPUT = "input"


def principals_problem(value: Any) -> str | None:
    """What is wrong with an `x-callgate.allowed_principals` value (None: nothing). Both the
    load (`contract_meta`) and `callgate schemas lint` ask here."""
    if not isinstance(value, list) or not all(type(name) is str and name for name in value):
        return "must be a list of principal names (non-empty strings)"
    if len(set(value)) != len(value):
        return "names a principal twice"
    return None


def file_version(digits: str | None, file: str) -> str:
    """The canonical version a file name gives (no `.v<N>` at all: version 1)."""
    version = parse_version("1" if digits is None else digits)
    if version is None:
        raise SchemaLoadError(
            f"the version in the file name has more than {MAX_VERSION_DIGITS} digits", file=file
        )
    return version


def read_json(path: Path) -> Any:
    """A file's JSON, read as strictly as a call's arguments are (`worker._native.parse_json`:
    no key twice, every number by the rule for numbers), or `SchemaLoadError` naming the file and
    the JSON Pointer of what is wrong. So a schema's bounds, steps and constants are exact: a
    number the rule refuses (`maximum: 99999999999999999999`) never loads as a rounded double."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise SchemaLoadError(f"cannot be read: {exc.strerror}", file=str(path)) from None
    value = parse_json(text, MAX_DOCUMENT_DEPTH)
    if isinstance(value, ParseError):
        raise SchemaLoadError(
            f"is not strict JSON at {value.path or '/'}: {value.message} ({value.code})",
            file=str(path),
        )
    return value


def contract_meta(schema: Any, file: str) -> ContractMeta:
    """The `x-callgate` annotation, strictly: a misspelt key must not turn approval off."""
    raw = schema.get("x-callgate", {}) if isinstance(schema, dict) else {}
    if not isinstance(raw, dict):
        raise SchemaLoadError("x-callgate must be an object", file=file)
    unknown = set(raw) - _META_KEYS
    if unknown:
        raise SchemaLoadError(
            f"x-callgate has unknown keys {sorted(unknown)}; known: {sorted(_META_KEYS)}",
            file=file,
        )
    for key in ("side_effects", "requires_approval"):
        if not isinstance(raw.get(key, False), bool):
            raise SchemaLoadError(f"x-callgate.{key} must be true or false", file=file)
    try:
        idempotency = IdempotencyPolicy(raw.get("idempotency", "optional"))
    except ValueError:
        choices = [p.value for p in IdempotencyPolicy]
        raise SchemaLoadError(
            f"x-callgate.idempotency must be one of {choices}", file=file
        ) from None
    argument = raw.get("idempotency_key_argument")
    if argument is not None and (not isinstance(argument, str) or not argument):
        raise SchemaLoadError(
            "x-callgate.idempotency_key_argument must name a top-level argument", file=file
        )
    principals = raw.get("allowed_principals")
    if principals is not None:
        problem = principals_problem(principals)
        if problem is not None:
            raise SchemaLoadError(f"x-callgate.allowed_principals {problem}", file=file)
    kind = call_kind_of(raw, file)
    return ContractMeta(
        side_effects=raw.get("side_effects", False),
        requires_approval=raw.get("requires_approval", False),
        idempotency=idempotency,
        idempotency_key_argument=argument,
        allowed_principals=frozenset(principals) if principals is not None else None,
        call_kind=kind,
    )


def call_kind_of(raw: dict[str, Any], file: str) -> CallKind:
    """The kind of call an `x-callgate` annotation's contract judges, or `SchemaLoadError`
    (the load and `callgate schemas lint` ask here)."""
    kind = raw.get("call_kind", CallKind.FUNCTION_CALL.value)
    if kind not in CONTRACT_KINDS:
        raise SchemaLoadError(
            f"x-callgate.call_kind must be one of {sorted(CONTRACT_KINDS)} (a remote MCP "
            "tool's approval request is judged by the tool's function_call contract)",
            file=file,
        )
    if "format" in raw and kind != CallKind.CUSTOM_TOOL_CALL:
        raise SchemaLoadError(
            "x-callgate.format declares a custom tool's grammar: only a contract of "
            "call_kind custom_tool_call has one",
            file=file,
        )
    return CallKind(kind)


@dataclass(frozen=True, slots=True)
class SchemaSource:
    """One schema to compile: where it came from, what it judges, and the schema itself."""

    file: str
    tool: str
    schema_id: str
    version: str
    schema: Any
    output_schema: Any = None
    output_file: str | None = None


def contract_files(directory: Path) -> list[Path]:
    """The files of a contracts directory that its layout reads (each a contract, or one the
    loader refuses by name); raises `SchemaLoadError` when the directory does not exist."""
    if not directory.is_dir():
        raise SchemaLoadError(f"schema directory {directory} does not exist")
    nested = [
        p for p in directory.glob("*/*.json") if p.name.endswith((".schema.json", ".tools.json"))
    ]
    return sorted([*nested, *directory.glob("*.tools.json")])


def discover(directory: Path) -> list[SchemaSource]:
    """Every contract source under a directory, in a stable order (no compiling)."""
    if not directory.is_dir():
        raise SchemaLoadError(f"schema directory {directory} does not exist")
    sources: list[SchemaSource] = []
    outputs: dict[tuple[str, str, str], Path] = {}
    for path in sorted(directory.glob("*/*.json")):
        name, domain = path.name, path.parent.name
        if match := OUTPUT_FILE.match(name):
            outputs[(domain, match["tool"], file_version(match["version"], str(path)))] = path
        elif match := SCHEMA_FILE.match(name):
            schema = read_json(path)
            if not isinstance(schema, dict):
                raise SchemaLoadError("a schema must be a JSON object", file=str(path))
            tool, version = match["tool"], file_version(match["version"], str(path))
            sources.append(SchemaSource(str(path), tool, f"{domain}.{tool}", version, schema))
        elif match := TOOLS_FILE.match(name):
            sources.extend(_mcp_sources(path, domain, match))
        elif name.endswith(".schema.json"):
            raise SchemaLoadError(
                "a schema file is named <tool>.v<N>.schema.json (a tool with no version)",
                file=str(path),
            )
    for path in sorted(directory.glob("*.tools.json")):
        if match := TOOLS_FILE.match(path.name):
            sources.extend(_mcp_sources(path, MCP_DOMAIN, match))
    by_key = {(s.schema_id.split(".", 1)[0], s.tool, s.version): i for i, s in enumerate(sources)}
    for key, path in outputs.items():
        index = by_key.get(key)
        if index is None:
            raise SchemaLoadError(
                "an output schema needs its input schema beside it "
                f"({key[1]}.v{key[2]}.schema.json)",
                file=str(path),
            )
        source = sources[index]
        sources[index] = SchemaSource(
            source.file,
            source.tool,
            source.schema_id,
            source.version,
            source.schema,
            read_json(path),
            str(path),
        )
    return sources


def mcp_tools(document: Any) -> list[Any] | None:
    if isinstance(document, list):
        return document
    if not isinstance(document, dict):
        return None
    if isinstance(document.get("result"), dict):
        document = document["result"]
    if isinstance(document.get("tools"), list):
        return list(document["tools"])
    if "name" in document and "inputSchema" in document:
        return [document]
    return None


def _mcp_sources(path: Path, domain: str, match: re.Match[str]) -> Iterator[SchemaSource]:
    file = str(path)
    tools = mcp_tools(read_json(path))
    if tools is None:
        raise SchemaLoadError(
            'is not MCP tools/list output: expected {"tools": [...]} or a tool object', file=file
        )
    server, version = match["server"], file_version(match["version"], file)
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        where = f"{file}#/tools/{index}"
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise SchemaLoadError("an MCP tool needs a string 'name'", file=where)
        name = tool["name"]
        if not re.fullmatch(_NAME, name):
            raise SchemaLoadError(f"MCP tool name {name!r} is not [A-Za-z0-9_-]+", file=where)
        if name in seen:
            raise SchemaLoadError(f"MCP tool {name!r} is listed twice", file=where)
        seen.add(name)
        if not isinstance(tool.get("inputSchema"), dict):
            raise SchemaLoadError(f"MCP tool {name!r} needs an 'inputSchema' object", file=where)
        output = tool.get("outputSchema")
        if output is not None and not isinstance(output, dict):
            raise SchemaLoadError(
                f"MCP tool {name!r}: 'outputSchema' must be an object", file=where
            )
        yield SchemaSource(
            f"{file}#/tools/{index}/inputSchema",
            f"{server}.{name}",
            f"{domain}.{server}.{name}",
            version,
            tool["inputSchema"],
            output,
            f"{file}#/tools/{index}/outputSchema" if output is not None else None,
        )


def compile_source(source: SchemaSource, engine: str, limits: ViolationLimits) -> Contract:
    output_check = None
    if source.output_schema is not None:
        output_check = compile_check(
            source.output_schema,
            file=source.output_file or source.file,
            engine=engine,
            limits=limits,
        )
    meta = contract_meta(source.schema, source.file)
    declared = _declared(source.schema)
    grammar = None
    if meta.call_kind is CallKind.CUSTOM_TOOL_CALL:
        declared |= {CUSTOM_INPUT}
        grammar = input_check(source.schema["x-callgate"].get("format"), source.file)
    return Contract(
        tool=source.tool,
        ref=SchemaRef(source.schema_id, source.version),
        meta=meta,
        check=compile_check(source.schema, file=source.file, engine=engine, limits=limits),
        file=source.file,
        output_check=output_check,
        declared_names=declared,
        output_declared_names=_declared(source.output_schema),
        input_check=grammar,
        early=early_schema(source.schema, meta.call_kind),
    )


def early_schema(schema: Any, call_kind: CallKind) -> EarlySchema | None:
    """The contract's early rules (the core decides which keywords it can decide early), for
    the kinds of call it judges; none for a custom tool's, whose text is free-form, not JSON."""
    draft = draft_of(schema)
    if not isinstance(schema, dict) or draft is None or call_kind is CallKind.CUSTOM_TOOL_CALL:
        return None
    judges = sorted(kind for kind, judged_by in JUDGED_BY.items() if judged_by is call_kind)
    early = EarlySchema(orjson.dumps(schema), draft.value, judges)
    return early if early.decides_anything else None


def _declared(schema: Any) -> frozenset[str]:
    draft = draft_of(schema)  # vetted: a supported draft, or no schema at all
    return declared_names(schema, draft) if schema is not None and draft else frozenset()


@dataclass(frozen=True, slots=True)
class _ToolVersions:
    schema_id: str
    by_version: dict[str, Contract]
    newest: Contract


class SchemaRegistry:
    """Contracts by tool name and schema id; built once, read-only afterwards."""

    def __init__(self, contracts: Iterable[Contract], engine: str = FASTJSONSCHEMA) -> None:
        self.engine = engine
        grouped: dict[str, dict[str, Contract]] = {}
        for contract in contracts:
            versions = grouped.setdefault(contract.ref.id, {})
            if contract.ref.version in versions:
                raise SchemaLoadError(
                    f"{contract.ref.id} version {contract.ref.version} is defined twice "
                    f"(also in {versions[contract.ref.version].file})",
                    file=contract.file,
                )
            versions[contract.ref.version] = contract
        self._by_name: dict[str, _ToolVersions] = {}
        for schema_id, versions in grouped.items():
            newest = versions[max(versions, key=int)]
            entry = _ToolVersions(schema_id, versions, newest)
            for name in {schema_id, *(c.tool for c in versions.values())}:
                if name in self._by_name and self._by_name[name].schema_id != schema_id:
                    raise SchemaLoadError(
                        f"tool name {name!r} is defined by both {self._by_name[name].schema_id} "
                        f"and {schema_id}; tool names must be unique in a registry",
                        file=newest.file,
                    )
                self._by_name[name] = entry

    @classmethod
    def load(
        cls,
        directory: Path,
        engine: str = FASTJSONSCHEMA,
        *,
        limits: ViolationLimits,
    ) -> SchemaRegistry:
        """Compile every contract under `directory` with `engine`, or raise naming the culprit.
        `limits` bound what each check reports."""
        if engine not in ENGINES:
            raise SchemaLoadError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
        contracts = [compile_source(source, engine, limits) for source in discover(directory)]
        if not contracts:
            raise SchemaLoadError(f"no schemas found under {directory}")
        return cls(contracts, engine)

    def resolve(self, tool: str, version: str | int | None) -> Contract | LookupFailure:
        """The contract a call names; never raises, whatever the tool and version text."""
        entry = self._by_name.get(tool)
        if entry is None:
            return LookupFailure(Code.UNKNOWN_TOOL, "no contract is registered for this tool")
        if version is None:
            return entry.newest
        # a call usually names the version as the registry keys it; any other spelling is parsed
        contract = entry.by_version.get(version) if isinstance(version, str) else None
        if contract is None:
            wanted = parse_version(version)
            contract = entry.by_version.get(wanted) if wanted is not None else None
        if contract is None:
            return LookupFailure(
                Code.UNKNOWN_SCHEMA_VERSION,
                f"this tool has versions {sorted(entry.by_version, key=int)}",
            )
        return contract

    def early_rules(self, max_depth: int) -> EarlyRules:
        """The early rules of every (name, version) a call may name, resolved as `resolve`
        resolves them (`None`: a call that names no version gets the newest)."""
        entries: list[tuple[str, str | None, EarlySchema]] = []
        for name, entry in self._by_name.items():
            if entry.newest.early is not None:
                entries.append((name, None, entry.newest.early))
            for version, contract in entry.by_version.items():
                if contract.early is not None:
                    entries.append((name, version, contract.early))
        return EarlyRules(entries, max_depth)

    def tool_names(self) -> frozenset[str]:
        return frozenset(entry.newest.tool for entry in self._by_name.values())

    def tool_name(self, name: str) -> str | None:
        """The tool's own name for any name a call may use (bare name or schema id)."""
        entry = self._by_name.get(name)
        return entry.newest.tool if entry is not None else None

    def schema_id(self, name: str) -> str | None:
        """The schema id of the tool any name names (bare name or schema id)."""
        entry = self._by_name.get(name)
        return entry.schema_id if entry is not None else None

    def contracts(self) -> tuple[Contract, ...]:
        """Every loaded contract, each version once."""
        entries = {entry.schema_id: entry for entry in self._by_name.values()}
        return tuple(
            entries[sid].by_version[v]
            for sid in sorted(entries)
            for v in sorted(entries[sid].by_version, key=int)
        )
