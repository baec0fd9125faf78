"""`callgate schemas compat`: can one version of a contract read everything the other accepted?

In the spirit of Confluent Schema Registry's JSON Schema rules. `backward`: NEW accepts every
instance OLD accepted (consumers upgraded first). `forward`: OLD accepts every instance NEW
accepts. `full`: both.

"Compatible" is a proof, never a guess. Every keyword of the reading schema is a constraint the
writing schema must already imply; the rules below prove that for the keywords they analyse, and
any other keyword that differs at all (added, changed, or removed where removing it may narrow)
is reported as not analysed, never assumed safe. So a keyword this module does not know, or an
assertion of one draft that is an annotation in the other (draft 7 `contentMediaType`), is a
breaking change until shown otherwise. Values are compared as JSON values: `true` is not `1`,
`1` is `1.0`, numbers exactly (`worker.schemas.keywords.exact`).

The analysed rules: `type` (a type removed, `null` called out); `enum` / `const` (a value OLD
allowed no longer allowed, or values newly limited); a bound (`min*`, `max*`, `exclusive*`) added
or made stricter; `multipleOf` added, or OLD's step no multiple of NEW's; `pattern` added or
changed; `uniqueItems`; a property newly required; the schema of each property, which is the
`properties` entry and every `patternProperties` entry whose pattern matches the name (RE2, with
its ECMA-262 meaning), or `additionalProperties` when none applies; the schema of each array
position, from draft 7 `items` / `additionalItems` or 2020-12 `prefixItems` / `items`; and
`allOf`, each of whose schemas must be implied by OLD or by one of OLD's; and a *discriminated
union*, a `oneOf` or `anyOf` whose branches each require one same property with a `const` of
their own (as `outcome` in callgate's events): an instance can match only the branch of its
value, so the two are compared branch by branch, matched by that value, and a branch the reading
schema lacks is a variant removed. `patternProperties` themselves, any other `anyOf` / `oneOf`,
`not`, `if`/`then`/`else`, `contains`, dependencies and the rest are compared as written;
`unevaluated*` makes any change of its schema object breaking.

A contract is more than its schema: its `x-callgate` (read as the registry reads it,
`worker.schemas.registry.contract_meta`) decides which calls reach the schema at all, so the
reading contract breaks the other's calls when it judges another call kind, applies a custom
tool's grammar the other did not (added or changed), allows fewer principals, needs an
idempotency key the other did not, or reads that key from another argument.

Both documents must load as contracts (`worker.schemas.vetting`, with jsonschema-rs's rules).
Local `$ref`s are inlined first as each draft means them: in 2020-12 beside their siblings (as
one more `allOf` schema), in draft 7 alone; a loop of references is compared as written, with the
`$defs` it runs through. Annotations are left out before comparing. Paths are JSON Pointers into
the reading schema (NEW for `backward`, OLD for `forward`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from worker.schemas.drafts import Draft, children, is_annotation, map_subschemas, pointer
from worker.schemas.keywords import exact, is_multiple
from worker.schemas.patterns import Re2Search
from worker.schemas.refs import Document, Pointer
from worker.schemas.registry import contract_meta
from worker.schemas.vetting import JSONSCHEMA_RS, vet


class Mode(StrEnum):
    BACKWARD = "backward"
    FORWARD = "forward"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class BreakingChange:
    direction: Mode  # BACKWARD: NEW cannot read OLD's data; FORWARD: OLD cannot read NEW's
    path: str
    rule: str
    why: str

    def __str__(self) -> str:
        return f"[{self.direction}] {self.path or '/'}: {self.rule}: {self.why}"


_LOWER = ("minLength", "minimum", "exclusiveMinimum", "minItems", "minProperties")
_UPPER = ("maxLength", "maximum", "exclusiveMaximum", "maxItems", "maxProperties")
_OBJECT = ("properties", "patternProperties", "additionalProperties")
_ARRAY = ("items", "prefixItems", "additionalItems")
_ANALYSED = frozenset(
    {"type", "enum", "const", "multipleOf", "pattern", "uniqueItems", "required", "allOf"}
    | {*_LOWER, *_UPPER, *_OBJECT, *_ARRAY}
)
#: Keywords that hold subschemas (named `composition-changed` when they differ).
_APPLICATORS = frozenset(
    {"anyOf", "oneOf", "not", "if", "then", "else", "contains", "propertyNames", "$ref"}
    | {"dependencies", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems"}
    | {"$dynamicRef", "$defs", "definitions", "contentSchema"}
)
#: Keywords whose absence only widens what a schema accepts (each is one more constraint).
_REMOVAL_WIDENS = frozenset(
    {"anyOf", "oneOf", "not", "if", "then", "else", "contains", "maxContains", "propertyNames"}
    | {"dependencies", "dependentRequired", "dependentSchemas", "unevaluatedProperties"}
    | {"unevaluatedItems", "contentMediaType", "contentEncoding", "$dynamicRef", "$ref"}
)
_UNEVALUATED = ("unevaluatedProperties", "unevaluatedItems")


def compare(old: Any, new: Any, mode: Mode = Mode.BACKWARD) -> list[BreakingChange]:
    """Every breaking change between two schema documents for the given mode."""
    was, now = _prepare(old, "OLD"), _prepare(new, "NEW")
    changes: list[BreakingChange] = []
    if mode in (Mode.BACKWARD, Mode.FULL):
        changes.extend(_contract_narrower(old, new, Mode.BACKWARD))
        changes.extend(_Comparison(was, now, Mode.BACKWARD).narrower(was.schema, now.schema, ()))
    if mode in (Mode.FORWARD, Mode.FULL):
        changes.extend(_contract_narrower(new, old, Mode.FORWARD))
        changes.extend(_Comparison(now, was, Mode.FORWARD).narrower(now.schema, was.schema, ()))
    return changes


def _grammar(schema: Any) -> Any:
    """A custom tool's declared grammar (None: any text)."""
    declared = schema.get("x-callgate", {}).get("format") if isinstance(schema, dict) else None
    return declared if isinstance(declared, dict) and declared.get("type") == "grammar" else None


