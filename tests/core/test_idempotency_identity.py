"""One relation, "an equal request", at the gate, at the key's owner and in the executor.

The README: the key's owner remembers a key with the request's canonical digest (tool, schema
version, arguments) and rejects a later call under it `duplicate` when its request is equal,
`idempotency_conflict` when it is not; the executor, per execution key, replays the recorded
result for an equal request ("same tool, schema version and canonical arguments, as the gate
digests them") and answers `conflict` for another. The executor only ever sees the accepted
event, whose `arguments` are the call's internal shape after its version's adapter; so the
relation both apply is equality of (schema id, schema version, the arguments the accepted event
carries), compared as exact JSON values: any member order, number spelling or string escape of
one value is one request, NFC and NFD spellings of a text are two.

Generated here: pairs of calls under one key, each in any input format (envelopes on records
keyed or not, OpenAI Chat and Responses, Anthropic, Gemini, Bedrock), any spelling, of a
contract whose newest version (the one a vendor call, which names none, is judged by) has an
adapter that fills defaults, as the shipped weather contract's does; the key store rebuilt from
its changelog between the two calls or not.
"""

from __future__ import annotations

import json
import random
import unicodedata
from typing import Any, NamedTuple

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate_executor import contract
from tests.adapters import streamgen
from worker.check import FileRecord
from worker.compose import build_processor, build_registry
from worker.core.approval import pending_event
from worker.core.events import read_idempotency_request
from worker.core.idempotency import Decision, KeyStore, resolve
from worker.core.processor import Emission, Processor, Route
from worker.published.model import Accepted, ResultStatus, parse_event
from worker.schemas.registry import SchemaRegistry
from worker.settings import Settings

FIXED = settings(derandomize=True, deadline=None, print_blob=True, max_examples=100)
TOPIC = "model-output"
KEY = "order-7"
FORMATS = [
    "envelope",
    "openai.chat",
    "openai.responses",
    "anthropic.messages",
    "google.gemini",
    "bedrock.converse",
]


def _schema(version: int) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "x-callgate": {"side_effects": True, "idempotency_key_argument": "key"},
        "type": "object",
        "properties": {
            "item": {"type": "string"},
            "qty": {"type": ["integer", "null"]},
            "note": {"type": "string"},
            "key": {"type": "string"},
        },
        "required": ["item", "key"],
        "additionalProperties": False,
        "description": f"version {version}",
    }


#: version 2's adapter, as the contract's plugins.py registers it: the internal shape has a
#: quantity (1 when absent, null or 0) and a note ("" when absent)
PLUGINS = """
def v2_to_internal(arguments):
    return {
        "item": arguments["item"],
        "qty": arguments.get("qty") or 1,
        "note": arguments.get("note", ""),
        "key": arguments["key"],
    }


def register(plugins):
    plugins.adapter("shop.order", "2")(v2_to_internal)
"""


def internal(version: int, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments an accepted call of `version` carries, as the README's adapter says."""
    if version != 2:
        return arguments
    return {
        "item": arguments["item"],
        "qty": arguments.get("qty") or 1,
        "note": arguments.get("note", ""),
        "key": arguments["key"],
    }


@pytest.fixture(scope="module")
def contracts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, SchemaRegistry]:
    directory = tmp_path_factory.mktemp("contracts")
    (directory / "shop").mkdir()
    for version in (1, 2):
        path = directory / "shop" / f"order.v{version}.schema.json"
        path.write_text(json.dumps(_schema(version)))
    (directory / "plugins.py").write_text(PLUGINS)
    settings_ = Settings(schemas={"dir": directory})
    return settings_, build_registry(settings_)


# --- spellings ---------------------------------------------------------------------------------


