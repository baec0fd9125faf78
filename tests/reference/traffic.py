"""Hostile envelope traffic for the reference judge (Hypothesis strategies).

A model's calls are drawn first: arguments close to the test contracts (valid or a little
off), written as JSON text with every spelling a number may take, escaped and raw odd
Unicode, insignificant whitespace, now and then a ```json fence; the text is cut into pieces
(numbered by `seq` or not), the calls of one or two streams interleaved, each stream perhaps
ended by an `end` record. Then the transport is made hostile: pieces deleted, duplicated
(later, verbatim), swapped, their text mutated, their channel changed, `end` records copied.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NamedTuple, TypeVar

from hypothesis import strategies as st

from tests.reference import exact

T = TypeVar("T")

#: the contracts the judge's tests load (a directory is written from these)
SCHEMAS: dict[str, dict[str, dict[str, Any]]] = {
    "pay": {
        "1": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "amount_minor": {"type": "integer", "minimum": 1, "maximum": 100000000},
                "rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000.5},
                "step": {"type": "number", "multipleOf": 0.25},
                "currency": {"enum": ["EUR", "USD", "JPY"]},
                "memo": {"type": ["string", "null"], "maxLength": 8},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                "flag": {"const": True},
                "nested": {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "maximum": 9007199254740992}},
                    "additionalProperties": False,
                },
            },
            "required": ["amount_minor", "currency"],
            "additionalProperties": False,
        },
        "2": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"amount_minor": {"type": "integer", "minimum": 0}},
            "required": ["amount_minor"],
        },
    },
    "note": {
        "1": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1}},
        }
    },
}

#: numbers a double holds exactly, in or near the test contracts' bounds
_EXACT_NUMBERS = st.one_of(
    st.integers(min_value=-3, max_value=12),
    st.sampled_from([0, 1, 99999999, 100000000, 100000001, 2**53, 2**53 - 1, -(2**53)]),
    st.sampled_from(["0.25", "0.5", "1000.5", "1000.75", "0.125", "-0", "-0.0", "2.5", "1.75"]),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
).map(Decimal)

#: numbers a double cannot hold exactly, or only just: below the minimum by less than a
#: double's step, past 2^53, integer-valued only in exponent form, beyond 64 bits, at and past
#: the ends of a double's range
_HOSTILE_SAMPLES = st.sampled_from(
    [
        "0.99999999999999999",
        "99999999.99999999999",
        "100000000.00000001",
        "1.0000000000000001",
        "0.25000000000000001",
        "9007199254740993",
        "18446744073709551615",
        "18446744073709551616",
        "9223372036854775807",
        "-9223372036854775808",
        "-9223372036854775809",
        "1e28",
        "3e28",
        "1e300",
        "1.7976931348623157e308",
        "1.7976931348623158e308",
        "1e400",
        "-1e400",
        "4.9e-324",
        "5e-324",
        "2.5e-324",
        "2.2250738585072014e-308",
        "1e-400",
        "0.1",
        "0.30000000000000004",
        "1000.5000000000000001",
        "1000.5000000000001",
    ]
).map(Decimal)

#: integers near the boundaries a reader may round at: 2^53, 2^63, 2^64, and far past them
_BOUNDARY_INTEGERS = [2**53, 2**63, 2**64, 10**17, 10**19, 10**28, 3 * 10**28]
#: doubles near which a reader may round: the test contracts' bounds, 2^53, 2^63, 2^64, the
#: largest double, the smallest normal and subnormal ones
_DOUBLE_ANCHORS = [
    0.1,
    0.25,
    1.0,
    1000.5,
    1e8,
    2.0**53,
    2.0**63,
    2.0**64,
    1e300,
    sys.float_info.max,
    sys.float_info.min,
    5e-324,
]


@st.composite
def _boundary_numbers(draw: st.DrawFn) -> Decimal:
    """An exact decimal near a boundary, either sign: an integer near 2^53, 2^63, 2^64 or far
    past them; a double near an anchor (or any double) as its shortest decimal (a value the
    README admits unless it is an integer past 64 bits), as its full binary expansion, with one
    digit more than its shortest form, or the exact midpoint between it and the next double
    (values no double holds); or up to 25 digits at a scale from 10^-30 to 10^30."""
    kind = draw(
        st.sampled_from(["integer", "shortest", "expansion", "longer", "midpoint", "digits"])
    )
    if kind == "integer":
        value = Decimal(draw(st.sampled_from(_BOUNDARY_INTEGERS)) + draw(st.integers(-3, 3)))
    elif kind == "digits":
        value = Decimal(draw(st.integers(1, 10**25))).scaleb(
            draw(st.integers(-30, 30)), exact.EXACT
        )
    else:
        double = draw(
            st.sampled_from(_DOUBLE_ANCHORS)
            | st.floats(min_value=0, allow_nan=False, allow_infinity=False)
        )
        for _ in range(draw(st.integers(0, 2))):
            double = math.nextafter(double, draw(st.sampled_from([0.0, math.inf])))
        if not math.isfinite(double):
            double = sys.float_info.max
        value = Decimal(repr(double))
        if kind == "expansion":
            value = Decimal(double)
        elif kind == "longer":
            value = exact.EXACT.add(
                value, value.scaleb(-17, exact.EXACT) if value else Decimal("1e-340")
            )
        elif kind == "midpoint":
            after = Decimal(math.nextafter(double, math.inf if double < sys.float_info.max else 0))
            value = exact.EXACT.divide(exact.EXACT.add(Decimal(double), after), 2)
    return exact.EXACT.minus(value) if draw(st.booleans()) else value


#: numbers no double holds, or only just, each drawn in every spelling (`spelled`)
HOSTILE_NUMBERS: st.SearchStrategy[Decimal] = st.one_of(_HOSTILE_SAMPLES, _boundary_numbers())

#: the numbers the judge's traffic holds: exact doubles near the contracts' bounds, and hostile
NUMBERS = st.one_of(_EXACT_NUMBERS, HOSTILE_NUMBERS)

_ODD_TEXT = st.sampled_from(
    [
        "",
        "EUR",
        "USD",
        "JPY",
        "eur",
        "\u0000",
        "\u2028\u2029",
        "e\u0301",
        "\ufeff",
        "\U0001f600",
        "\uffff",
        "\\",
        '"',
        "a/b",
        "\u00e9t\u00e9",
        "\ud7ff",
        "\U0010ffff",
        "0123456789",
    ]
)
_TEXT = st.one_of(_ODD_TEXT, st.text(max_size=10))


#: insignificant whitespace drawn between tokens: spaces, tabs, line breaks (models often write
#: arguments pretty-printed; the gate embeds them without it and its output stays JSON Lines)
WHITESPACE = ["", "", "", " ", "  ", "\t", "\n", "\r\n", "\n  ", " \n\t\r "]


@st.composite
def spelled(draw: st.DrawFn, number: Decimal) -> str:
    """One of the spellings of `number`'s exact value: digits, a fraction with trailing zeros,
    an exponent (either case, signed or not), a mantissa shifted against its exponent."""
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    mantissa = "".join(map(str, digits)) or "0"
    minus = "-" if sign else ""
    form = draw(st.sampled_from(["plain", "fraction", "exponent", "shifted"]))
    if form == "plain" or mantissa == "0":
        text = format(number, "f")
        if form == "fraction" and "." not in text:
            text += "." + "0" * draw(st.integers(1, 3))
        return text
    if form == "fraction":
        text = format(number, "f")
        return text + ("" if "." in text else ".") + "0" * draw(st.integers(1, 3))
    shift = draw(st.integers(0, 3))
    mark = draw(st.sampled_from(["e", "E", "e+", "E+"]))
    if form == "exponent":
        exp = exponent - shift
        body = mantissa + "0" * shift
    else:  # one digit before the point
        exp = exponent + len(mantissa) - 1
        body = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
    if exp < 0:
        mark = mark.rstrip("+") + "-"
    return f"{minus}{body}{mark}{abs(exp)}"


@st.composite
def string_text(draw: st.DrawFn, value: str) -> str:
    """`value` as a JSON string, each character raw or escaped (`\\uXXXX`, pairs for the
    astral planes), as models and encoders variously write them."""
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch in '"\\' or code < 0x20 or draw(st.integers(0, 4)) == 0:
            if code > 0xFFFF:
                high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
                out.append(f"\\u{high:04x}\\u{low:04X}")
            elif ch in '"\\' and draw(st.booleans()):
                out.append("\\" + ch)
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


@st.composite
def json_text(draw: st.DrawFn, value: Any) -> str:
    """`value` written as JSON text in a drawn spelling: drawn insignificant whitespace between
    tokens, or pretty-printed (a line per member or item, indented by two spaces or a tab, as
    `json.dumps(indent=...)` and many models write it)."""
    pretty = draw(st.integers(0, 3)) == 0
    indent, newline = draw(st.sampled_from(["  ", "\t"])), draw(st.sampled_from(["\n", "\r\n"]))

    def gap() -> str:
        return draw(st.sampled_from(WHITESPACE))

    def write(value: Any, level: int) -> str:
        if value is None or isinstance(value, bool):
            return json.dumps(value)
        if isinstance(value, Decimal):
            return draw(spelled(value))
        if isinstance(value, str):
            return draw(string_text(value))
        items = (
            [write(v, level + 1) for v in value]
            if isinstance(value, list)
            else [draw(string_text(k)) + ": " + write(v, level + 1) for k, v in value.items()]
            if pretty
            else [
                draw(string_text(k)) + gap() + ":" + gap() + write(v, level + 1)
                for k, v in value.items()
            ]
        )
        opening, closing = "[]" if isinstance(value, list) else "{}"
        if not items:
            return opening + closing
        if pretty:
            inner, outer = newline + indent * (level + 1), newline + indent * level
            return opening + inner + ("," + inner).join(items) + outer + closing
        return opening + ",".join(gap() + item + gap() for item in items) + closing

    return write(value, 0)


def _values() -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | _EXACT_NUMBERS | _TEXT,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
        max_leaves=6,
    )


@st.composite
def pay_arguments(draw: st.DrawFn, numbers: st.SearchStrategy[Decimal] = NUMBERS) -> dict[str, Any]:
    """Arguments for `pay` v1, valid or a little off (a value out of bounds, a wrong type, an
    unknown member, a number no double holds)."""
    args: dict[str, Any] = {"amount_minor": draw(numbers)}
    args["currency"] = draw(st.sampled_from(["EUR", "USD", "JPY"]) | _TEXT)
    optional = {
        "rate": numbers,
        "step": numbers,
        "memo": st.none() | _TEXT,
        "tags": st.lists(_TEXT, max_size=4),
        "flag": st.sampled_from([True, Decimal(1), False]),
        "nested": st.fixed_dictionaries({}, optional={"n": numbers}),
        "other": _values(),
    }
    for name, strategy in optional.items():
        if draw(st.integers(0, 3)) == 0:
            args[name] = draw(strategy)
    if draw(st.integers(0, 9)) == 7:
        del args[draw(st.sampled_from(sorted(args)))]
    if draw(st.integers(0, 9)) == 7:  # any shape at all
        return draw(st.dictionaries(_TEXT, _values(), max_size=3))
    return args


@st.composite
def arguments_text(draw: st.DrawFn) -> tuple[str, str | None, str]:
    """(tool, version, the text a model streams for it)."""
    tool, version = draw(
        st.sampled_from(
            [("pay", "1"), ("pay", "1"), ("pay", None), ("pay", "2"), ("note", "1"), ("nope", "1")]
        )
    )
    if tool == "note":
        value: Any = draw(st.fixed_dictionaries({}, optional={"text": _TEXT}))
    else:
        value = draw(pay_arguments())
    text = draw(json_text(value))
    if draw(st.integers(0, 15)) == 7:
        text = "```json\n" + text + "\n```"
    if draw(st.integers(0, 15)) == 7:  # a model that wrote something else
        text = draw(st.sampled_from(["[1]", "null", '{"a":1,"a":2}', '{"a":NaN}', "{", "", "{}x"]))
    if draw(st.integers(0, 20)) == 7:
        text = "[" * 40 + "]" * 40
    return tool, version, text


def _cut(draw: st.DrawFn, text: str) -> list[str]:
    points = draw(st.lists(st.integers(0, len(text)), max_size=5, unique=True))
    bounds = [0, *sorted(points), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def envelope(**fields: Any) -> bytes:
    """One record's value (keys in the order given, ASCII or not)."""
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


