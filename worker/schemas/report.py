"""The violations of an invalid instance: at most `max_violations`, and no more work than that.

jsonschema-rs's Python `iter_errors` is not lazy: it builds every error (with a copy of the
failing instance, a path and a message each) before it returns its iterator, so 120,000
violations cost seconds and hundreds of MB however few are wanted. Its `validate` stops at the
first error, except that a failed `anyOf` / `oneOf` carries every error of every branch. So the
`Reporter` asks jsonschema-rs only questions whose cost does not grow with the number of
violations, walking the schema (as `worker.schemas.refs` indexed it) beside the instance:

* `is_valid` of a subschema against a part of the instance, through a validator compiled (once,
  when first needed) for that subschema's JSON Pointer inside the document;
* the errors of a subschema's own assertions only (`type`, `required`, `maxLength`, `pattern`,
  `contains`, ...), each of which yields at most one error, or one per name the schema lists;
* where a subschema fails but none of its parts explains it (`unevaluated*`, `$dynamicRef`):
  its first error (`validate`), when no `anyOf` / `oneOf` can be reached from it; otherwise a
  violation naming the keyword that cannot be taken apart.

It descends through `$ref`, `allOf`, `if`/`then`/`else`, `dependentSchemas`, `properties`,
`patternProperties` (matched with RE2, meaning what the engines mean), `additionalProperties`,
`prefixItems` / `items` (draft 7: `items` / `additionalItems`) and reports a failed `anyOf`,
`oneOf`, `not` or `propertyNames` as one violation where it applies. It stops as soon as it holds
`max_violations`. Every violation's path and message is bounded in bytes (`bounded`; one made
elsewhere, with its keyword, by `bounded_violation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import jsonschema_rs

from worker.model import Violation
from worker.schemas.contract import CUT, ViolationLimits
from worker.schemas.drafts import Draft, children, escape, pointer, schema_uri
from worker.schemas.keywords import is_custom_error, rs_keywords
from worker.schemas.messages import describe
from worker.schemas.patterns import Re2Search
from worker.schemas.refs import DOCUMENT, Document, Pointer

Path = list[str | int]
Finding = tuple[Path, str, str]  # instance path, keyword, message

#: A subschema's own assertions: jsonschema-rs reports at most one error for each (`required`
#: and `dependentRequired`: one per name the schema lists).
_LOCAL = frozenset(
    {"type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum"}
    | {"exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems"}
    | {"uniqueItems", "maxProperties", "minProperties", "required", "dependentRequired"}
    | {"contentMediaType", "contentEncoding", "minContains", "maxContains"}
)
#: Keywords a subschema cannot be taken apart at: only its first error says what failed.
_OPAQUE = ("unevaluatedProperties", "unevaluatedItems", "$dynamicRef")
#: Where a jsonschema-rs error kind holds the schema's parameter its message names, by preference.
_PARAMETERS = ("types", "limit", "options", "expected_value", "pattern", "multiple_of")
_RS_KEYWORDS = {
    "falseSchema": "false",
    "oneOfNotValid": "oneOf",
    "oneOfMultipleValid": "oneOf",
}


def bounded(
    path: Path, keyword: str, message: str, limits: ViolationLimits, *, cut: bool = False
) -> Violation:
    """A violation whose path and message fit their byte bounds. A cut path keeps whole tokens
    and ends in `CUT` ("/\u2026"); a cut message ends in "\u2026". `cut`: the path is known
    to go on past `path`."""
    text = pointer(path)
    if cut or len(text.encode()) > limits.max_path_bytes:
        room = limits.max_path_bytes - len(CUT.encode())
        kept, used = [], 0
        for token in path:
            piece = "/" + escape(token)
            size = len(piece.encode())
            if used + size > room:
                break
            kept.append(piece)
            used += size
        text = "".join(kept) + CUT
    return Violation(text, keyword, _cut(message, limits.max_message_bytes))


def _cut(text: str, max_bytes: int) -> str:
    """`text` as it is when it fits `max_bytes`, or cut to fit and ending in "\u2026"."""
    if len(text.encode()) <= max_bytes:
        return text
    room = max_bytes - len("\u2026".encode())
    return text.encode()[:room].decode(errors="ignore") + "\u2026"


def bounded_violation(violation: Violation, limits: ViolationLimits) -> Violation:
    """A violation made elsewhere (a business rule's, the parser's, the tool-output check's)
    within the bounds `bounded` gives the engines' own: the same violation when it fits; else
    its path (a JSON Pointer; any other text is one token) cut at a token boundary, and its
    keyword and message cut like a message."""
    path, keyword, message = violation.path, violation.keyword, violation.message
    if len(path.encode()) > limits.max_path_bytes:
        tokens: Path = (
            [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]
            if path.startswith("/")
            else [path]
        )
        path = bounded(tokens, "", "", limits).path
    keyword = _cut(keyword, limits.max_message_bytes)
    return Violation(path, keyword, _cut(message, limits.max_message_bytes))


class Findings:
    """Violations found so far, never more than the limit (`full`: the limit is reached)."""

    __slots__ = ("found", "full", "limits")

    def __init__(self, limits: ViolationLimits) -> None:
        self.limits = limits
        self.found: list[Violation] = []
        self.full = False  # an attribute, not a property: the walk asks at every node

    def add(self, path: Path, keyword: str, message: str) -> None:
        if not self.full:
            self.found.append(bounded(path, keyword, message, self.limits))
            self.full = len(self.found) >= self.limits.max_violations

    def extend(self, findings: Iterator[Finding]) -> None:
        for path, keyword, message in findings:
            if self.full:
                return
            self.add(path, keyword, message)


def rs_validator(schema: Any, draft: Draft, registry: Any = None) -> Any:
    """A jsonschema-rs validator as callgate runs every one: no formats, nothing fetched, patterns
    matched by the Rust `regex` crate (linear time), and the keywords callgate judges itself
    (`worker.schemas.keywords`)."""
    cls = (
        jsonschema_rs.Draft7Validator
        if draft is Draft.DRAFT7
        else jsonschema_rs.Draft202012Validator
    )
    return cls(
        schema,
        validate_formats=False,
        offline=True,
        pattern_options=jsonschema_rs.RegexOptions(),
        registry=registry,
        keywords=rs_keywords(draft),
    )


def rs_findings(
    error: Any, prefix: Path, originals: dict[str, str], limit: int
) -> Iterator[Finding]:
    """One jsonschema-rs error as findings (an additionalProperties error lists names: at most
    `limit` of them), its path under `prefix`, its message from the schema only."""
    kind = error.kind
    keyword = _RS_KEYWORDS.get(kind.name, kind.name)
    path: Path = [*prefix, *error.instance_path]
    if keyword == "required":
        name = kind.property
        yield [*path, str(name)], keyword, describe(keyword, name)
        return
    unexpected = getattr(kind, "unexpected", None)
    if keyword in ("additionalProperties", "unevaluatedProperties") and unexpected:
        message = describe(keyword)
        for name in unexpected[:limit]:
            yield [*path, str(name)], keyword, message
        return
    details = kind.as_dict()
    if is_custom_error(details):
        yield path, keyword, details["message"]
        return
    param = None
    for field in _PARAMETERS:  # a loop, not next(generator): an abandoned generator is costly
        if field in details:
            param = details[field]
            break
    if keyword == "pattern" and isinstance(param, str):
        param = originals.get(param, param)
    yield path, keyword, describe(keyword, param)


class Reporter:
    """Bounded violations of instances known or found to be invalid (see the module doc)."""

    def __init__(
        self,
        document: Document,
        originals: dict[str, str],
        limits: ViolationLimits,
        root: Any,
    ) -> None:
        """`document`: the schema as jsonschema-rs is given it (patterns rendered for Rust),
        indexed; `originals`: rendered pattern -> the schema's pattern; `root`: the validator of
        the whole document."""
        self._document = document
        self._draft = document.draft
        self._draft7 = document.draft is Draft.DRAFT7  # asked at every node of the walk
        self._originals = originals
        self._limits = limits
        self._registry = jsonschema_rs.Registry([(DOCUMENT, document.schema)])
        self._valid: dict[Pointer, Callable[[Any], bool]] = {(): root.is_valid}
        self._validate: dict[Pointer, Callable[[Any], None]] = {(): root.validate}
        self._local: dict[Pointer, Callable[[Any], Any] | None] = {}
        self._bounded_first_error: dict[Pointer, bool] = {}
        self._matchers: dict[str, Re2Search] = {}

    def violations(self, instance: Any, *, known_invalid: bool) -> tuple[Violation, ...]:
        """At most `max_violations`; empty when jsonschema-rs finds the instance valid. Never
        raises: should a validator for a part of the document fail to build, the violations
        found so far are the answer (the caller has a fallback for none)."""
        findings = Findings(self._limits)
        try:
            if self._document.dynamic_refs:
                # a validator for a part of the document would not see the dynamic scope the
                # whole document gives a $dynamicRef: the document is taken as one opaque piece
                if known_invalid or not self._is_valid((), instance):
                    self._opaque((), self._document.schema, instance, [], findings)
            else:
                self._visit((), instance, [], findings, known_invalid=known_invalid)
        except (jsonschema_rs.ReferencingError, ValueError, RecursionError):
            pass
        return tuple(findings.found)

    # --- validators for parts of the document --------------------------------------------------

    def _pointer_schema(self, at: Pointer) -> dict[str, Any]:
        return {"$ref": DOCUMENT + "#" + quote(pointer(at), safe="/~!$&'()*+,;=:@")}

    def _is_valid(self, at: Pointer, value: Any) -> bool:
        check = self._valid.get(at)
        if check is None:
            validator = rs_validator(self._pointer_schema(at), self._draft, self._registry)
            check = self._valid[at] = validator.is_valid
            self._validate[at] = validator.validate
        return bool(check(value))

    def _local_errors(self, at: Pointer, node: dict[str, Any]) -> Callable[[Any], Any] | None:
        if at in self._local:
            return self._local[at]
        own = {k: v for k, v in node.items() if k in _LOCAL}
        if "contains" in node:
            own["contains"] = self._pointer_schema((*at, "contains"))
        if self._draft7:
            dependencies = node.get("dependencies")
            if isinstance(dependencies, dict):
                listed = {k: v for k, v in dependencies.items() if isinstance(v, list)}
                if listed:
                    own["dependencies"] = listed
            if isinstance(node.get("items"), list) and node.get("additionalItems") is False:
                own["items"] = [True] * len(node["items"])
                own["additionalItems"] = False
        errors = None
        if own:
            own["$schema"] = schema_uri(self._draft)
            errors = rs_validator(own, self._draft, self._registry).iter_errors
        self._local[at] = errors
        return errors

    def _matcher(self, rendered: str) -> Re2Search:
        matcher = self._matchers.get(rendered)
        if matcher is None:
            matcher = self._matchers[rendered] = Re2Search(self._originals[rendered])
        return matcher

    def _reaches_context(self, starts: list[Pointer]) -> bool:
        """Whether an `anyOf` / `oneOf` can be reached from any of `starts` (a first error
        there may carry every error of every branch)."""
        nodes, seen, stack = self._document.nodes, set(starts), list(starts)
        while stack:
            here = stack.pop()
            node = nodes[here]
            if not isinstance(node, dict):
                continue
            if "anyOf" in node or "oneOf" in node:
                return True
            nexts = [(*here, *sub) for sub, _ in children(node, self._draft)]
            nexts += [self._document.refs[here]] if here in self._document.refs else []
            nexts += self._document.dynamic_refs.get(here, ())
            for target in nexts:
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        return False

    # --- the walk ------------------------------------------------------------------------------

    def _visit(
        self, at: Pointer, value: Any, path: Path, out: Findings, *, known_invalid: bool = False
    ) -> None:
        node = self._document.nodes[at]
        if node is False and not out.full:
            out.add(path, "false", describe("false"))
        if out.full or not isinstance(node, dict):
            return
        if not known_invalid and self._is_valid(at, value):
            return
        before = len(out.found)
        if at in self._document.refs:
            self._visit(self._document.refs[at], value, path, out)
        if not (self._draft7 and "$ref" in node):  # draft 7: siblings ignored
            local = self._local_errors(at, node)
            if local is not None:
                limit = self._limits.max_violations
                for error in local(value):
                    out.extend(rs_findings(error, path, self._originals, limit))
                    if out.full:
                        return
            self._same_place(at, node, value, path, out)
            if isinstance(value, dict):
                self._properties(at, node, value, path, out)
            elif isinstance(value, list):
                self._items(at, node, value, path, out)
        if len(out.found) == before:
            self._opaque(at, node, value, path, out)

    def _same_place(
        self, at: Pointer, node: dict[str, Any], value: Any, path: Path, out: Findings
    ) -> None:
        for index in range(len(node.get("allOf", ()))):
            self._visit((*at, "allOf", index), value, path, out)
        branches = len(node.get("anyOf", ()))
        if branches and not any(self._is_valid((*at, "anyOf", i), value) for i in range(branches)):
            out.add(path, "anyOf", describe("anyOf"))
        branches = len(node.get("oneOf", ()))
        if branches:
            valid = 0
            for index in range(branches):
                valid += self._is_valid((*at, "oneOf", index), value)
                if valid > 1:
                    break
            if valid != 1:
                out.add(path, "oneOf", describe("oneOf"))
        if "not" in node and self._is_valid((*at, "not"), value):
            out.add(path, "not", describe("not"))
        if "if" in node:
            branch = "then" if self._is_valid((*at, "if"), value) else "else"
            if branch in node:
                self._visit((*at, branch), value, path, out)
        dependent = "dependencies" if self._draft7 else "dependentSchemas"
        if isinstance(node.get(dependent), dict) and isinstance(value, dict):
            for name, sub in node[dependent].items():
                if name in value and not isinstance(sub, list):
                    self._visit((*at, dependent, name), value, path, out)

    def _properties(
        self, at: Pointer, node: dict[str, Any], value: dict[str, Any], path: Path, out: Findings
    ) -> None:
        properties = node.get("properties", {})
        patterns = node.get("patternProperties", {})
        additional = node.get("additionalProperties", True)
        for key, child in value.items():
            if out.full:
                return
            matched = key in properties
            if matched:
                self._visit((*at, "properties", key), child, [*path, key], out)
            for rendered in patterns:
                if self._matcher(rendered).search(key):
                    matched = True
                    self._visit((*at, "patternProperties", rendered), child, [*path, key], out)
            if matched:
                continue
            if additional is False:
                out.add([*path, key], "additionalProperties", describe("additionalProperties"))
            elif additional is not True:
                self._visit((*at, "additionalProperties"), child, [*path, key], out)
        if "propertyNames" in node and not out.full:
            names = (*at, "propertyNames")
            if any(not self._is_valid(names, key) for key in value):
                out.add(path, "propertyNames", describe("propertyNames"))

    def _items(
        self, at: Pointer, node: dict[str, Any], value: list[Any], path: Path, out: Findings
    ) -> None:
        if self._draft7:
            items = node.get("items")
            prefix_key, rest_key = "items", "additionalItems"
            prefix = len(items) if isinstance(items, list) else 0
            if not isinstance(items, list):
                rest_key = "items"
            elif node.get("additionalItems") is False:
                rest_key = ""  # one error at the array, from its own assertions
        else:
            prefix_key, rest_key = "prefixItems", "items"
            prefix = len(node.get("prefixItems", ()))
        for index, child in enumerate(value):
            if out.full:
                return
            if index < prefix:
                self._visit((*at, prefix_key, index), child, [*path, index], out)
            elif rest_key and rest_key in node:
                self._visit((*at, rest_key), child, [*path, index], out)

    def _opaque(
        self, at: Pointer, node: dict[str, Any], value: Any, path: Path, out: Findings
    ) -> None:
        """The subschema fails and none of its parts said why: ask for its first error, when that
        is bounded; otherwise name the keyword the walk cannot take apart.

        Every other part of it was found valid, so its first error comes from what cannot be
        taken apart (an `unevaluated*` or `$dynamicRef` subschema, or the whole document when
        it holds a `$dynamicRef`); that error is bounded unless an `anyOf` / `oneOf` can be
        reached from there."""
        if at not in self._bounded_first_error:
            starts = [(*at, k) for k in _OPAQUE[:2] if isinstance(node.get(k), dict)]
            starts += list(self._document.dynamic_refs.get(at, ()))
            if at == () and self._document.dynamic_refs:
                starts = [()]
            self._bounded_first_error[at] = not self._reaches_context(starts)
        if not self._bounded_first_error[at]:
            keyword = next((k for k in _OPAQUE if k in node), "schema")
            message = describe(keyword) if keyword != "schema" else "does not match the schema"
            out.add(path, keyword, message)
            return
        if at not in self._validate:
            self._is_valid(at, value)  # compiles it
        try:
            self._validate[at](value)
        except jsonschema_rs.ValidationError as error:
            out.extend(rs_findings(error, path, self._originals, self._limits.max_violations))
