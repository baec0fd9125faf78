"""`callgate check` without `--format`: every recorded stream is told its format from its own
records, and judged exactly as with the format given; what cannot be told is an error that says
what to give, never a file of rejections; the head read to tell it is never lost."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS, data_files, data_path
from worker.adapters.decoder import ENVELOPE
from worker.cli import main
from worker.detect import HEAD_BYTES, detect, peek
from worker.errors import ConfigError

#: every recorded or generated vendor stream the tests keep, with the format it is in
RECORDED = [
    *((path, "openai.chat") for path in data_files("streams/openai_chat", "*.sse", at_least=6)),
    *(
        (path, "openai.responses")
        for path in data_files("streams/openai_responses", "*.sse", at_least=2)
    ),
    *(
        (path, "anthropic.messages")
        for path in data_files("streams/anthropic", "*.sse", at_least=4)
    ),
    *(
        (path, "google.gemini")
        for pattern in ("*.sse", "*.jsonl")
        for path in data_files("streams/google_gemini", pattern, at_least=3)
    ),
    *(
        (path, "bedrock.converse")
        for path in data_files("streams/bedrock_converse", "*.eventstream", at_least=2)
    ),
    *((path, "google.gemini") for path in data_files("generated", "google_gemini_*.sse")),
    *(
        (path, "bedrock.converse")
        for path in data_files("generated", "bedrock_converse_*.eventstream")
    ),
    (data_path("generated", "openai_chat_two_choices.sse"), "openai.chat"),
    (data_path("generated", "openai_responses_parallel_calls.sse"), "openai.responses"),
    (data_path("generated", "openai_responses_incomplete_mid_call.sse"), "openai.responses"),
    (data_path("generated", "anthropic_max_tokens_two_tool_blocks.sse"), "anthropic.messages"),
    (data_path("generated", "envelopes.jsonl"), ENVELOPE),
]
#: MCP recordings: JSON-RPC responses are results; bare results are refused with the wrapping
MCP = data_files("streams/mcp", "*.json", at_least=10)
MCP_RESPONSES = [path for path in MCP if b'"jsonrpc"' in path.read_bytes()]
MCP_BARE_RESULTS = [path for path in MCP if "__CallToolResult_" in path.name]


@pytest.mark.parametrize(("path", "expected"), RECORDED, ids=lambda v: getattr(v, "name", v))
def test_every_recorded_stream_is_told_its_format(path: Path, expected: str) -> None:
    assert detect(path.read_bytes()[:HEAD_BYTES], name=str(path)).format == expected


def _check(
    capsysbinary: pytest.CaptureFixture[bytes], *args: str
) -> tuple[int, list[dict[str, Any]]]:
    """`callgate check ARGS` in this process: its status and its events, timings left out."""
    status = main(["check", "--schemas", str(SCHEMAS), *args])
    events = [orjson.loads(line) for line in capsysbinary.readouterr().out.splitlines()]
    for event in events:
        del event["metrics"]["phases_us"]
    return status, events


@pytest.mark.parametrize(("path", "expected"), RECORDED, ids=lambda v: getattr(v, "name", v))
def test_a_stream_told_its_format_is_judged_as_with_the_format_given(
    capsysbinary: pytest.CaptureFixture[bytes], path: Path, expected: str
) -> None:
    told = _check(capsysbinary, str(path))
    given_format = _check(capsysbinary, "--format", expected, str(path))
    assert told[0] == given_format[0] == 0
    assert told[1] == given_format[1]
    if expected != ENVELOPE:  # (the envelope sample holds a poison record on purpose)
        assert all(event["error_code"] != "malformed_record" for event in told[1])


@pytest.mark.parametrize("path", MCP_RESPONSES, ids=lambda p: p.name)
def test_an_mcp_response_is_told_and_needs_its_tool_named(
    capsysbinary: pytest.CaptureFixture[bytes], path: Path
) -> None:
    assert detect(path.read_bytes(), name=str(path)).format == "mcp.result"
    assert main(["check", "--schemas", str(SCHEMAS), str(path)]) == 2
    assert "--header tool=" in capsysbinary.readouterr().err.decode()


@pytest.mark.parametrize("path", MCP_BARE_RESULTS, ids=lambda p: p.name)
def test_a_bare_mcp_result_is_refused_with_how_to_wrap_it(path: Path) -> None:
    with pytest.raises(ConfigError, match=r"without its JSON-RPC response around it; wrap it"):
        detect(path.read_bytes(), name=str(path))


@given(
    events=st.lists(
        st.dictionaries(
            st.sampled_from(["type", "data", "id", "message"]),
            st.sampled_from(["ping", "x.y", "hello", "1"]),
            min_size=1,
        ),
        min_size=1,
        max_size=5,
    )
)
def test_server_sent_events_of_no_known_format_are_an_error_naming_the_formats(
    events: list[dict[str, str]],
) -> None:
    sse = b"".join(b"event: x\ndata: " + orjson.dumps(event) + b"\n\n" for event in events)
    with pytest.raises(ConfigError, match=r"server-sent events of no format .* give --format \("):
        detect(sse, name="in.sse")


@given(lines=st.lists(st.binary(max_size=40).filter(lambda b: b"\n" not in b), max_size=5))
def test_json_lines_nothing_recognises_stay_envelopes(lines: list[bytes]) -> None:
    body = b"\n".join(b"{" + line for line in lines)  # JSON-looking or not: never an error
    assert detect(body, name="in.jsonl").format == ENVELOPE


@given(
    data=st.binary(max_size=3 * HEAD_BYTES),
    reads=st.lists(st.sampled_from([None, 1, 7, 4096, 100_000]), max_size=50),
)
def test_the_head_read_to_tell_the_format_is_read_again(
    data: bytes, reads: list[int | None]
) -> None:
    head, source = peek(io.BytesIO(data))
    assert head == data[:HEAD_BYTES]
    got = b""
    for size in reads:
        got += source.readline() if size is None else source.read(size)
    got += source.read()
    assert got == data


def test_stdin_is_told_its_format_too(
    capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = data_path("streams", "anthropic", "tool_use_response.sse")

    class Stdin:
        buffer = io.BytesIO(path.read_bytes())

    monkeypatch.setattr("sys.stdin", Stdin)
    from_stdin = _check(capsysbinary, "-")
    from_file = _check(capsysbinary, "--format", "anthropic.messages", str(path))
    assert from_stdin[0] == 0
    # the same events, but for what names the input: its name, and the ids made from it
    unnamed = {"source": None, "event_id": None}
    assert [{**event, **unnamed} for event in from_stdin[1]] == [
        {**event, **unnamed, "stream_id": "-"} for event in from_file[1]
    ]


@given(garbage=st.binary(max_size=200))
def test_input_that_is_neither_json_nor_events_is_left_to_be_rejected_records(
    garbage: bytes,
) -> None:
    first = garbage.lstrip(b" \t\r\n").split(b"\n", 1)[0]
    if first.startswith((b"data:", b"event:", b"id:", b"retry:", b":", b"\xef\xbb\xbf")):
        return
    assert detect(garbage, name="in").format == ENVELOPE