@st.composite
def stream_records(draw: st.DrawFn, stream_id: str) -> list[list[bytes]]:
    """One stream: each call's records in order, then (perhaps) its `end` as a last list."""
    calls = []
    for n in range(draw(st.integers(1, 3))):
        tool, version, text = draw(arguments_text())
        numbered = draw(st.booleans())
        pieces = _cut(draw, text)
        records = []
        for i, delta in enumerate(pieces):
            fields: dict[str, Any] = {"stream_id": stream_id, "call_id": f"call_{n}"}
            if numbered:
                fields["seq"] = i
            fields["kind"] = "tool_call"
            if i == 0 or draw(st.integers(0, 4)) == 0:  # later pieces may repeat them
                fields["tool"] = tool
                if version is not None:
                    fields["tool_version"] = version
            fields["delta"] = delta
            fields["final"] = i == len(pieces) - 1
            records.append(envelope(**fields))
        calls.append(records)
    if draw(st.booleans()):
        reason = draw(st.sampled_from(["stop", "tool_calls", "length", "content_filter"]))
        calls.append([envelope(stream_id=stream_id, kind="end", finish_reason=reason)])
    return calls


@st.composite
def interleaved(draw: st.DrawFn, groups: list[list[bytes]]) -> list[bytes]:
    """The groups' records merged, each group's own order kept."""
    queues = [list(g) for g in groups]
    out: list[bytes] = []
    while any(queues):
        live = [q for q in queues if q]
        pick = draw(st.integers(0, len(live) - 1))
        out.append(live[pick].pop(0))
    return out


