"""The early judge's soundness, through the reassembler, against the final judgement.

The contract (native/core/src/early.rs): a prefix that some value the contract accepts extends
is never rejected early. Values are generated from real schemas (the repository's contracts, and
the JSON Schema Test Suite's schemas of the keywords the early judge decides, beside ones it
must leave alone), kept only when the final judgement accepts them, spelled three ways (compact,
indented, every non-ASCII character escaped, surrogate pairs included) and fed to the reassembler
one character per chunk (so the judge sees every prefix) or in random chunks: never rejected
early. Generated invalid values, when rejected early, are rejected by the final judgement too, in
the same phase, with the early violation among its violations, unless the strict parser refuses
the text at a byte the early judge had not read: values spelled with a key twice, with a stray
character of any width or edited anywhere, values nested past the depth bound, and calls of
every kind against contracts of every kind, are judged so too. Whatever a later chunk states of
its call (version, kind, caller, double encoding), a call rejected early is one its whole
judgement never accepts.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS, data_files
from worker._native import AssembledCall, Chunk
from worker.compose import build_processor
from worker.core.processor import Processor
from worker.model import Outcome, Phase, Verdict
from worker.settings import Settings

SOUND = settings(
    derandomize=True,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
#: the final judgement reports every violation (the early one is then always among them)
LIMITS = {"max_violations": 1000}
CONTRACTS = [
    ("get_weather", "1"),
    ("get_weather", "2"),
    ("create_payment", "1"),
    ("weather.get_weather_data", "1"),
]
#: suite files of the keywords the early judge decides, and of ones it must leave alone
SUITE_FILES = {
    "type.json",
    "enum.json",
    "const.json",
    "maxLength.json",
    "maxItems.json",
    "items.json",
    "properties.json",
    "additionalProperties.json",
    "minimum.json",
    "maximum.json",
    "exclusiveMinimum.json",
    "exclusiveMaximum.json",
    "ref.json",
    "defs.json",
    "boolean_schema.json",
    "patternProperties.json",
    "prefixItems.json",
    "anyOf.json",
    "allOf.json",
    "oneOf.json",
}


def processor(contracts: Path, engine: str = "fastjsonschema") -> Processor:
    return build_processor(Settings(schemas={"dir": contracts, "engine": engine}, limits=LIMITS))


@cache
def repository() -> Processor:
    return processor(SCHEMAS)


def early_call(
    p: Processor,
    tool: str,
    version: str,
    text: str,
    cuts: list[int],
    *,
    kind: str | None = None,
    double: bool = False,
) -> Any:
    """`text` fed as chunks cut at `cuts` (char positions) through the reassembler: the call it
    closed early, if any (else None); the stream's last chunk is final."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)] or [""]
    p.assembler.drop_partition("early-test", 0)
    for seq, piece in enumerate(pieces):
        chunk = Chunk(
            "s",
            "tool_call",
            "c",
            seq=seq,
            tool=tool if seq == 0 else None,
            tool_version=version if seq == 0 else None,
            call_kind=kind if seq == 0 else None,
            double_encoded=double and seq == 0,
            delta=piece,
            final=seq == len(pieces) - 1,
        )
        closed = p.assembler.feed_chunks("early-test", 0, seq, 1_000 + seq, [chunk])
        if closed:
            (call,) = closed
            return call if call.early is not None else None
    return None


def final_verdict(
    p: Processor, tool: str, version: str, text: str, kind: str = "function_call"
) -> Verdict:
    call = AssembledCall("s", "c", tool, text.encode(), tool_version=version, call_kind=kind)
    return p.gate.judge(call)


#: phases of a text the final judgement never parsed (a later byte it refuses, nesting too deep)
UNREAD = {Phase.JSON_PARSE, Phase.LIMITS}


def spellings(value: Any) -> list[str]:
    return [
        json.dumps(value, separators=(",", ":"), ensure_ascii=False),
        json.dumps(value, indent=1, ensure_ascii=False),
        json.dumps(value, ensure_ascii=True, separators=(", ", " : ")),
    ]


