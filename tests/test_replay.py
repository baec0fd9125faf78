"""`callgate replay` on input files: the report, its JSON, exit statuses, keyed calls, options.

Run in this process through the command line's `main`, as a user runs it. The README's example
(examples/contracts, examples/traffic.jsonl) is checked call by call: the candidate drops
`fahrenheit` and adds `kelvin`, so exactly the two fahrenheit calls flip to rejected and the
kelvin call to accepted. The replay on a Kafka topic is in tests/runtime/test_history.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.test_flips import FIXED, rewrite
from tests.core.test_processor import (
    IDLE_MS,
    LIFETIME_MS,
    TOPIC,
    envelope,
    every_format,
    normalized,
    payment_args,
    traffic,
)
from tests.datafiles import REPO, SCHEMAS
from worker.check import FileRecord
from worker.cli import main
from worker.compose import (
    build_assembler,
    build_decoder,
    build_gate,
    build_key_store,
    build_registry,
    event_limits,
    with_contracts,
)
from worker.core.approval import APPROVAL_RESERVE
from worker.core.flips import compare
from worker.core.idempotency import resolve
from worker.core.pipeline import Gate
from worker.core.processor import Processor, Route
from worker.model import Outcome, Phase, Verdict
from worker.replay import Replay, parse_time
from worker.settings import Settings

EXAMPLES = REPO / "examples"
CURRENT = EXAMPLES / "contracts" / "current"
CANDIDATE = EXAMPLES / "contracts" / "candidate"
TRAFFIC = EXAMPLES / "traffic.jsonl"


def replay(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = main(["replay", *(str(arg) for arg in args)])
    out, err = capsys.readouterr()
    return status, out, err


def report(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, dict[str, Any]]:
    status, out, err = replay(capsys, "--json", "--examples", "100", *args)
    assert status in (0, 1), err
    return status, orjson.loads(out)


def flipped(document: dict[str, Any]) -> dict[str, set[str]]:
    return {
        kind: {example["call_id"] for example in examples}
        for kind, examples in document["examples"].items()
    }


def test_the_readme_example_flips_exactly_the_calls_the_candidate_changes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, document = report(capsys, "--baseline", CURRENT, "--schemas", CANDIDATE, TRAFFIC)
    assert status == 0
    assert document["calls"] == 7
    assert document["flips"] == 3
    assert flipped(document) == {
        "accepted_to_rejected": {"call_2", "call_3"},
        "rejected_to_accepted": {"call_4"},
    }
    kinds = {kind: count for kind, count in document["kinds"].items() if count}
    assert kinds == {
        "accepted_to_rejected": 2,
        "rejected_to_accepted": 1,
        "accepted_unchanged": 1,
        "rejected_unchanged": 2,
        "incomplete_unchanged": 1,
    }
    (weather,) = [row for row in document["tools"] if row["version"] == "1"]
    assert weather == {
        "tool": "get_weather",
        "version": "1",
        "calls": 6,
        "flips": 3,
        "kinds": {
            "accepted_to_rejected": 2,
            "rejected_to_accepted": 1,
            "accepted_unchanged": 1,
            "rejected_unchanged": 2,
        },
    }
    (example, _) = document["examples"]["accepted_to_rejected"]
    assert example["baseline"]["outcome"] == "accepted"
    assert example["candidate"]["violations"] == [
        {"path": "/units", "keyword": "enum", "message": 'must be one of ["celsius","kelvin"]'}
    ]


def test_the_table_says_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = replay(capsys, "--baseline", CURRENT, "--schemas", CANDIDATE, TRAFFIC)
    assert status == 0
    assert "3 flips: 2 accepted -> rejected, 1 rejected -> accepted" in out
    assert "call call_2 of stream resp_1" in out
    assert "/units enum: must be one of" in out


def test_no_value_of_the_calls_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--json"], []):
        _, out, _ = replay(capsys, *args, "--baseline", CURRENT, "--schemas", CANDIDATE, TRAFFIC)
        for city in ("Oslo", "Boston", "Denver", "Geneva", "Lima", "Kyiv", "debug"):
            assert city not in out


@pytest.mark.parametrize(("allowed", "status"), [(None, 0), (0, 1), (2, 1), (3, 0), (10, 0)])
def test_fail_on_flips_fails_when_more_calls_flip(
    capsys: pytest.CaptureFixture[str], allowed: int | None, status: int
) -> None:
    limit = [] if allowed is None else ["--fail-on-flips", str(allowed)]
    got, _, _ = replay(capsys, *limit, "--baseline", CURRENT, "--schemas", CANDIDATE, TRAFFIC)
    assert got == status


def test_a_candidate_equal_to_the_baseline_flips_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, document = report(
        capsys,
        "--fail-on-flips",
        "0",
        "--baseline",
        REPO / "schemas",
        "--schemas",
        REPO / "schemas",
        TRAFFIC,
        EXAMPLES / "calls.jsonl",
        EXAMPLES / "stream.sse",
    )
    assert status == 0
    assert document["flips"] == 0
    assert document["examples"] == {}
    assert document["calls"] == 7 + 3 + 1


def write_contract(root: Path, maximum: int) -> Path:
    domain = root / "billing"
    domain.mkdir(parents=True)
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "x-callgate": {"idempotency": "required", "idempotency_key_argument": "key"},
        "type": "object",
        "properties": {
            "key": {"type": "string"},
            "amount": {"type": "integer", "minimum": 1, "maximum": maximum},
        },
        "required": ["key", "amount"],
        "additionalProperties": False,
    }
    (domain / "charge.v1.schema.json").write_bytes(orjson.dumps(schema))
    return root


def test_each_side_decides_keys_with_a_store_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The baseline accepts `first` and refuses `second` (the same key, another request); the
    candidate refuses `first` by its schema, so the key is still new when `second` comes."""
    current = write_contract(tmp_path / "current", maximum=10)
    candidate = write_contract(tmp_path / "candidate", maximum=4)
    calls = [
        ("first", {"key": "k1", "amount": 5}),
        ("second", {"key": "k1", "amount": 3}),
        ("again", {"key": "k2", "amount": 2}),
        ("again-twice", {"key": "k2", "amount": 2}),
    ]
    lines = [
        {
            "stream_id": "s",
            "call_id": call,
            "kind": "tool_call",
            "tool": "charge",
            "delta": orjson.dumps(args).decode(),
            "final": True,
        }
        for call, args in calls
    ]
    traffic = tmp_path / "keyed.jsonl"
    traffic.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    _, document = report(capsys, "--baseline", current, "--schemas", candidate, traffic)
    assert flipped(document) == {
        "accepted_to_rejected": {"first"},
        "rejected_to_accepted": {"second"},
    }
    (first,) = document["examples"]["accepted_to_rejected"]
    assert first["candidate"]["code"] == "schema_violation"
    (second,) = document["examples"]["rejected_to_accepted"]
    assert (second["baseline"]["phase"], second["baseline"]["code"]) == (
        "idempotency",
        "idempotency_conflict",
    )
    kinds = {kind: count for kind, count in document["kinds"].items() if count}
    assert kinds == {
        "accepted_to_rejected": 1,
        "rejected_to_accepted": 1,
        "accepted_unchanged": 1,
        "rejected_unchanged": 1,
    }
    assert "k1" not in orjson.dumps(document).decode()