@st.composite
def opened_in_order(draw: st.DrawFn, outputs: list[list[T]]) -> list[T]:
    """The events of a stream's outputs (Chat Completions choices, Gemini candidates) merged,
    each output's own order kept and each opened after the one before (a new output has the
    next index)."""
    queues = [list(output) for output in outputs if output]
    out: list[T] = []
    opened = 1
    while any(queues):
        live = [q for q in queues[:opened] if q]
        pick = draw(st.integers(0, len(live) - 1 + (opened < len(queues))))
        if pick == len(live):
            live, opened = [queues[opened]], opened + 1
            pick = 0
        out.append(live[pick].pop(0))
    return out


@st.composite
def mutated(draw: st.DrawFn, records: list[bytes], *, in_place: bool = True) -> list[bytes]:
    """`records` after up to four transport faults (a piece changed in place too, unless
    `in_place` is false: then a changed piece is always a later copy)."""
    records = list(records)
    for _ in range(draw(st.integers(0, 4))):
        if not records:
            break
        i = draw(st.integers(0, len(records) - 1))
        fault = draw(
            st.sampled_from(["delete", "duplicate", "swap", "text", "channel", "nameless", "named"])
        )
        if fault == "delete":
            del records[i]
        elif fault == "nameless":
            # a record that names no stream: garbled, or not an envelope at all
            nameless = draw(st.sampled_from([b"garbage", b"\xff\xfe", b"[]", b'{"kind":"end"}']))
            if in_place and draw(st.booleans()):
                records[i] = nameless
            else:
                records.insert(i, nameless)
        elif fault == "named":
            # a piece malformed in a field other than its stream and call, which stay readable
            try:
                fields = json.loads(records[i])
            except ValueError:
                continue
            if not isinstance(fields, dict) or fields.get("kind") != "tool_call":
                continue
            broken = draw(
                st.sampled_from(
                    [
                        {"final": "yes"},
                        {"delta": 7},
                        {"seq": -1},
                        {"seq": 1.5},
                        {"tool_version": "v" * 5000},
                        {"trace_id": ["x"]},
                    ]
                )
                | st.just(None)
            )
            bad = envelope(**{**fields, **broken}) if broken else records[i][:-1] + b',"final":1}'
            if in_place and draw(st.booleans()):
                records[i] = bad
            else:
                records.insert(draw(st.integers(i, len(records))), bad)
        elif fault == "duplicate":
            records.insert(draw(st.integers(i + 1, len(records))), records[i])
        elif fault == "swap" and i + 1 < len(records):
            records[i], records[i + 1] = records[i + 1], records[i]
        elif fault in ("text", "channel"):
            try:
                fields = json.loads(records[i])
            except ValueError:
                continue  # a nameless record
            if not isinstance(fields, dict) or fields.get("kind") != "tool_call":
                continue
            if fault == "channel":
                fields["kind"] = draw(st.sampled_from(["text", "refusal", "error"]))
            else:
                delta = fields.get("delta", "")
                if not isinstance(delta, str):
                    continue  # a piece already made malformed: its text is no string
                at = draw(st.integers(0, len(delta)))
                fields["delta"] = (
                    delta[:at] + draw(st.sampled_from(['"', "}", "1", ",", ""])) + delta[at + 1 :]
                )
            copy_it = not in_place or draw(st.booleans())  # a differing copy, or a changed piece
            changed = envelope(**fields)
            if copy_it:
                records.insert(draw(st.integers(i + 1, len(records))), changed)
            else:
                records[i] = changed
    return records


