"""Early verdicts through the processor, as `run` and `check` see them.

A call whose chunks already prove its contract cannot accept it gets its one event when the
deciding chunk arrives (`rejected`, `early: true`, `early_offset`); the rest of its stream is
dropped and counted, and stays dropped across a checkpoint, a restore and a replay of records
already fed; an envelope call is judged early only under the version it names (a later chunk may
name it); every vendor format gets it (it sits on the reassembler); the setting turns it off;
in shadow mode only tools whose candidate decides alike keep it. The generated crash and restore
properties of `test_processor` run with early verdicts on, over traffic that has them.
"""

from __future__ import annotations

import itertools
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.adapters import streamgen
from tests.core.test_processor import TOPIC, Partition, envelope, events
from tests.datafiles import REPO, SCHEMAS
from worker.compose import build_processor
from worker.core.processor import Processor, Route
from worker.published.model import Rejected, parse_event
from worker.settings import Settings

SETTINGS = Settings(schemas={"dir": SCHEMAS})
DOOMED = ['{"city":"Oslo",', '"units":"kel', 'vin","days":3', "}"]


def new_processor(settings: Settings = SETTINGS, candidate: Path | None = None) -> Processor:
    return build_processor(settings, candidate=candidate)


def doomed_records(rec: Partition, call: str = "c1", stream: str = "r1") -> list[Any]:
    return [
        rec(envelope(stream, call, seq, piece, tool="get_weather", tool_version="2", final=last))
        for seq, (piece, last) in enumerate(
            (piece, n == len(DOOMED) - 1) for n, piece in enumerate(DOOMED)
        )
    ]


def test_the_chunk_that_decides_emits_the_calls_one_event_and_the_rest_is_dropped() -> None:
    p, rec = new_processor(), Partition()
    records = doomed_records(rec)
    assert p.feed(TOPIC, 0, records[:1]) == []
    (emission,) = p.feed(TOPIC, 0, records[1:2])
    assert emission.route is Route.REJECTED
    event = orjson.loads(emission.value)
    assert (event["phase"], event["error_code"], event["early"], event["early_offset"]) == (
        "schema_validation",
        "schema_violation",
        True,
        records[1].offset,
    )
    assert [(v["path"], v["keyword"]) for v in event["violations"]] == [("/units", "enum")]
    assert event["violations"][0]["message"] == 'must be one of ["celsius","fahrenheit"]'
    assert event["source"]["last_offset"] == records[1].offset
    assert event["metrics"]["bytes"] == len("".join(DOOMED[:2]))
    read = parse_event(emission.value)  # the published model reads it
    assert isinstance(read, Rejected)
    assert (read.early, read.early_offset) == (True, records[1].offset)
    assert p.feed(TOPIC, 0, records[2:]) == []
    assert p.flush() == []
    assert p.assembler.early_dropped_chunks == 2


def test_the_early_verdict_survives_a_checkpoint_a_restore_and_a_replay() -> None:
    for full in (True, False):
        p, rec = new_processor(), Partition()
        records = doomed_records(rec)
        frames = [p.checkpoint(TOPIC, 0, full=True)]
        (first,) = p.feed(TOPIC, 0, records[:2])
        frames.append(p.checkpoint(TOPIC, 0, full=full))
        successor = new_processor()
        successor.restore(TOPIC, 0, frames if not full else frames[-1:])
        # a fetch from an older offset, and the rest of the stream: nothing more
        assert successor.feed(TOPIC, 0, records) == []
        assert successor.flush() == []
        assert successor.assembler.early_dropped_chunks == 2
        # restored before the deciding chunk: the same event, byte for byte but the timings
        before = new_processor()
        before.restore(TOPIC, 0, frames[:1])
        (again,) = before.feed(TOPIC, 0, records)
        assert again.value.split(b'"phases_us"')[0] == first.value.split(b'"phases_us"')[0]


def test_a_call_that_opens_after_an_early_verdict_under_a_new_id_is_judged_whole() -> None:
    p, rec = new_processor(), Partition()
    doomed = doomed_records(rec, "c1")
    fixed = rec(
        envelope("r1", "c2", 0, '{"city":"Oslo","units":"celsius"}', tool="get_weather", final=True)
    )
    out = p.feed(TOPIC, 0, [*doomed, fixed])
    assert [(e["call_id"], e["outcome"], e.get("early", False)) for e in events(out)] == [
        ("c1", "rejected", True),
        ("c2", "accepted", False),
    ]


