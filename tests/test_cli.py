"""The command line as a user runs it: `python -m worker check` and `schemas`, as subprocesses.

Exit statuses, stdout (one event per call, findings) and stderr (the summary, one clear message)
are what scripts around callgate rely on.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.datafiles import REPO, SCHEMAS, data_path
from worker.cli import main
from worker.compose import contract_event_bytes
from worker.model import SchemaRef
from worker.settings import MAX_LIMIT, LimitSettings

SAMPLE = data_path("generated", "envelopes.jsonl")
BOM = b"\xef\xbb\xbf"


def callgate(
    *args: str | Path, stdin: bytes | None = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`callgate ARGS`, with no CALLGATE_* setting from the calling environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    return subprocess.run(
        [sys.executable, "-m", "worker", *map(str, args)],
        input=stdin,
        capture_output=True,
        cwd=REPO,
        timeout=60,
        check=False,
        env={**clean, **(env or {})},
    )


def events(result: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr.decode()
    assert b"Traceback" not in result.stderr
    return [orjson.loads(line) for line in result.stdout.splitlines()]


def envelope(call: str, delta: str, **fields: Any) -> bytes:
    """One chunk that closes its call (unless `final=False`), in stream r1 unless said."""
    body = {"stream_id": "r1", "kind": "tool_call", "call_id": call, "seq": 0, "delta": delta}
    return orjson.dumps({**body, "final": True, **fields})


# --- check ------------------------------------------------------------------------------------


def test_check_writes_one_event_per_call_and_a_summary() -> None:
    result = callgate("check", "--schemas", SCHEMAS, SAMPLE)
    by_call = {e["call_id"]: e for e in events(result)}
    assert {
        call: (e["outcome"], e["error_code"] or e["reason"]) for call, e in by_call.items()
    } == {
        "ok": ("accepted", None),
        "bad": ("rejected", "invalid_json"),
        "fence": ("accepted", None),
        f"record:{SAMPLE}:0:4": ("rejected", "malformed_record"),
        "dup": ("rejected", "duplicate_key"),
        "cut": ("incomplete", "max_tokens"),
    }
    assert by_call["ok"]["arguments"] == {"city": "Hangzhou", "units": "celsius", "days": 1}
    assert by_call["fence"]["repairs"] == [{"kind": "markdown_fence"}]
    assert by_call["ok"]["source"]["first_offset"] == 0  # a line's number is its offset
    summary = result.stderr.decode()
    assert "6 calls: 2 accepted, 3 rejected, 1 incomplete" in summary
    assert "json_parse / invalid_json" in summary
    assert "assembly / malformed_record" in summary


def test_a_file_that_starts_with_a_bom_is_read_as_envelopes(tmp_path: Path) -> None:
    path = tmp_path / "with-bom.jsonl"
    first = envelope("c1", '{"city":"Oslo","units":"celsius"}', tool="get_weather")
    second = envelope("c2", '{"city":"Rome","units":"celsius"}', tool="get_weather")
    path.write_bytes(BOM + first + b"\r\n" + second + b"\r\n")
    found = events(callgate("check", "--schemas", SCHEMAS, path))
    assert [(e["call_id"], e["outcome"]) for e in found] == [
        ("c1", "accepted"),
        ("c2", "accepted"),
    ]


def test_a_bom_anywhere_else_is_the_lines_own_problem(tmp_path: Path) -> None:
    path = tmp_path / "late-bom.jsonl"
    ok = envelope("c1", '{"city":"Oslo","units":"celsius"}', tool="get_weather")
    path.write_bytes(ok + b"\n" + BOM + ok.replace(b"c1", b"c2") + b"\n")
    found = events(callgate("check", "--schemas", SCHEMAS, path))
    assert [(e["outcome"], e["error_code"]) for e in found] == [
        ("accepted", None),
        ("rejected", "malformed_record"),
    ]


def test_check_reads_stdin_and_survives_garbage() -> None:
    result = callgate("check", "--schemas", SCHEMAS, "-", stdin=b"\xff\xfe\n{\n[]\n\n")
    found = events(result)
    assert [(e["call_id"], e["error_code"]) for e in found] == [
        ("record:-:0:0", "malformed_record"),
        ("record:-:0:1", "malformed_record"),
        ("record:-:0:2", "malformed_record"),
    ]
    assert "3 calls: 0 accepted, 3 rejected, 0 incomplete" in result.stderr.decode()


def test_empty_input_is_no_calls() -> None:
    result = callgate("check", "--schemas", SCHEMAS, "-", stdin=b"")
    assert events(result) == []
    assert "0 calls" in result.stderr.decode()


def test_a_keyed_duplicate_in_one_file_is_decided_in_process(tmp_path: Path) -> None:
    def pay(call: str, amount: int) -> bytes:
        arguments = {
            "amount_minor": amount,
            "currency": "EUR",
            "recipient": "acct_1",
            "description": None,
            "idempotency_key": "pay-7",
        }
        return envelope(call, orjson.dumps(arguments).decode(), tool="create_payment")

    path = tmp_path / "payments.jsonl"
    path.write_bytes(b"\n".join([pay("first", 100), pay("again", 100), pay("other", 999)]))
    result = callgate("check", "--schemas", SCHEMAS, path)
    first, again, other = events(result)
    assert (first["call_id"], first["outcome"], first["idempotency_key"]) == (
        "first",
        "accepted",
        "pay-7",
    )
    assert first["requires_approval"] is False  # refunds are the approved tool
    assert (again["outcome"], again["phase"], again["error_code"], again["duplicate_of"]) == (
        "rejected",
        "idempotency",
        "duplicate",
        first["event_id"],
    )
    assert (other["error_code"], other["duplicate_of"]) == (
        "idempotency_conflict",
        first["event_id"],
    )
    summary = result.stderr.decode()
    assert "3 calls: 1 accepted, 2 rejected, 0 incomplete" in summary
    assert "idempotency / duplicate " in summary
    assert "idempotency / idempotency_conflict" in summary


def test_check_reads_a_recorded_vendor_stream() -> None:
    path = data_path("streams", "anthropic", "tool_use_response.sse")
    found = events(callgate("check", "--schemas", SCHEMAS, "--format", "anthropic.messages", path))
    assert len(found) == 1
    (event,) = found
    assert event["stream_id"] == "tool_use_response"  # the file name, unless said
    assert event["tool"] == "get_weather"
    assert event["call_id"].startswith("toolu_")


def test_a_bad_schema_directory_stops_with_one_clear_message(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "t.v1.schema.json").write_text('{"type": "object", "prefixItems": [1]}')
    result = callgate("check", "--schemas", tmp_path, "-")
    assert result.returncode == 2
    message = result.stderr.decode()
    assert message.startswith("callgate: ")
    assert "t.v1.schema.json" in message
    assert "Traceback" not in message
    assert result.stdout == b""
    missing = callgate("check", "--schemas", tmp_path / "nope", "-")
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr.decode()


def test_a_broken_plugins_file_stops_with_one_clear_message(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    schema = {"type": "object", "additionalProperties": False}
    (tmp_path / "d" / "t.v1.schema.json").write_bytes(orjson.dumps(schema))
    (tmp_path / "plugins.py").write_text("raise RuntimeError('broken on purpose')\n")
    result = callgate("check", "--schemas", tmp_path, "-")
    assert result.returncode == 2
    message = result.stderr.decode()
    assert "plugins.py" in message
    assert "broken on purpose" in message
    assert "Traceback" not in message


def test_a_contract_too_long_for_the_event_bound_stops_with_one_clear_message(
    tmp_path: Path,
) -> None:
    """Under the least event bound the settings allow, a contract whose schema id could make
    an accepted call's event (or one written later in its place) too long is refused at start
    (status 2, naming its file and the setting): the settings alone cannot know it."""
    domain = tmp_path / ("d" * 120)
    domain.mkdir()
    file = domain / "t.v1.schema.json"
    file.write_bytes(orjson.dumps({"type": "object", "additionalProperties": False}))
    limits = {"max_id_bytes": 4096, "max_bytes": 2, "max_event_bytes": MAX_LIMIT}
    least = contract_event_bytes(LimitSettings(**limits), SchemaRef("", ""))
    env = {f"CALLGATE_LIMITS__{name.upper()}": str(value) for name, value in limits.items()}
    result = callgate(
        "check",
        "--schemas",
        tmp_path,
        "-",
        env={**env, "CALLGATE_LIMITS__MAX_EVENT_BYTES": str(least)},
    )
    assert result.returncode == 2
    message = result.stderr.decode()
    assert str(file) in message
    assert "CALLGATE_LIMITS__MAX_EVENT_BYTES" in message
    assert "Traceback" not in message
    roomier = {**env, "CALLGATE_LIMITS__MAX_EVENT_BYTES": str(least + 6 * 2 * 200)}
    assert callgate("check", "--schemas", tmp_path, "-", env=roomier).returncode == 0


def test_a_wrong_setting_stops_with_the_variable_named() -> None:
    result = callgate(
        "check", "--schemas", SCHEMAS, "-", env={"CALLGATE_LIMITS__MAX_DEPTH": "zero"}
    )
    assert result.returncode == 2
    assert "CALLGATE_LIMITS__MAX_DEPTH" in result.stderr.decode()
    assert "Traceback" not in result.stderr.decode()


def test_a_missing_input_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    result = callgate("check", "--schemas", SCHEMAS, tmp_path / "absent.jsonl")
    assert result.returncode == 2
    message = result.stderr.decode()
    assert message.startswith("callgate: ")
    assert "absent.jsonl" in message
    assert "Traceback" not in message


CALLS = REPO / "examples" / "calls.jsonl"  # one call of each outcome
OUTCOMES = ("accepted", "rejected", "incomplete")
#: a call of each outcome, as the records of a stream of its own
CALL_OF = {
    "accepted": [envelope("a", '{"city": "Oslo", "units": "celsius"}', tool="get_weather")],
    "rejected": [envelope("r", '{"city": "Oslo"}', tool="get_weather", stream_id="r")],
    "incomplete": [
        envelope("i", '{"city": "Li', tool="get_weather", stream_id="i", final=False),
        orjson.dumps({"stream_id": "i", "kind": "end", "finish_reason": "length"}),
    ],
}


def _subsets(items: tuple[str, ...], smallest: int) -> list[tuple[str, ...]]:
    return [c for n in range(smallest, len(items) + 1) for c in itertools.combinations(items, n)]


@pytest.mark.parametrize("present", _subsets(OUTCOMES, 0), ids=",".join)
def test_fail_on_exits_1_exactly_when_a_call_has_an_outcome_it_names(
    capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path, present: tuple[str, ...]
) -> None:
    calls = tmp_path / "calls.jsonl"
    calls.write_bytes(b"".join(line + b"\n" for o in present for line in CALL_OF[o]))
    for fail_on in _subsets(OUTCOMES, 1):
        args = ["check", "--schemas", str(SCHEMAS), "--fail-on", ",".join(fail_on), str(calls)]
        status = main(args)
        captured = capsysbinary.readouterr()
        judged = [orjson.loads(line)["outcome"] for line in captured.out.splitlines()]
        assert sorted(judged) == sorted(present)
        assert status == (1 if set(fail_on) & set(present) else 0), (fail_on, present)
        assert ("(--fail-on)" in captured.err.decode()) == (status == 1)


def test_fail_on_as_a_pipeline_sees_it(tmp_path: Path) -> None:
    accepted_only = tmp_path / "ok.jsonl"
    accepted_only.write_bytes(CALL_OF["accepted"][0])
    gate = ("check", "--schemas", SCHEMAS, "--fail-on", "rejected,incomplete")
    assert callgate(*gate, accepted_only).returncode == 0
    failing = callgate(*gate, CALLS)
    assert failing.returncode == 1
    assert b"2 call(s) incomplete or rejected (--fail-on)" in failing.stderr
    wrong = callgate("check", "--schemas", SCHEMAS, "--fail-on", "rejectd", CALLS)
    assert wrong.returncode == 2
    assert b"--fail-on takes outcomes" in wrong.stderr


# --- schemas lint | compat | test -------------------------------------------------------------

WEATHER_V1 = SCHEMAS / "weather" / "get_weather.v1.schema.json"
WEATHER_V2 = SCHEMAS / "weather" / "get_weather.v2.schema.json"


def test_lint_passes_the_shipped_contracts_and_names_findings_elsewhere(tmp_path: Path) -> None:
    clean = callgate("schemas", "lint", SCHEMAS)
    assert clean.returncode == 0, clean.stdout.decode()
    assert "0 finding(s)" in clean.stdout.decode()
    (tmp_path / "d").mkdir()
    loose = {"type": "object", "properties": {"a": {"type": "string"}}}
    (tmp_path / "d" / "t.v1.schema.json").write_bytes(orjson.dumps(loose))
    dirty = callgate("schemas", "lint", tmp_path)
    assert dirty.returncode == 1
    assert "t.v1.schema.json" in dirty.stdout.decode()
    assert callgate("schemas", "lint", tmp_path / "missing").returncode == 2


def test_compat_tells_a_compatible_change_from_a_breaking_one() -> None:
    backward = callgate("schemas", "compat", WEATHER_V1, WEATHER_V2)
    assert backward.returncode == 0
    assert backward.stdout.decode().startswith("compatible (backward)")
    full = callgate("schemas", "compat", "--mode", "full", WEATHER_V1, WEATHER_V2)
    assert full.returncode == 1
    assert "days" in full.stdout.decode()
    same = callgate("schemas", "compat", "--mode", "full", WEATHER_V1, WEATHER_V1)
    assert same.returncode == 0


def test_compat_of_a_file_that_cannot_be_read_is_status_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.schema.json"
    bad.write_text("{not json")
    result = callgate("schemas", "compat", WEATHER_V1, bad)
    assert result.returncode == 2
    assert "bad.schema.json" in result.stderr.decode()


def test_test_runs_every_shipped_example_on_both_engines(tmp_path: Path) -> None:
    result = callgate("schemas", "test", SCHEMAS)
    assert result.returncode == 0, result.stdout.decode()
    out = result.stdout.decode()
    assert "fastjsonschema:" in out
    assert "jsonschema-rs:" in out
    assert " 0 failed" in out


def test_test_fails_on_an_example_that_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "d" / "examples" / "t.v1" / "valid").mkdir(parents=True)
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    (tmp_path / "d" / "t.v1.schema.json").write_bytes(orjson.dumps(schema))
    (tmp_path / "d" / "examples" / "t.v1" / "valid" / "wrong.json").write_text('{"n": "one"}')
    result = callgate("schemas", "test", tmp_path, "--engine", "fastjsonschema")
    assert result.returncode == 1
    out = result.stdout.decode()
    assert "FAIL" in out
    assert "wrong.json" in out