@st.composite
def traffic(draw: st.DrawFn) -> list[bytes]:
    """A partition's envelope records: one or two streams' calls, interleaved, then made
    hostile."""
    groups: list[list[bytes]] = []
    ends: list[bytes] = []
    late: list[list[bytes]] = []
    for stream in ["s1", "s2"][: draw(st.integers(1, 2))]:
        calls = draw(stream_records(stream))
        if json.loads(calls[-1][0]).get("kind") == "end":
            ends.append(calls.pop()[0])
            if draw(st.booleans()):
                late.append(draw(after_the_end(stream, [r for c in calls for r in c])))
        groups.extend(calls)
    records = draw(interleaved(groups)) + ends + draw(interleaved(late))
    return draw(mutated(records))


@st.composite
def after_the_end(draw: st.DrawFn, stream_id: str, held: list[bytes]) -> list[bytes]:
    """What a producer may still send on a stream after its `end`: a call's pieces under a
    new id (twice, perhaps: the pieces after one the end refused), a verbatim copy of a piece
    it held, another `end`."""
    out: list[bytes] = []
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["call", "call", "copy", "end"]))
        if what == "copy" and held:
            out.append(draw(st.sampled_from(held)))
        elif what == "end":
            reason = draw(st.sampled_from(["stop", "tool_calls", "length", "content_filter"]))
            out.append(envelope(stream_id=stream_id, kind="end", finish_reason=reason))
        else:
            tool, _, text = draw(arguments_text())
            # new ids only: a held id's pieces after the end come from `mutated` (copies and
            # differing copies); a reused id numbered otherwise than its call (unnumbered pieces,
            # then numbered ones) is a case the README leaves open, not generated here
            call_id, numbered = f"call_{draw(st.integers(3, 4))}", draw(st.booleans())
            first = draw(st.integers(0, 1)) if numbered else 0  # a numbered tail, perhaps
            pieces = _cut(draw, text)
            for i, delta in enumerate(pieces, start=first):
                fields: dict[str, Any] = {"stream_id": stream_id, "call_id": call_id}
                if numbered:
                    fields["seq"] = i
                fields["kind"] = "tool_call"
                if i == 0:
                    fields["tool"] = tool
                fields["delta"] = delta
                fields["final"] = i == first + len(pieces) - 1
                out.append(envelope(**fields))
    return out


