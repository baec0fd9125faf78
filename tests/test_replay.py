"""`callgate replay` on input files: the report, its JSON, exit statuses, keyed calls, options.

Run in this process through the command line's `main`, as a user runs it. The README's example
(examples/contracts, examples/traffic.jsonl) is checked call by call: the candidate drops
`fahrenheit` and adds `kelvin`, so exactly the two fahrenheit calls flip to rejected and the
kelvin call to accepted. The replay on a Kafka topic is in tests/runtime/test_history.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.datafiles import REPO
from worker.cli import main
from worker.replay import parse_time

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
