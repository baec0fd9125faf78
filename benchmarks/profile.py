"""The hot path under pyinstrument: the core workload (small and large, valid, jsonschema-rs).

Writes the text profiles beside the results (profile-<schema>.txt) and returns where the time
went, by function, as shares of the run, so the README can quote what the profile showed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyinstrument import Profiler

from benchmarks import workload
from benchmarks.common import RESULTS
from benchmarks.core import SCHEMA_DIRS
from benchmarks.harness import callgate_run, processor_factory

ENGINE = "jsonschema-rs"


def _shares(profiler: Profiler, top: int = 12) -> list[dict[str, Any]]:
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


def run(*, calls: int = 20_000, out: Path = RESULTS) -> dict[str, Any]:
    body: dict[str, Any] = {"engine": ENGINE, "calls": calls, "profiles": {}}
    for label, schema in workload.SCHEMAS.items():
        records = workload.records(workload.calls(schema, calls, 0.0), 10)
        go = callgate_run(processor_factory(SCHEMA_DIRS[label], ENGINE), records)
        profiler = Profiler(interval=0.0005)
        profiler.start()
        go()
        profiler.stop()
        out.mkdir(parents=True, exist_ok=True)
        text = profiler.output_text(unicode=False, color=False)
        (out / f"profile-{label}.txt").write_text(text)
        body["profiles"][label] = {
            "file": f"results/profile-{label}.txt",
            "top_self": _shares(profiler),
        }
    return body
