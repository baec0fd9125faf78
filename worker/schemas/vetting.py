"""Load-time refusal: a schema the chosen engine would not enforce as its draft means never loads.

`vet(schema, file=..., engine=...)` returns the indexed document (`worker.schemas.refs.Document`:
its draft and where its references go) or raises, naming file, keyword and JSON Pointer. It
refuses, for every engine:

* a `$schema` other than draft 7 or 2020-12 (absent means 2020-12), or a nested one that differs;
* a schema that is not valid against its draft's meta-schema;
* an unknown keyword (it may be an assertion elsewhere, or a typo of one); annotations and `x-*`
  extensions are fine;
* draft 2020-12 `items` given as an array (not 2020-12; use `prefixItems`);
* a `$ref` / `$dynamicRef` that leaves the document (nothing is ever fetched) or names nothing in
  it, and a loop of references that never descends into the instance (`worker.schemas.refs`);
* a `pattern` (or `patternProperties` name) that either linear-time engine cannot match with its
  ECMA-262 meaning (backreferences, lookaround, ...; `worker.schemas.patterns`), naming the
  pattern.

And for fastjsonschema, which implements draft 7 only, also: the 2020-12 keywords it ignores and
that have no draft-7 equivalent (measured against the JSON-Schema-Test-Suite: `unevaluated*`,
`minContains`, `maxContains`, `$dynamicRef`, `$dynamicAnchor`, `$anchor`), and a `$ref` pointing
into a keyword the translation to draft 7 moves (`prefixItems`, `dependent*`; see
`worker.schemas.engines`).
"""

from __future__ import annotations

from typing import Any

import jsonschema_rs

from worker.errors import SchemaLoadError, UnsupportedKeywordError
from worker.schemas import patterns, refs
from worker.schemas.drafts import Draft, draft_of, is_known, pointer, walk

FASTJSONSCHEMA = "fastjsonschema"
JSONSCHEMA_RS = "jsonschema-rs"
ENGINES = (FASTJSONSCHEMA, JSONSCHEMA_RS)

#: What fastjsonschema (a draft-7 implementation) silently ignores in a 2020-12 schema.
_FASTJSONSCHEMA_IGNORES_2020 = frozenset(
    {
        "unevaluatedItems",
        "unevaluatedProperties",
        "minContains",
        "maxContains",
        "$dynamicRef",
        "$dynamicAnchor",
        "$anchor",
    }
)


def vet(schema: Any, *, file: str, engine: str) -> refs.Document:
    """The indexed document, once every check above passed; raises `SchemaLoadError` otherwise."""
    if engine not in ENGINES:
        raise SchemaLoadError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    draft = draft_of(schema)
    if draft is None:
        raise UnsupportedKeywordError("$schema", file=file, pointer="/$schema", engine=engine)
    _meta_valid(schema, file)
    for path, node in walk(schema, draft):
        at = pointer(path)
        if path and "$schema" in node and draft_of(node) is not draft:
            raise UnsupportedKeywordError(
                "$schema", file=file, pointer=at + "/$schema", engine=engine
            )
        for keyword, value in node.items():
            if not is_known(keyword, draft):
                raise UnsupportedKeywordError(
                    keyword, file=file, pointer=f"{at}/{keyword}", engine=engine
                )
            if (
                engine == FASTJSONSCHEMA
                and draft is Draft.DRAFT2020_12
                and keyword in _FASTJSONSCHEMA_IGNORES_2020
            ):
                raise UnsupportedKeywordError(
                    keyword, file=file, pointer=f"{at}/{keyword}", engine=engine
                )
            if draft is Draft.DRAFT2020_12 and keyword == "items" and isinstance(value, list):
                raise UnsupportedKeywordError(
                    "items", file=file, pointer=f"{at}/items", engine=engine
                )
        moved = ("/prefixItems", "/dependentSchemas", "/dependentRequired")
        ref = node.get("$ref")
        if (
            engine == FASTJSONSCHEMA
            and draft is Draft.DRAFT2020_12
            and isinstance(ref, str)
            and any(part in ref for part in moved)
        ):
            raise UnsupportedKeywordError("$ref", file=file, pointer=f"{at}/$ref", engine=engine)
        if isinstance(node.get("pattern"), str):
            _vet_pattern(node["pattern"], file, f"{at}/pattern", draft)
        if isinstance(node.get("patternProperties"), dict):
            for name in node["patternProperties"]:
                at_name = pointer((*path, "patternProperties", name))
                _vet_pattern(name, file, at_name, draft)
    document = refs.index(schema, draft, file)
    refs.refuse_loops(document, file)
    _no_ref_into_pattern_properties(document, file)
    return document


def _no_ref_into_pattern_properties(document: refs.Document, file: str) -> None:
    """Both engines receive patterns rewritten (`worker.schemas.patterns`), `patternProperties`
    names included, so a JSON Pointer through one would name nothing: refused."""
    targets = [(at, "$ref", t) for at, t in document.refs.items()]
    targets += [(at, "$dynamicRef", t) for at, ts in document.dynamic_refs.items() for t in ts]
    for at, keyword, target in targets:
        for i, token in enumerate(target[:-1]):
            if token == "patternProperties" and target[:i] in document.nodes:
                raise SchemaLoadError(
                    f"{keyword} at {pointer(at)}/{keyword} points into patternProperties, whose "
                    "names callgate rewrites for its linear-time matchers; move the schema under "
                    "$defs and refer to it there",
                    file=file,
                )


def _meta_valid(schema: Any, file: str) -> None:
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as exc:
        where = pointer(list(exc.instance_path)) or "/"
        raise SchemaLoadError(
            f"is not a valid schema at {where}: {exc.message.splitlines()[0]}", file=file
        ) from None
    except jsonschema_rs.ReferencingError as exc:  # a custom meta-schema: would need fetching
        raise SchemaLoadError(f"meta-schema cannot be resolved: {exc}", file=file) from None


def _vet_pattern(pattern: str, file: str, at: str, draft: Draft) -> None:
    reason = patterns.problem(pattern, draft)
    if reason is not None:
        raise SchemaLoadError(
            f"pattern {quote(pattern)} at {at} is refused: {reason}; every pattern is matched "
            "in linear time with its ECMA-262 meaning",
            file=file,
        )


def quote(text: str, limit: int = 120) -> str:
    """A schema string for a message, cut to `limit` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."