class Call(NamedTuple):
    """A call as the model streamed it."""

    stream_id: str
    call_id: str
    tool: str
    text: str


@st.composite
def numbered_traffic(
    draw: st.DrawFn, numbers: st.SearchStrategy[Decimal]
) -> tuple[list[bytes], dict[tuple[str, str], Call]]:
    """Calls of `pay` v1 in numbered pieces whose arguments hold `numbers` in every spelling,
    and a transport that loses, repeats and reorders pieces and sends differing copies, but
    never changes a piece in place: what the model streamed for each call is its text."""
    calls: dict[tuple[str, str], Call] = {}
    groups: list[list[bytes]] = []
    for stream in ["s1", "s2"][: draw(st.integers(1, 2))]:
        for n in range(draw(st.integers(1, 3))):
            call_id = f"call_{n}"
            text = draw(json_text(draw(pay_arguments(numbers))))
            calls[(stream, call_id)] = Call(stream, call_id, "pay", text)
            pieces = _cut(draw, text)
            groups.append(
                [
                    envelope(
                        stream_id=stream,
                        call_id=call_id,
                        seq=i,
                        kind="tool_call",
                        **({"tool": "pay", "tool_version": "1"} if i == 0 else {}),
                        delta=delta,
                        final=i == len(pieces) - 1,
                    )
                    for i, delta in enumerate(pieces)
                ]
            )
    records = draw(mutated(draw(interleaved(groups)), in_place=False))
    return records, calls


