"""Where the core's time goes: the Python side under pyinstrument, the native side under perf.

The workload of the core table's target rows (mixed, jsonschema-rs): small at 10 and at 100
chunks per call, large at 10. For each:

- pyinstrument (`profile-<row>.txt`): Python frames only, so time in native code shows as the
  self time of the Python function that called it (`Processor.feed` holds the native
  reassembler's time, `Processor.emit` the event's, `Gate.judge` the parse's);
- perf, when it is installed and allowed (`profile-<row>-perf.txt`): every sample by shared
  object and symbol, the interpreter, the native extension and libc apart. The child starts
  with perf's counting disabled and enables it (perf's control FIFO) only around the fed
  batches, so imports, schema compilation and the workload's build are not in it.

Returns the top self-time shares of both, so the README can quote what the profiles showed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyinstrument import Profiler

from benchmarks import workload
from benchmarks.common import RESULTS, ROOT
from benchmarks.core import SCHEMA_DIRS
from benchmarks.harness import Callgate, callgate_run

ENGINE = "jsonschema-rs"
ROWS = (("small", 10), ("small", 100), ("large", 10))
_PERF_LINE = re.compile(r"^\s*([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(.+?)(?:\s+-\s+-)?\s*$")


def _prepared(label: str, chunks: int, records: int) -> Any:
    calls = max(10, records // chunks)
    work = workload.calls(workload.SCHEMAS[label], calls, workload.MIXES["mixed"])
    return callgate_run(Callgate(SCHEMA_DIRS[label], ENGINE), workload.records(work, chunks))()


def _shares(profiler: Profiler, top: int = 14) -> list[dict[str, Any]]:
    """Self time by function (pyinstrument's "[self]" pseudo-frames folded into their parent)."""
    session = profiler.last_session
    assert session is not None
    root = session.root_frame()
    assert root is not None
    total = root.time or 1.0
    selfs: dict[str, float] = {}
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        frame, parent = stack.pop()
        own = f"{frame.function} ({frame.file_path_short}:{frame.line_no})"
        name = parent if frame.function == "[self]" and parent else own
        spent = frame.time - sum(child.time for child in frame.children)
        selfs[name] = selfs.get(name, 0.0) + spent
        stack.extend((child, own) for child in frame.children)
    ranked = sorted(selfs.items(), key=lambda item: -item[1])[:top]
    return [{"function": name, "self_share": round(t / total, 3)} for name, t in ranked]


def _pyinstrument(label: str, chunks: int, records: int, out: Path) -> dict[str, Any]:
    go = _prepared(label, chunks, records)
    profiler = Profiler(interval=0.0005)
    profiler.start()
    go()
    profiler.stop()
    name = f"profile-{label}-{chunks}.txt"
    (out / name).write_text(profiler.output_text(unicode=False, color=False))
    return {"file": f"results/{name}", "top_self": _shares(profiler)}


def _perf(label: str, chunks: int, records: int, out: Path) -> dict[str, Any] | None:
    """perf's samples of a child's fed batches, by shared object and symbol; None without perf."""
    if shutil.which("perf") is None:
        return None
    with tempfile.TemporaryDirectory(prefix="callgate-perf-") as tmp:
        control, ack, data = Path(tmp, "ctl"), Path(tmp, "ack"), Path(tmp, "perf.data")
        os.mkfifo(control)
        os.mkfifo(ack)
        record = [
            "perf", "record", "-F", "2000", "-D", "-1", "-o", str(data),
            f"--control=fifo:{control},{ack}", "--",
            sys.executable, "-m", "benchmarks.profile", label, str(chunks), str(records),
        ]  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "BENCH_PERF_CONTROL": str(control),
            "BENCH_PERF_ACK": str(ack),
        }
        done = subprocess.run(
            record, cwd=ROOT, env=env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            return {"error": done.stderr[-1000:]}
        report = subprocess.run(
            ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,symbol",
             "-g", "none", "--percent-limit", "0.3", "--stdio"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        by_dso = subprocess.run(
            ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso", "-g", "none",
             "--stdio"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
    name = f"profile-{label}-{chunks}-perf.txt"
    (out / name).write_text(by_dso + "\n" + report)
    symbols = []
    for line in report.splitlines():
        found = _PERF_LINE.match(line)
        if found:
            share, dso, symbol = found.groups()
            symbols.append({"dso": dso, "symbol": symbol[:120], "share": float(share) / 100})
    dsos = {}
    for line in by_dso.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].endswith("%"):
            dsos[parts[1]] = float(parts[0][:-1]) / 100
    return {"file": f"results/{name}", "by_object": dsos, "top_symbols": symbols[:25]}


def run(*, records: int = 200_000, out: Path = RESULTS) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {"engine": ENGINE, "records": records, "mix": "mixed", "rows": {}}
    for label, chunks in ROWS:
        body["rows"][f"{label}-{chunks}"] = {
            "pyinstrument": _pyinstrument(label, chunks, records, out),
            "perf": _perf(label, chunks, records, out),
        }
    return body


def _child(argv: list[str]) -> int:
    """Under `perf record -D -1`: build the run, enable counting, run, disable."""
    label, chunks, records = argv
    go = _prepared(label, int(chunks), int(records))
    control = os.environ["BENCH_PERF_CONTROL"]
    ack = os.environ["BENCH_PERF_ACK"]

    def command(word: str) -> None:
        with open(control, "w") as fifo:
            fifo.write(word + "\n")
        with open(ack) as answer:
            answer.readline()

    command("enable")
    go()
    command("disable")
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1:]))