def _contract_narrower(writing: Any, reading: Any, direction: Mode) -> list[BreakingChange]:
    """The calls the writing contract's `x-callgate` let through that the reading one refuses."""
    was, now = contract_meta(writing, "OLD"), contract_meta(reading, "NEW")
    out: list[BreakingChange] = []

    def add(key: str, rule: str, why: str) -> None:
        out.append(BreakingChange(direction, f"/x-callgate/{key}", rule, why))

    if now.call_kind is not was.call_kind:
        add("call_kind", "call-kind-changed", f"judges {now.call_kind} calls, not {was.call_kind}")
    grammar = _grammar(reading)
    if grammar is not None and not _same(grammar, _grammar(writing)):
        add("format", "grammar-changed", "a different or new grammar applies")
    allowed = now.allowed_principals
    if allowed is not None and (was.allowed_principals is None or was.allowed_principals - allowed):
        add("allowed_principals", "principals-narrowed", "a principal allowed before is not")
    if now.needs_key and not was.needs_key:
        add("idempotency", "key-required", "a call without an idempotency key is now rejected")
    argument = now.idempotency_key_argument
    if argument is not None and argument != was.idempotency_key_argument:
        add(
            "idempotency_key_argument",
            "key-argument-changed",
            "the key is read from another argument",
        )
    return out


# --- one side: vetted, references inlined, annotations left out --------------------------------


@dataclass(frozen=True, slots=True)
class _Side:
    schema: Any
    draft: Draft


def _prepare(schema: Any, label: str) -> _Side:
    document = vet(schema, file=label, engine=JSONSCHEMA_RS)
    inlined, looped = _inline(document)
    if not looped:
        inlined = _without_defs(inlined, document.draft)
    return _Side(_bare(inlined, document.draft), document.draft)


def _with_children(node: dict[str, Any], draft: Draft, build: Callable[[Pointer], Any]) -> Any:
    """A copy of `node` with each direct subschema replaced by `build(its path below node)`."""
    out = dict(node)
    for sub_path, _ in children(node, draft):
        keyword = str(sub_path[0])  # the first token of a subschema's path is its keyword
        if len(sub_path) == 1:
            out[keyword] = build(sub_path)
            continue
        if out[keyword] is node[keyword]:
            out[keyword] = (
                list(node[keyword]) if isinstance(node[keyword], list) else dict(node[keyword])
            )
        out[keyword][sub_path[1]] = build(sub_path)
    return out


