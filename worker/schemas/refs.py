"""Where every `$ref` of a schema document points, and the loops no engine can judge.

`index(schema, draft, file)` reads a whole document once: every schema in it by JSON Pointer,
each one's base URI (`$id`), its anchors (`$anchor`, `$dynamicAnchor`, draft 7's `$id: "#name"`),
and the target of every `$ref` and `$dynamicRef`. A reference that leaves the document (nothing
is ever fetched) or that names nothing in it is refused at load, naming file and pointer.

It then refuses a loop that never descends into the instance: a chain of keywords that apply to
the same instance location (`$ref`, `$dynamicRef`, `allOf`, `anyOf`, `oneOf`, `not`, `if`,
`then`, `else`, `dependentSchemas`, draft 7's schema-valued `dependencies`) that comes back to
where it started, like `{"$ref": "#"}` or `a -> b -> a` through `$defs`. Evaluating it never
ends: fastjsonschema recurses until Python gives up, jsonschema-rs stops early and accepts
anything. A recursive schema that descends (`properties/children/items/$ref: "#"`) is fine: every
round consumes a level of the instance, whose depth is bounded before any schema runs. Every
loop is refused, reachable from the root or not; a `$dynamicRef` counts as pointing at every
schema that could answer it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

from worker.errors import SchemaLoadError
from worker.schemas.drafts import Draft, children, pointer

Pointer = tuple[str | int, ...]

#: The base URI of a document without `$id`; only its own fragments resolve against it.
DOCUMENT = "https://callgate.invalid/schema.json"

#: Keywords whose subschemas apply to the instance itself, not to a part of it.
_SAME_PLACE_SINGLE = ("not", "if", "then", "else")
_SAME_PLACE_LIST = ("allOf", "anyOf", "oneOf")


@dataclass(frozen=True, slots=True)
class Document:
    """A vetted schema document: its draft, every schema in it, and where its references go."""

    draft: Draft
    schema: Any
    nodes: dict[Pointer, Any]
    #: a node holding `$ref` -> the pointer of the schema it names
    refs: dict[Pointer, Pointer]
    #: a node holding `$dynamicRef` -> every schema it may name
    dynamic_refs: dict[Pointer, tuple[Pointer, ...]]

    def same_place(self, at: Pointer) -> Iterator[tuple[Pointer, Pointer]]:
        """(where, target) for each subschema applied to the same instance location as `at`:
        `where` is the keyword's own pointer (`/allOf/0`, `/$ref`), `target` the schema."""
        node = self.nodes[at]
        if not isinstance(node, dict):
            return
        if at in self.refs:
            yield (*at, "$ref"), self.refs[at]
            if self.draft is Draft.DRAFT7:
                return  # draft 7: `$ref` makes its siblings be ignored
        for target in self.dynamic_refs.get(at, ()):
            yield (*at, "$dynamicRef"), target
        for keyword in _SAME_PLACE_SINGLE:
            if keyword in node:
                yield (*at, keyword), (*at, keyword)
        for keyword in _SAME_PLACE_LIST:
            if isinstance(node.get(keyword), list):
                for index in range(len(node[keyword])):
                    yield (*at, keyword, index), (*at, keyword, index)
        dependent = "dependencies" if self.draft is Draft.DRAFT7 else "dependentSchemas"
        if isinstance(node.get(dependent), dict):
            for name, sub in node[dependent].items():
                if not isinstance(sub, list):
                    yield (*at, dependent, name), (*at, dependent, name)


def join(base: str, reference: str) -> str:
    """`reference` resolved against `base`, or a URI no resource has when it cannot be."""
    if reference.startswith("#"):
        return urldefrag(base).url + reference
    if urlsplit(reference).scheme:
        return reference
    if urlsplit(base).scheme in ("http", "https", "file", "ftp"):
        return urljoin(base, reference)
    return "callgate-unresolvable:" + reference  # relative to a URN: no document to find it in


def index(schema: Any, draft: Draft, file: str) -> Document:
    """Index a document and resolve its references; raises `SchemaLoadError` naming the first
    reference that leaves the document or names nothing in it."""
    return _Indexer(schema, draft).document(file)