def _chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, choice: int = 0
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-test",
        "choices": [{"index": choice, "delta": delta or {}, "finish_reason": finish}],
    }


#: how many choices a completion has (`n`)
CHOICES = [1, 1, 2, 3]
_USAGE = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "gpt-test",
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 9, "total_tokens": 18},
}


@st.composite
def chat_stream(draw: st.DrawFn) -> list[bytes]:
    """One Chat Completions stream of `CHOICES` choices, their chunks interleaved (each choice
    opened after the one before), each choice text perhaps, one to three tool calls whose
    arguments come in pieces (their ids alike in every choice: the gate names them apart) and
    its own finish reason (or none); the usage chunk and `[DONE]` (or not); then up to four
    transport faults: a chunk deleted, repeated later, swapped with the next, its arguments
    changed, or chunks sent at the end (after the finish, when there is one): a call opened at
    the next index or out of order, more text for the last call, a second finish, a chunk that
    carries nothing, the usage chunk."""
    outputs: list[list[Any]] = []
    for choice in range(draw(st.sampled_from(CHOICES))):
        own: list[Any] = [_chunk({"role": "assistant", "content": None}, choice=choice)]
        if draw(st.booleans()):
            own.append(_chunk({"content": draw(_TEXT)}, choice=choice))
        for index in range(draw(st.integers(1, 3))):
            tool, _, text = draw(arguments_text())
            pieces = _cut(draw, text)
            first = pieces.pop(0) if draw(st.booleans()) else ""
            function = {"name": tool, "arguments": first}
            opening = {
                "index": index,
                "id": f"call_{index}",
                "type": "function",
                "function": function,
            }
            own.append(_chunk({"tool_calls": [opening]}, choice=choice))
            for piece in pieces:
                call = {"index": index, "function": {"arguments": piece}}
                own.append(_chunk({"tool_calls": [call]}, choice=choice))
        reason = draw(st.sampled_from(["tool_calls", "stop", "length", "content_filter", None]))
        if reason is not None:
            own.append(_chunk(finish=reason, choice=choice))
        outputs.append(own)
    chunks = draw(opened_in_order(outputs))
    if draw(st.booleans()):
        chunks.append(_USAGE)
    done = draw(st.booleans())

    def changed(chunk: dict[str, Any]) -> dict[str, Any] | None:
        calls = (chunk.get("choices") or [{}])[0].get("delta", {}).get("tool_calls")
        if not calls:
            return None
        copy = json.loads(json.dumps(chunk))
        function = copy["choices"][0]["delta"]["tool_calls"][0]["function"]
        function["arguments"] = draw(_CHANGED_TEXT)
        return copy

    def opening(index: int) -> dict[str, Any]:
        function = {"name": "note", "arguments": "{}"}
        call = {"index": index, "id": f"call_late{index}", "type": "function", "function": function}
        return _chunk({"tool_calls": [call]})

    more = {"index": index, "function": {"arguments": "}"}}
    late = [
        [opening(9)],  # out of order, wherever it comes
        [opening(index + 1), _chunk(finish="tool_calls")],  # a new call (after the finish?)
        [_chunk({"tool_calls": [more]})],  # more text for the last call
        [_chunk(finish=draw(st.sampled_from(["tool_calls", "stop", "length"])))],  # a 2nd finish
        [_chunk({})],  # a chunk that carries nothing
        [_USAGE],
    ]
    chunks = draw(vendor_faults(chunks, changed, late))
    records = [json.dumps(c, ensure_ascii=False).encode() for c in chunks]
    return [*records, b"[DONE]"] if done else records


_CHANGED_TEXT = st.sampled_from(['"', "}", "1", ",", "", "{}"])


