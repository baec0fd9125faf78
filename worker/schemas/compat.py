"""`callgate schemas compat`: can one version of a contract read everything the other accepted?

In the spirit of Confluent Schema Registry's JSON Schema rules. `backward`: NEW accepts every
instance OLD accepted (consumers upgraded first). `forward`: OLD accepts every instance NEW
accepts. `full`: both. A change is breaking when the reading schema is narrower somewhere:
a property removed from a closed object, or added with constraints to an open one; a type
removed (`null` removed called out); an enum narrowed or a const/enum added; a property newly
required; `additionalProperties` tightened; a bound, pattern, multipleOf or uniqueItems made
stricter; a composition (`allOf`/`anyOf`/`oneOf`/`not`/`if`...) changed, which is not analysed
and so reported rather than assumed safe. Local `$ref`s are inlined first; remote ones are
refused as everywhere else. Paths are JSON Pointers into the schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import jsonschema_rs

from worker.errors import SchemaLoadError
from worker.schemas.drafts import pointer


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


_LOWER = ("minLength", "minimum", "exclusiveMinimum", "minItems", "minProperties", "minContains")
_UPPER = ("maxLength", "maximum", "exclusiveMaximum", "maxItems", "maxProperties", "maxContains")
_UNANALYSED = (
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "prefixItems",
    "patternProperties",
    "propertyNames",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
)


def compare(old: Any, new: Any, mode: Mode = Mode.BACKWARD) -> list[BreakingChange]:
    """Every breaking change between two schema documents for the given mode."""
    old, new = _inline(old, "OLD"), _inline(new, "NEW")
    changes: list[BreakingChange] = []
    if mode in (Mode.BACKWARD, Mode.FULL):
        changes.extend(_narrower(old, new, (), Mode.BACKWARD))
    if mode in (Mode.FORWARD, Mode.FULL):
        changes.extend(_narrower(new, old, (), Mode.FORWARD))
    return changes


def _inline(schema: Any, label: str) -> Any:
    try:
        return jsonschema_rs.dereference(schema, offline=True)
    except (jsonschema_rs.ReferencingError, ValueError) as exc:
        raise SchemaLoadError(f"{label}: cannot inline its $refs: {exc}") from None


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


def _narrower(
    was: Any, now: Any, path: tuple[str | int, ...], direction: Mode
) -> list[BreakingChange]:
    """What `now` rejects that `was` accepted, as far as the rules above can tell."""
    out: list[BreakingChange] = []

    def add(at: tuple[str | int, ...], rule: str, why: str) -> None:
        out.append(BreakingChange(direction, pointer(at), rule, why))

    old, new = _as_dict(was), _as_dict(now)
    if old is None:
        return out  # nothing was accepted: nothing can break
    if new is None:
        add(path, "rejects-everything", "the schema is now `false`")
        return out
    old_types, new_types = _types(old), _types(new)
    if new_types is not None:
        if old_types is None:
            add((*path, "type"), "type-added", f"now restricted to {sorted(new_types)}")
        else:
            lost = old_types - new_types
            if "null" in lost:
                add((*path, "type"), "null-removed", "null is no longer accepted")
            if lost - {"null"}:
                add((*path, "type"), "retyped", f"no longer accepts {sorted(lost - {'null'})}")
    if "enum" in new:
        if "enum" not in old and "const" not in old:
            add((*path, "enum"), "enum-added", "values are now limited to an enum")
        else:
            old_values = old["enum"] if "enum" in old else [old["const"]]
            lost_values = [v for v in old_values if v not in new["enum"]]
            if lost_values:
                add((*path, "enum"), "enum-narrowed", f"no longer accepts {lost_values}")
    if "const" in new and old.get("const", object()) != new["const"]:
        add((*path, "const"), "const-changed", "now limited to one other value")
    for keyword in _LOWER:
        if keyword in new and (keyword not in old or new[keyword] > old[keyword]):
            add((*path, keyword), "bound-tightened", f"{keyword} raised to {new[keyword]}")
    for keyword in _UPPER:
        if keyword in new and (keyword not in old or new[keyword] < old[keyword]):
            add((*path, keyword), "bound-tightened", f"{keyword} lowered to {new[keyword]}")
    if "pattern" in new and new["pattern"] != old.get("pattern"):
        add((*path, "pattern"), "pattern-changed", "a different or new pattern applies")
    if "multipleOf" in new and (
        "multipleOf" not in old or old["multipleOf"] % new["multipleOf"] != 0
    ):
        add((*path, "multipleOf"), "bound-tightened", "multipleOf is stricter")
    if new.get("uniqueItems") is True and old.get("uniqueItems") is not True:
        add((*path, "uniqueItems"), "bound-tightened", "items must now be unique")
    for keyword in _UNANALYSED:
        if keyword in new and new[keyword] != old.get(keyword):
            add(
                (*path, keyword),
                "composition-changed",
                "changed; not analysed, so not assumed safe",
            )
    out.extend(_object_rules(old, new, path, direction))
    if "items" in new and not isinstance(new["items"], list):
        was_items = old.get("items", True)
        if not isinstance(was_items, list):
            out.extend(_narrower(was_items, new["items"], (*path, "items"), direction))
    return out


def _object_rules(
    old: dict[str, Any], new: dict[str, Any], path: tuple[str | int, ...], direction: Mode
) -> list[BreakingChange]:
    out: list[BreakingChange] = []
    old_props: dict[str, Any] = old.get("properties") or {}
    new_props: dict[str, Any] = new.get("properties") or {}
    old_extra = old.get("additionalProperties", True)
    new_extra = new.get("additionalProperties", True)
    for name in sorted(set(new.get("required") or []) - set(old.get("required") or [])):
        out.append(
            BreakingChange(
                direction,
                pointer((*path, "properties", name)),
                "newly-required",
                f"property {name!r} is now required",
            )
        )
    for name, was in old_props.items():
        at = (*path, "properties", name)
        if name in new_props:
            out.extend(_narrower(was, new_props[name], at, direction))
        elif new_extra is False:
            out.append(
                BreakingChange(
                    direction,
                    pointer(at),
                    "property-removed",
                    f"property {name!r} is gone and the object is closed",
                )
            )
        else:
            out.extend(_narrower(was, new_extra, at, direction))
    for name, now in new_props.items():
        if name not in old_props:
            at = (*path, "properties", name)
            out.extend(_narrower(old_extra, now, at, direction))
    if new_extra is not True and old_extra != new_extra:
        if new_extra is False:
            out.append(
                BreakingChange(
                    direction,
                    pointer((*path, "additionalProperties")),
                    "additional-properties-tightened",
                    "properties not listed are now refused",
                )
            )
        else:
            out.extend(_narrower(old_extra, new_extra, (*path, "additionalProperties"), direction))
    return out
