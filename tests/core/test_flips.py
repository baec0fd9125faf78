"""One call under two contract sets: `compare`, `judge_both`, the flip's record, the processor.

The properties the comparison must have hold for generated inputs: swapping the sides reverses
every answer, and equal verdicts (whatever their arguments' spelling) are never a flip; for
whole gates, contracts compiled twice from one schema never flip a call, and two generated
contract sets flip each call one way when compared one way round and the reverse the other.
A flip's record never holds what the call sent beyond its ids.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS
from tests.schemas.test_compat import instances, schema_pairs, schemas
from tests.support.contracts import LIMITS
from worker._native import AssembledCall
from worker.check import FileRecord
from worker.compose import build_gate, build_processor, build_registry, with_contracts
from worker.core.flips import FLIPS, Comparison, Kind, changes, compare, judge_both
from worker.core.pipeline import Gate, GateLimits
from worker.errors import SchemaLoadError
from worker.model import Code, IncompleteReason, Outcome, Phase, SchemaRef, Verdict
from worker.plugins import Plugins
from worker.schemas.registry import SchemaRegistry, SchemaSource, compile_source
from worker.schemas.vetting import FASTJSONSCHEMA
from worker.settings import Settings

FIXED = settings(derandomize=True, deadline=None, print_blob=True)
SETTINGS = Settings(schemas={"dir": SCHEMAS})
GATE_LIMITS = GateLimits(
    max_depth=32,
    max_feedback_bytes=4096,
    retry_budget=3,
    max_id_bytes=256,
    violations=LIMITS,
)
REFS = [SchemaRef("weather.get_weather", "1"), SchemaRef("weather.get_weather", "2"), None]

# -- generated verdicts ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


def spelled(value: Any, draw: st.DrawFn) -> bytes:
    """`value` as JSON text, spelled one of several ways (indented, keys in another order)."""
    if isinstance(value, dict) and draw(st.booleans()):
        value = dict(reversed(value.items()))
    option = draw(st.sampled_from([0, orjson.OPT_INDENT_2]))
    return orjson.dumps(value, option=option)


@st.composite
def verdicts(draw: st.DrawFn) -> Verdict:
    outcome = draw(st.sampled_from(list(Outcome)))
    schema = draw(st.sampled_from(REFS))
    if outcome is Outcome.ACCEPTED:
        arguments = draw(st.dictionaries(st.sampled_from("abc"), json_values, max_size=3))
        return Verdict(
            outcome,
            schema=schema,
            arguments_json=spelled(arguments, draw),
            requires_approval=draw(st.booleans()),
            idempotency_key=draw(st.sampled_from([None, "k1", "k2"])),
        )
    if outcome is Outcome.REJECTED:
        phase, code = draw(
            st.sampled_from(
                [
                    (Phase.SCHEMA_VALIDATION, Code.SCHEMA_VIOLATION),
                    (Phase.SCHEMA_VALIDATION, Code.UNKNOWN_TOOL),
                    (Phase.JSON_PARSE, Code.INVALID_JSON),
                    (Phase.IDEMPOTENCY, Code.DUPLICATE),
                ]
            )
        )
        return Verdict(outcome, phase=phase, code=code, schema=schema)
    reason = draw(st.sampled_from([IncompleteReason.MAX_TOKENS, IncompleteReason.INPUT_REQUIRED]))
    return Verdict(outcome, phase=Phase.ASSEMBLY, reason=reason, schema=schema)


@st.composite
def respelled(draw: st.DrawFn, verdict: Verdict) -> Verdict:
    """An equal verdict: the same fields, its arguments (if any) spelled another way."""
    arguments = verdict.arguments_json
    if arguments is not None:
        arguments = spelled(orjson.loads(arguments), draw)
    return Verdict(
        verdict.outcome,
        phase=verdict.phase,
        code=verdict.code,
        reason=verdict.reason,
        schema=verdict.schema,
        arguments_json=arguments,
        requires_approval=verdict.requires_approval,
        idempotency_key=verdict.idempotency_key,
    )


def expected_kind(baseline: Verdict, candidate: Verdict) -> Kind:
    """The kind as the module's docstring defines it, written out case by case."""
    b, c = baseline.outcome.value, candidate.outcome.value
    if b != c:
        return Kind(f"{b}_to_{c}")
    if b == "accepted":
        same = (
            baseline.schema == candidate.schema
            and orjson.loads(baseline.arguments_json or b"null")
            == orjson.loads(candidate.arguments_json or b"null")
            and baseline.idempotency_key == candidate.idempotency_key
            and baseline.requires_approval == candidate.requires_approval
        )
        return Kind.ACCEPTED_UNCHANGED if same else Kind.ACCEPTED_CHANGED
    if b == "rejected":
        same = (baseline.phase, baseline.code) == (candidate.phase, candidate.code)
        return Kind.REJECTED_UNCHANGED if same else Kind.REJECTED_CHANGED
    return Kind.INCOMPLETE_UNCHANGED


