"""Hostile Google Gemini `streamGenerateContent` traffic for the reference judge (Hypothesis).

A response as Gemini streams it (one `GenerateContentResponse` a record): `CANDIDATES`
candidates, each with perhaps some text, then one to three whole `functionCall` parts (with or
without an `id`; an id or a name past the identifier bound now and then), in chunks of one part
or several, a last chunk with its own finish reason (and the usage); the candidates' chunks
interleaved (each opened after the one before), now and then two candidates in one chunk; or the
stream ends with a blocked prompt, an `error` chunk, or not at all. A call's `args` is the
argument text the other formats' traffic streams, spliced into the record as it is (numbers in
every spelling, a key twice, odd whitespace and Unicode: the record is read strictly). Then the
transport is made hostile (`traffic.vendor_faults`: chunks deleted, repeated, swapped, changed,
sent after the end), and perhaps a record that is not JSON.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tests.reference import traffic

FINISH_REASONS = [
    "STOP",
    "MAX_TOKENS",
    "SAFETY",
    "RECITATION",
    "MALFORMED_FUNCTION_CALL",
    "UNEXPECTED_TOOL_CALL",
    "OTHER",
    "TOO_MANY_TOOL_CALLS",
]
#: how many candidates a response has
CANDIDATES = [1, 1, 2, 3]
_USAGE = {"usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 9}}
#: past the default identifier bound (`CALLGATE_LIMITS__MAX_ID_BYTES`, 256 bytes)
_LONG = "x" * 257
#: where a call's arguments text goes in its record (it is spliced in as written)
_ARGS = "\x00ARGS\x00"


def _chunk(index: int, parts: list[Any] | None, reason: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {}
    if parts is not None:
        candidate["content"] = {"role": "model", "parts": parts}
    if reason is not None:
        candidate["finishReason"] = reason
    candidate["index"] = index
    return {"candidates": [candidate], "modelVersion": "gemini-test"}


def _record(chunk: Any, args: list[str]) -> bytes:
    """`chunk` as a record, each `_ARGS` placeholder replaced by the next text of `args` (on
    one line: a text's line breaks are insignificant whitespace, its strings escape theirs)."""
    text = json.dumps(chunk, ensure_ascii=False)
    for arg in args:
        text = text.replace(json.dumps(_ARGS), arg.replace("\r", " ").replace("\n", " "), 1)
    return text.encode()


def _joined(draw: st.DrawFn, chunks: list[tuple[Any, list[str]]]) -> list[tuple[Any, list[str]]]:
    """`chunks`, now and then two in a row of different candidates sent as one chunk."""
    out: list[tuple[Any, list[str]]] = []
    for value, texts in chunks:
        if out and draw(st.integers(0, 3)) == 0:
            before, before_texts = out[-1]
            if value["candidates"][0]["index"] not in [c["index"] for c in before["candidates"]]:
                both = {**before, **value, "candidates": before["candidates"] + value["candidates"]}
                out[-1] = (both, before_texts + texts)
                continue
        out.append((value, texts))
    return out


@st.composite
def gemini_stream(draw: st.DrawFn) -> list[bytes]:
    """One Gemini stream's records, made hostile."""
    outputs: list[list[tuple[Any, list[str]]]] = []  # each candidate's (chunk, its texts)
    candidates = draw(st.sampled_from(CANDIDATES))
    ending = draw(st.sampled_from(["finish"] * 7 + ["blocked", "error", "cut"]))
    for index in range(candidates):
        own: list[tuple[Any, list[str]]] = []
        parts: list[tuple[Any, list[str]]] = []
        if draw(st.booleans()):
            parts.append(({"text": draw(st.text(min_size=1, max_size=8))}, []))
        for n in range(draw(st.integers(1, 3))):
            tool, _, text = draw(traffic.arguments_text())
            call: dict[str, Any] = {"name": tool, "args": _ARGS}
            if draw(st.booleans()):
                call = {"id": f"call_{index}_{n}", **call}
            long = draw(st.integers(0, 12))
            if long == 0:
                call["name"] = _LONG
            elif long == 1:
                call["id"] = _LONG
            parts.append(({"functionCall": call}, [text]))
        if draw(st.integers(0, 3)) == 0:  # text after the calls
            parts.append(({"text": "done"}, []))
        while parts:  # chunks of one part or several
            size = draw(st.integers(1, len(parts)))
            taken, parts = parts[:size], parts[size:]
            texts = [t for _, ts in taken for t in ts]
            own.append((_chunk(index, [p for p, _ in taken]), texts))
        if ending == "finish":
            reason = draw(st.just("STOP") | st.sampled_from(FINISH_REASONS))
            if draw(st.integers(0, 7)) == 0:
                own.append((_chunk(index, None, "CONTINUATION"), []))
            own.append(({**_chunk(index, None, reason), **_USAGE}, []))
        outputs.append(own)
    chunks = _joined(draw, draw(traffic.opened_in_order(outputs)))
    if ending == "blocked":
        chunks.append(({"promptFeedback": {"blockReason": "SAFETY"}}, []))
    elif ending == "error":
        error = {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}
        chunks.append(({"error": error}, []))

    def changed(chunk: tuple[Any, list[str]]) -> tuple[Any, list[str]] | None:
        value, texts = chunk
        copy: Any = json.loads(json.dumps(value))
        candidate = (copy.get("candidates") or [None])[0]
        if candidate is None:
            return None
        how = draw(st.integers(0, 3))
        if texts and how == 0:  # other arguments
            return copy, [draw(st.sampled_from(["{}", '{"a":1,"a":2}', "[]", '{"x":1e400}']))]
        if how == 1:
            candidate["index"] = draw(st.sampled_from([5, "0"]))
        elif how == 2 and "content" in candidate:
            candidate["content"]["role"] = "user"
        elif how == 3:
            candidate["finishReason"] = draw(st.sampled_from(FINISH_REASONS))
        else:
            return None
        return copy, texts

    late = [
        [(_USAGE, [])],  # a chunk that carries nothing
        [(_chunk(0, [{"functionCall": {"name": "note", "args": {}}}]), [])],
        [(_chunk(0, [{"text": "more"}], "STOP"), [])],
        [(_chunk(candidates, [{"functionCall": {"name": "note", "args": {}}}], "STOP"), [])],
        [({"error": {"code": 500, "message": "Internal", "status": "INTERNAL"}}, [])],
        [({"promptFeedback": {"blockReason": "OTHER"}}, [])],
    ]
    chunks = draw(traffic.vendor_faults(chunks, changed, late))
    records = [_record(value, texts) for value, texts in chunks]
    if draw(st.integers(0, 7)) == 0:  # a record that is not JSON, anywhere
        records.insert(draw(st.integers(0, len(records))), b"not json")
    return records
