"""Benchmark 4, profiled: where a record's CPU time goes end to end, callgate and the pass-through.

On one broker (Apache Kafka unless told), the workload of the e2e benchmark (20,000 small calls
of 10 chunks, 20 % invalid, 3 partitions) is loaded once; then the pass-through and `python -m
worker run` each drain it in a fresh group, as in the e2e benchmark, with py-spy attached to the
contender's process for its whole life (`py-spy record --pid`, raw folded stacks). py-spy leaves
out the samples of an idle thread, mostly: those it keeps of a thread blocked in a poll or a
wait are a bucket of their own. So a bucket's samples / sampling rate / input records is its CPU
time per input record, comparable between the two contenders. Each sample goes to the first
bucket whose rule matches its stack (`BUCKETS`):

- `read`: aiokafka's fetch (`getmany` turning fetched batches into records, the fetcher task);
- `judge: native reassembly`: `Processor.feed` running the native reassembler (the leaf frame:
  py-spy shows native code as the Python frame that called it);
- `judge: per call`: `Processor.emit` (the chain, the engines, the event);
- `judge: metrics`, `judge: checkpoints`, `judge: rest` (the worker's own per-batch loop);
- `write`: the outbox and aiokafka's producer (batches, the sender, the acknowledgements);
- `start and stop`: imports, schema compilation, the clients' start and close;
- `other`: the event loop, connections, the group;
- `waiting`: a thread blocked in a poll or a wait.

The running total leaves out `waiting` and `start and stop`.

The two drains alternate over `repeats` rounds and their samples add up. The figures are the
profile behind the e2e share: what callgate spends per record beyond what the pass-through
spends, and in which part. `python -m benchmarks e2e_profile` needs py-spy (a dev dependency)
and the right to attach to a process (root, or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import e2e, workload
from benchmarks.common import RESULTS

#: samples per second (py-spy stops the process for the moment it reads each)
RATE_HZ = 500
#: how long to wait for py-spy to write its samples once its process has ended
SPY_EXIT_S = 60
CONTENDERS = ("passthrough", "callgate")
#: stacks kept in each contender's folded file (the rest are in the bucket totals only)
KEPT_STACKS = 400

Stack = list[str]


def _function(frame: str) -> str:
    """`Processor.feed (worker/core/processor.py:80)` -> `Processor.feed`."""
    return frame.split(" (", 1)[0]


def _has(*names: str) -> Callable[[Stack], bool]:
    def rule(stack: Stack) -> bool:
        return any(_function(frame) in names for frame in stack)

    return rule


def _has_prefix(*prefixes: str) -> Callable[[Stack], bool]:
    def rule(stack: Stack) -> bool:
        return any(_function(frame).startswith(prefixes) for frame in stack)

    return rule


def _waiting(stack: Stack) -> bool:
    # py-spy does not always see a thread blocked in a poll as idle: the event loop's `epoll`
    # and the health server thread's `poll` are waiting, whatever it says
    return bool(stack) and _function(stack[-1]).endswith(_WAITS)


def _native_reassembly(stack: Stack) -> bool:
    return bool(stack) and _function(stack[-1]) == "Processor.feed"


_WAITS = (".select", "Condition.wait", "Event.wait")
_START_AND_STOP = (
    "_find_and_load", "build_worker", "build_processor", "build_registry", "Worker.start",
    "Worker.close", "main.<locals>.close",
)  # fmt: skip
_WRITE_PREFIXES = (
    "Outbox.", "Sender.", "SendProduceReqHandler.", "BatchBuilder.", "MessageAccumulator.",
    "AIOKafkaProducer.", "_send", "AtLeastOnce.", "ExactlyOnce.", "Outcomes.", "Transactions.",
)  # fmt: skip

#: (bucket, rule), the first that matches a sample's stack takes it
BUCKETS: tuple[tuple[str, Callable[[Stack], bool]], ...] = (
    ("waiting", _waiting),
    ("start and stop", _has(*_START_AND_STOP)),
    ("read", _has_prefix("AIOKafkaConsumer.getmany", "Fetcher.", "PartitionRecords.")),
    ("judge: native reassembly", _native_reassembly),
    ("judge: per call", _has("Processor.emit")),
    ("judge: metrics", _has("Metrics.observe", "Metrics.set_lag")),
    ("judge: checkpoints", _has("Partitions.checkpoint")),
    ("judge: rest", _has("Judge.round")),
    ("write", _has_prefix(*_WRITE_PREFIXES)),
    ("other", lambda stack: True),
)


def bucket_of(stack: Stack) -> str:
    return next(name for name, rule in BUCKETS if rule(stack))


def read_folded(path: Path) -> Counter[str]:
    """py-spy's raw output: one `frame;frame;... count` line per distinct stack."""
    stacks: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[stack] += int(count)
    return stacks


