"""A real OpenTelemetry Collector for the tests: OTLP in on free loopback ports, spans to a file.

`collector_binary` runs `tools/otelcol/build` (the collector's builder makes a minimal
distribution from Go modules into `.cache/`; once it is there, the script only prints where).
`OtelCollector` owns exactly one collector process: it writes its configuration into the
directory it is given (an OTLP receiver on gRPC and HTTP, a file exporter that flushes every
100 ms, no telemetry port of its own), starts it, waits (bounded) until its log says it is
ready and both ports accept connections, and stops only that pid. Each start writes a file of
its own (the file exporter truncates the one it opens), so a collector stopped and started
again keeps what it wrote before. `spans()` reads what the file exporter wrote (OTLP JSON, one
export request a line) as flat `Span` values; `wait_for_spans` polls until a predicate holds,
bounded. A start that fails raises `CollectorError`
with the tail of the collector's log.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support.processes import (
    ChildWait,
    accepts,
    file_tail,
    free_port,
    stop_process,
    wait_until,
)
from tests.support.tools import OTELCOL, ToolError, built

LOOPBACK = "127.0.0.1"
READY = "Everything is ready. Begin running and processing data."
LOG_TAIL_LINES = 40
POLL_S = 0.05


class CollectorError(RuntimeError):
    """The collector could not be built or started, or its file could not be read."""


def collector_binary(timeout_s: float) -> Path:
    """The collector's binary, built first by `tools/otelcol/build` if missing."""
    try:
        return built(OTELCOL, timeout_s)
    except ToolError as exc:
        raise CollectorError(str(exc)) from None


@dataclass(frozen=True)
class Span:
    """One span as the collector received it: ids in lowercase hex ("" for no parent)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str  # SPAN_KIND_INTERNAL, SPAN_KIND_CONSUMER, ...
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    status: str  # STATUS_CODE_UNSET, STATUS_CODE_OK, STATUS_CODE_ERROR
    resource: dict[str, Any]
    scope: str


_KINDS = {
    0: "SPAN_KIND_UNSPECIFIED",
    1: "SPAN_KIND_INTERNAL",
    2: "SPAN_KIND_SERVER",
    3: "SPAN_KIND_CLIENT",
    4: "SPAN_KIND_PRODUCER",
    5: "SPAN_KIND_CONSUMER",
}
_STATUSES = {0: "STATUS_CODE_UNSET", 1: "STATUS_CODE_OK", 2: "STATUS_CODE_ERROR"}


def _value(any_value: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as a Python value."""
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in any_value:
            return any_value[key]
    if "intValue" in any_value:
        return int(any_value["intValue"])  # OTLP JSON writes 64-bit integers as strings
    if "arrayValue" in any_value:
        return [_value(v) for v in any_value["arrayValue"].get("values", [])]
    if "kvlistValue" in any_value:
        return _attributes(any_value["kvlistValue"].get("values", []))
    if "bytesValue" in any_value:
        return any_value["bytesValue"]
    return None