def refused_at(text: str, final: Verdict) -> int:
    """The byte the strict parser's failure names ("(line L, column C)", C counted in bytes), or
    the text's end for a failure it locates nowhere (a nesting bound)."""
    data = text.encode()
    found = re.search(r"\(line (\d+), column (\d+)\)$", final.violations[0].message)
    if final.phase is not Phase.JSON_PARSE or found is None:
        return len(data)
    line, column = int(found[1]), int(found[2])
    starts = [0, *(at + 1 for at, byte in enumerate(data) if byte == ord("\n"))]
    return starts[line - 1] + column - 1


def check_sound(p: Processor, tool: str, version: str, value: Any, cuts: list[int]) -> None:
    check_texts(p, tool, version, spellings(value), cuts)


def check_texts(
    p: Processor,
    tool: str,
    version: str,
    texts: list[str],
    cuts: list[int],
    *,
    kind: str = "function_call",
) -> None:
    """Each text of a call of `kind` fed a character at a time and cut at `cuts`: a text the
    final judgement accepts is never rejected early; one rejected early is rejected finally in
    the same phase, with the early violation among its own, unless the strict parser refuses it
    at a byte the early judge had not read (the defect the text read first shows is named)."""
    for text in texts:
        final = final_verdict(p, tool, version, text, kind)
        every = list(range(len(text)))
        for chunking in (every, cuts):
            call = early_call(p, tool, version, text, chunking, kind=kind)
            if final.outcome is Outcome.ACCEPTED:
                assert call is None, (text, call and call.early)
            elif call is not None:
                early = p.gate.judge(call)
                assert early.outcome is Outcome.REJECTED
                if final.phase in UNREAD and early.phase not in UNREAD:
                    # text the strict parser refuses later: rejected either way (fed a
                    # character at a time, the text read ends with the byte that decided)
                    if chunking is every:
                        assert refused_at(text, final) >= call.nbytes, (text, early, final)
                    continue
                assert early.phase == final.phase, (text, early, final)
                (violation,) = early.violations
                assert violation in final.violations, (text, violation, final)


# --- values from a schema ---------------------------------------------------------------------


def resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return True
    node = root
    for raw in [t for t in ref[1:].split("/") if t]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return True
    return node


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=6),
)
ANY_VALUE = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def count(value: Any) -> int | None:
    """A length or count keyword's value as an int (the suite writes some as `2.0`)."""
    return int(value) if isinstance(value, int | float) and value >= 0 else None


@st.composite
def instance(draw: st.DrawFn, schema: Any, root: Any, wild: bool, depth: int = 0) -> Any:
    """A value for `schema`, mostly fitting it; with `wild`, often not (any value anywhere,
    strings too long, numbers past bounds, undeclared members)."""
    if (wild and draw(st.integers(0, 5)) == 0) or depth > 5 or not isinstance(schema, dict):
        return draw(ANY_VALUE)
    if "$ref" in schema and draw(st.booleans()):
        return draw(instance(resolve(root, schema["$ref"]), root, wild, depth + 1))
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key] and draw(st.booleans()):
            branch = draw(st.sampled_from(schema[key]))
            return draw(instance(branch, root, wild, depth + 1))
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return draw(st.sampled_from(schema["enum"]))
    kinds = schema.get(
        "type", ["null", "boolean", "integer", "number", "string", "array", "object"]
    )
    kind = draw(st.sampled_from(kinds if isinstance(kinds, list) else [kinds]))
    if kind == "null":
        return None
    if kind == "boolean":
        return draw(st.booleans())
    if kind in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        low = low if isinstance(low, int | float) and not wild else None
        high = high if isinstance(high, int | float) and not wild else None
        if kind == "integer" or draw(st.booleans()):
            low = -(2**63) if low is None else max(-(2**63), math.ceil(low))
            high = 2**63 - 1 if high is None else min(2**63 - 1, math.floor(high))
            return draw(st.integers(low, max(low, high)))
        return draw(st.floats(low, high, allow_nan=False, allow_infinity=False))
    if kind == "string":
        most = count(schema.get("maxLength")) if not wild else None
        least = count(schema.get("minLength")) or 0 if not wild else 0
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and draw(st.booleans()):
            try:
                re.compile(pattern)
                text = draw(st.from_regex(pattern, fullmatch=True))
            except re.error:
                text = draw(st.text(max_size=8))
            return text
        return draw(st.text(min_size=least, max_size=most if most is not None else 12))
    if kind == "array":
        items = schema.get("items", True)
        most = count(schema.get("maxItems")) if not wild else 5
        most = 4 if most is None else most
        least = min(count(schema.get("minItems")) or 0, most)
        return draw(st.lists(instance(items, root, wild, depth + 1), min_size=least, max_size=most))
    members: dict[str, Any] = {}
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    for name, sub in properties.items() if isinstance(properties, dict) else ():
        if name in required or draw(st.booleans()):
            members[name] = draw(instance(sub, root, wild, depth + 1))
    if wild or schema.get("additionalProperties") is not False:
        for name in draw(st.lists(st.text(max_size=5), max_size=2)):
            extra = schema.get("additionalProperties", True)
            members.setdefault(name, draw(instance(extra, root, wild, depth + 1)))
    return members