def test_the_setting_turns_it_off_and_the_verdict_waits_for_the_last_chunk() -> None:
    off = Settings(schemas={"dir": SCHEMAS}, assembly={"early_verdict": False})
    p, rec = new_processor(off), Partition()
    records = doomed_records(rec)
    assert p.feed(TOPIC, 0, records[:-1]) == []
    (emission,) = p.feed(TOPIC, 0, records[-1:])
    event = orjson.loads(emission.value)
    assert event["outcome"] == "rejected"
    assert "early" not in event
    assert [(v["path"], v["keyword"]) for v in event["violations"]] == [("/units", "enum")]


def test_invalid_json_no_repair_rescues_is_rejected_early_in_its_phase() -> None:
    p, rec = new_processor(), Partition()
    pieces = ['{"city" "Oslo"', ',"units":"celsius"', "}"]
    records = [
        rec(envelope("r1", "c1", n, piece, tool="get_weather", tool_version="2", final=n == 2))
        for n, piece in enumerate(pieces)
    ]
    (emission,) = p.feed(TOPIC, 0, records)
    event = orjson.loads(emission.value)
    assert (event["phase"], event["error_code"], event["early_offset"]) == (
        "json_parse",
        "invalid_json",
        records[0].offset,
    )
    # the same text whole: the same violation
    whole = rec(
        envelope("r2", "c2", 0, "".join(pieces), tool="get_weather", tool_version="2", final=True)
    )
    (final,) = p.feed(TOPIC, 0, [whole])
    assert orjson.loads(final.value)["violations"] == event["violations"]
    # a fence may open: the one repair the chain makes is left to the end
    fenced = ['```json\n{"city":3', "}\n```"]
    records = [
        rec(envelope("r3", "c3", n, piece, tool="get_weather", tool_version="2", final=n == 1))
        for n, piece in enumerate(fenced)
    ]
    assert p.feed(TOPIC, 0, records[:1]) == []
    (late,) = p.feed(TOPIC, 0, records[1:])
    assert "early" not in orjson.loads(late.value)


MEMBER_SCHEMAS = st.one_of(
    st.builds(lambda e: {"enum": e}, st.lists(st.sampled_from(["x", "xy", "y", ""]), min_size=1)),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 3)),
    st.builds(lambda n: {"type": "integer", "maximum": n}, st.integers(-2, 2)),
    st.sampled_from([{"type": ["string", "null"]}, {"const": "x"}, {"type": "boolean"}]),
)
MEMBER_VALUES = st.one_of(
    st.sampled_from(["x", "xy", "y", "", "xyz", "yx"]), st.integers(-3, 3), st.none(), st.booleans()
)


@st.composite
def object_schema(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from("abc"), unique=True))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {name: draw(MEMBER_SCHEMAS) for name in names},
        "additionalProperties": draw(st.booleans()),
    }


def verdict_of(event: dict[str, Any]) -> tuple[Any, ...]:
    """What an event decides: all but its record, timing and early fields, its violations
    apart (an early rejection names one, the whole judgement each it finds)."""
    feedback = dict(event.get("retry_feedback") or {})
    feedback.pop("violations", None)
    return (
        event["call_id"],
        event["outcome"],
        event["phase"],
        event["error_code"],
        event["reason"],
        event["schema"],
        feedback,
        event.get("arguments"),
    )