@FIXED
@given(verdicts(), verdicts())
def test_swapping_the_sides_reverses_the_kind(baseline: Verdict, candidate: Verdict) -> None:
    kind = compare(baseline, candidate)
    assert compare(candidate, baseline) is kind.reversed
    assert kind.reversed.reversed is kind
    assert kind.is_flip == kind.reversed.is_flip


@FIXED
@given(verdicts(), verdicts())
def test_the_kind_is_what_the_docstring_says(baseline: Verdict, candidate: Verdict) -> None:
    # orjson reads 1 and True as different values, as canonical form does (1 == True in Python
    # would not); the generated integers and booleans keep the two apart
    assert compare(baseline, candidate) is expected_kind(baseline, candidate)


@FIXED
@given(st.data())
def test_equal_verdicts_are_never_a_flip_however_spelled(data: st.DataObject) -> None:
    verdict = data.draw(verdicts())
    other = data.draw(respelled(verdict))
    assert compare(verdict, verdict) in {
        Kind.ACCEPTED_UNCHANGED,
        Kind.REJECTED_UNCHANGED,
        Kind.INCOMPLETE_UNCHANGED,
    }
    assert not compare(verdict, other).is_flip
    assert not compare(other, verdict).is_flip


def test_every_kind_has_its_reverse_and_the_flips_are_the_changes_of_what_runs() -> None:
    assert {kind.reversed for kind in Kind} == set(Kind)
    assert {kind for kind in Kind if "_to_" in kind.value} | {Kind.ACCEPTED_CHANGED} == FLIPS


def test_arguments_compare_as_json_values() -> None:
    ref = REFS[0]

    def accepted(text: bytes) -> Verdict:
        return Verdict(Outcome.ACCEPTED, schema=ref, arguments_json=text)

    assert compare(accepted(b'{"a":1,"b":[1,2]}'), accepted(b'{ "b": [1, 2], "a": 1 }')) is (
        Kind.ACCEPTED_UNCHANGED
    )
    assert compare(accepted(b'{"a":1}'), accepted(b'{"a":1.0}')) is Kind.ACCEPTED_UNCHANGED
    assert compare(accepted(b'{"a":1}'), accepted(b'{"a":true}')) is Kind.ACCEPTED_CHANGED
    assert compare(accepted(b'{"a":9007199254740993}'), accepted(b'{"a":9007199254740992}')) is (
        Kind.ACCEPTED_CHANGED
    )
    assert changes(accepted(b'{"a":1}'), accepted(b'{"a":2}')) == ("arguments",)


# -- whole gates on generated contracts ----------------------------------------------------------


def gate_of(schema: Any) -> Gate:
    """A gate of one tool `t`, version 1, judged by `schema` (compiled afresh each time)."""
    source = SchemaSource("generated.schema.json", "t", "gen.t", "1", schema)
    registry = SchemaRegistry([compile_source(source, FASTJSONSCHEMA, LIMITS)])
    return Gate(registry, Plugins(), GATE_LIMITS)


def calls_of(values: list[Any]) -> list[AssembledCall]:
    return [
        AssembledCall("s", f"c{i}", "t", orjson.dumps(value), tool_version="1")
        for i, value in enumerate(values)
    ]


GENERATED = settings(
    derandomize=True,
    deadline=None,
    max_examples=150,
    print_blob=True,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)


@GENERATED
@given(schemas(draft7=False), st.lists(instances(), min_size=8, max_size=8))
def test_contracts_equal_to_the_baseline_never_flip_a_call(schema: Any, values: list[Any]) -> None:
    try:
        baseline, candidate = gate_of(schema), gate_of(schema)
    except SchemaLoadError:
        assume(False)
    for call in calls_of([*values, *({"a": v} for v in values)]):
        compared = judge_both(call, baseline.judge(call), candidate.judge)
        assert not compared.kind.is_flip, (compared.baseline, compared.candidate)


@GENERATED
@given(schema_pairs(), st.lists(instances(), min_size=8, max_size=8))
def test_swapped_contracts_flip_each_call_the_other_way(
    pair: tuple[Any, Any], values: list[Any]
) -> None:
    old, new = pair
    try:
        first, second = gate_of(old), gate_of(new)
    except SchemaLoadError:
        assume(False)
    for call in calls_of([*values, *({"a": v} for v in values)]):
        forward = judge_both(call, first.judge(call), second.judge)
        backward = judge_both(call, second.judge(call), first.judge)
        assert backward.kind is forward.kind.reversed, (forward.baseline, forward.candidate)


