"""`callgate demo`, as the README runs it: embedded broker, sample traffic, summary, clean stop."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import orjson
import pytest

from tests.runtime.kafka_helpers import REPO
from worker.runtime.traffic import sample_traffic

pytestmark = pytest.mark.integration


def test_sample_traffic_covers_every_format_and_keeps_stream_order() -> None:
    records = sample_traffic("t")
    formats = {dict(r.headers).get("content-format", b"envelope") for r in records}
    assert formats >= {
        b"envelope",
        b"openai.chat",
        b"openai.responses",
        b"anthropic.messages",
        b"mcp.result",
    }
    assert len({r.scenario for r in records}) >= 25
    # interleaved across streams, yet each stream's own records stay in order
    first_streams = [r.key for r in records[:10]]
    assert len(set(first_streams)) == 10
    seqs: dict[str, list[int]] = {}
    for r in records:
        if not r.headers and r.value.startswith(b"{"):
            envelope = orjson.loads(r.value)
            if "seq" in envelope:
                seqs.setdefault(envelope["call_id"], []).append(envelope["seq"])
    assert len(seqs) >= 15
    assert all(order == sorted(order) for order in seqs.values())
    assert sample_traffic("t") == records  # deterministic for a given run id


@pytest.mark.timeout(120)
def test_demo_runs_end_to_end_on_the_embedded_broker() -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    result = subprocess.run(
        [sys.executable, "-m", "worker", "demo"],
        env={**clean, "PYTHONPATH": str(REPO), "CALLGATE_METRICS__PORT": "0"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
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
    assert out.rstrip().endswith("embedded broker stopped")