def test_examples_are_bounded_per_kind(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = replay(
        capsys, "--json", "--examples", "1", "--baseline", CURRENT, "--schemas", CANDIDATE, TRAFFIC
    )
    document = orjson.loads(out)
    assert {kind: len(shown) for kind, shown in document["examples"].items()} == {
        "accepted_to_rejected": 1,
        "rejected_to_accepted": 1,
    }
    assert document["kinds"]["accepted_to_rejected"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "input files or --topic"),
        ([TRAFFIC, "--topic", "t"], "input files or --topic"),
        ([TRAFFIC, "--since", "2025-01-01"], "need --topic"),
        ([TRAFFIC, "--partition", "1"], "need --topic"),
        (["--topic", "t", "--format", "openai.chat"], "for input files"),
        (["--topic", "t", "--since", "yesterday"], "--since takes an ISO 8601 time"),
        (["--topic", "t", "--since", "1", "--from-offset", "3"], "not both"),
        (["--topic", "t", "--until", "1", "--to-offset", "3"], "not both"),
        ([EXAMPLES / "missing.jsonl"], "cannot read"),
        (["--schemas-typo"], None),
    ],
)
def test_what_cannot_be_used_is_status_2_with_one_message(
    capsys: pytest.CaptureFixture[str], args: list[Any], message: str | None
) -> None:
    base = ["--baseline", CURRENT, "--schemas", CANDIDATE]
    if message is None:
        with pytest.raises(SystemExit) as stopped:
            main(["replay", *(str(a) for a in [*base, *args])])
        assert stopped.value.code == 2
        return
    status, out, err = replay(capsys, *base, *args)
    assert status == 2
    assert message in err
    assert out == ""


