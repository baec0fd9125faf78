"""`python -m benchmarks.json_parse`: the strict native parser against orjson and json, per call.

In one process, pinned to one CPU: microseconds per call of `worker._native.parse_json` (strict:
duplicate keys, 64-bit integers, UTF-8, depth), `orjson.loads` (no such checks) and `json.loads`,
on generated tool-call arguments of about 100 B, 1 KB, 10 KB and 100 KB. The three alternate
within each repeat; a ratio is the median of the per-repeat ratios. Prints a Markdown table;
`--json` prints the figures as JSON instead. Standalone (not in `python -m benchmarks`).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from benchmarks.common import environment, median, one_core, paired_ratio
from worker._native import parse_json
from worker.settings import LimitSettings

SIZES: dict[str, int] = {"100 B": 100, "1 KB": 1_000, "10 KB": 10_000, "100 KB": 100_000}
DOCUMENTS = 32  # distinct texts per size, parsed in turn
BYTES_PER_RUN = 2_000_000  # each timed run parses about this much text
SEED = 20_240_601

_CITIES = ("Hangzhou", "Zürich", "São Paulo", "Köln", "東京", "Reykjavík", "Austin", "Lagos")
_WORDS = (
    "deliver", "before", "noon", "fragile", "leave", "at", "the", "door", "call", "on", "arrival",
    "gift", "wrap", "invoice", "attached", "priority", "über", "naïve", "café", "señal", "🚚",
)  # fmt: skip
_TAGS = ("new", "sale", "eco", "bulk", "gift", "fragile", "cold-chain", "b2b")


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def _small(rng: random.Random) -> dict[str, Any]:
    """A weather-style call: a few short strings, an integer, a flag (about 100 bytes)."""
    return {
        "city": rng.choice(_CITIES),
        "country": rng.choice(("CN", "CH", "BR", "DE", "JP", "IS", "US", "NG")),
        "units": rng.choice(("metric", "imperial")),
        "days": rng.randint(1, 14),
        "include_hourly": rng.random() < 0.5,
        "lang": rng.choice(("en", "de", "zh", "pt", "ja")),
    }


def _item(rng: random.Random, n: int) -> dict[str, Any]:
    return {
        "line": n,
        "sku": f"SKU-{rng.randrange(10**6):06d}",
        "name": _sentence(rng, rng.randint(2, 4)),
        "quantity": rng.randint(1, 50),
        "unit_price": round(rng.uniform(0.5, 900.0), 2),
        "currency": rng.choice(("EUR", "USD", "CNY")),
        "tags": rng.sample(_TAGS, rng.randint(0, 3)),
        "attributes": {
            "weight_kg": round(rng.uniform(0.01, 40.0), 3),
            "dimensions_cm": [rng.randint(1, 120) for _ in range(3)],
            "hazardous": rng.random() < 0.05,
            "origin": rng.choice(_CITIES),
        },
        "note": None if rng.random() < 0.6 else _sentence(rng, rng.randint(3, 12)),
    }


def arguments(size: int, rng: random.Random) -> bytes:
    """One argument text of about `size` bytes: an order whose items fill it out."""
    if size <= 200:
        return orjson.dumps(_small(rng))
    order: dict[str, Any] = {
        "order_id": f"ord_{rng.randrange(16**12):012x}",
        "customer": {
            "id": rng.randrange(10**9),
            "name": _sentence(rng, 2),
            "address": {"city": rng.choice(_CITIES), "postcode": f"{rng.randrange(10**5):05d}"},
        },
        "express": rng.random() < 0.3,
        "items": [],
    }
    text = orjson.dumps(order)
    while len(text) < size:
        order["items"].append(_item(rng, len(order["items"]) + 1))
        text = orjson.dumps(order)
    return text


def _alternate(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per run of each contender, `repeats` times, interleaved (a, b, c, a, b, c, ...)."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            gc.collect()
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def _runs(texts: list[bytes], calls: int, max_depth: int) -> dict[str, Callable[[], object]]:
    schedule = [texts[n % len(texts)] for n in range(calls)]

    def native() -> object:
        for text in schedule:
            parse_json(text, max_depth)
        return None

    def fast() -> object:
        loads = orjson.loads
        for text in schedule:
            loads(text)
        return None

    def stdlib() -> object:
        loads = json.loads
        for text in schedule:
            loads(text)
        return None

    return {"parse_json": native, "orjson.loads": fast, "json.loads": stdlib}


def run(repeats: int = 9, quick: bool = False) -> dict[str, Any]:
    rng = random.Random(SEED)
    max_depth = LimitSettings().max_depth
    rows = []
    with one_core() as cpu:
        for label, size in SIZES.items():
            texts = [arguments(size, rng) for _ in range(DOCUMENTS)]
            for text in texts:  # the figures are of texts the strict parser accepts
                if parse_json(text, max_depth) != orjson.loads(text):
                    raise RuntimeError(f"parse_json refuses or misreads a {label} text")
            mean_bytes = sum(map(len, texts)) / len(texts)
            calls = 3 if quick else max(10, int(BYTES_PER_RUN / mean_bytes))
            seconds = _alternate(_runs(texts, calls, max_depth), repeats)
            per_call = {name: median(s) / calls * 1e6 for name, s in seconds.items()}
            rows.append(
                {
                    "size": label,
                    "mean_bytes": round(mean_bytes),
                    "calls_per_run": calls,
                    "us_per_call": {name: round(us, 3) for name, us in per_call.items()},
                    "parse_json_vs_orjson": round(
                        paired_ratio(seconds["parse_json"], seconds["orjson.loads"]), 3
                    ),
                    "parse_json_vs_json": round(
                        paired_ratio(seconds["parse_json"], seconds["json.loads"]), 3
                    ),
                }
            )
    return {
        "repeats": repeats,
        "seed": SEED,
        "max_depth": max_depth,
        "cpu": cpu,
        "environment": environment(),
        "rows": rows,
    }


def table(body: dict[str, Any]) -> str:
    lines = [
        "| size | mean bytes | parse_json µs | orjson.loads µs | json.loads µs "
        "| parse_json / orjson | parse_json / json |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in body["rows"]:
        us = row["us_per_call"]
        lines.append(
            f"| {row['size']} | {row['mean_bytes']} | {us['parse_json']:.2f} "
            f"| {us['orjson.loads']:.2f} | {us['json.loads']:.2f} "
            f"| {row['parse_json_vs_orjson']:.2f} | {row['parse_json_vs_json']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.json_parse", description=__doc__)
    parser.add_argument("--repeats", type=int, default=9, help="repeats per measurement")
    parser.add_argument("--quick", action="store_true", help="a few calls: a smoke run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    print(f"seed {SEED}", file=sys.stderr)
    body = run(repeats=args.repeats, quick=args.quick)
    if args.json:
        print(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    else:
        print(table(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