def cuts_for(draw: st.DrawFn) -> list[int]:
    return draw(st.lists(st.integers(0, 400), max_size=12))


# --- the repository's contracts ---------------------------------------------------------------


def contract_schema(tool: str, version: str) -> Any:
    p = repository()
    contract = p.gate.registry.resolve(tool, version)
    assert not isinstance(contract, type(None))
    for path in SCHEMAS.rglob("*.json"):
        document = orjson.loads(path.read_bytes())
        if path.name.endswith(".tools.json"):
            for item in document.get("tools", []):
                if tool.endswith(item.get("name", "\0")):
                    return item["inputSchema"]
        elif path.name.startswith(f"{tool}.v{version}."):
            return document
    raise AssertionError(f"no schema file for {tool} v{version}")


def test_every_contract_of_the_repository_decides_something_early() -> None:
    p = repository()
    for tool, version in CONTRACTS:
        contract = p.gate.registry.resolve(tool, version)
        assert getattr(contract, "early", None) is not None, (tool, version)


def contract_value(data: st.DataObject, *, wild: bool) -> tuple[str, str, Any]:
    tool, version = data.draw(st.sampled_from(CONTRACTS))
    schema = contract_schema(tool, version)
    return tool, version, data.draw(instance(schema, schema, wild))


@SOUND
@given(data=st.data())
def test_a_value_a_contract_accepts_is_never_rejected_early(data: st.DataObject) -> None:
    tool, version, value = contract_value(data, wild=False)
    p = repository()
    assume(final_verdict(p, tool, version, spellings(value)[0]).outcome is Outcome.ACCEPTED)
    check_sound(p, tool, version, value, cuts_for(data.draw))


@SOUND
@given(data=st.data())
def test_an_early_rejection_of_a_contract_is_the_final_judgements_too(data: st.DataObject) -> None:
    tool, version, value = contract_value(data, wild=True)
    check_sound(repository(), tool, version, value, cuts_for(data.draw))


@st.composite
def twin_spelling(draw: st.DrawFn, value: Any) -> tuple[str, bool]:
    """`value` spelled compactly, some of its objects holding a key twice (a copy of one of
    their keys, spelled with or without escapes, with any value, placed after it: the strict
    parser refuses the text there), and whether one does."""
    if isinstance(value, list):
        elements = [draw(twin_spelling(element)) for element in value]
        return "[" + ",".join(t for t, _ in elements) + "]", any(twin for _, twin in elements)
    if not isinstance(value, dict):
        return json.dumps(value, ensure_ascii=draw(st.booleans())), False
    members = []
    twinned = False
    for key, member in value.items():
        text, twin = draw(twin_spelling(member))
        members.append((key, text))
        twinned |= twin
    if members and draw(st.booleans()):
        at = draw(st.integers(0, len(members) - 1))
        other = draw(st.sampled_from([members[at][1], json.dumps(draw(ANY_VALUE))]))
        members.insert(draw(st.integers(at + 1, len(members))), (members[at][0], other))
        twinned = True
    spelled = [f"{json.dumps(k, ensure_ascii=draw(st.booleans()))}:{v}" for k, v in members]
    return "{" + ",".join(spelled) + "}", twinned