def _inline(document: Document) -> tuple[Any, bool]:
    """The document with each `$ref` replaced by what it names (see the module doc), and whether
    a loop of references was left as written."""
    draft = document.draft
    looped = False

    def build(at: Pointer, chain: frozenset[Pointer]) -> Any:
        nonlocal looped
        node = document.nodes[at]
        if not isinstance(node, dict):
            return node
        target = document.refs.get(at)
        if target is not None and target in chain:
            looped = True
            return node
        rebuilt = _with_children(node, draft, lambda sub: build((*at, *sub), chain))
        if target is None:
            return rebuilt
        named = build(target, chain | {target})
        siblings = {k: v for k, v in rebuilt.items() if k != "$ref"}
        if draft is Draft.DRAFT7 or all(is_annotation(k, draft) for k in siblings):
            return named
        siblings["allOf"] = [*siblings.get("allOf", []), named]
        return siblings

    return build((), frozenset({()})), looped


def _without_defs(node: Any, draft: Draft) -> Any:
    """`$defs` / `definitions` left out everywhere: once inlined, nothing uses them."""
    if not isinstance(node, dict):
        return node
    out = map_subschemas(node, draft, lambda sub: _without_defs(sub, draft))
    return {k: v for k, v in out.items() if k not in ("$defs", "definitions")}


def _bare(node: Any, draft: Draft) -> Any:
    """The schema without its annotations, at every level."""
    if not isinstance(node, dict):
        return node
    out = map_subschemas(node, draft, lambda sub: _bare(sub, draft))
    return {k: v for k, v in out.items() if not is_annotation(k, draft)}