def test_a_candidate_that_does_not_load_is_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = replay(capsys, "--baseline", CURRENT, "--schemas", tmp_path / "none", TRAFFIC)
    assert status == 2
    assert "does not exist" in err


def test_times_are_read_as_iso_8601_or_epoch_milliseconds() -> None:
    assert parse_time("1750000000000", "--since") == 1_750_000_000_000
    assert parse_time("2025-06-01T00:00:00Z", "--since") == 1_748_736_000_000
    assert parse_time("2025-06-01", "--since") == 1_748_736_000_000
    assert parse_time("2025-06-01T02:00:00+02:00", "--until") == 1_748_736_000_000


def test_the_readme_shows_what_the_example_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Trying a contract change on recorded traffic") :]
    command = section[section.index("callgate replay ") :].split("\n", 1)[0]
    shown = section.split("The first prints:\n\n```text\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(REPO)
    status, out, _ = replay(capsys, *command.split()[2:])
    assert status == 0
    assert out == shown


# -- each side is what a worker running that side's contracts emits ---------------------------

#: a small event bound (the least the settings allow is near 32 KiB with these arguments), so an
#: adapter can make an accepted call's event too large for it
BOUND = Settings(
    schemas={"dir": SCHEMAS},
    assembly={
        "idle_timeout_s": IDLE_MS / 1000,
        "max_call_lifetime_s": LIFETIME_MS / 1000,
        "early_verdict": False,  # a replay judges whole calls
    },
    limits={"max_bytes": 16_384, "max_event_bytes": 65_536},
)
#: an adapter's padding that leaves an event of the generated calls under the bound, but not
#: with the bytes an approval reserves; and one past the bound
PAD_HELD, PAD_OVER = 65_536 - 1_000 - APPROVAL_RESERVE // 2, 70_000
PADDED = """

def _padded(adapt, pad):
    return lambda arguments: {**adapt(arguments), "note": "x" * pad}


def register(plugins: Plugins) -> None:
    plugins.adapter("weather.get_weather", "1")(_padded(weather_v1_to_internal, PAD))
    plugins.adapter("weather.get_weather", "2")(_padded(weather_v2_to_internal, PAD))
    plugins.adapter("payments.create_payment", "1")(_padded(dict, PAD))
    plugins.rule("payments.create_payment")(payment_within_ceiling)
"""


def contract_sets(root: Path) -> dict[str, Settings]:
    """The shipped contracts; their copies whose adapters make accepted events too large (keyed
    ones too); and ones holding get_weather v2 for approval, too large only with its approval."""
    sets = {"shipped": BOUND}
    for name, pad, held in (("too large", PAD_OVER, False), ("held", PAD_HELD, True)):
        target = root / name.replace(" ", "-")
        shutil.copytree(SCHEMAS, target)
        plugins = target / "plugins.py"
        plugins.write_text(plugins.read_text() + f"\nPAD = {pad}\n" + PADDED)
        if held:
            rewrite(
                target / "weather" / "get_weather.v2.schema.json",
                lambda s: s.setdefault("x-callgate", {}).__setitem__("requires_approval", True),
            )
        sets[name] = with_contracts(BOUND, target)
    return sets


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Gate]:
    return {
        name: build_gate(chosen, build_registry(chosen))
        for name, chosen in contract_sets(tmp_path_factory.mktemp("contracts")).items()
    }


