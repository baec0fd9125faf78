"""Every recorded stream (and every generated one) against the provider's own SDK accumulator.

For each stream the calls our adapters and the real reassembler produce (ids, names, argument
text) must equal what the vendor's SDK accumulates from the same events; calls cut off by the
token limit must come out incomplete even where the SDK hands back a plausible partial object.
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from tests.adapters import streamgen
from tests.adapters.oracles import (
    FOLDERS,
    GENERATED_PATTERNS,
    RECORDED,
    RECORDING_PATTERNS,
    assemble,
    sdk_calls,
)
from tests.datafiles import data_files, data_path
from worker.adapters.input import read_records
from worker.model import ChunkKind, Code, IncompleteReason

GENERATED = data_path("generated")
FORMATS = FOLDERS
#: streams whose last call was cut by the token limit, by file name
TRUNCATED = {
    "incomplete_partial_json_response.sse",
    "openai_responses_incomplete_mid_call.sse",
    "anthropic_max_tokens_two_tool_blocks.sse",
    "google_gemini_partial_args_cut_by_max_tokens.sse",
    "bedrock_converse_max_tokens_inside_the_last_tool_block.eventstream",
}


def _streams() -> list[tuple[str, Path]]:
    found = [
        (FORMATS[path.parent.name], path)
        for pattern in RECORDING_PATTERNS
        for path in data_files("streams", pattern)
        if path.parent.name in FORMATS
    ]
    for pattern in GENERATED_PATTERNS:
        for path in data_files("generated", pattern):
            prefix = next(name for name in FORMATS if path.name.startswith(name))
            found.append((FORMATS[prefix], path))
    return found


STREAMS = _streams()


#: truncated streams whose cut call the SDK does not hold at all (strands keeps a tool block
#: only once it stopped)
UNHELD_WHEN_CUT = {"bedrock_converse_max_tokens_inside_the_last_tool_block.eventstream"}
#: how many recordings of each format (a file that goes missing fails the count)
RECORDINGS = {
    "anthropic": 4,
    "openai_chat": 6,
    "openai_responses": 11,
    "google_gemini": 8,
    "bedrock_converse": 2,
}


def test_every_recorded_stream_is_covered() -> None:
    found = [path.parent.name for _, path in STREAMS if RECORDED in path.parents]
    assert {folder: found.count(folder) for folder in RECORDINGS} == RECORDINGS
    assert len(found) == sum(RECORDINGS.values())
    assert sum(1 for _, path in STREAMS if GENERATED in path.parents) == 8


@pytest.mark.parametrize(("fmt", "path"), STREAMS, ids=[p.name for _, p in STREAMS])
def test_calls_equal_the_sdk_accumulation(fmt: str, path: Path) -> None:
    with path.open("rb") as fp:
        values = list(read_records(fp, fmt))
    sdk = sdk_calls(fmt, [orjson.loads(v) for v in values])
    assert sdk.raised_at is None, sdk.error
    calls = assemble(fmt, values)
    ours = [c for c in calls if c.channel == ChunkKind.TOOL_CALL and c.assembly_error is None]
    rejected = [c.assembly_error for c in calls if c.assembly_error is not None]
    assert set(rejected) <= {Code.UNSUPPORTED_CALL_KIND}
    held = sorted((call_id, call.name) for call_id, call in sdk.calls.items())
    if path.name in UNHELD_WHEN_CUT:  # the SDK drops the cut call ours ends incomplete
        assert sorted((c.call_id, c.tool) for c in ours[:-1]) == held
    else:
        assert sorted((c.call_id, c.tool) for c in ours) == held
    for call in ours:
        if call.incomplete is None:
            assert sdk.holds(fmt, call.call_id, call.tool, call.arguments.decode())
    if path.name in TRUNCATED:
        assert ours[-1].incomplete == IncompleteReason.MAX_TOKENS
        assert all(call.incomplete is None for call in ours[:-1])
    else:
        assert all(call.incomplete is None for call in ours)


def test_the_sdk_returns_a_plausible_object_where_we_say_max_tokens() -> None:
    path = RECORDED / "anthropic" / "incomplete_partial_json_response.sse"
    with path.open("rb") as fp:
        values = list(read_records(fp, "anthropic.messages"))
    sdk = sdk_calls("anthropic.messages", [orjson.loads(v) for v in values])
    partial = next(block for block in sdk.snapshot.content if block.type == "tool_use")
    assert partial.input["filename"] == "taxes.txt"  # looks usable...
    (call,) = assemble("anthropic.messages", values)
    assert call.incomplete == IncompleteReason.MAX_TOKENS  # ...but is not


def test_refusals_carry_the_vendor_text() -> None:
    path = RECORDED / "openai_chat" / "refusal_delta_refusal.sse"
    with path.open("rb") as fp:
        values = list(read_records(fp, "openai.chat"))
    sdk = sdk_calls("openai.chat", [orjson.loads(v) for v in values])
    (call,) = assemble("openai.chat", values)
    assert call.channel == ChunkKind.REFUSAL
    assert call.incomplete is None
    assert call.arguments.decode() == sdk.refusal

    path = RECORDED / "anthropic" / "refusal_response.sse"
    with path.open("rb") as fp:
        (call,) = assemble("anthropic.messages", read_records(fp, "anthropic.messages"))
    assert call.channel == ChunkKind.REFUSAL
    assert call.arguments == b"This request was refused due to policy."


@pytest.mark.parametrize("seed", range(20))
def test_random_generated_streams_equal_the_sdk(seed: int) -> None:
    rng = random.Random(seed)
    calls = [
        (f"call_{seed}_{i}", f"tool_{i}", streamgen.arguments(rng))
        for i in range(rng.randint(1, 4))
    ]
    streams = {
        "openai.responses": streamgen.responses_stream(
            f"resp_{seed}", calls, rng, numbered=rng.random() < 0.5
        ),
        "openai.chat": streamgen.chat_stream(
            f"chat_{seed}", [calls, calls[:1]] if seed % 3 == 0 else [calls], rng
        ),
        "anthropic.messages": streamgen.anthropic_stream(
            f"msg_{seed}", calls, rng, server_tool=seed % 2 == 0
        ),
        "google.gemini": streamgen.gemini_stream(
            f"gen_{seed}", calls, rng, partial=seed % 2 == 0, with_ids=seed % 3 == 0
        ),
        "bedrock.converse": streamgen.bedrock_stream(calls, rng, server_tool=seed % 2 == 0),
    }
    for fmt, events in streams.items():
        values = [orjson.dumps(event) for event in events]
        sdk = sdk_calls(fmt, [orjson.loads(v) for v in values])
        ours = assemble(fmt, values)
        assert sorted((c.call_id, c.tool) for c in ours) == sorted(
            (call_id, name) for call_id, name, _ in sdk.triples()
        ), fmt
        for call in ours:
            assert sdk.holds(fmt, call.call_id, call.tool, call.arguments.decode()), fmt
        assert all(call.incomplete is None for call in ours), fmt


def test_generated_fixture_files_are_current() -> None:
    for name, body in streamgen.committed_fixtures().items():
        assert (GENERATED / name).read_bytes() == body, f"run python {streamgen.__file__}"