def _same(a: Any, b: Any) -> bool:
    """JSON equality: `true` is not `1`, `1` is `1.0`, numbers compared exactly."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return exact(a) == exact(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _as_dict(schema: Any) -> dict[str, Any] | None:
    """A schema object; True means {} (accept all); False gives None (accept nothing)."""
    if schema is True:
        return {}
    if schema is False:
        return None
    return schema if isinstance(schema, dict) else {}


def _types(node: dict[str, Any]) -> set[str] | None:
    declared = node.get("type")
    if declared is None:
        return None
    names = {declared} if isinstance(declared, str) else set(declared)
    if "number" in names:
        names.add("integer")
    return names


def _allowed(node: dict[str, Any]) -> list[Any] | None:
    """The only values a schema object allows by `const` / `enum`; None when not limited."""
    if "const" in node:
        return [node["const"]]
    return list(node["enum"]) if "enum" in node else None


def _union(branches: Any) -> tuple[str, dict[str, tuple[int, Any]]] | None:
    """A discriminated union's property and its branches (value as JSON -> (index, branch)), or
    None when `branches` is not one. The property is one every branch requires with a `const` (a
    string, an integer or a boolean), a different one in each; the first by name when several
    are."""
    if not isinstance(branches, list) or not branches:
        return None
    constants: list[dict[str, Any]] = []
    for branch in branches:
        if not isinstance(branch, dict):
            return None
        required = branch.get("required", ())
        constants.append(
            {
                name: prop["const"]
                for name, prop in branch.get("properties", {}).items()
                if isinstance(prop, dict) and "const" in prop and name in required
            }
        )
    for name in sorted(set.intersection(*(set(found) for found in constants))):
        values = [found[name] for found in constants]
        keys = [_json(value) for value in values]
        if all(type(v) in (str, int, bool) for v in values) and len(set(keys)) == len(keys):
            return name, {key: (index, branches[index]) for index, key in enumerate(keys)}
    return None


# --- the comparison ----------------------------------------------------------------------------


class _Comparison:
    """What the reading schema (`now`) rejects that the writing one (`was`) accepted."""

    def __init__(self, was: _Side, now: _Side, direction: Mode) -> None:
        self.was_draft = was.draft
        self.now_draft = now.draft
        self.direction = direction
        self._matchers: dict[str, Re2Search] = {}

    def narrower(self, was: Any, now: Any, path: Pointer) -> list[BreakingChange]:
        out: list[BreakingChange] = []

        def add(at: Pointer, rule: str, why: str) -> None:
            out.append(BreakingChange(self.direction, pointer(at), rule, why))

        old, new = _as_dict(was), _as_dict(now)
        if old is None:
            return out  # nothing was accepted: nothing can break
        if new is None:
            add(path, "rejects-everything", "the schema is now `false`")
            return out
        self._types(old, new, path, add)
        self._values(old, new, path, add)
        self._numbers(old, new, path, add)
        if "pattern" in new and new["pattern"] != old.get("pattern"):
            add((*path, "pattern"), "pattern-changed", "a different or new pattern applies")
        if new.get("uniqueItems") is True and old.get("uniqueItems") is not True:
            add((*path, "uniqueItems"), "bound-tightened", "items must now be unique")
        for name in sorted(set(new.get("required", ())) - set(old.get("required", ()))):
            add((*path, "properties", name), "newly-required", f"property {name!r} is now required")
        out.extend(self._object(old, new, path))
        out.extend(self._array(old, new, path))
        out.extend(self._all_of(old, new, path))
        unions = [k for k in ("oneOf", "anyOf") if _union(old.get(k)) and _union(new.get(k))]
        for keyword in unions:
            out.extend(self._union(old[keyword], new[keyword], (*path, keyword)))
        for keyword in sorted(set(old) | set(new)):
            if keyword in _ANALYSED or (keyword not in new and keyword in _REMOVAL_WIDENS):
                continue
            if keyword in unions:
                continue
            if keyword not in new or keyword not in old or not _same(old[keyword], new[keyword]):
                rule = "composition-changed" if keyword in _APPLICATORS else "assertion-changed"
                verb = (
                    "removed"
                    if keyword not in new
                    else "added"
                    if keyword not in old
                    else "changed"
                )
                add((*path, keyword), rule, f"{verb}; not analysed, so not assumed safe")
        unevaluated = next((k for k in _UNEVALUATED if k in old or k in new), None)
        if unevaluated is not None and not _same(old, new):
            add(
                (*path, unevaluated),
                "composition-changed",
                f"the schema beside {unevaluated} changed; not analysed, so not assumed safe",
            )
        return out

    @staticmethod
    def _types(old: dict[str, Any], new: dict[str, Any], path: Pointer, add: Any) -> None:
        old_types, new_types = _types(old), _types(new)
        if new_types is None:
            return
        if old_types is None:
            add((*path, "type"), "type-added", f"now restricted to {sorted(new_types)}")
            return
        lost = old_types - new_types
        if "null" in lost:
            add((*path, "type"), "null-removed", "null is no longer accepted")
        if lost - {"null"}:
            add((*path, "type"), "retyped", f"no longer accepts {sorted(lost - {'null'})}")

    @staticmethod
    def _values(old: dict[str, Any], new: dict[str, Any], path: Pointer, add: Any) -> None:
        allowed = _allowed(old)
        if "enum" in new:
            if allowed is None:
                add((*path, "enum"), "enum-added", "values are now limited to an enum")
            else:
                lost = [v for v in allowed if not any(_same(v, o) for o in new["enum"])]
                if lost:
                    add((*path, "enum"), "enum-narrowed", f"no longer accepts {_json(lost)}")
        if "const" in new:
            if allowed is None:
                add((*path, "const"), "const-added", "now limited to one value")
            elif not all(_same(v, new["const"]) for v in allowed):
                add((*path, "const"), "const-changed", "now limited to one other value")

    @staticmethod
    def _numbers(old: dict[str, Any], new: dict[str, Any], path: Pointer, add: Any) -> None:
        for keyword in _LOWER:
            if keyword in new and (keyword not in old or exact(new[keyword]) > exact(old[keyword])):
                add((*path, keyword), "bound-tightened", f"{keyword} raised to {new[keyword]}")
        for keyword in _UPPER:
            if keyword in new and (keyword not in old or exact(new[keyword]) < exact(old[keyword])):
                add((*path, keyword), "bound-tightened", f"{keyword} lowered to {new[keyword]}")
        step = new.get("multipleOf")
        if step is not None and (
            "multipleOf" not in old or not is_multiple(old["multipleOf"], step)
        ):
            add((*path, "multipleOf"), "bound-tightened", "multipleOf is stricter")

    def _union(self, was: list[Any], now: list[Any], path: Pointer) -> list[BreakingChange]:
        """Two discriminated unions (`_union`), branch by branch."""
        old_union, new_union = _union(was), _union(now)
        assert old_union is not None, "called for unions only"
        assert new_union is not None, "called for unions only"
        (old_name, old_branches), (new_name, new_branches) = old_union, new_union
        if old_name != new_name:
            why = f"now told apart by {new_name!r}, not {old_name!r}"
            return [BreakingChange(self.direction, pointer(path), "composition-changed", why)]
        out: list[BreakingChange] = []
        for value, (index, branch) in old_branches.items():
            found = new_branches.get(value)
            if found is None:
                why = f"no branch for {old_name} {value}"
                out.append(
                    BreakingChange(self.direction, pointer((*path, index)), "variant-removed", why)
                )
                continue
            new_index, new_branch = found
            out.extend(self.narrower(branch, new_branch, (*path, new_index)))
        return out

    # --- objects ---------------------------------------------------------------------------------

    def _matches(self, pattern: str, name: str) -> bool:
        matcher = self._matchers.get(pattern)
        if matcher is None:
            matcher = self._matchers[pattern] = Re2Search(pattern)
        return matcher.search(name) is not None

    def _applying(self, node: dict[str, Any], name: str) -> Iterator[tuple[Pointer, Any]]:
        """(where, schema) for each schema the object `node` applies to its property `name`."""
        found = False
        properties = node.get("properties", {})
        if name in properties:
            found = True
            yield ("properties", name), properties[name]
        for pattern, schema in node.get("patternProperties", {}).items():
            if self._matches(pattern, name):
                found = True
                yield ("patternProperties", pattern), schema
        if not found:
            yield ("additionalProperties",), node.get("additionalProperties", True)

    def _object(
        self, old: dict[str, Any], new: dict[str, Any], path: Pointer
    ) -> list[BreakingChange]:
        out: list[BreakingChange] = []
        if not _same(old.get("patternProperties", {}), new.get("patternProperties", {})):
            out.append(
                BreakingChange(
                    self.direction,
                    pointer((*path, "patternProperties")),
                    "composition-changed",
                    "changed; not analysed, so not assumed safe",
                )
            )
        names = set(old.get("properties", {})) | set(new.get("properties", {}))
        for name in sorted(names):
            was_parts = list(self._applying(old, name))
            for where, schema in self._applying(new, name):
                if where == ("additionalProperties",) and schema is False:
                    out.append(
                        BreakingChange(
                            self.direction,
                            pointer((*path, "properties", name)),
                            "property-removed",
                            f"property {name!r} is gone and the object is closed",
                        )
                    )
                    continue
                at = (
                    (*path, *where)
                    if where[0] != "additionalProperties"
                    else (*path, "properties", name)
                )
                out.extend(self._implied(was_parts, schema, at))
        old_extra = old.get("additionalProperties", True)
        new_extra = new.get("additionalProperties", True)
        if new_extra is not True and not _same(old_extra, new_extra):
            if new_extra is False:
                out.append(
                    BreakingChange(
                        self.direction,
                        pointer((*path, "additionalProperties")),
                        "additional-properties-tightened",
                        "properties not listed are now refused",
                    )
                )
            else:
                out.extend(self.narrower(old_extra, new_extra, (*path, "additionalProperties")))
        return out

    def _implied(
        self, was_parts: list[tuple[Pointer, Any]], schema: Any, at: Pointer
    ) -> list[BreakingChange]:
        """Nothing when one of `was_parts` is no wider than `schema`; else the first's findings."""
        first: list[BreakingChange] | None = None
        for _, was in was_parts:
            found = self.narrower(was, schema, at)
            if not found:
                return []
            first = found if first is None else first
        return first or []

    # --- arrays and allOf ------------------------------------------------------------------------

    @staticmethod
    def _positions(node: dict[str, Any], draft: Draft) -> tuple[list[Any], Any, str, str]:
        """(schemas of the first positions, schema of the rest, their keywords) of an array."""
        if draft is Draft.DRAFT7:
            items = node.get("items", True)
            if isinstance(items, list):
                return items, node.get("additionalItems", True), "items", "additionalItems"
            return [], items, "items", "items"
        return list(node.get("prefixItems", ())), node.get("items", True), "prefixItems", "items"

    def _array(
        self, old: dict[str, Any], new: dict[str, Any], path: Pointer
    ) -> list[BreakingChange]:
        if not any(k in old or k in new for k in _ARRAY):
            return []
        old_first, old_rest, _, _ = self._positions(old, self.was_draft)
        new_first, new_rest, first_key, rest_key = self._positions(new, self.now_draft)
        out: list[BreakingChange] = []
        for index in range(max(len(old_first), len(new_first)) + 1):
            was = old_first[index] if index < len(old_first) else old_rest
            if index < len(new_first):
                out.extend(self.narrower(was, new_first[index], (*path, first_key, index)))
            else:
                out.extend(self.narrower(was, new_rest, (*path, rest_key)))
        return out

    def _all_of(
        self, old: dict[str, Any], new: dict[str, Any], path: Pointer
    ) -> list[BreakingChange]:
        out: list[BreakingChange] = []
        old_all = list(old.get("allOf", ()))
        for index, schema in enumerate(new.get("allOf", ())):
            candidates = [old_all[index]] if index < len(old_all) else []
            candidates += [s for i, s in enumerate(old_all) if i != index] + [old]
            out.extend(
                self._implied([((), c) for c in candidates], schema, (*path, "allOf", index))
            )
        return out
