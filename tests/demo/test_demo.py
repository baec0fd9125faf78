"""`callgate-demo`, as the README runs it: embedded broker, sample traffic, summary, clean stop."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

import pytest

from callgate_demo.cli import main
from tests.datafiles import REPO


def _demo(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    return subprocess.run(
        [sys.executable, "-m", "callgate_demo", *args],
        env={**clean, "PYTHONPATH": str(REPO), "CALLGATE_METRICS__PORT": "0"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_the_console_script_is_the_demo_command_line() -> None:
    with open(REPO / "pyproject.toml", "rb") as fp:
        scripts = tomllib.load(fp)["project"]["scripts"]
    assert scripts["callgate-demo"] == f"{main.__module__}:{main.__name__}"


def test_help_names_both_options_and_every_setting() -> None:
    result = _demo("--help")
    assert result.returncode == 0, result.stderr
    assert "--repeat N" in result.stdout
    assert "--settings FILE" in result.stdout
    assert "CALLGATE_KAFKA__BOOTSTRAP_SERVERS=" in result.stdout


def test_repeat_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--repeat", "0"]) == 2
    assert capsys.readouterr().err.strip() == "callgate-demo: --repeat must be at least 1"


def test_a_broken_settings_file_is_named_with_status_2(tmp_path: os.PathLike[str]) -> None:
    broken = os.path.join(tmp_path, "settings.json")
    with open(broken, "w") as fp:
        fp.write("{not json")
    result = _demo("--settings", broken)
    assert result.returncode == 2
    assert "settings.json" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_demo_runs_end_to_end_on_the_embedded_broker() -> None:
    result = _demo(timeout_s=100)
    out = result.stdout
    assert result.returncode == 0, (out, result.stderr[-3000:])
    assert re.search(r"embedded broker \(tansu\) on 127\.0\.0\.1:\d+", out)
    assert re.search(r"metrics: http://127\.0\.0\.1:\d+/metrics", out)
    rows = {
        tuple(cell for cell in re.split(r"\s{2,}", line.strip()))
        for line in out.splitlines()
        if re.match(r"^(accepted|rejected|incomplete)\s", line)
    }
    codes = {row[2] for row in rows}
    assert {
        "duplicate_key",
        "invalid_json",
        "refusal",
        "schema_violation",
        "unknown_tool",
        "idempotency_conflict",
        "duplicate",
        "malformed_record",
        "tool_error",
    } <= codes
    assert {"max_tokens", "stream_ended", "timeout", "sequence_gap"} <= codes
    assert "repaired: markdown_fence" in codes
    accepted = sum(int(row[3]) for row in rows if row[0] == "accepted")
    assert accepted >= 6
    judged = re.search(r"(\d+) calls judged", out)
    assert judged
    assert int(judged[1]) == sum(int(row[3]) for row in rows)
    # the refunds waited for approval; the demo decided them with `callgate approve` / `deny`
    assert re.search(r"^\$ callgate approve [0-9a-f]{32} --by callgate-demo$", out, re.M)
    assert re.search(r"^\$ callgate deny [0-9a-f]{32} --by callgate-demo$", out, re.M)
    assert re.search(
        r"^  approved +by callgate-demo: written to tool-calls\.pending-appr", out, re.M
    )
    assert re.search(r"^  denied +by callgate-demo: written to tool-calls\.pending-appr", out, re.M)
    assert ("rejected", "approval", "approval_denied", "1") in rows
    assert not any(row[0] == "pending_approval" for row in rows)
    # the executor ran every accepted call (the accepted MCP tool result is an answer, not a
    # call): the weather calls, the payment, the approved refund
    executor = re.search(
        r"executor: (\d+) executed \((\d+) succeeded\), (\d+) deduplicated, "
        r"(\d+) conflicting, (\d+) awaiting approval, (\d+) denied "
        r"\((\d+) approved refunds executed\)",
        out,
    )
    assert executor, out
    executed, succeeded, *counts = map(int, executor.groups())
    assert executed == succeeded == accepted - 1
    # deduplicated, conflicting, awaiting approval, denied, approved refunds executed
    assert counts == [1, 1, 0, 1, 1]
    assert re.search(
        r"payments database \(SQLite, unique on the idempotency key\): 1 rows, 1 refunds", out
    )
    assert out.rstrip().endswith("embedded broker stopped")
