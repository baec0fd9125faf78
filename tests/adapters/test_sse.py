"""The incremental SSE decoder, against the OpenAI SDK's own decoder and the WHATWG grammar."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder as SdkDecoder

from tests.adapters.oracles import RECORDED
from worker.adapters.sse import SSEDecoder, SSEEvent

FILES = sorted(RECORDED.glob("*/*.sse"))


def decode(data: bytes, cuts: list[int] | None = None) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    start = 0
    for cut in sorted(cuts or []):
        events += decoder.feed(data[start:cut])
        start = cut
    events += decoder.feed(data[start:])
    return events + decoder.flush()


def sdk(data: bytes) -> list[tuple[str | None, str]]:
    # The recorded Anthropic files end without the blank line after the last event: add it, as
    # our flush does, so both sides see the same last event.
    return [(e.event, e.data) for e in SdkDecoder().iter_bytes(iter([data + b"\n\n"])) if e.data]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_recorded_streams_decode_as_the_sdk_decodes_them(path: Path) -> None:
    data = path.read_bytes()
    ours = [(e.event, e.data.decode()) for e in decode(data)]
    assert ours == sdk(data)
    assert ours  # not vacuous (a Gemini recording can be one event long)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_split_of_the_bytes_gives_the_same_events(data: st.DataObject) -> None:
    body = data.draw(st.sampled_from(FILES)).read_bytes()
    body = body.replace(b"\n", data.draw(st.sampled_from([b"\n", b"\r\n", b"\r"])))
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=30))
    assert decode(body, cuts) == decode(body)


def test_grammar_details() -> None:
    text = (
        "\ufeff: a comment\n"
        "event: a\n"
        "data:no space\n"
        "data:  two spaces\n"
        "id: 7\n"
        "retry: 100\n"
        "\n"
        "event: only a name, never dispatched\n"
        "\n"
        "data\n"
        "\n"
        "data: last, no blank line after it"
    ).encode()
    assert decode(text) == [
        SSEEvent("a", b"no space\n two spaces", "7"),
        SSEEvent(None, b"", "7"),
        SSEEvent(None, b"last, no blank line after it", "7"),
    ]


def test_utf8_split_inside_a_character_and_invalid_utf8_kept_as_it_came() -> None:
    body = "data: Zürich 東京\n\n".encode()
    assert decode(body, [9, 10, 16, 17]) == [SSEEvent(None, "Zürich 東京".encode())]
    # bytes that are not UTF-8 are the record's to refuse (never replaced by U+FFFD)
    assert decode(b"data: \xff{}\n\nevent: \xfe\ndata: 1\n\n") == [
        SSEEvent(None, b"\xff{}"),
        SSEEvent("\ufffd", b"1"),
    ]


def test_an_event_larger_than_the_bound_is_a_fault_and_the_next_is_read() -> None:
    decoder = SSEDecoder(max_event_bytes=100)
    events = decoder.feed(b"data: " + b"x" * 50 + b"\n")
    events += decoder.feed(b"data: " + b"x" * 50 + b"\ndata: more\n\ndata: next\n\n")
    fault = "the SSE event at line 2 is larger than 100 bytes"
    assert events == [SSEEvent(None, b"", fault=fault), SSEEvent(None, b"next")]
    decoder = SSEDecoder(max_event_bytes=100)
    assert decoder.feed(b"data: " + b"y" * 200) == []
    assert decoder.flush() == [SSEEvent(None, b"", fault=fault.replace("2", "1"))]
