"""The command line as a user runs it: `python -m worker check`, exit statuses, messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from tests.datafiles import REPO, data_path

ROOT = REPO
SAMPLE = data_path("generated", "envelopes.jsonl")


def callgate(*args: str | Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *map(str, args)],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_check_writes_one_event_per_call_and_a_summary() -> None:
    result = callgate("check", "--schemas", "schemas", SAMPLE)
    assert result.returncode == 0, result.stderr
    events = {e["call_id"]: e for e in map(orjson.loads, result.stdout.splitlines())}
    outcomes = {call: (e["outcome"], e["error_code"] or e["reason"]) for call, e in events.items()}
    assert outcomes == {
        "ok": ("accepted", None),
        "bad": ("rejected", "invalid_json"),
        "fence": ("accepted", None),
        "record:" + str(SAMPLE) + ":0:4": ("rejected", "malformed_record"),
        "dup": ("rejected", "duplicate_key"),
        "cut": ("incomplete", "max_tokens"),
    }
    assert events["fence"]["repairs"] == [{"kind": "markdown_fence"}]
    summary = result.stderr.decode()
    assert "6 calls: 2 accepted, 3 rejected, 1 incomplete" in summary
    assert "json_parse / invalid_json" in summary


def test_check_reads_stdin_and_survives_garbage() -> None:
    result = callgate("check", "--schemas", "schemas", "-", stdin=b"\xff\xfe\n{\n[]\n")
    assert result.returncode == 0
    events = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [e["error_code"] for e in events] == ["malformed_record"] * 3
    assert b"Traceback" not in result.stderr


def test_a_bad_schema_directory_stops_with_one_clear_message(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "t.v1.schema.json").write_text('{"type": "object", "prefixItems": [1]}')
    result = callgate("check", "--schemas", tmp_path, stdin=b"")
    assert result.returncode == 2
    message = result.stderr.decode()
    assert message.startswith("callgate: ")
    assert "t.v1.schema.json" in message
    assert "Traceback" not in message
    missing = callgate("check", "--schemas", tmp_path / "nope", stdin=b"")
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr.decode()


def test_a_wrong_setting_stops_with_the_variable_named(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "worker", "check", "--schemas", "schemas", "-"],
        input=b"",
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        check=False,
        env={"CALLGATE_LIMITS__MAX_DEPTH": "zero", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "CALLGATE_LIMITS__MAX_DEPTH" in result.stderr.decode()