@SOUND
@given(data=st.data())
def test_a_key_twice_leaves_the_call_to_the_strict_parser(data: st.DataObject) -> None:
    """The strict parser refuses an object holding a key twice (`duplicate_key`), whatever
    follows: nothing read after the twin is judged against the schema."""
    tool, version, value = contract_value(data, wild=True)
    assume(isinstance(value, dict))
    text, twinned = data.draw(twin_spelling(value))
    assume(twinned)
    check_texts(repository(), tool, version, [text], cuts_for(data.draw))


#: characters put where JSON holds none: ASCII, and ones of two, three and four bytes in UTF-8
STRAYS = st.sampled_from(["x", "'", "\x7f", "é", "€", "\u2028", "😀"]) | st.characters(
    min_codepoint=0x80, exclude_categories=["Cs"]
)


@SOUND
@given(data=st.data())
def test_a_stray_character_of_any_width_is_named_as_the_strict_parser_names_the_whole_text(
    data: st.DataObject,
) -> None:
    """A character put anywhere in a value's text (where JSON holds none, or in a string): when
    no JSON text continues with it, the early rejection is the strict parser's failure on the
    whole text (code, place and message), however many bytes the character takes in UTF-8."""
    tool, version, value = contract_value(data, wild=True)
    assume(isinstance(value, dict))  # a root of another kind is refused at its first byte
    text = data.draw(st.sampled_from(spellings(value)))
    at = data.draw(st.integers(0, len(text)))
    stray = text[:at] + data.draw(STRAYS) + text[at:]
    check_texts(repository(), tool, version, [stray], cuts_for(data.draw))


#: JSON's own characters, and a few no JSON text holds
EDITS = st.sampled_from(list('{}[],:"\\0123456789.eE+-tfnu /ax'))


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    """`text` with a few characters inserted, deleted or replaced anywhere, or inserted beside
    a digit (where a number may go on, end, or be spelt wrong)."""
    for _ in range(draw(st.integers(1, 3))):
        digits = [at for at, char in enumerate(text) if char.isdigit()]
        if digits and draw(st.booleans()):
            at = draw(st.sampled_from(digits)) + draw(st.integers(0, 1))
        else:
            at = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["insert", "delete", "replace"]))
        char = draw(EDITS) if edit != "delete" else ""
        text = text[:at] + char + text[at + (edit != "insert") :]
    return text


@SOUND
@given(data=st.data())
def test_a_text_edited_anywhere_is_rejected_early_only_for_what_its_read_part_shows(
    data: st.DataObject,
) -> None:
    """A value's text with characters inserted, deleted or replaced: an early rejection is the
    whole judgement's, in its phase with its violation, unless the strict parser refuses the
    text at a byte the judge had not read (a byte that no JSON value continues with, a number
    ended by a byte that may not follow it, is the strict parser's to name)."""
    tool, version, value = contract_value(data, wild=True)
    assume(isinstance(value, dict))
    text = data.draw(mutated(data.draw(st.sampled_from(spellings(value)))))
    assume(text.lstrip(" \n").startswith("{"))  # another root is refused at its first byte
    check_texts(repository(), tool, version, [text], cuts_for(data.draw))


TYPE_NAMES = ["null", "boolean", "integer", "number", "string", "array", "object"]


@cache
def typed_processor(engine: str, types: tuple[str, ...], workdir: Path) -> Processor:
    """A contract whose one member `a` allows `types`, listed in that order, on `engine`."""
    schema = {"type": "object", "properties": {"a": {"type": list(types)}}}
    contracts = workdir / engine / "-".join(types)
    (contracts / "types").mkdir(parents=True)
    (contracts / "types" / "case.v1.schema.json").write_text(json.dumps(schema))
    return processor(contracts, engine)


