"""The two validation engines behind one interface: compile once, then report violations alike.

`compile_check(schema, file=..., engine=...)` vets the schema (`worker.schemas.vetting`), compiles
it with the chosen engine and returns a `CompiledCheck`. Both engines yield `Violation`s in one
format: JSON Pointer into the instance, the failed keyword, and a value-free message
(`worker.schemas.messages`). Neither fills defaults, asserts `format`, or fetches anything.

The hot path is the valid call: fastjsonschema's generated function (fast-fail) is
called directly and only a failure runs the second, collect-all compilation that builds the
violations; jsonschema-rs builds its validator once and runs `is_valid` before `iter_errors`.

fastjsonschema implements draft 7; a 2020-12 schema reaches it translated to the same meaning in
draft 7: `$ref` with siblings (an applicator beside them in 2020-12, alone in draft 7) is moved
into `allOf`, content annotations are dropped. What cannot be translated was refused by the
vetting.

No pattern is ever matched by Python's backtracking `re`. fastjsonschema's generated code looks
its compiled regexes up by key in the `REGEX_PATTERNS` global of the code generator's
`global_state`; callgate hands the generator a placeholder key for each pattern, and before the
code is executed replaces every entry with an RE2 matcher of the ECMA-262 pattern
(`worker.schemas.patterns.Re2Search`). A key callgate did not give, or generated code that names
`re`, refuses the load. jsonschema-rs receives each pattern rendered for the Rust `regex` crate
with the same meaning (`worker.schemas.patterns.translate`); violations quote the schema's own
pattern.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

import fastjsonschema
import jsonschema_rs
from fastjsonschema import draft07
from fastjsonschema.ref_resolver import RefResolver

from worker.errors import SchemaLoadError
from worker.model import Violation
from worker.schemas import patterns
from worker.schemas.contract import CompiledCheck
from worker.schemas.drafts import Draft, map_subschemas, pointer, schema_uri
from worker.schemas.messages import describe
from worker.schemas.vetting import JSONSCHEMA_RS, vet

Path = list[str | int]

#: Siblings of `$ref` that draft 7 may ignore without changing a verdict.
_PASSIVE = frozenset(
    {"title", "description", "default", "examples", "$comment", "readOnly", "writeOnly"}
    | {"deprecated", "format"}
)
_CONTENT = ("contentMediaType", "contentEncoding", "contentSchema")


def compile_check(schema: Any, *, file: str, engine: str) -> CompiledCheck:
    """Vet and compile one schema; raises `SchemaLoadError` (never returns a half-built check)."""
    draft = vet(schema, file=file, engine=engine).draft
    if engine == JSONSCHEMA_RS:
        return _compile_rs(schema, draft, file)
    return _compile_fastjsonschema(schema, draft, file)


# --- fastjsonschema ---------------------------------------------------------------------------


class _RemoteRefused(Exception):
    pass


def _refuse(uri: str) -> Any:
    raise _RemoteRefused(uri)


class _NoFetch(dict[str, Callable[[str], Any]]):
    """A handler for every URI scheme, each refusing: fastjsonschema never opens a URL."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> Callable[[str], Any]:
        return _refuse


#: fastjsonschema's draft-7 code generator (the library's own class; untyped)
_GENERATOR: Any = draft07.CodeGeneratorDraft07
#: fastjsonschema's key for the n-th pattern: a valid Python regex that is never used to match.
_PLACEHOLDER = "callgate-pattern-{}"


class _Matchers(dict[str, patterns.Re2Search]):
    """Placeholder key -> RE2 matcher of the schema's pattern, filled while translating."""

    def key_for(self, pattern: str) -> str:
        for key, matcher in self.items():
            if matcher.pattern == pattern:
                return key
        key = _PLACEHOLDER.format(len(self))
        self[key] = patterns.Re2Search(pattern)
        return key

    def original(self, key: Any) -> Any:
        """The schema's pattern behind a placeholder (anything else unchanged)."""
        matcher = self.get(key) if isinstance(key, str) else None
        return matcher.pattern if matcher is not None else key