@st.composite
def vendor_faults(
    draw: st.DrawFn,
    events: list[Any],
    change: Callable[[Any], Any | None],
    late: list[list[Any]],
) -> list[Any]:
    """`events` after up to four transport faults: one deleted, repeated later, swapped with
    the next, changed in place (`change` gives the changed copy, or None for an event it does
    not change), or one of the sequences `late` sent at the end (after the stream's end, when
    it had one: a new call, more text, a second message; or what may come after it)."""
    events = list(events)
    for _ in range(draw(st.integers(0, 4))):
        if not events:
            break
        i = draw(st.integers(0, len(events) - 1))
        fault = draw(st.sampled_from(["delete", "duplicate", "swap", "change", "late"]))
        if fault == "delete":
            del events[i]
        elif fault == "duplicate":
            events.insert(draw(st.integers(i + 1, len(events))), events[i])
        elif fault == "swap" and i + 1 < len(events):
            events[i], events[i + 1] = events[i + 1], events[i]
        elif fault == "change":
            events[i] = change(events[i]) or events[i]
        elif fault == "late":
            events.extend(draw(st.sampled_from(late)))
    return events


@st.composite
def anthropic_stream(draw: st.DrawFn) -> list[bytes]:
    """One Messages stream: perhaps a text block, one to three `tool_use` blocks whose input
    comes in `input_json_delta` pieces, pings, the stop reason (sometimes followed by more
    `message_delta`s: without a reason, the same, another) and `message_stop`; then up to
    four transport faults (`vendor_faults`), late events being a ping, a new block, a second
    stop reason or `message_stop`, or a whole second message."""
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-test",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 9, "output_tokens": 1},
            },
        }
    ]
    blocks: list[tuple[str, str, str]] = []
    if draw(st.booleans()):
        blocks.append(("text", "", draw(_TEXT)))
    for _ in range(draw(st.integers(1, 3))):
        tool, _, text = draw(arguments_text())
        # a call without arguments streams no text (or a stop cut it before any)
        blocks.append(("tool_use", tool, "" if draw(st.integers(0, 4)) == 0 else text))
    for index, (kind, tool, text) in enumerate(blocks):
        if kind == "text":
            block: dict[str, Any] = {"type": "text", "text": ""}
        else:
            block = {"type": "tool_use", "id": f"toolu_{index}", "name": tool, "input": {}}
        events.append({"type": "content_block_start", "index": index, "content_block": block})
        for piece in _cut(draw, text):
            delta = (
                {"type": "text_delta", "text": piece}
                if kind == "text"
                else {"type": "input_json_delta", "partial_json": piece}
            )
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
        if draw(st.integers(0, 4)) == 2:
            events.append({"type": "ping"})
    reasons = st.sampled_from(
        [
            "tool_use",
            "end_turn",
            "max_tokens",
            "model_context_window_exceeded",
            "stop_sequence",
            "refusal",
        ]
    )
    reason = draw(reasons)

    def stopping(reason: str | None) -> dict[str, Any]:
        delta = {"stop_reason": reason, "stop_sequence": None}
        return {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 99}}

    events.append(stopping(reason))
    # more message_deltas before the end: usage updates without a reason, the same reason
    # again, or another reason (a cut call's `max_tokens` turned into `tool_use`)
    for _ in range(draw(st.integers(0, 2)) if draw(st.integers(0, 3)) == 0 else 0):
        events.append(stopping(draw(st.sampled_from([None, reason]) | reasons)))
    events.append({"type": "message_stop"})

    def changed(event: dict[str, Any]) -> dict[str, Any] | None:
        if event.get("delta", {}).get("type") != "input_json_delta":
            return None
        copy = json.loads(json.dumps(event))
        copy["delta"]["partial_json"] = draw(_CHANGED_TEXT)
        return copy

    def block(index: int) -> list[dict[str, Any]]:
        opened = {"type": "tool_use", "id": f"toolu_late{index}", "name": "note", "input": {}}
        delta = {"type": "input_json_delta", "partial_json": "{}"}
        return [
            {"type": "content_block_start", "index": index, "content_block": opened},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]

    stop = {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 99},  # the SDK's type requires it: never without
    }
    late = [
        [{"type": "ping"}],
        block(len(blocks))[:1],  # a block opened after the stop reason, or the message's end
        [events[0], *block(0), stop, {"type": "message_stop"}],  # a second message, whole
        [stop],
        [{"type": "message_stop"}],
    ]
    events = draw(vendor_faults(events, changed, late))
    return [json.dumps(e, ensure_ascii=False).encode() for e in events]