def processor(gate: Gate, shadow: Gate | None = None) -> Processor:
    limits = BOUND.limits
    return Processor(
        build_assembler(BOUND),
        build_decoder(BOUND),
        gate,
        event_limits(limits),
        shadow=shadow,
    )


Seen = tuple[str, Outcome, Phase | None, str | None, bool]


def emitted(records: list[FileRecord], gate: Gate) -> list[Seen]:
    """What a worker running `gate`'s contracts emits for each call, its keys decided by their
    owner as `callgate check` decides them: outcome, phase, code, held for approval."""
    run, keys, seen = processor(gate), build_key_store(BOUND), []
    for emission in [*run.feed(TOPIC, 0, records), *run.flush()]:
        verdict = emission.verdict
        found = (verdict.outcome, verdict.phase, verdict.code or verdict.reason)
        held = emission.route is Route.PENDING_APPROVAL
        if emission.route is Route.IDEMPOTENCY:
            decided = resolve(keys, emission.value, None, BOUND.limits.max_feedback_bytes)
            if decided.code is not None:
                found = (decided.outcome, Phase.IDEMPOTENCY, decided.code)
            held = decided.pending
        seen.append((emission.call.event_id, *found, held))
    return seen


def side(event_id: str, verdict: Verdict) -> Seen:
    held = verdict.outcome is Outcome.ACCEPTED and verdict.requires_approval
    return (event_id, verdict.outcome, verdict.phase, verdict.code or verdict.reason, held)


#: whole keyed calls: payments and refunds (a refund is held for approval) under two keys each,
#: requests equal or not, some refused by their schema or rule; get_weather keyed by its envelope
KEYED = st.one_of(
    st.builds(
        lambda key, amount: ("create_payment", {**payment_args(idempotency_key=key), **amount}),
        st.sampled_from(["pay-1", "pay-2"]),
        st.sampled_from([{}, {}, {"amount_minor": 2}, {"amount_minor": 10**12}]),
    ),
    st.builds(
        lambda key, amount: (
            "refund_payment",
            {
                "payment_id": "p1",
                "amount_minor": amount,
                "currency": "EUR",
                "reason": None,
                "idempotency_key": key,
            },
        ),
        st.sampled_from(["ref-1", "ref-2"]),
        st.sampled_from([1, 1, 2, 0]),
    ),
    st.builds(
        lambda units: ("get_weather", {"city": "Oslo", "units": units, "idempotency_key": "w-1"}),
        st.sampled_from(["celsius", "kelvin"]),
    ),
)


@st.composite
def keyed_traffic(draw: st.DrawFn) -> list[FileRecord]:
    """Generated traffic (`traffic()`, or `every_format()`: every vendor format, keyed envelopes)
    with whole keyed calls after it, on the same partition."""
    records = draw(st.one_of(traffic(), every_format()))
    offset = len(records)
    clock = records[-1].timestamp if records else 1_700_000_000_000
    for n, (tool, arguments) in enumerate(draw(st.lists(KEYED, min_size=2, max_size=8))):
        fields: dict[str, Any] = {"tool": tool, "final": True}
        if tool == "get_weather":  # an envelope's key, for a contract that reads none
            fields["idempotency_key"] = arguments.pop("idempotency_key")
        value = envelope("keyed", f"k{n}", 0, orjson.dumps(arguments).decode(), **fields)
        assert clock is not None
        clock += 1
        records.append(FileRecord(TOPIC, 0, offset + n, clock, None, value, ()))
    return records