# -- on the shipped contracts ------------------------------------------------------------------


def candidate_dir(tmp_path: Path, edit: Any) -> Path:
    """A copy of schemas/ (plugins included) with `edit(path)` applied to it."""
    target = tmp_path / "candidate"
    shutil.copytree(SCHEMAS, target)
    edit(target)
    return target


def rewrite(path: Path, change: Any) -> None:
    schema = orjson.loads(path.read_bytes())
    change(schema)
    path.write_bytes(orjson.dumps(schema, option=orjson.OPT_INDENT_2))


def celsius_only(root: Path) -> None:
    for version in (1, 2):
        path = root / "weather" / f"get_weather.v{version}.schema.json"
        rewrite(path, lambda s: s["properties"]["units"].__setitem__("enum", ["celsius"]))


def weather(
    city: str, units: str, version: str | None = "1", tool: str = "get_weather"
) -> AssembledCall:
    text = orjson.dumps({"city": city, "units": units})
    return AssembledCall("s", f"{city}-{units}", tool, text, tool_version=version)


def test_a_tightened_enum_flips_the_calls_it_now_refuses_and_no_other(tmp_path: Path) -> None:
    baseline = build_gate(SETTINGS, build_registry(SETTINGS))
    candidate_settings = with_contracts(SETTINGS, candidate_dir(tmp_path, celsius_only))
    candidate = build_gate(candidate_settings, build_registry(candidate_settings))
    kinds = {}
    for call in [
        weather("Oslo", "celsius"),
        weather("Boston", "fahrenheit"),
        weather("Denver", "fahrenheit", version="2"),
        weather("Lima", "kelvin"),
        weather("Quito", "fahrenheit", version=None, tool="weather.get_weather"),
    ]:
        kinds[call.call_id] = judge_both(call, baseline.judge(call), candidate.judge).kind
    assert kinds == {
        "Oslo-celsius": Kind.ACCEPTED_UNCHANGED,
        "Boston-fahrenheit": Kind.ACCEPTED_TO_REJECTED,
        "Denver-fahrenheit": Kind.ACCEPTED_TO_REJECTED,
        "Lima-kelvin": Kind.REJECTED_UNCHANGED,
        "Quito-fahrenheit": Kind.ACCEPTED_TO_REJECTED,
    }


def test_accepted_changed_names_what_an_executor_would_see_differ(tmp_path: Path) -> None:
    def edit(root: Path) -> None:
        # approval now needed for v1; v3 added (the newest judges calls without a version);
        # the version adapters gone (no plugins: v2's arguments pass as sent)
        rewrite(
            root / "weather" / "get_weather.v1.schema.json",
            lambda s: s.__setitem__("x-callgate", {"requires_approval": True}),
        )
        v2 = root / "weather" / "get_weather.v2.schema.json"
        shutil.copy(v2, root / "weather" / "get_weather.v3.schema.json")
        (root / "plugins.py").unlink()

    baseline = build_gate(SETTINGS, build_registry(SETTINGS))
    candidate_settings = with_contracts(SETTINGS, candidate_dir(tmp_path, edit))
    candidate = build_gate(candidate_settings, build_registry(candidate_settings))
    found = {}
    for call in [weather("Oslo", "celsius"), weather("Rome", "celsius", version=None)]:
        compared = judge_both(call, baseline.judge(call), candidate.judge)
        assert compared.kind is Kind.ACCEPTED_CHANGED
        found[call.call_id] = compared.record()["changed"]
    assert found == {
        "Oslo-celsius": ["arguments", "requires_approval"],
        "Rome-celsius": ["schema", "arguments"],
    }


def test_a_call_the_reassembler_decided_is_not_judged_again() -> None:
    class Refusing(Gate):
        def judge(self, call: AssembledCall) -> Verdict:
            raise AssertionError("judged again")

    gate = build_gate(SETTINGS, build_registry(SETTINGS))
    refusing = Refusing(SchemaRegistry([]), Plugins(), GATE_LIMITS)
    cut = AssembledCall(
        "s", "c", "get_weather", b'{"ci', incomplete=IncompleteReason.MAX_TOKENS.value
    )
    verdict = gate.judge(cut)
    compared = judge_both(cut, verdict, refusing.judge)
    assert compared.candidate is verdict
    assert compared.kind is Kind.INCOMPLETE_UNCHANGED


SECRET = "hunter2-Secret"