def spell_string(text: str, rng: random.Random) -> str:
    """`text` as a JSON string, each character raw or escaped (a pair for astral ones)."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char < " " or rng.random() < 0.3:
            if code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        elif char == "/" and rng.random() < 0.5:
            out.append("\\/")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def spell_integer(value: int, rng: random.Random) -> str:
    """`value` in one of the spellings an integer may take: digits, a zero fraction, an
    exponent, a negative zero."""
    spellings = [str(value), f"{value}.0", f"{value}e0", f"{value * 10}e-1", f"{value}.000E0"]
    if value == 0:
        spellings += ["-0", "-0.0", "0e5"]
    return rng.choice(spellings)


def spell(arguments: dict[str, Any], rng: random.Random) -> str:
    """A JSON text of `arguments`: members in any order, any layout, each value spelt anyhow."""
    members = list(arguments.items())
    rng.shuffle(members)
    parts = []
    for name, value in members:
        if value is None:
            text = "null"
        elif type(value) is int:
            text = spell_integer(value, rng)
        else:
            text = spell_string(value, rng)
        gap = rng.choice(["", " ", "\n  "])
        parts.append(f"{gap}{spell_string(name, rng)}:{rng.choice(['', ' '])}{text}")
    return "{" + ",".join(parts) + rng.choice(["", "\n"]) + "}"


# --- one call in any format --------------------------------------------------------------------


def call_records(
    fmt: str,
    stream: str,
    call_id: str,
    *,
    version: int | None,
    text: str,
    keyed: bool,
    rng: random.Random,
) -> list[tuple[bytes | None, bytes, tuple[tuple[str, bytes], ...]]]:
    """The records (key, value, headers) of one call of tool `order` in format `fmt`, naming
    `version` (an envelope only: a vendor call names none)."""
    call = (call_id, "order", text)
    if fmt == "envelope":
        events = streamgen.envelope_call(stream, call, rng)
        if version is not None:
            events[0]["tool_version"] = str(version)
        key = stream.encode() if keyed else None
        return [(key, orjson.dumps(event), ()) for event in events]
    headers = (("content-format", fmt.encode()),)
    values: list[bytes]
    if fmt == "openai.chat":
        values = [orjson.dumps(e) for e in streamgen.chat_stream(stream, [[call]], rng)]
    elif fmt == "openai.responses":
        values = [orjson.dumps(e) for e in streamgen.responses_stream(stream, [call], rng)]
    elif fmt == "anthropic.messages":
        values = [orjson.dumps(e) for e in streamgen.anthropic_stream(stream, [call], rng)]
    elif fmt == "bedrock.converse":
        values = [orjson.dumps(e) for e in streamgen.bedrock_stream([call], rng)]
    else:  # Gemini sends the arguments as an object inside its event: spelt as generated
        part = {"functionCall": {"name": "order", "id": call_id, "args": "@"}}
        whole = orjson.dumps(streamgen._gemini_chunk(stream, 0, [part]))
        end = streamgen._gemini_chunk(stream, 0, [{"text": ""}], "STOP")
        values = [whole.replace(b'"@"', text.encode()), orjson.dumps(end)]
    return [(stream.encode(), value, headers) for value in values]


class Drawn(NamedTuple):
    """A generated call: its format, the version it names (None: the newest), its arguments,
    and whether its records are keyed by their stream id."""

    fmt: str
    version: int | None
    arguments: dict[str, Any]
    keyed: bool

    @property
    def request(self) -> tuple[int, dict[str, Any]]:
        """What the README compares: the version judged, and the arguments the event carries."""
        version = self.version or 2
        return version, internal(version, self.arguments)


class Judged:
    """One call through the processor and its key's owner: the request the gate sent, the
    owner's decision, and the accepted event the call carries (what an executor is given)."""

    def __init__(self, emission: Emission, store: KeyStore) -> None:
        assert emission.route is Route.IDEMPOTENCY, orjson.loads(emission.value)
        self.request = read_idempotency_request(emission.value)
        self.resolution = resolve(store, emission.value, None, 4096)
        event = parse_event(self.request.event)
        assert isinstance(event, Accepted)
        self.event = event


def judge(
    p: Processor, store: KeyStore, offset: int, drawn: Drawn, rng: random.Random
) -> tuple[Judged, int]:
    """The call `drawn`, its records from `offset` on (a stream of its own), judged by `p` and
    `store`; and the offset after its records."""
    text = spell(drawn.arguments, rng)
    stream, call_id = f"s{offset}", f"call_{offset}"
    records = call_records(
        drawn.fmt, stream, call_id, version=drawn.version, text=text, keyed=drawn.keyed, rng=rng
    )
    fed = [
        FileRecord(TOPIC, 0, offset + n, None, key, value, headers)
        for n, (key, value, headers) in enumerate(records)
    ]
    (emission,) = p.feed(TOPIC, 0, fed)
    return Judged(emission, store), offset + len(records)