@settings(FIXED, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=keyed_traffic(),
    pair=st.tuples(*[st.sampled_from(["shipped", "too large", "held"])] * 2),
)
def test_each_side_of_a_replay_is_what_a_worker_on_its_contracts_emits(
    gates: dict[str, Gate], records: list[FileRecord], pair: tuple[str, str]
) -> None:
    """Generated traffic (envelopes keyed and not, vendor streams, poison records, calls cut,
    resent, timed out) judged under two of: the shipped contracts, adapters that make accepted
    events (keyed ones too) too large for the event bound, and get_weather v2 held for approval
    with an event too large only with its approval. Each call's verdict on each side of the
    replay, once its keys are decided, is the event a worker on that side's contracts writes,
    and the kind is the comparison of the two; what the processor writes is what it writes
    without the candidate."""
    baseline, candidate = gates[pair[0]], gates[pair[1]]
    replayed = processor(baseline, candidate)
    tally = Replay(
        build_key_store(BOUND),
        build_key_store(BOUND),
        (baseline.registry, candidate.registry),
        BOUND.limits.max_feedback_bytes,
    )
    compared, written = [], []
    for emission in [*replayed.feed(TOPIC, 0, records), *replayed.flush()]:
        assert emission.shadow is not None
        settled = tally.settle(emission.shadow)
        assert settled.kind is compare(settled.baseline, settled.candidate)
        compared.append(settled)
        written.append(normalized(emission))
    alone = processor(baseline)  # the candidate changes nothing written (shadow mode)
    assert written == [normalized(e) for e in [*alone.feed(TOPIC, 0, records), *alone.flush()]]
    assert [side(c.call.event_id, c.baseline) for c in compared] == emitted(records, baseline)
    assert [side(c.call.event_id, c.candidate) for c in compared] == emitted(records, candidate)


# -- each input file its own partition ---------------------------------------------------------

#: input names (the prefix a directory): twice the same file, and two files whose paths are the
#: same in their first 249 bytes (the longest topic name Kafka allows, which names the records)
LONG = "d" * 250
NAMES = ["a.jsonl", "b.jsonl", f"{LONG}/a.jsonl", f"{LONG}/b.jsonl"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    for name in NAMES:
        (root / name).parent.mkdir(exist_ok=True)
        shutil.copy(TRAFFIC, root / name)
    return root


# capsys: each replay's output is read (and so reset) before the next
@settings(FIXED, max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chosen=st.lists(st.sampled_from(NAMES), min_size=1, max_size=4))
def test_every_call_of_every_input_is_counted_once_or_the_inputs_are_refused(
    inputs: Path, chosen: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Inputs that would be read as one partition (a file named twice, paths alike in the bytes
    a topic name keeps) are refused; any others are each counted whole, as each alone."""
    paths = [str(inputs / name) for name in chosen]
    topics = [path.encode()[:249] for path in paths]
    status, out, err = replay(
        capsys, "--json", "--baseline", CURRENT, "--schemas", CANDIDATE, *paths
    )
    if len(set(topics)) < len(topics):
        assert (status, out) == (2, "")
        assert "read as one partition" in err
        return
    assert status == 0, err
    alone = len(examples_calls(capsys))
    assert orjson.loads(out)["calls"] == alone * len(paths)


def examples_calls(capsys: pytest.CaptureFixture[str]) -> list[Any]:
    """The calls of examples/traffic.jsonl, judged alone by `check`."""
    status = main(["check", "--schemas", str(CURRENT), str(TRAFFIC)])
    out, _ = capsys.readouterr()
    assert status == 0
    return [orjson.loads(line) for line in out.splitlines()]
