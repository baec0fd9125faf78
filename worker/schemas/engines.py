"""The two validation engines behind one interface: compile once, then report violations alike.

`compile_check(schema, file=..., engine=..., limits=...)` vets the schema
(`worker.schemas.vetting`), compiles it with the chosen engine and returns a `CompiledCheck`.
Both engines yield `Violation`s in one format: JSON Pointer into the instance, the failed keyword,
and a value-free message (`worker.schemas.messages`), at most `limits.max_violations` of them,
each bounded in bytes. Neither fills defaults, asserts `format`, or fetches anything.

The hot path is the valid call, answered by one call into the engine: fastjsonschema's
generated fast-fail function, or jsonschema-rs's `is_valid`. Only a failed call looks for its
violations, and both engines find them the same bounded way: a jsonschema-rs validator of the
same vetted schema walked by `worker.schemas.report.Reporter`, which never computes more than
`max_violations`. On the fastjsonschema engine, fastjsonschema stays the verdict; should
jsonschema-rs find nothing wrong, the fast-fail exception's one error is the violation.

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

from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

import fastjsonschema
from fastjsonschema.ref_resolver import RefResolver

from worker.errors import SchemaLoadError
from worker.model import Violation
from worker.schemas import keywords, patterns, refs
from worker.schemas.contract import CompiledCheck, ViolationLimits
from worker.schemas.drafts import Draft, map_subschemas, schema_uri
from worker.schemas.messages import describe
from worker.schemas.report import Findings, Path, Reporter, bounded, rs_validator
from worker.schemas.vetting import JSONSCHEMA_RS, vet

#: Siblings of `$ref` that draft 7 may ignore without changing a verdict.
_PASSIVE = frozenset(
    {"title", "description", "default", "examples", "$comment", "readOnly", "writeOnly"}
    | {"deprecated", "format"}
)
_CONTENT = ("contentMediaType", "contentEncoding", "contentSchema")
_NO_MATCH = (Violation("", "schema", "does not match the schema"),)


def compile_check(schema: Any, *, file: str, engine: str, limits: ViolationLimits) -> CompiledCheck:
    """Vet and compile one schema; raises `SchemaLoadError` (never returns a half-built check)."""
    draft = vet(schema, file=file, engine=engine).draft
    reporter, root = _compile_reporter(schema, draft, file, limits)
    if engine == JSONSCHEMA_RS:
        is_valid = root.is_valid
        violations = reporter.violations

        def check_rs(instance: Any) -> tuple[Violation, ...]:
            if is_valid(instance):
                return ()
            return violations(instance, known_invalid=True) or _NO_MATCH

        return check_rs
    return _compile_fastjsonschema(schema, draft, file, reporter, limits)


# --- jsonschema-rs: the verdict of one engine, the violations of both -------------------------


def _compile_reporter(
    schema: Any, draft: Draft, file: str, limits: ViolationLimits
) -> tuple[Reporter, Any]:
    originals: dict[str, str] = {}
    rendered = rust_patterns(schema, draft, originals)
    try:
        root = rs_validator(rendered, draft)
    except Exception as exc:  # jsonschema-rs raises ValidationError, ReferencingError, ValueError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SchemaLoadError(f"jsonschema-rs cannot compile it: {first}", file=file) from None
    document = refs.index(rendered, draft, file)
    return Reporter(document, originals, limits, root), root


def rust_patterns(schema: Any, draft: Draft, originals: dict[str, str]) -> Any:
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


#: fastjsonschema's draft-7 code generator, with callgate's own keywords
_GENERATOR: Any = keywords.Draft7Generator
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


def _compile_fastjsonschema(
    schema: Any, draft: Draft, file: str, reporter: Reporter, limits: ViolationLimits
) -> CompiledCheck:
    matchers = _Matchers()
    fast = _fastjsonschema_function(_translate(schema, draft, matchers), matchers, file)
    invalid = fastjsonschema.JsonSchemaValueException
    violations = reporter.violations

    def check(instance: Any) -> tuple[Violation, ...]:
        try:
            fast(instance)
        except invalid as error:
            found = violations(instance, known_invalid=False)
            return found or _fast_fail_violations(error, instance, matchers, limits)
        return ()

    return check


def _fastjsonschema_function(
    definition: Any, matchers: _Matchers, file: str
) -> Callable[[Any], Any]:
    """fastjsonschema's fast-fail validation function, its patterns matched by RE2.

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
            fast_fail=True,
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
    state.update(keywords.GENERATED_CODE_NAMES)
    exec(code, state)
    function: Callable[[Any], Any] = state[resolver.get_scope_name()]
    return function


def _names(code: CodeType) -> Iterator[str]:
    """Every global or attribute name the code (and the functions it defines) uses."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from _names(constant)


def _fast_fail_violations(
    error: Any, instance: Any, matchers: _Matchers, limits: ViolationLimits
) -> tuple[Violation, ...]:
    """The fast-fail exception's one error, as violations (when jsonschema-rs found none)."""
    path, complete = _fastjsonschema_path(
        str(error.name or "data"), instance, limits.max_path_bytes
    )
    keyword = str(error.rule) if error.rule else "false"
    param = matchers.original(error.rule_definition)
    value = error.value
    findings = Findings(limits)
    if not complete:
        return (bounded(path, keyword, describe(keyword, param), limits, cut=True),)
    if keyword == "required" and isinstance(param, list) and isinstance(value, dict):
        for name in param:
            if name not in value:
                findings.add([*path, name], "required", describe("required", name))
    elif keyword == "additionalProperties" and isinstance(value, dict):
        definition = error.definition if isinstance(error.definition, dict) else {}
        known = definition.get("properties", {})
        regexes = [matchers[p] for p in definition.get("patternProperties", {})]
        for name in value:
            if findings.full:
                break
            if name not in known and not any(regex.search(name) for regex in regexes):
                findings.add([*path, name], keyword, describe(keyword))
    if not findings.found:
        findings.add(path, keyword, describe(keyword, param))
    return tuple(findings.found)


def _fastjsonschema_path(name: str, instance: Any, limit: int) -> tuple[Path, bool]:
    """fastjsonschema names a place `data.key[0].other`; a key may itself hold `.` or `[`, so the
    name is read against the instance, taking the longest key that fits. Reading stops past
    `limit` characters (the path would be cut there anyway); False says it stopped early."""
    rest = name.removeprefix("data")
    node = instance
    tokens: Path = []
    used = 0
    while rest:
        if used > limit:
            return tokens, False
        if rest[0] == "[" and isinstance(node, list):
            end = rest.find("]", 0, 12)
            index = rest[1:end] if end > 0 else ""
            if index.isascii() and index.isdigit() and int(index) < len(node):
                tokens.append(int(index))
                node = node[int(index)]
                rest = rest[end + 1 :]
                used += len(index) + 1
                continue
        if rest[0] == "." and isinstance(node, dict):
            tail = rest[1:]
            ends = [j for j, char in enumerate(tail[: limit + 1]) if char in ".["]
            if len(tail) <= limit:
                ends.append(len(tail))
            key = next((tail[:j] for j in reversed(ends) if tail[:j] in node), None)
            if key is not None:
                tokens.append(key)
                node = node[key]
                rest = tail[len(key) :]
                used += len(key) + 1
                continue
        return tokens, False
    return tokens, True