def assert_decided_alike(early: dict[str, Any], whole: dict[str, Any]) -> None:
    """The early verdict is the whole judgement's: the same decision, its violation among the
    whole judgement's."""
    assert verdict_of(early) == verdict_of(whole), (early, whole)
    assert all(v in whole["violations"] for v in early["violations"]), (early, whole)
    named = (early.get("retry_feedback") or {}).get("violations", [])
    assert all(v in whole["retry_feedback"]["violations"] for v in named), (early, whole)


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    schemas=st.tuples(object_schema(), object_schema()),
    value=st.dictionaries(st.sampled_from("abcd"), MEMBER_VALUES, max_size=4),
    cuts=st.lists(st.integers(1, 30), min_size=1, max_size=8),
    named=st.tuples(st.sampled_from(["1", "2", "3"]), st.integers(0, 9)),
)
def test_an_envelope_call_is_judged_early_under_the_version_it_names_at_any_chunk(
    tmp_path_factory: pytest.TempPathFactory,
    schemas: tuple[dict[str, Any], dict[str, Any]],
    value: dict[str, Any],
    cuts: list[int],
    named: tuple[str, int],
) -> None:
    """A call whose envelopes name its version on a later chunk than its tool (or never) gets
    the verdict of the contract it names, early or not: the events with early verdicts on are
    those with them off, but for when they come."""
    contracts = tmp_path_factory.mktemp("contracts")
    (contracts / "case").mkdir()
    for version, schema in zip(("1", "2"), schemas, strict=True):
        (contracts / "case" / f"case.v{version}.schema.json").write_bytes(orjson.dumps(schema))
    text = orjson.dumps(value).decode()
    bounds = [0, *sorted({c for c in cuts if c < len(text)}), len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    version, at = named[0], named[1] % (len(pieces) + 1)  # past the last piece: never
    decided = []
    for early in (True, False):
        settings_ = Settings(schemas={"dir": contracts}, assembly={"early_verdict": early})
        p, rec = new_processor(settings_), Partition()
        out = []
        for seq, piece in enumerate(pieces):
            fields: dict[str, Any] = {"final": seq == len(pieces) - 1}
            if seq == 0:
                fields["tool"] = "case"
            if seq == at:
                fields["tool_version"] = version
            out += p.feed(TOPIC, 0, [rec(envelope("r1", "c1", seq, piece, **fields))])
        (event,) = events(out)
        decided.append(event)
    assert_decided_alike(*decided)


@pytest.mark.parametrize("fmt", ["openai.chat", "anthropic.messages", "openai.responses"])
def test_every_vendor_format_gets_early_verdicts(fmt: str) -> None:
    rng = random.Random(7)
    text = '{"city":"Oslo","units":"kelvin","days":3,"and":"' + "x" * 200 + '"}'
    calls = [("call_1", "get_weather", text)]
    if fmt == "openai.chat":
        stream = streamgen.chat_stream("chat1", [calls], rng)
    elif fmt == "anthropic.messages":
        stream = streamgen.anthropic_stream("msg1", calls, rng)
    else:
        stream = streamgen.responses_stream("resp1", calls, rng)
    p, rec = new_processor(), Partition()
    records = [rec(orjson.dumps(e), key=b"vendor-1", fmt=fmt) for e in stream]
    out = p.feed(TOPIC, 0, records)
    (event,) = events(out)
    assert (event["outcome"], event["early"]) == ("rejected", True)
    assert event["early_offset"] < records[-1].offset
    assert [(v["path"], v["keyword"]) for v in event["violations"]] == [("/units", "enum")]
    assert p.assembler.early_dropped_chunks > 0


def test_shadow_mode_keeps_early_verdicts_only_where_the_candidate_decides_alike(
    tmp_path: Path,
) -> None:
    same, wider = tmp_path / "same", tmp_path / "wider"
    shutil.copytree(SCHEMAS, same)
    shutil.copytree(SCHEMAS, wider)
    v2 = wider / "weather" / "get_weather.v2.schema.json"
    schema = orjson.loads(v2.read_bytes())
    schema["properties"]["units"]["enum"].append("kelvin")
    v2.write_bytes(orjson.dumps(schema))
    # a candidate equal to the contracts: the early verdict is the candidate's too
    p, rec = new_processor(candidate=same), Partition()
    (early,) = p.feed(TOPIC, 0, doomed_records(rec)[:2])
    assert orjson.loads(early.value)["early"] is True
    assert early.shadow is not None
    assert early.shadow.kind == "rejected_unchanged"
    # a candidate that accepts kelvin: the call is judged whole, the flip is seen
    p, rec = new_processor(candidate=wider), Partition()
    records = doomed_records(rec)
    assert p.feed(TOPIC, 0, records[:-1]) == []
    (whole,) = p.feed(TOPIC, 0, records[-1:])
    assert "early" not in orjson.loads(whole.value)
    assert whole.shadow is not None
    assert whole.shadow.kind == "rejected_to_accepted"


def test_check_offline_writes_the_early_event(tmp_path: Path) -> None:
    lines = [
        envelope("r1", "c1", seq, piece, tool="get_weather", tool_version="2", final=seq == 3)
        for seq, piece in enumerate(DOOMED)
    ]
    path = tmp_path / "calls.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = subprocess.run(
        [sys.executable, "-m", "worker", "check", "--schemas", str(SCHEMAS), str(path)],
        capture_output=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    (event,) = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert (event["outcome"], event["early"], event["early_offset"]) == ("rejected", True, 1)


def test_the_readme_shows_what_the_example_prints() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Early verdicts: a rejection before the stream ends") :]
    command = section.split("```sh\n", 1)[1].split("\n", 1)[0]
    shown = orjson.loads(section.split("```json\n", 1)[1].split("```", 1)[0])
    result = subprocess.run(
        [sys.executable, "-m", "worker", *command.split()[1:]],
        capture_output=True,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    printed = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [(e["call_id"], e["outcome"], e.get("early_offset")) for e in printed] == [
        ("call_1", "rejected", 1),
        ("call_2", "rejected", 4),
        ("call_3", "accepted", None),
    ]
    del printed[0]["metrics"]["phases_us"]
    assert printed[0] == shown