def _attributes(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    return {pair["key"]: _value(pair.get("value", {})) for pair in pairs}


def _enum(value: Any, names: dict[int, str]) -> str:
    return names.get(value, str(value)) if isinstance(value, int) else str(value)


def parse_spans(text: str) -> list[Span]:
    """Every span in the file exporter's output (one OTLP JSON export request a line)."""
    spans: list[Span] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        request = json.loads(line)
        for resource_spans in request.get("resourceSpans", []):
            resource = _attributes(resource_spans.get("resource", {}).get("attributes", []))
            for scope_spans in resource_spans.get("scopeSpans", []):
                scope = scope_spans.get("scope", {}).get("name", "")
                for span in scope_spans.get("spans", []):
                    spans.append(
                        Span(
                            trace_id=span["traceId"].lower(),
                            span_id=span["spanId"].lower(),
                            parent_span_id=span.get("parentSpanId", "").lower(),
                            name=span["name"],
                            kind=_enum(span.get("kind", 0), _KINDS),
                            attributes=_attributes(span.get("attributes", [])),
                            events=tuple(
                                (event["name"], _attributes(event.get("attributes", [])))
                                for event in span.get("events", [])
                            ),
                            links=tuple(
                                (link["traceId"].lower(), link["spanId"].lower())
                                for link in span.get("links", [])
                            ),
                            status=_enum(span.get("status", {}).get("code", 0), _STATUSES),
                            resource=resource,
                            scope=scope,
                        )
                    )
    return spans


class OtelCollector:
    """One collector on free 127.0.0.1 ports; `work_dir` gets its config, log and span file.

    Use as a context manager or call `start` and `stop`. `otlp_http` / `otlp_grpc` are the
    endpoints an exporter sends to.
    """

    def __init__(self, binary: Path, work_dir: Path, *, host: str = LOOPBACK) -> None:
        self.binary = binary
        self.work_dir = work_dir
        self.host = host
        self.grpc_port = free_port(host)
        self.http_port = free_port(host)
        while self.http_port == self.grpc_port:
            self.http_port = free_port(host)
        self._process: subprocess.Popen[bytes] | None = None
        self._starts = 0

    @property
    def otlp_http(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def otlp_grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def spans_file(self) -> Path:
        """The file the running collector writes (one per start: `spans-<start>.jsonl`)."""
        return self.work_dir / f"spans-{self._starts}.jsonl"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "collector.log"

    @property
    def config_file(self) -> Path:
        return self.work_dir / "collector.yaml"

    def config(self) -> dict[str, Any]:
        """The collector's configuration: OTLP on both protocols, spans to `spans_file`."""
        return {
            "receivers": {
                "otlp": {
                    "protocols": {
                        "grpc": {"endpoint": f"{self.host}:{self.grpc_port}"},
                        "http": {"endpoint": f"{self.host}:{self.http_port}"},
                    }
                }
            },
            "exporters": {
                "file": {"path": str(self.spans_file), "format": "json", "flush_interval": "100ms"}
            },
            "service": {
                # no port of its own for the collector's metrics: nothing but loopback OTLP
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info"}},
                "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}},
            },
        }

    def start(self, timeout_s: float) -> None:
        """Start the collector; return once it is ready and both OTLP ports accept."""
        if self._process is not None:
            raise CollectorError("this collector is already started")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._starts += 1
        # JSON is YAML: the collector reads it as its configuration file
        self.config_file.write_text(json.dumps(self.config(), indent=2))
        command = [str(self.binary), "--config", f"file:{self.config_file}"]
        with self.log_file.open("ab") as log:
            try:
                self._process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            except OSError as exc:
                raise CollectorError(f"cannot run {self.binary}: {exc}") from None
        waited = wait_until(self._serves, timeout_s, process=self._process)
        if waited is ChildWait.EXITED:
            code, self._process = self._process.returncode, None
            raise CollectorError(
                f"the collector exited with status {code} before it was ready; "
                f"{self.log_file} ends:\n{self.log_tail()}"
            )
        if waited is ChildWait.TIMED_OUT:
            self.stop()
            raise CollectorError(
                f"the collector was not ready within {timeout_s:.0f} s; {self.log_file} ends:\n"
                f"{self.log_tail()}"
            )

    def _serves(self) -> bool:
        if READY not in self.log_file.read_text(errors="replace"):
            return False
        return all(accepts(self.host, port) for port in (self.grpc_port, self.http_port))

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop this collector's process and only it: SIGTERM (it flushes), then SIGKILL."""
        process, self._process = self._process, None
        stop_process(process, timeout_s)

    def spans(self) -> list[Span]:
        """Every span the file exporter has written so far, over every start, in order."""
        spans: list[Span] = []
        for start in range(1, self._starts + 1):
            try:
                text = (self.work_dir / f"spans-{start}.jsonl").read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            # the exporter may be mid-line: only whole lines are read
            spans.extend(parse_spans(text[: text.rfind("\n") + 1]))
        return spans

    def wait_for_spans(
        self, done: Callable[[list[Span]], bool], timeout_s: float, what: str = "spans"
    ) -> list[Span]:
        """Poll the span file until `done(spans)` holds; `CollectorError` at the deadline, with
        what was found (and the log's tail when the collector died)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if done(spans):
                return spans
            if self._process is not None and self._process.poll() is not None:
                raise CollectorError(
                    f"the collector exited while waiting for {what}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                names = sorted({span.name for span in spans})
                raise CollectorError(
                    f"no {what} within {timeout_s:.0f} s: {len(spans)} spans written, named {names}"
                )
            time.sleep(POLL_S)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the collector's log ("" before it has one)."""
        return file_tail(self.log_file, lines)

    def __enter__(self) -> OtelCollector:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