def _translate(schema: Any, draft: Draft, matchers: _Matchers) -> Any:
    def prepare(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = map_subschemas(node, draft, prepare)
        if isinstance(out.get("pattern"), str):
            out["pattern"] = matchers.key_for(out["pattern"])
        if isinstance(out.get("patternProperties"), dict):
            out["patternProperties"] = {
                matchers.key_for(name): sub for name, sub in out["patternProperties"].items()
            }
        if draft is Draft.DRAFT2020_12:
            for keyword in _CONTENT:
                out.pop(keyword, None)
            _to_draft7_arrays_and_dependencies(out)
            if "$ref" in out and any(k not in _PASSIVE and k != "$ref" for k in out):
                ref = out.pop("$ref")
                out["allOf"] = [*out.get("allOf", []), {"$ref": ref}]
        if "$ref" not in out and "required" in out and not out.get("additionalProperties", True):
            # fastjsonschema's generator matches `required` names against the (placeholder)
            # patterns with Python's re when additionalProperties is false or {}: beside it,
            # `required` means the same inside `allOf`, where that check does not run
            out["allOf"] = [*out.get("allOf", []), {"required": out.pop("required")}]
        return out

    translated = prepare(schema)
    if draft is Draft.DRAFT2020_12 and isinstance(translated, dict):
        translated["$schema"] = schema_uri(Draft.DRAFT7)
    return translated


def _to_draft7_arrays_and_dependencies(node: dict[str, Any]) -> None:
    """2020-12 `prefixItems`+`items` is draft 7 `items` (array)+`additionalItems`; 2020-12
    `dependentRequired`/`dependentSchemas` are the two forms of draft 7 `dependencies`."""
    if "prefixItems" in node:
        node["items"], rest = node.pop("prefixItems"), node.get("items")
        if rest is None:
            node.pop("additionalItems", None)
        else:
            node["additionalItems"] = rest
    dependencies: dict[str, Any] = {}
    dependencies.update(node.pop("dependentRequired", {}))
    for name, schema in node.pop("dependentSchemas", {}).items():
        if name in dependencies:
            schema = {"allOf": [{"required": dependencies[name]}, schema]}  # noqa: PLW2901
        dependencies[name] = schema
    if dependencies:
        node["dependencies"] = dependencies


def _compile_fastjsonschema(schema: Any, draft: Draft, file: str) -> CompiledCheck:
    matchers = _Matchers()
    translated = _translate(schema, draft, matchers)
    fast = _fastjsonschema_function(translated, matchers, file, fast_fail=True)
    full = _fastjsonschema_function(translated, matchers, file, fast_fail=False)
    invalid = fastjsonschema.JsonSchemaValueException

    def check(instance: Any) -> tuple[Violation, ...]:
        try:
            fast(instance)
        except invalid:
            return _fastjsonschema_violations(full, instance, matchers)
        return ()

    return check


def _fastjsonschema_function(
    definition: Any, matchers: _Matchers, file: str, *, fast_fail: bool
) -> Callable[[Any], Any]:
    """fastjsonschema's validation function for `definition`, its patterns matched by RE2.

    The steps of `fastjsonschema.compile`, with the regexes swapped before the code runs."""
    try:
        resolver = RefResolver.from_schema(definition, handlers=_NoFetch(), store={})
        generator = _GENERATOR(
            definition,
            resolver=resolver,
            formats={},
            use_default=False,
            use_formats=False,
            detailed_exceptions=True,
            fast_fail=fast_fail,
        )
        state = generator.global_state  # generates the code; holds REGEX_PATTERNS
        code = compile(generator.func_code, "<fastjsonschema>", "exec")
    except _RemoteRefused as exc:
        raise SchemaLoadError(
            f"$ref to {exc} would need fetching; remote references are never fetched", file=file
        ) from None
    except Exception as exc:  # fastjsonschema's code generator raises many kinds
        raise SchemaLoadError(f"fastjsonschema cannot compile it: {exc}", file=file) from None
    unknown = set(state["REGEX_PATTERNS"]) - set(matchers)
    if unknown or "re" in _names(code):
        raise SchemaLoadError(
            "fastjsonschema generated code that would match with Python's re; refusing it",
            file=file,
        )
    state["REGEX_PATTERNS"] = {key: matchers[key] for key in state["REGEX_PATTERNS"]}
    del state["re"]
    exec(code, state)
    function: Callable[[Any], Any] = state[resolver.get_scope_name()]
    return function


def _names(code: CodeType) -> Iterator[str]:
    """Every global or attribute name the code (and the functions it defines) uses."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from _names(constant)


def _fastjsonschema_violations(
    full: Callable[[Any], Any], instance: Any, matchers: _Matchers
) -> tuple[Violation, ...]:
    try:
        full(instance)
    except fastjsonschema.JsonSchemaValuesException as exc:
        errors = list(exc.errors)
    except fastjsonschema.JsonSchemaValueException as exc:
        errors = [exc]
    else:
        errors = []
    found: list[Violation] = []
    for error in errors:
        found.extend(_from_fastjsonschema(error, instance, matchers))
    return tuple(found) or (Violation("", "schema", "does not match the schema"),)


def _from_fastjsonschema(error: Any, instance: Any, matchers: _Matchers) -> list[Violation]:
    path = _fastjsonschema_path(str(error.name or "data"), instance)
    keyword = str(error.rule) if error.rule else "false"
    param = matchers.original(error.rule_definition)
    value = error.value
    if keyword == "required" and isinstance(param, list) and isinstance(value, dict):
        return [
            Violation(pointer([*path, name]), "required", describe("required", name))
            for name in param
            if name not in value
        ]
    if keyword == "additionalProperties" and isinstance(value, dict):
        definition = error.definition if isinstance(error.definition, dict) else {}
        extras = _extra_properties(value, definition, matchers)
        if extras:
            message = describe("additionalProperties")
            return [Violation(pointer([*path, name]), keyword, message) for name in extras]
    return [Violation(pointer(path), keyword, describe(keyword, param))]


def _extra_properties(
    value: dict[str, Any], definition: dict[str, Any], matchers: _Matchers
) -> list[str]:
    known = definition.get("properties", {})
    regexes = [matchers[p] for p in definition.get("patternProperties", {})]
    return [
        name
        for name in value
        if name not in known and not any(regex.search(name) for regex in regexes)
    ]


def _fastjsonschema_path(name: str, instance: Any) -> Path:
    """fastjsonschema names a place `data.key[0].other`; a key may itself hold `.` or `[`, so the
    name is read against the instance, taking the longest key that fits."""
    rest = name.removeprefix("data")
    node = instance
    tokens: Path = []
    while rest:
        if rest[0] == "[" and isinstance(node, list) and "]" in rest:
            end = rest.index("]")
            index = rest[1:end]
            if index.isdigit() and int(index) < len(node):
                tokens.append(int(index))
                node = node[int(index)]
                rest = rest[end + 1 :]
                continue
        if rest[0] == "." and isinstance(node, dict):
            tail = rest[1:]
            fits = [
                key
                for key in node
                if tail.startswith(key) and (len(tail) == len(key) or tail[len(key)] in ".[")
            ]
            if fits:
                key = max(fits, key=len)
                tokens.append(key)
                node = node[key]
                rest = tail[len(key) :]
                continue
        tokens.extend(part for part in re.split(r"[.\[\]]+", rest) if part)
        break
    return tokens


# --- jsonschema-rs ----------------------------------------------------------------------------


def _rust_patterns(schema: Any, draft: Draft, originals: dict[str, str]) -> Any:
    """The schema with every pattern rendered for the Rust `regex` crate (ECMA-262 meaning);
    `originals` maps each rendering back to the schema's pattern, for messages."""

    def render(pattern: str) -> str:
        rendered = patterns.translate(pattern).rust
        originals[rendered] = pattern
        return rendered

    def prepare(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = map_subschemas(node, draft, prepare)
        if isinstance(out.get("pattern"), str):
            out["pattern"] = render(out["pattern"])
        if isinstance(out.get("patternProperties"), dict):
            out["patternProperties"] = {
                render(name): sub for name, sub in out["patternProperties"].items()
            }
        return out

    return prepare(schema)


def _compile_rs(schema: Any, draft: Draft, file: str) -> CompiledCheck:
    originals: dict[str, str] = {}
    schema = _rust_patterns(schema, draft, originals)
    cls = (
        jsonschema_rs.Draft7Validator
        if draft is Draft.DRAFT7
        else jsonschema_rs.Draft202012Validator
    )
    try:
        validator = cls(
            schema,
            validate_formats=False,
            offline=True,  # no retrieval of any URI, ever
            pattern_options=jsonschema_rs.RegexOptions(),  # linear-time matching
        )
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SchemaLoadError(f"jsonschema-rs cannot compile it: {first}", file=file) from None
    is_valid = validator.is_valid
    iter_errors = validator.iter_errors

    def check(instance: Any) -> tuple[Violation, ...]:
        if is_valid(instance):
            return ()
        found: list[Violation] = []
        for error in iter_errors(instance):
            found.extend(_from_rs(error, originals))
        return tuple(found) or (Violation("", "schema", "does not match the schema"),)

    return check


_RS_KEYWORDS = {
    "falseSchema": "false",
    "oneOfNotValid": "oneOf",
    "oneOfMultipleValid": "oneOf",
}


def _from_rs(error: Any, originals: dict[str, str]) -> list[Violation]:
    kind = error.kind
    keyword = _RS_KEYWORDS.get(kind.name, kind.name)
    details = kind.as_dict()
    path: Path = list(error.instance_path)
    if keyword == "required":
        name = details.get("property")
        return [Violation(pointer([*path, str(name)]), keyword, describe(keyword, name))]
    if keyword in ("additionalProperties", "unevaluatedProperties") and details.get("unexpected"):
        message = describe(keyword)
        return [
            Violation(pointer([*path, str(name)]), keyword, message)
            for name in details["unexpected"]
        ]
    param = _rs_param(error, keyword, details)
    if keyword == "pattern":
        param = originals.get(param, param)
    return [Violation(pointer(path), keyword, describe(keyword, param))]


def _rs_param(error: Any, keyword: str, details: dict[str, Any]) -> Any:
    for field in ("types", "limit", "options", "expected_value", "pattern", "multiple_of"):
        if field in details:
            return details[field]
    return None
