"""Deterministic workloads: tool calls as canonical chunk envelopes (bytes), as Kafka carries them.

A workload is a list of `Call`s turned into envelope records, each call's argument text cut into a
fixed number of fragments. Several streams interleave (round-robin, `lanes` calls in flight), the
way many model responses share one partition. Invalid calls rotate through the failure kinds a
model really produces: schema violations, a truncated text and a duplicate key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import orjson

TOPIC = "bench.model-output"
#: record time of the first record (ms); each next record is 1 ms later
EPOCH_MS = 1_767_225_600_000


class Record(NamedTuple):
    """A fetched record as the processor reads it (what an aiokafka ConsumerRecord offers)."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Call:
    stream_id: str
    call_id: str
    tool: str
    tool_version: str | None
    arguments: str
    #: what is wrong with it: None (valid), "schema", "truncated" or "duplicate_key"
    defect: str | None = None


@dataclass(frozen=True, slots=True)
class Schema:
    """A benchmark contract: where it lives, the tool and version, and its argument makers."""

    label: str
    tool: str
    version: str
    valid: Callable[[int], dict[str, object]]
    violating: Callable[[int], dict[str, object]]

    def schema_file(self, directory: Path) -> Path:
        """This contract's `<domain>/<tool>.v<N>.schema.json` under a schema directory."""
        return next(directory.glob(f"*/{self.tool}.v{self.version}.schema.json"))


# --- small: the seed's get_weather v1 ---------------------------------------------------------

_CITIES = ("Paris", "São Paulo", "Hangzhou", "Reykjavík", "Lagos", "Montréal", "Kyiv", "Lima")


def _weather_valid(i: int) -> dict[str, object]:
    return {"city": _CITIES[i % len(_CITIES)], "units": ("celsius", "fahrenheit")[i % 2]}


def _weather_violating(i: int) -> dict[str, object]:
    kind = i % 3
    if kind == 0:
        return {"city": _CITIES[i % len(_CITIES)], "units": "kelvin"}
    if kind == 1:
        return {"city": 42, "units": "celsius"}
    return {"city": "", "units": "celsius", "debug": True}


# --- large: benchmarks/schemas/bench/place_order.v1 (17 properties) ---------------------------


def _order_valid(i: int) -> dict[str, object]:
    items = [
        {
            "sku": f"SKU-{1000 + (i + n) % 9000}",
            "quantity": 1 + (i + n) % 9,
            "unit_price_minor": 199 + 100 * n,
            "tags": ["gift", f"batch{n}"],
        }
        for n in range(3)
    ]
    return {
        "order_id": f"ord_{i:012d}",
        "customer_id": f"cus_Cust{i:08d}",
        "email": f"buyer{i}@example.com",
        "currency": ("EUR", "USD", "GBP")[i % 3],
        "amount_minor": 12_345 + i,
        "items": items,
        "shipping_address": {
            "line1": f"{i % 200} Rue de Rivoli",
            "line2": "Bâtiment B",
            "city": "Paris",
            "postal_code": "75001",
            "country": "FR",
        },
        "billing_address": {"line1": "1 Main Street", "city": "Dublin", "country": "IE"},
        "notes": "Leave at the door, please ring twice.",
        "priority": ("low", "normal", "high")[i % 3],
        "gift": i % 2 == 0,
        "coupon_codes": ["SPRING24", f"C{i % 1000:04d}"],
        "metadata": {"campaign": "spring", "source": "agent"},
        "requested_delivery": "2026-12-24",
        "channel": "agent",
        "risk_score": 0.125,
        "contact_phone": "+33123456789",
    }


def _order_violating(i: int) -> dict[str, object]:
    order = _order_valid(i)
    kind = i % 4
    if kind == 0:
        order["email"] = "not-an-email"
    elif kind == 1:
        order["items"] = [{"sku": "bad sku", "quantity": 0, "unit_price_minor": -1}]
    elif kind == 2:
        order["shipping_address"] = {"line1": "", "city": "Paris", "country": "France"}
    else:
        del order["currency"]
        order["unexpected"] = True
    return order


