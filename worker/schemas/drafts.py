"""What each supported JSON Schema draft means: its keywords, which hold subschemas, which annotate.

Every other module that walks a schema (vetting, engines, lint, compat) asks this one where the
subschemas are, so none of them mistakes a property *named* `$ref` or `pattern` for a keyword.
Two drafts are supported, draft 7 and draft 2020-12 (the default when `$schema` is absent).
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from typing import Any


class Draft(StrEnum):
    DRAFT7 = "draft7"
    DRAFT2020_12 = "draft2020-12"


_SCHEMA_URIS = {
    "http://json-schema.org/draft-07/schema": Draft.DRAFT7,
    "https://json-schema.org/draft/2020-12/schema": Draft.DRAFT2020_12,
}


def draft_of(schema: Any) -> Draft | None:
    """The draft `$schema` names (2020-12 when absent); None for a draft not supported."""
    if not isinstance(schema, dict) or "$schema" not in schema:
        return Draft.DRAFT2020_12
    uri = schema["$schema"]
    if not isinstance(uri, str):
        return None
    return _SCHEMA_URIS.get(uri.removesuffix("#"))


def schema_uri(draft: Draft) -> str:
    return next(uri for uri, d in _SCHEMA_URIS.items() if d is draft)


#: Keywords that never assert anything: any engine may ignore them without changing a verdict.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "readOnly",
        "writeOnly",
        "deprecated",
        "format",  # callgate never asserts format (2020-12: annotation; draft 7 allows that)
        "$schema",
        "$id",
        "$vocabulary",
    }
)

#: Keywords that hold one subschema.
_SINGLE: dict[Draft, frozenset[str]] = {
    Draft.DRAFT7: frozenset(
        {"additionalItems", "additionalProperties", "contains", "propertyNames", "if", "then"}
        | {"else", "not"}
    ),
    Draft.DRAFT2020_12: frozenset(
        {"additionalProperties", "contains", "propertyNames", "if", "then", "else", "not"}
        | {"items", "unevaluatedItems", "unevaluatedProperties", "contentSchema"}
    ),
}
#: Keywords that hold a list of subschemas.
_LIST: dict[Draft, frozenset[str]] = {
    Draft.DRAFT7: frozenset({"allOf", "anyOf", "oneOf"}),
    Draft.DRAFT2020_12: frozenset({"allOf", "anyOf", "oneOf", "prefixItems"}),
}
#: Keywords that hold a map of name -> subschema. `definitions`/`$defs` are containers in both.
_MAP: dict[Draft, frozenset[str]] = {
    Draft.DRAFT7: frozenset({"properties", "patternProperties", "definitions", "$defs"}),
    Draft.DRAFT2020_12: frozenset(
        {"properties", "patternProperties", "definitions", "$defs", "dependentSchemas"}
    ),
}
#: Keywords that assert on the instance itself (no subschema inside).
_ASSERTIONS: dict[Draft, frozenset[str]] = {
    Draft.DRAFT7: frozenset(
        {"type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum"}
        | {"exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems"}
        | {"uniqueItems", "maxProperties", "minProperties", "required", "$ref"}
        | {"contentMediaType", "contentEncoding"}
    ),
    Draft.DRAFT2020_12: frozenset(
        {"type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum"}
        | {"exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems"}
        | {"uniqueItems", "maxProperties", "minProperties", "required", "$ref"}
        | {"dependentRequired", "minContains", "maxContains", "$dynamicRef"}
    ),
}
#: 2020-12 annotations beyond the shared ones (content* are annotations there, assertions in 7).
_EXTRA_ANNOTATIONS: dict[Draft, frozenset[str]] = {
    Draft.DRAFT7: frozenset(),
    Draft.DRAFT2020_12: frozenset(
        {"$anchor", "$dynamicAnchor", "contentMediaType", "contentEncoding"}
    ),
}


def is_extension(keyword: str) -> bool:
    return keyword.startswith("x-")


def is_annotation(keyword: str, draft: Draft) -> bool:
    return keyword in ANNOTATIONS or keyword in _EXTRA_ANNOTATIONS[draft] or is_extension(keyword)


def is_known(keyword: str, draft: Draft) -> bool:
    return (
        is_annotation(keyword, draft)
        or keyword in _SINGLE[draft]
        or keyword in _LIST[draft]
        or keyword in _MAP[draft]
        or keyword in _ASSERTIONS[draft]
        or (keyword in ("items", "dependencies") and draft is Draft.DRAFT7)
    )


def escape(token: str | int) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(parts: tuple[str | int, ...] | list[str | int]) -> str:
    """An RFC 6901 JSON Pointer from its reference tokens."""
    return "".join(["/" + escape(p) for p in parts])


def children(node: dict[str, Any], draft: Draft) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Each direct subschema of a schema object, with its path (reference tokens) below `node`."""
    for keyword, value in node.items():
        if is_extension(keyword):
            continue
        if keyword in _SINGLE[draft]:
            yield (keyword,), value
        elif keyword in _LIST[draft] and isinstance(value, list):
            for index, sub in enumerate(value):
                yield (keyword, index), sub
        elif keyword in _MAP[draft] and isinstance(value, dict):
            for name, sub in value.items():
                yield (keyword, name), sub
        elif draft is Draft.DRAFT7 and keyword == "items":
            if isinstance(value, list):
                for index, sub in enumerate(value):
                    yield (keyword, index), sub
            else:
                yield (keyword,), value
        elif draft is Draft.DRAFT7 and keyword == "dependencies" and isinstance(value, dict):
            for name, sub in value.items():
                if not isinstance(sub, list):
                    yield (keyword, name), sub