REQUESTS = st.fixed_dictionaries(
    {
        "item": st.sampled_from(
            ["café", unicodedata.normalize("NFD", "café"), "a/b", "😀 x", 'say "hi"', "tea"]
        ),
        "key": st.just(KEY),
    },
    optional={
        "qty": st.sampled_from([None, 0, 1, 2]),
        "note": st.sampled_from(["", "gift", "gift\n"]),
    },
)


@st.composite
def calls(draw: st.DrawFn) -> Drawn:
    fmt = draw(st.sampled_from(FORMATS))
    version = draw(st.sampled_from([None, 1, 2])) if fmt == "envelope" else None
    return Drawn(fmt, version, draw(REQUESTS), draw(st.booleans()))


@st.composite
def pairs(draw: st.DrawFn) -> tuple[Drawn, Drawn]:
    """Two calls; half the time the second has the first's arguments (spelt anew, maybe in
    another format, under another version)."""
    first, second = draw(calls()), draw(calls())
    if draw(st.booleans()):
        second = second._replace(arguments=first.arguments)
    return first, second


def new_store() -> KeyStore:
    return KeyStore(max_keys=100, retention_ms=7 * 24 * 3600 * 1000)


@FIXED
@given(call=calls(), rng=st.randoms(use_true_random=False))
def test_the_gate_the_approval_and_the_executor_digest_a_call_as_one_request(
    contracts: tuple[Settings, SchemaRegistry], call: Drawn, rng: random.Random
) -> None:
    """The key's owner compares the digest the gate computed, the approval binds the pending
    event's fingerprint, the executor digests the accepted event: for every call, in every
    format and spelling, adapted or not, these are one value."""
    judged, _ = judge(build_processor(*contracts), new_store(), 0, call, rng)
    assert judged.resolution.decision is Decision.FIRST
    version, arguments = call.request
    assert (judged.event.schema_ref.version, judged.event.arguments) == (str(version), arguments)
    gate = judged.request.digest.hex()
    assert contract.digest_of(judged.event) == gate, call
    _, fingerprint = pending_event(judged.request.event)
    assert fingerprint == gate


@FIXED
@given(
    pair=pairs(),
    restarted=st.booleans(),
    rng=st.randoms(use_true_random=False),
)
def test_an_equal_request_is_one_relation_at_the_key_owner_and_in_the_executor(
    contracts: tuple[Settings, SchemaRegistry],
    pair: tuple[Drawn, Drawn],
    restarted: bool,
    rng: random.Random,
) -> None:
    """Two calls under one key: the second is a `duplicate` at the key's owner exactly when the
    executor, having run the first, replays its result to it, and that is exactly when the two
    carry the same schema version and equal arguments; else `idempotency_conflict`, and the
    executor's `conflict`. Whatever the formats, spellings, and a restart of the key's owner
    (its store rebuilt from its changelog) between them."""
    first, second = pair
    p = build_processor(*contracts)
    store = new_store()
    a, offset = judge(p, store, 0, first, rng)
    assert a.resolution.decision is Decision.FIRST
    if restarted:
        store = new_store()
        changes = a.resolution.changes
        store.restore((key, record.encode() if record else None) for key, record in changes)
    b, _ = judge(p, store, offset, second, rng)

    equal = first.request == second.request
    owner = Decision.DUPLICATE if equal else Decision.CONFLICT
    assert b.resolution.decision is owner, (first, second)

    ran = contract.answer(a.event, {}, refusal=None, retry_safe=False)
    assert ran.step is contract.Step.RUN
    assert ran.begun is not None
    outcome = contract.Outcome(ResultStatus.SUCCEEDED, {"ok": 1})
    limits = Settings().limits
    done = contract.ran(
        a.event,
        ran.begun,
        outcome,
        max_bytes=limits.max_event_bytes,
        max_id_bytes=limits.max_id_bytes,
    )
    state = {record.key: record for record in done.records}
    executor = contract.Step.REPLAY if equal else contract.Step.CONFLICT
    assert contract.answer(b.event, state, refusal=None, retry_safe=False).step is executor
