"""The demo's sample traffic: every format, stream order kept, and the recordings it replays."""

from __future__ import annotations

import re
from importlib import resources

import orjson

from callgate_demo.traffic import REFUND_DECISIONS, sample_traffic
from tests.datafiles import data_path

SAMPLES = resources.files("callgate_demo").joinpath("samples")
PROVENANCE = "PROVENANCE.md"


def test_sample_traffic_covers_every_format_and_keeps_stream_order() -> None:
    records = sample_traffic("t")
    formats = {dict(r.headers).get("content-format", b"envelope") for r in records}
    assert formats >= {
        b"envelope",
        b"openai.chat",
        b"openai.responses",
        b"anthropic.messages",
        b"google.gemini",
        b"bedrock.converse",
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


def _provenance_rows() -> dict[str, str]:
    """sample file -> the file under tests/data/streams/ it copies, from samples/PROVENANCE.md."""
    rows: dict[str, str] = {}
    for line in SAMPLES.joinpath(PROVENANCE).read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\| `([^`]+)` \| `([^`]+)` \|", line)
        if match:
            rows[match[1]] = match[2]
    return rows


def test_every_sample_has_a_provenance_note_and_is_its_recording_byte_for_byte() -> None:
    samples = {item.name for item in SAMPLES.iterdir() if item.name != PROVENANCE}
    rows = _provenance_rows()
    assert samples, "no samples shipped"
    assert set(rows) == samples
    for name, origin in rows.items():
        recorded = data_path("streams", *origin.split("/")).read_bytes()
        assert SAMPLES.joinpath(name).read_bytes() == recorded, name


def test_the_traffic_holds_one_refund_for_each_decision_the_demo_makes() -> None:
    calls = {
        envelope["call_id"]: envelope.get("tool")
        for r in sample_traffic("t")
        if not r.headers and r.value.startswith(b"{")
        for envelope in [orjson.loads(r.value)]
        if envelope.get("seq") == 0
    }
    assert {f"t:{name}": "refund_payment" for name in REFUND_DECISIONS}.items() <= calls.items()
    assert sorted(REFUND_DECISIONS.values()) == ["approve", "deny"]