SMALL = Schema("small", "get_weather", "1", _weather_valid, _weather_violating)
LARGE = Schema("large", "place_order", "1", _order_valid, _order_violating)
SCHEMAS = {"small": SMALL, "large": LARGE}

#: share of invalid calls in each mix
MIXES = {"valid": 0.0, "mixed": 0.2, "invalid": 1.0}


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()


def defect_of(invalid: int | None) -> str | None:
    """What the `invalid`-th invalid call gets wrong: three schema violations out of five, then a
    truncation, then a duplicate key."""
    if invalid is None:
        return None
    return {3: "truncated", 4: "duplicate_key"}.get(invalid % 5, "schema")


def arguments_text(schema: Schema, i: int, invalid: int | None = None) -> str:
    """One call's argument text, with the defect `defect_of(invalid)` names."""
    defect = defect_of(invalid)
    if defect is None:
        return _dumps(schema.valid(i))
    if defect == "truncated":  # cut mid-value: invalid JSON
        text = _dumps(schema.valid(i))
        return text[: len(text) * 2 // 3]
    if defect == "duplicate_key":  # json.loads and orjson would keep the last one silently
        text = _dumps(schema.valid(i))
        first_key = text[1 : text.index(":")]
        return "{" + first_key + ':"dup",' + text[1:]
    return _dumps(schema.violating(i))


def calls(schema: Schema, count: int, invalid_share: float, *, prefix: str = "c") -> list[Call]:
    out = []
    invalid_every = 0 if invalid_share == 0 else round(1 / invalid_share)
    for i in range(count):
        invalid = i // invalid_every if invalid_every and i % invalid_every == 0 else None
        out.append(
            Call(
                stream_id=f"{prefix}s{i // 2}",
                call_id=f"{prefix}{i}",
                tool=schema.tool,
                tool_version=schema.version,
                arguments=arguments_text(schema, i, invalid),
                defect=defect_of(invalid),
            )
        )
    return out


def split(text: str, parts: int) -> list[str]:
    """`text` cut into `parts` fragments of near-equal length (some may be empty)."""
    if parts <= 1:
        return [text]
    size, extra = divmod(len(text), parts)
    out, start = [], 0
    for n in range(parts):
        end = start + size + (1 if n < extra else 0)
        out.append(text[start:end])
        start = end
    return out


def _envelopes(call: Call, fragments: int) -> Iterator[bytes]:
    pieces = split(call.arguments, fragments)
    last = len(pieces) - 1
    for seq, delta in enumerate(pieces):
        envelope: dict[str, object] = {
            "stream_id": call.stream_id,
            "call_id": call.call_id,
            "seq": seq,
            "kind": "tool_call",
            "delta": delta,
            "final": seq == last,
        }
        if seq == 0:
            envelope["tool"] = call.tool
            envelope["tool_version"] = call.tool_version
        yield orjson.dumps(envelope)


def records(
    work: list[Call], fragments: int, *, lanes: int = 8, partition: int = 0
) -> list[Record]:
    """Envelope records of `work`, `lanes` calls interleaved chunk by chunk, offsets from 0."""
    out: list[Record] = []
    offset = 0
    for start in range(0, len(work), lanes):
        group = [
            (c.stream_id.encode(), list(_envelopes(c, fragments)))
            for c in work[start : start + lanes]
        ]
        depth = max(len(chunks) for _, chunks in group)
        for n in range(depth):
            for key, chunks in group:
                if n < len(chunks):
                    out.append(Record(TOPIC, partition, offset, EPOCH_MS + offset, key, chunks[n]))
                    offset += 1
    return out


def batches(records: Sequence[Record], size: int) -> list[Sequence[Record]]:
    """`records` cut as a consumer fetches them: `size` at a time (the worker's 2,000)."""
    return [records[start : start + size] for start in range(0, len(records), size)]
