"""The demo's sample traffic: every format, stream order kept, and the recordings it replays."""

from __future__ import annotations

import re
from importlib import resources

import orjson

from callgate_demo.traffic import REFUND_DECISIONS, sample_traffic
from tests.datafiles import SCHEMAS as REPO_SCHEMAS
from tests.datafiles import data_path
from worker.check import FileRecord
from worker.compose import build_processor, build_registry
from worker.settings import load_settings

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


def test_only_the_deliberately_broken_samples_are_malformed() -> None:
    """The synthesized vendor streams are shaped as the vendors send them (every field the
    gate checks), so each is judged as the call it shows: the one poison record and the one
    unknown content-format are the only malformed records, and no stream is corrupt."""
    settings = load_settings(schemas={"dir": REPO_SCHEMAS})
    processor = build_processor(settings, build_registry(settings))
    records = sample_traffic("t")
    fetched = [
        FileRecord("in", 0, offset, None, r.key, r.value, tuple(r.headers))
        for offset, r in enumerate(records)
    ]
    broken = []
    for emission in [*processor.feed("in", 0, fetched), *processor.flush()]:
        if not emission.value.startswith(b"{"):
            continue  # an idempotency request: its call was accepted
        event = orjson.loads(emission.value)
        if event.get("error_code") == "malformed_record" or event.get("reason") == "stream_corrupt":
            broken.append(event["stream_id"])
    assert sorted(broken) == ["t:badformat", "t:poison"]