@FIXED
@given(
    st.dictionaries(
        st.sampled_from(["city", "units", f"x-{SECRET}", "days"]),
        st.sampled_from([SECRET, 7, None, [SECRET], {"k": SECRET}]),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(["1", "2", None]),
)
def test_a_flip_record_holds_no_argument_value(
    arguments: dict[str, Any], version: str | None
) -> None:
    baseline = build_gate(SETTINGS, build_registry(SETTINGS))
    call = AssembledCall("s", "c", "get_weather", orjson.dumps(arguments), tool_version=version)
    verdict = baseline.judge(call)
    record = orjson.dumps(Comparison(call, verdict, verdict, Kind.REJECTED_UNCHANGED).record())
    assert SECRET.encode() not in record
    # and the other way round, each side with the other's verdict
    accepted = AssembledCall(
        "s", "c", "get_weather", b'{"city":"Oslo","units":"celsius"}', tool_version="1"
    )
    other = baseline.judge(accepted)
    for first, second in ((verdict, other), (other, verdict)):
        shown = Comparison(call, first, second, compare(first, second)).encode()
        assert SECRET.encode() not in shown


# -- the processor ------------------------------------------------------------------------------


def records(lines: list[dict[str, Any]]) -> list[FileRecord]:
    return [
        FileRecord("in", 0, offset, None, None, orjson.dumps(line), ())
        for offset, line in enumerate(lines)
    ]


def traffic() -> list[FileRecord]:
    lines: list[dict[str, Any]] = []
    for n, units in enumerate(["celsius", "fahrenheit", "kelvin", "celsius"]):
        args = orjson.dumps({"city": f"c{n}", "units": units}).decode()
        lines.append(
            {
                "stream_id": "s",
                "call_id": f"c{n}",
                "kind": "tool_call",
                "tool": "get_weather",
                "tool_version": "1",
                "delta": args,
                "final": True,
            }
        )
    payment = {
        "amount_minor": 100,
        "currency": "EUR",
        "recipient": "acct_1",
        "description": None,
        "idempotency_key": "k1",
    }
    lines.append(
        {
            "stream_id": "s",
            "call_id": "pay",
            "kind": "tool_call",
            "tool": "create_payment",
            "delta": orjson.dumps(payment).decode(),
            "final": True,
        }
    )
    lines.append(
        {
            "stream_id": "s",
            "call_id": "cut",
            "kind": "tool_call",
            "tool": "get_weather",
            "delta": "{",
        }
    )
    lines.append({"stream_id": "s", "kind": "end", "finish_reason": "length"})
    return records(lines)


def without_timings(value: bytes) -> Any:
    """An emission's value with the phases' durations left out (they are measurements)."""
    event = orjson.loads(value.split(b"\n", 1)[-1])
    event["metrics"].pop("phases_us")
    return event


def test_a_shadow_gate_changes_no_emission_and_compares_every_call(tmp_path: Path) -> None:
    plain = build_processor(SETTINGS)
    shadowed = build_processor(SETTINGS, candidate=candidate_dir(tmp_path, celsius_only))
    alone = plain.feed("in", 0, traffic())
    both = shadowed.feed("in", 0, traffic())
    assert len(alone) == len(both) == 6
    kinds = {}
    for one, other in zip(alone, both, strict=True):
        assert one.shadow is None
        assert (one.route, one.key, one.headers) == (other.route, other.key, other.headers)
        assert without_timings(one.value) == without_timings(other.value)
        assert other.shadow is not None
        assert other.shadow.call is other.call
        assert other.shadow.baseline.outcome is other.verdict.outcome
        kinds[other.call.call_id] = other.shadow.kind
    assert kinds == {
        "c0": Kind.ACCEPTED_UNCHANGED,
        "c1": Kind.ACCEPTED_TO_REJECTED,
        "c2": Kind.REJECTED_UNCHANGED,
        "c3": Kind.ACCEPTED_UNCHANGED,
        "pay": Kind.ACCEPTED_UNCHANGED,  # pending its key's owner, on both sides
        "cut": Kind.INCOMPLETE_UNCHANGED,
    }


def test_a_candidate_directory_that_cannot_load_is_refused_by_name(tmp_path: Path) -> None:
    broken = tmp_path / "broken" / "weather"
    broken.mkdir(parents=True)
    (broken / "get_weather.v1.schema.json").write_text('{"type": "object", "type": "object"}')
    with pytest.raises(SchemaLoadError, match=r"get_weather\.v1\.schema\.json"):
        build_processor(SETTINGS, candidate=broken.parent)


def test_comparisons_are_values() -> None:
    call = weather("Oslo", "celsius")
    verdict = build_gate(SETTINGS, build_registry(SETTINGS)).judge(call)
    compared = Comparison(call, verdict, verdict, Kind.ACCEPTED_UNCHANGED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        compared.kind = Kind.ACCEPTED_CHANGED  # type: ignore[misc]
    assert compared.version == "1"