class _Indexer:
    def __init__(self, schema: Any, draft: Draft) -> None:
        self.schema = schema
        self.draft = draft
        self.nodes: dict[Pointer, Any] = {}
        self.resources: dict[str, Pointer] = {DOCUMENT: ()}
        self.anchors: dict[tuple[str, str], Pointer] = {}
        self.dynamic_anchors: dict[str, list[Pointer]] = {}
        self.found: list[tuple[Pointer, str, str, str]] = []  # (node, keyword, base, reference)
        stack: list[tuple[Pointer, Any, str]] = [((), schema, DOCUMENT)]
        while stack:
            at, node, base = stack.pop()
            self.nodes[at] = node
            if not isinstance(node, dict):
                continue
            base = self.enter(node, at, base)
            for keyword in ("$ref", "$dynamicRef"):
                if isinstance(node.get(keyword), str):
                    self.found.append((at, keyword, base, node[keyword]))
            for sub_path, sub in children(node, draft):
                stack.append(((*at, *sub_path), sub, base))

    def enter(self, node: dict[str, Any], at: Pointer, base: str) -> str:
        """The base URI inside `node`; records the resources and anchors it declares."""
        node_id = node.get("$id")
        if self.draft is Draft.DRAFT7:
            if isinstance(node_id, str) and "$ref" not in node:  # beside $ref, $id is ignored
                if node_id.startswith("#"):
                    self.anchors[(urldefrag(base).url, node_id[1:])] = at
                else:
                    uri, fragment = urldefrag(join(base, node_id))
                    base = uri
                    self.resources.setdefault(uri, at)
                    if fragment and not fragment.startswith("/"):
                        self.anchors[(uri, fragment)] = at
            return base
        if isinstance(node_id, str):
            base = urldefrag(join(base, node_id)).url
            self.resources.setdefault(base, at)
        for keyword in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(keyword), str):
                self.anchors[(base, node[keyword])] = at
        if isinstance(node.get("$dynamicAnchor"), str):
            self.dynamic_anchors.setdefault(node["$dynamicAnchor"], []).append(at)
        return base

    def document(self, file: str) -> Document:
        refs: dict[Pointer, Pointer] = {}
        dynamic_refs: dict[Pointer, tuple[Pointer, ...]] = {}
        for at, keyword, base, reference in sorted(self.found, key=lambda f: pointer(f[0])):
            where = pointer(at) + "/" + keyword
            uri, fragment = urldefrag(join(base, reference))
            if uri not in self.resources:
                raise SchemaLoadError(
                    f"{keyword} at {where} points outside this document; remote references are "
                    "never fetched (inline the referenced schema under $defs)",
                    file=file,
                )
            target = self.resolve(uri, fragment)
            if target is None:
                raise SchemaLoadError(
                    f"{keyword} at {where} names no schema in this document", file=file
                )
            if keyword == "$ref":
                refs[at] = target
                continue
            targets = [target]
            answered = self.nodes[target]
            if isinstance(answered, dict) and answered.get("$dynamicAnchor") == fragment:
                targets.extend(self.dynamic_anchors.get(fragment, []))
            dynamic_refs[at] = tuple(dict.fromkeys(targets))
        return Document(self.draft, self.schema, self.nodes, refs, dynamic_refs)

    def resolve(self, uri: str, fragment: str) -> Pointer | None:
        resource = self.resources[uri]
        if not fragment:
            return resource
        if not fragment.startswith("/"):
            return self.anchors.get((uri, fragment))
        node = self.schema
        for part in resource:
            node = node[part]
        at: list[str | int] = list(resource)
        for raw in unquote(fragment)[1:].split("/"):
            token = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
                at.append(token)
            elif isinstance(node, list) and 0 <= _index(token) < len(node):
                node = node[_index(token)]
                at.append(_index(token))
            else:
                return None
        target = tuple(at)
        return target if target in self.nodes else None


def _index(token: str) -> int:
    """An array index in a JSON Pointer (no sign, no leading zero); -1 for anything else."""
    canonical = token == "0" or (token[:1] in "123456789" and len(token) < 10)
    return int(token) if canonical and token.isascii() and token.isdigit() else -1


def refuse_loops(document: Document, file: str) -> None:
    """Raise `SchemaLoadError` for the first loop that applies to the same instance location."""
    state: dict[Pointer, int] = {}  # 1: on the current path, 2: done
    for start in document.nodes:
        if start in state:
            continue
        path: list[tuple[Pointer, Pointer]] = [((), start)]  # (keyword pointer, schema)
        iterators = [document.same_place(start)]
        state[start] = 1
        while iterators:
            step = next(iterators[-1], None)
            if step is None:
                iterators.pop()
                state[path.pop()[1]] = 2
                continue
            where, target = step
            if state.get(target) == 1:
                cycle = [w for w, _ in path[[t for _, t in path].index(target) + 1 :]] + [where]
                raise SchemaLoadError(
                    f"{_describe(cycle)} loops back to {pointer(target) or '/'} without "
                    "descending into the instance; no engine can judge such a schema "
                    f"(the loop: {' -> '.join(pointer(w) for w in cycle)})",
                    file=file,
                )
            if target not in state:
                state[target] = 1
                path.append((where, target))
                iterators.append(document.same_place(target))


def _describe(cycle: list[Pointer]) -> str:
    """The loop's reference (every loop has one) by its keyword and pointer."""
    for where in cycle:
        if where and where[-1] in ("$ref", "$dynamicRef"):
            return f"{where[-1]} at {pointer(where)}"
    return f"the keyword at {pointer(cycle[-1])}"