def walk(schema: Any, draft: Draft) -> Iterator[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """Every schema object in a document (boolean schemas have nothing to walk), depth first."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield path, node
        for sub_path, sub in children(node, draft):
            stack.append((path + sub_path, sub))


def map_subschemas(node: dict[str, Any], draft: Draft, fn: Any) -> dict[str, Any]:
    """A copy of a schema object with `fn` applied to each direct subschema (same positions)."""
    out = dict(node)
    for keyword, value in node.items():
        if is_extension(keyword):
            continue
        draft7_items = draft is Draft.DRAFT7 and keyword == "items"
        if (keyword in _SINGLE[draft] or draft7_items) and not isinstance(value, list):
            out[keyword] = fn(value)
        elif (keyword in _LIST[draft] or draft7_items) and isinstance(value, list):
            out[keyword] = [fn(sub) for sub in value]
        elif keyword in _MAP[draft] and isinstance(value, dict):
            out[keyword] = {name: fn(sub) for name, sub in value.items()}
        elif draft is Draft.DRAFT7 and keyword == "dependencies" and isinstance(value, dict):
            out[keyword] = {
                name: sub if isinstance(sub, list) else fn(sub) for name, sub in value.items()
            }
    return out


def declared_names(schema: Any, draft: Draft) -> frozenset[str]:
    """Every property name the schema itself declares: `properties` names, `required` and
    `dependentRequired` / `dependentSchemas` / draft 7 `dependencies` names, and the `const` /
    `enum` strings of a `propertyNames`. `patternProperties` are patterns, not names: no name
    matching one is declared by it."""
    names: set[str] = set()
    for _, node in walk(schema, draft):
        for keyword in ("properties", "dependentRequired", "dependentSchemas", "dependencies"):
            value = node.get(keyword)
            if isinstance(value, dict):
                names.update(value)
                if keyword != "properties":
                    for listed in value.values():
                        if isinstance(listed, list):
                            names.update(n for n in listed if isinstance(n, str))
        if isinstance(node.get("required"), list):
            names.update(n for n in node["required"] if isinstance(n, str))
        property_names = node.get("propertyNames")
        if isinstance(property_names, dict):
            allowed = [property_names.get("const"), *property_names.get("enum", ())]
            names.update(n for n in allowed if isinstance(n, str))
    return frozenset(names)