@settings(SOUND, max_examples=100)
@given(
    engine=st.sampled_from(["fastjsonschema", "jsonschema-rs"]),
    types=st.lists(st.sampled_from(TYPE_NAMES), min_size=1, max_size=4, unique=True),
    value=ANY_VALUE,
    cuts=st.lists(st.integers(0, 40), max_size=4),
)
def test_a_type_list_is_named_alike_in_any_order_on_either_engine(
    tmp_path_factory: pytest.TempPathFactory,
    engine: str,
    types: list[str],
    value: Any,
    cuts: list[int],
) -> None:
    """The early `type` violation reads as the whole judgement's, whatever order the schema
    lists the types in and whichever engine judges."""
    p = typed_processor(engine, tuple(types), tmp_path_factory.getbasetemp() / "typed")
    check_texts(p, "case", "1", [json.dumps({"a": value, "z": 0})], cuts)


@cache
def deep_processor(max_depth: int, workdir: Path) -> Processor:
    """A contract whose `a` is the contract again and whose `b` is a string, judging arguments
    at most `max_depth` levels deep."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#"}, "b": {"type": "string"}}}
    contracts = workdir / str(max_depth)
    (contracts / "deep").mkdir(parents=True)
    (contracts / "deep" / "case.v1.schema.json").write_text(json.dumps(schema))
    limits = {**LIMITS, "max_depth": max_depth}
    return build_processor(Settings(schemas={"dir": contracts}, limits=limits))


def too_deep_at(text: str, max_depth: int) -> int | None:
    """Where the first bracket past `max_depth` levels is (outside strings), if there is one."""
    depth, quoted, escaped = 0, False, False
    for at, char in enumerate(text):
        if quoted:
            quoted, escaped = (escaped or char != '"'), (not escaped and char == "\\")
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                return at
        elif char in "]}":
            depth -= 1
    return None


NESTED = st.recursive(
    st.fixed_dictionaries({}, optional={"b": ANY_VALUE}),
    lambda inner: st.fixed_dictionaries({"a": inner}, optional={"b": ANY_VALUE}),
    max_leaves=6,
)


@settings(SOUND, max_examples=150)
@given(max_depth=st.integers(1, 5), value=NESTED, cuts=st.lists(st.integers(0, 80), max_size=6))
def test_a_value_too_deep_is_left_to_the_depth_bound_from_its_first_bracket_past_it(
    tmp_path_factory: pytest.TempPathFactory, max_depth: int, value: Any, cuts: list[int]
) -> None:
    """Arguments nested past `max_depth` are rejected `too_deep` whatever they hold: the early
    judge decides only on what it read before the first bracket past the bound (never the type
    of the container that bracket opens), and judges the rest as any other value."""
    p = deep_processor(max_depth, tmp_path_factory.getbasetemp() / "deep")
    texts = spellings(value)
    check_texts(p, "case", "1", texts, cuts)
    for text in texts:
        deep = too_deep_at(text, max_depth)
        call = early_call(p, "case", "1", text, list(range(len(text))))
        if deep is not None and call is not None:
            assert call.nbytes <= len(text[:deep].encode()), (text, p.gate.judge(call))


#: contract kinds whose text is JSON, and every kind of call
JSON_CONTRACT_KINDS = ["function_call", "apply_patch_call", "shell_call", "local_shell_call"]
CALL_KINDS = [*JSON_CONTRACT_KINDS, "custom_tool_call", "mcp_approval_request"]


@cache
def kind_processor(contract_kind: str, workdir: Path) -> Processor:
    """The repository's `get_weather` v2 schema as a contract of `contract_kind`, tool `case`."""
    schema = {**contract_schema("get_weather", "2"), "x-callgate": {"call_kind": contract_kind}}
    domain = workdir / contract_kind / "kinds"
    domain.mkdir(parents=True)
    (domain / "case.v1.schema.json").write_text(json.dumps(schema))
    return processor(workdir / contract_kind)


