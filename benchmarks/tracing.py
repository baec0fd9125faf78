"""Benchmark: what tracing costs a worker's rounds, counted in CPU instructions (callgrind).

Each contender judges the same workload through the worker's own `Judge.round` (the fetched
batches of one partition, the records it makes appended to a list: no Kafka), in a child
process under callgrind with instrumentation on only around the rounds, at `n` and `2 n` calls;
the difference of the two counts over `n` is the cost of a call (imports, compilation and
start-up cancel out). Contenders:

- `off`: tracing off (the default), this checkout;
- `on`: tracing on, every call sampled, its spans through the SDK's batch processor to an
  exporter that drops them (what the exporter's thread does with the network is not counted);
- `before`, with `--baseline ROOT`: tracing off on another checkout of callgate (one from
  before tracing existed, say): the same child code judging with that checkout's `worker`.

`off / before` is what the off path adds to a call; `on / off`, what tracing on costs. Counts
are exact for a given binary, input and `PYTHONHASHSEED`, whatever else the machine does.
`python -m benchmarks tracing [--baseline ROOT]` needs valgrind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA, CHUNKS, MIX = "small", 10, "mixed"
#: calls at the smaller size (whole groups of the workload's eight interleaved lanes)
CALLS = 800


def _child(mode: str, calls: int) -> int:
    """Run in the child (its `worker` is the checkout on sys.path): judge `calls` calls."""
    import gc  # noqa: PLC0415 (the child imports what the checkout under test has)

    from aiokafka import TopicPartition  # noqa: PLC0415

    from benchmarks import workload  # noqa: PLC0415
    from benchmarks.common import BATCH, SEED_SCHEMAS  # noqa: PLC0415
    from benchmarks.instructions import _toggle  # noqa: PLC0415
    from worker.compose import build_key_store, build_metrics, build_processor  # noqa: PLC0415
    from worker.runtime.delivery import Stats  # noqa: PLC0415
    from worker.runtime.judging import Judge  # noqa: PLC0415
    from worker.runtime.keys import KeyOwners  # noqa: PLC0415
    from worker.settings import load_settings  # noqa: PLC0415

    settings = load_settings(
        schemas={"dir": SEED_SCHEMAS, "engine": "jsonschema-rs"},
        topics={"input": workload.TOPIC},
    )
    processor = build_processor(settings)
    owners = KeyOwners("requests", lambda: build_key_store(settings), 4096)
    extra: dict[str, Any] = {}
    try:
        from worker.compose import build_approval_store  # noqa: PLC0415
        from worker.runtime.approvals import ApprovalOwners  # noqa: PLC0415
    except ImportError:  # a baseline from before calls could wait for approval
        pass
    else:
        extra["approvals"] = ApprovalOwners("pending", lambda: build_approval_store(settings))
        extra["approvals_topic"] = "approvals"
    if mode == "on":
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        from worker.runtime.tracing import CallTracing  # noqa: PLC0415

        class Dropped(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropped()))
        extra["tracing"] = CallTracing(provider, group="bench", client_id="bench")
    judge = Judge(
        settings,
        processor,
        owners,
        build_metrics(settings, processor),
        Stats(),
        requests_topic="requests",
        keys_topic="keys",
        **extra,
    )
    schema = workload.SCHEMAS[SCHEMA]
    records = workload.records(workload.calls(schema, calls, workload.MIXES[MIX]), CHUNKS)
    tp = TopicPartition(workload.TOPIC, 0)
    fetched = [list(batch) for batch in workload.batches(records, BATCH)]
    made: list[Any] = []
    gc.collect()
    _toggle("on")
    for number, batch in enumerate(fetched):
        judge.round(number, {tp: batch}, made.append)
    _toggle("off")
    if mode == "on":
        provider.shutdown()
    return len(made)


def _count(mode: str, root: Path, calls: int) -> int:
    """Instructions one child spends in its rounds, judging with the `worker` under `root`."""
    # (here, not at the top: the child runs this file with another checkout's `benchmarks`)
    from benchmarks.instructions import _COLLECTED, CALLGRIND  # noqa: PLC0415

    code = (
        "import runpy, sys; sys.argv = ['tracing', sys.argv[1], sys.argv[2]]; "
        f"runpy.run_path({str(Path(__file__))!r}, run_name='__main__')"
    )
    command = [
        *CALLGRIND,
        sys.executable,
        "-c",
        code,
        mode,
        str(calls),
    ]
    # the checkout under test first (its `worker`), this one after it (the workload)
    path = os.pathsep.join(dict.fromkeys([str(root), str(ROOT)]))
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": path}
    env = {k: v for k, v in env.items() if not k.startswith("CALLGATE_")}
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {mode} ({root}) failed:\n{done.stderr[-3000:]}")
    return int(found.group(1))


def run(*, calls: int = CALLS, baseline: Path | None = None, jobs: int = 2) -> dict[str, Any]:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise RuntimeError("valgrind is not installed (Debian: apt-get install valgrind)")
    contenders: dict[str, tuple[str, Path]] = {"off": ("off", ROOT), "on": ("on", ROOT)}
    if baseline is not None:
        contenders["before"] = ("off", baseline.resolve())
    jobs_list = [(name, n) for name in contenders for n in (calls, 2 * calls)]

    def count(job: tuple[str, int]) -> int:
        mode, root = contenders[job[0]]
        return _count(mode, root, job[1])

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        counts = dict(zip(jobs_list, pool.map(count, jobs_list), strict=True))
    per_call = {
        name: (counts[(name, 2 * calls)] - counts[(name, calls)]) / calls for name in contenders
    }
    body: dict[str, Any] = {
        "description": __doc__.split("\n\n")[0],
        "statistic": "instructions per call = (count at 2 n calls - count at n calls) / n",
        "workload": {"schema": SCHEMA, "chunks_per_call": CHUNKS, "mix": MIX, "calls": calls},
        "instructions_per_call": {name: round(value) for name, value in per_call.items()},
        "on_over_off": round(per_call["on"] / per_call["off"], 3),
    }
    if baseline is not None:
        body["baseline"] = str(baseline)
        body["off_minus_before_per_call"] = round(per_call["off"] - per_call["before"], 1)
        body["off_over_before"] = round(per_call["off"] / per_call["before"], 5)
    return body


if __name__ == "__main__":
    print(_child(sys.argv[1], int(sys.argv[2])))
