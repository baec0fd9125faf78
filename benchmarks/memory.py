"""Benchmark 2: memory per open call, beyond its text, at 1k, 10k and 100k open calls.

Each call is its own stream and holds one 64-byte fragment (its first chunk, never closed). The
open calls live in the native reassembler, whose allocations Python's tracemalloc does not see,
so the heap is counted twice, in separate passes over the same feed: the C heap's bytes in use
(glibc `mallinfo2`: `uordblks + hblkhd`, every allocation Rust makes, and Python's objects over
512 bytes), and Python's own allocations (tracemalloc, which also sees those large objects, so
the sum is an upper bound). Bytes per open call = (both deltas - the buffered text) / calls,
with the processor and everything it holds still alive. The seed (its dict of lists) is counted
with tracemalloc alone (it is all Python), in the same run: the ratio is callgate's over the
seed's. Target: 300 bytes per open call at most.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson

from benchmarks import workload
from benchmarks.baseline import SeedGate, load_validators
from benchmarks.common import BATCH, SEED_SCHEMAS
from benchmarks.harness import Callgate
from benchmarks.workload import TOPIC, Record, batches

TEXT_BYTES = 64
TARGET_BYTES = 300
#: room for 100k open calls in one partition (the default bound is 10,000)
LIMITS = {"max_open_calls_per_partition": 200_000}


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> Callable[[], int] | None:
    """Bytes in use on the C heap now (glibc), or None where there is no mallinfo2."""
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    libc = ctypes.CDLL(path)
    function = getattr(libc, "mallinfo2", None)
    if function is None:
        return None
    function.restype = _MallInfo2

    def in_use() -> int:
        info = function()
        return int(info.uordblks + info.hblkhd)

    return in_use


def open_call_records(count: int) -> list[Record]:
    """`count` calls, each its own stream, each one 64-byte first chunk and never closed."""
    delta = '{"city":"' + "x" * (TEXT_BYTES - 9)
    assert len(delta) == TEXT_BYTES
    out = []
    for i in range(count):
        envelope = {
            "stream_id": f"m{i}",
            "call_id": f"m{i}",
            "seq": 0,
            "kind": "tool_call",
            "tool": "get_weather",
            "tool_version": "1",
            "delta": delta,
            "final": False,
        }
        value = orjson.dumps(envelope)
        # one instant: record time must not pass the idle timeout while they are fed
        out.append(Record(TOPIC, 0, i, workload.EPOCH_MS, f"m{i}".encode(), value))
    return out


def _grown(feed: Callable[[], object], measure: Callable[[], int]) -> tuple[int, object]:
    """How much `measure` grew while `feed` built what it returns (kept alive)."""
    gc.collect()
    before = measure()
    kept = feed()
    gc.collect()
    return measure() - before, kept


def _traced(feed: Callable[[], object]) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start()
    try:
        grown, kept = _grown(feed, lambda: tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    return grown, kept


def row(count: int, callgate: Callgate, in_use: Callable[[], int] | None) -> dict[str, Any]:
    records = open_call_records(count)
    fetched = batches(records, BATCH)
    validators = load_validators(SEED_SCHEMAS)

    def feed_callgate() -> object:
        processor = callgate.processor()
        for batch in fetched:
            emitted = processor.feed(TOPIC, 0, batch)
            assert not emitted, emitted[0].value
        return processor

    def feed_seed() -> object:
        gate = SeedGate(validators)
        for record in records:
            gate.feed(record)
        return gate

    text = TEXT_BYTES * count
    native = None
    if in_use is not None:
        native, kept = _grown(feed_callgate, in_use)
        del kept
    python, kept = _traced(feed_callgate)
    assembler = kept.assembler  # type: ignore[attr-defined]
    assert assembler.open_calls == count, assembler.open_calls
    assert assembler.buffered_bytes == text, assembler.buffered_bytes
    del kept, assembler
    seed, kept = _traced(feed_seed)
    del kept
    total = (native or 0) + python
    per_call = (total - text) / count
    seed_per_call = (seed - text) / count
    return {
        "open_calls": count,
        "buffered_text_bytes": text,
        "c_heap_bytes": native,
        "python_heap_bytes": python,
        "callgate_bytes_per_open_call": round(per_call),
        "python_bytes_per_open_call": round(python / count),
        "seed_bytes_per_open_call": round(seed_per_call),
        "ratio_vs_seed": round(per_call / seed_per_call, 2),
        "target": TARGET_BYTES,
        "meets_target": per_call <= TARGET_BYTES,
    }


def run(*, counts: tuple[int, ...] = (1_000, 10_000, 100_000)) -> dict[str, Any]:
    in_use = _mallinfo2()
    callgate = Callgate(SEED_SCHEMAS, "jsonschema-rs", limits=LIMITS)
    return {
        "description": __doc__.split("\n\n")[0],
        "c_heap_counted": in_use is not None,
        "text_bytes_per_call": TEXT_BYTES,
        "statistic": "one measurement per row (allocation counts do not vary between runs)",
        "rows": [row(count, callgate, in_use) for count in counts],
    }