@SOUND
@given(data=st.data())
def test_a_call_is_judged_early_only_by_a_contract_of_its_kind(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A contract judges one kind of call (a remote MCP tool's approval request is a function
    call's): a call of another kind is `unsupported_call_kind` whatever its text."""
    contract_kind = data.draw(st.sampled_from(JSON_CONTRACT_KINDS))
    p = kind_processor(contract_kind, tmp_path_factory.getbasetemp() / "kinds")
    schema = contract_schema("get_weather", "2")
    value = data.draw(instance(schema, schema, wild=True))
    kind = data.draw(st.sampled_from(CALL_KINDS))
    check_texts(p, "case", "1", spellings(value), cuts_for(data.draw), kind=kind)


def test_the_invalid_values_generated_are_often_rejected_early() -> None:
    """Not vacuous: the contracts' typical mistakes are caught before the end."""
    p = repository()
    doomed = [
        ("get_weather", "2", '{"city":"Oslo","units":"kelvin","days":3}', "/units", "enum"),
        ("get_weather", "2", '{"city":"Oslo","days":15,"units":"celsius"}', "/days", "maximum"),
        ("get_weather", "2", '{"town":"Oslo","units":"celsius"}', "/town", "additionalProperties"),
        ("create_payment", "1", '{"amount_minor":12.5,"currency":"EUR"}', "/amount_minor", "type"),
    ]
    for tool, version, text, path, keyword in doomed:
        call = early_call(p, tool, version, text, list(range(len(text))))
        assert call is not None, text
        verdict = p.gate.judge(call)
        assert [(v.path, v.keyword) for v in verdict.violations] == [(path, keyword)]
        assert call.nbytes < len(text.encode())


def test_a_custom_tools_free_form_text_is_never_judged_early() -> None:
    """A custom tool's text is not JSON (it is judged whole, as `{"input": text}`)."""
    p = repository()
    text = "*** Begin Patch\n{not json"
    assert early_call(p, "get_weather", "2", text, list(range(len(text)))) is not None
    kind = "custom_tool_call"
    assert early_call(p, "get_weather", "2", text, list(range(len(text))), kind=kind) is None


def test_a_double_encoding_servers_text_waits_for_its_repair() -> None:
    """A server known to double-encode sends a JSON string the repair decodes once."""
    p = repository()
    text = orjson.dumps(orjson.dumps({"city": "Oslo", "units": "celsius"}).decode()).decode()
    assert early_call(p, "get_weather", "2", text, list(range(len(text)))) is not None
    assert early_call(p, "get_weather", "2", text, list(range(len(text))), double=True) is None


# --- the JSON Schema Test Suite ---------------------------------------------------------------


def suite_groups() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for draft in ("draft7", "draft2020-12"):
        for path in data_files(f"json-schema-test-suite/tests/{draft}", "*.json", at_least=30):
            if path.name in SUITE_FILES:
                for group in json.loads(path.read_text()):
                    yield draft, path.name, group


GROUPS = list(suite_groups())


def suite_processor(schema: Any, draft: str, workdir: Path) -> Processor | None:
    if draft == "draft7" and isinstance(schema, dict) and "$schema" not in schema:
        schema = {"$schema": "http://json-schema.org/draft-07/schema#", **schema}
    domain = workdir / "suite"
    domain.mkdir(parents=True, exist_ok=True)
    (domain / "case.v1.schema.json").write_text(json.dumps(schema))
    try:
        return processor(workdir)
    except Exception:  # a schema the registry refuses at load is never judged
        return None


def test_every_suite_instance_is_judged_early_as_its_verdict_allows(tmp_path: Path) -> None:
    """Every test of the chosen suite files, fed a character at a time: a valid object is never
    rejected early; an invalid one rejected early is rejected finally with that violation."""
    judged = early = 0
    for index, (draft, _, group) in enumerate(GROUPS):
        p = suite_processor(group["schema"], draft, tmp_path / str(index))
        if p is None:
            continue
        for test in group["tests"]:
            value = test["data"]
            if not isinstance(value, dict):
                continue  # the arguments are an object: a root of another kind never gets this far
            judged += 1
            for text in spellings(value):
                call = early_call(p, "case", "1", text, list(range(len(text))))
                final = final_verdict(p, "case", "1", text)
                assert (final.outcome is Outcome.ACCEPTED) == test["valid"], (group, test)
                if call is None:
                    continue
                early += 1
                assert not test["valid"], (group["description"], test["description"], text)
                verdict = p.gate.judge(call)
                (violation,) = verdict.violations
                assert violation in final.violations, (group, test, violation)
    assert judged > 200, judged
    assert early > 40, early


@settings(SOUND, max_examples=200)
@given(data=st.data())
def test_values_generated_from_suite_schemas_are_judged_soundly(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    draft, _, group = data.draw(st.sampled_from(GROUPS))
    schema = group["schema"]
    p = suite_processor(schema, draft, tmp_path_factory.mktemp("suite"))
    assume(p is not None)
    assert p is not None
    wild = data.draw(st.booleans())
    value = data.draw(instance(schema, schema, wild))
    assume(isinstance(value, dict))
    check_sound(p, "case", "1", value, cuts_for(data.draw))


# --- what a later chunk states ------------------------------------------------------------------


@cache
def whole_repository() -> Processor:
    """The repository's contracts judging every call at its end."""
    return build_processor(Settings(schemas={"dir": SCHEMAS}, limits=LIMITS), early=False)


#: what a chunk may state beside its text: a version, a call kind, a caller, double encoding
STATEMENTS = st.fixed_dictionaries(
    {},
    optional={
        "tool_version": st.sampled_from(["1", "2"]),
        "call_kind": st.sampled_from(CALL_KINDS),
        "caller": st.just('{"type":"program"}'),
        "double_encoded": st.just(True),
    },
)


def chunked_call(p: Processor, pieces: list[str], said: list[dict[str, Any]]) -> AssembledCall:
    """`pieces` fed as one call's chunks (the first naming `get_weather`), each stating what
    `said` holds for it; the call the reassembler closed."""
    p.assembler.drop_partition("later", 0)
    for seq, (piece, statements) in enumerate(zip(pieces, said, strict=True)):
        chunk = Chunk(
            "s",
            "tool_call",
            "c",
            seq=seq,
            tool="get_weather" if seq == 0 else None,
            delta=piece,
            final=seq == len(pieces) - 1,
            **statements,
        )
        closed = p.assembler.feed_chunks("later", 0, seq, 1_000 + seq, [chunk])
        if closed:
            (call,) = closed
            return call
    raise AssertionError("the final chunk closes the call")


@SOUND
@given(data=st.data())
def test_what_a_later_chunk_states_never_makes_an_early_rejection_unsound(
    data: st.DataObject,
) -> None:
    """A chunk fed by an adapter may state the call's version, kind, caller or double encoding;
    each selects the rules the call is judged by (or whether its text is JSON at all). Whichever
    chunk states them, a call rejected early is one its whole judgement never accepts: it ends
    incomplete (a later chunk broke the stream), or is rejected in the same phase with the early
    violation among its own (unless the strict parser refuses a byte the judge had not read); a
    call not rejected early is judged alike either way."""
    schema = contract_schema("get_weather", "2")
    value = data.draw(instance(schema, schema, data.draw(st.booleans())))
    text = json.dumps(value, separators=(",", ":"))
    if data.draw(st.booleans()):
        text = json.dumps(text)  # as a double-encoding server sends it
    cuts = sorted(data.draw(st.lists(st.integers(1, len(text) - 1), max_size=4, unique=True)))
    pieces = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
    said = [data.draw(STATEMENTS) for _ in pieces]
    early_call = chunked_call(repository(), pieces, said)
    whole_call = chunked_call(whole_repository(), pieces, said)
    whole = whole_repository().gate.judge(whole_call)
    early = repository().gate.judge(early_call)
    if early_call.early is None:
        assert (early.outcome, early.violations) == (whole.outcome, whole.violations)
        return
    assert whole.outcome is not Outcome.ACCEPTED, (pieces, said, early)
    if whole.outcome is Outcome.INCOMPLETE or (whole.phase in UNREAD and early.phase not in UNREAD):
        return  # the stream broke, or the strict parser refuses a byte the judge had not read
    assert early.phase == whole.phase, (pieces, said, early, whole)
    (violation,) = early.violations
    assert violation in whole.violations, (pieces, said, early, whole)
