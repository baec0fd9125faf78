"""The schema registry: every contract under a directory, compiled once, looked up per call.

Layout: `DIR/<domain>/<tool>.v<N>.schema.json` is version N of tool `<tool>` (schema id
`<domain>.<tool>`); an MCP tool's result schema sits beside it as `<tool>.v<N>.output.schema.json`.
A call names its tool by bare name or by schema id; without a version the newest one judges it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastjsonschema
import orjson

from worker.errors import SchemaLoadError
from worker.model import Code, SchemaRef, Violation
from worker.schemas.contract import (
    CompiledCheck,
    Contract,
    ContractMeta,
    IdempotencyPolicy,
    LookupFailure,
)

_SCHEMA_FILE = re.compile(r"^(?P<tool>[A-Za-z0-9_\-]+)\.v(?P<version>[0-9]+)\.schema\.json$")


def _pointer(path: list[str] | tuple[str, ...]) -> str:
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "".join("/" + p for p in parts)


def _compile_fastjsonschema(schema: dict[str, Any], file: str) -> CompiledCheck:
    try:
        validate = fastjsonschema.compile(schema, use_default=False)
    except fastjsonschema.JsonSchemaDefinitionException as exc:
        raise SchemaLoadError(f"does not compile: {exc}", file=file) from exc

    def check(instance: Any) -> tuple[Violation, ...]:
        try:
            validate(instance)
        except fastjsonschema.JsonSchemaValueException as exc:
            path = list(exc.path or [])[1:]  # the first element is the root name "data"
            return (Violation(_pointer(path), str(exc.rule or "schema"), str(exc.message)),)
        return ()

    return check


def _meta(schema: dict[str, Any], file: str) -> ContractMeta:
    raw = schema.get("x-callgate", {})
    if not isinstance(raw, dict):
        raise SchemaLoadError("x-callgate must be an object", file=file)
    try:
        return ContractMeta(
            side_effects=bool(raw.get("side_effects", False)),
            requires_approval=bool(raw.get("requires_approval", False)),
            idempotency=IdempotencyPolicy(raw.get("idempotency", "optional")),
        )
    except ValueError as exc:
        raise SchemaLoadError(f"x-callgate.idempotency: {exc}", file=file) from exc


@dataclass(frozen=True, slots=True)
class _ToolVersions:
    schema_id: str
    by_version: dict[str, Contract]
    newest: Contract


class SchemaRegistry:
    """Contracts by tool name and schema id; built once, read-only afterwards."""

    def __init__(self, contracts: list[Contract]) -> None:
        grouped: dict[str, dict[str, Contract]] = {}
        for contract in contracts:
            grouped.setdefault(contract.ref.id, {})[contract.ref.version] = contract
        self._by_name: dict[str, _ToolVersions] = {}
        for schema_id, versions in grouped.items():
            newest = versions[max(versions, key=int)]
            entry = _ToolVersions(schema_id, versions, newest)
            for name in {schema_id, newest.tool}:
                if name in self._by_name and self._by_name[name].schema_id != schema_id:
                    raise SchemaLoadError(
                        f"tool name {name!r} is defined by both {self._by_name[name].schema_id} "
                        f"and {schema_id}; tool names must be unique in a registry",
                        file=newest.file,
                    )
                self._by_name[name] = entry

    @classmethod
    def load(cls, directory: Path) -> SchemaRegistry:
        if not directory.is_dir():
            raise SchemaLoadError(f"schema directory {directory} does not exist")
        contracts = []
        for path in sorted(directory.glob("*/*.schema.json")):
            match = _SCHEMA_FILE.match(path.name)
            if match is None:
                continue
            file = str(path)
            try:
                schema = orjson.loads(path.read_bytes())
            except orjson.JSONDecodeError as exc:
                raise SchemaLoadError(f"is not JSON: {exc}", file=file) from exc
            if not isinstance(schema, dict):
                raise SchemaLoadError("a schema must be a JSON object", file=file)
            domain, tool = path.parent.name, match["tool"]
            contracts.append(
                Contract(
                    tool=tool,
                    ref=SchemaRef(f"{domain}.{tool}", match["version"]),
                    meta=_meta(schema, file),
                    check=_compile_fastjsonschema(schema, file),
                    file=file,
                )
            )
        if not contracts:
            raise SchemaLoadError(f"no schemas found under {directory}")
        return cls(contracts)

    def resolve(self, tool: str, version: str | None) -> Contract | LookupFailure:
        entry = self._by_name.get(tool)
        if entry is None:
            return LookupFailure(Code.UNKNOWN_TOOL, "no contract is registered for this tool")
        if version is None:
            return entry.newest
        contract = entry.by_version.get(version.removeprefix("v"))
        if contract is None:
            return LookupFailure(
                Code.UNKNOWN_SCHEMA_VERSION,
                f"this tool has versions {sorted(entry.by_version, key=int)}",
            )
        return contract

    def tool_names(self) -> frozenset[str]:
        return frozenset(entry.newest.tool for entry in self._by_name.values())