NOT_RUNNING = ("waiting", "start and stop")


def per_record(stacks: Counter[str], records: int, rate_hz: int) -> dict[str, Any]:
    """Samples by bucket, and each bucket's CPU microseconds per input record."""
    samples: Counter[str] = Counter()
    for stack, count in stacks.items():
        samples[bucket_of(stack.split(";"))] += count
    micros = {name: samples[name] / rate_hz / records * 1e6 for name, _ in BUCKETS}
    running = sum(v for k, v in micros.items() if k not in NOT_RUNNING)
    return {
        "samples": {name: samples[name] for name, _ in BUCKETS},
        "us_per_record": {name: round(v, 3) for name, v in micros.items()},
        "us_per_record_running": round(running, 3),
    }


def _spy_executable() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).is_file():
        raise RuntimeError(
            "py-spy is not installed (it is a dev dependency: make .venv/.installed)"
        )
    return found


async def _on_broker(
    bootstrap: str, calls: int, repeats: int, logs: Path, out: Path
) -> dict[str, Any]:
    spy = _spy_executable()
    records = workload.records(
        workload.calls(workload.SMALL, calls, e2e.INVALID_SHARE, prefix="p"), e2e.FRAGMENTS
    )
    source = f"bench.in.{uuid.uuid4().hex[:8]}"
    await e2e._create(bootstrap, source)
    await e2e._load(bootstrap, source, e2e.partitioned(records))
    totals: dict[str, Counter[str]] = {kind: Counter() for kind in CONTENDERS}
    rates: dict[str, list[int]] = {kind: [] for kind in CONTENDERS}
    spies: list[tuple[subprocess.Popen[bytes], Path]] = []

    def attach(pid: int) -> None:
        samples = logs / f"{pid}.spy"
        command = [
            spy, "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--format", "raw",
            "--output", str(samples),
        ]  # fmt: skip
        with open(logs / "py-spy.log", "ab") as log:
            spies.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), samples))

    for _ in range(repeats):
        for kind in CONTENDERS:
            figures, _ = await e2e._drain(bootstrap, kind, source, len(records), logs, watch=attach)
            spied, samples = spies.pop()
            if await asyncio.to_thread(spied.wait, SPY_EXIT_S) != 0 or not samples.is_file():
                raise RuntimeError(f"py-spy did not profile {kind}; see {logs / 'py-spy.log'}")
            totals[kind] += read_folded(samples)
            rates[kind].append(figures["records_per_s"])
    body: dict[str, Any] = {"rate_hz": RATE_HZ, "records": len(records), "rounds": repeats}
    for kind in CONTENDERS:
        name = f"e2e-profile-{kind}.txt"
        kept = totals[kind].most_common(KEPT_STACKS)
        (out / name).write_text("".join(f"{stack} {count}\n" for stack, count in kept))
        body[kind] = {
            "records_per_s_by_round": rates[kind],
            "folded_stacks": f"results/{name}",
            **per_record(totals[kind], len(records) * repeats, RATE_HZ),
        }
    gate, floor = body["callgate"], body["passthrough"]
    body["callgate_beyond_passthrough_us_per_record"] = round(
        gate["us_per_record_running"] - floor["us_per_record_running"], 3
    )
    return body


def run(
    *, quick: bool = False, repeats: int = 3, broker: str = "apache", out: Path = RESULTS
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    calls = 300 if quick else 20_000
    with tempfile.TemporaryDirectory(prefix="callgate-e2e-profile-") as tmp:
        logs = Path(tmp)
        # a broker starts outside any event loop (Apache Kafka's start probes with its own)
        with e2e.broker(broker, logs) as bootstrap:
            body = asyncio.run(_on_broker(bootstrap, calls, repeats, logs, out))
    return {"description": __doc__.split("\n\n")[0], "broker": broker, **body}
