"""Writes deploy/grafana/dashboards/callgate.json, the operators' dashboard, from the panels below.

Standard library only, so it runs anywhere: `python deploy/grafana/generate.py` rewrites the JSON,
`--check` exits 1 when the checked-in JSON differs from what this script makes. The tests run the
check and verify that every metric a query names is declared in worker/metrics.py, so the
dashboard cannot drift from the code. Every query filters on the `instance` variable; those on
the series with a `tool` label (`callgate_calls_total`, `callgate_shadow_calls_total`) also
filter on `tool`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "callgate.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
JOB = "callgate"  # the scrape job name in deploy/prometheus/prometheus.yml

BY_WORKER = 'instance=~"$instance"'  # every query filters on the worker variable
BY_TOOL = f'{BY_WORKER}, tool=~"$tool"'
RI = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    stack: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _rate(metric: str, labels: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{labels}}}[{RI}]))"


def _quantile(q: float) -> str:
    return (
        f"histogram_quantile({q}, sum by (phase, le) "
        f"(rate(callgate_phase_duration_seconds_bucket{{{BY_WORKER}}}[{RI}])))"
    )


def _sum(metric: str, by: str = "instance") -> str:
    return f"sum by ({by}) ({metric}{{{BY_WORKER}}})"


def _internal(selector: str) -> str:
    return f'code="internal_error", {selector}'


EXECUTOR_CALLS = Query(
    _rate("callgate_executor_calls_total", BY_TOOL, "tool, outcome"), "{{tool}} {{outcome}}"
)

ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Traffic and outcomes",
        (
            Panel(
                "Calls/s by outcome",
                "Every judged call is exactly one of accepted, rejected, incomplete. A call with "
                "an idempotency key is counted when its key's owner decides.",
                (Query(_rate("callgate_calls_total", BY_TOOL, "outcome"), "{{outcome}}"),),
                unit="ops",
                stack=True,
                width=9,
            ),
            Panel(
                "Acceptance ratio",
                "Accepted calls over all judged calls. A drop means a model, prompt or schema "
                "changed: look at the rejection and incomplete panels below.",
                (
                    Query(
                        f'sum(rate(callgate_calls_total{{outcome="accepted", {BY_TOOL}}}[{RI}])) '
                        f"/ sum(rate(callgate_calls_total{{{BY_TOOL}}}[{RI}]))",
                        "accepted / all",
                    ),
                ),
                unit="percentunit",
                width=6,
                extra={"min": 0, "max": 1},
            ),
            Panel(
                "Records/s per worker",
                "Input records consumed (envelope chunks, vendor events). Flat at zero while lag "
                "grows: the worker is stuck.",
                (Query(_rate("callgate_records_total", BY_WORKER, "instance"), "{{instance}}"),),
                unit="ops",
                width=9,
            ),
            Panel(
                "Calls/s by tool and outcome",
                "Which tool fails. `_unknown` is a tool the schema registry does not know; `_none` "
                "a call without a tool (a refusal, an error, plain text).",
                (
                    Query(
                        _rate("callgate_calls_total", BY_TOOL, "tool, outcome"),
                        "{{tool}} {{outcome}}",
                    ),
                ),
                unit="ops",
                width=24,
            ),
        ),
    ),
    (
        "Why calls fail",
        (
            Panel(
                "Rejections/s by phase and code",
                "The first phase that failed and why (internal errors have their own panel). "
                "schema_violation: the model's arguments break the contract; invalid_json: the "
                "model wrote broken JSON; idempotency duplicate / idempotency_conflict: decided "
                "by the key's owner.",
                (
                    Query(
                        _rate(
                            "callgate_rejections_total",
                            f'code!="internal_error", {BY_WORKER}',
                            "phase, code",
                        ),
                        "{{phase}} {{code}}",
                    ),
                ),
                unit="ops",
                stack=True,
                width=16,
            ),
            Panel(
                "Internal errors/s by phase",
                "Calls callgate itself failed on (a bug, logged with its traceback): each one is "
                "rejected with code internal_error, never accepted. Any value here is a bug to "
                "report (alert CallgateInternalErrors).",
                (
                    Query(
                        _rate("callgate_rejections_total", _internal(BY_WORKER), "phase"),
                        "{{phase}}",
                    ),
                ),
                unit="ops",
                width=8,
                extra={"color": "red"},
            ),
            Panel(
                "Incomplete/s by reason",
                "Truncated or unfinished calls; never repaired into success. max_tokens: raise the "
                "model's output limit; timeout / stream_ended: the producer stopped mid-call; "
                "max_lifetime: a call open too long; stream_corrupt: the vendor stream "
                "contradicted itself.",
                (Query(_rate("callgate_incomplete_total", BY_WORKER, "reason"), "{{reason}}"),),
                unit="ops",
                stack=True,
            ),
            Panel(
                "Repairs/s by kind",
                "Lossless repairs applied before parsing (a ```json fence around the whole text).",
                (Query(_rate("callgate_repairs_total", BY_WORKER, "kind"), "{{kind}}"),),
                unit="ops",
            ),
        ),
    ),
    (
        "Latency per phase",
        (
            Panel(
                "p50 phase duration",
                "Median time each phase of the chain takes per call.",
                (Query(_quantile(0.5), "{{phase}}"),),
                unit="s",
                extra={"log": 10},
            ),
            Panel(
                "p99 phase duration",
                "Tail time per phase. schema_validation dominating: a schema is expensive; "
                "assembly: calls arrive in many small chunks.",
                (Query(_quantile(0.99), "{{phase}}"),),
                unit="s",
                extra={"log": 10},
            ),
        ),
    ),
    (
        "Open calls",
        (
            Panel(
                "Open calls",
                "Calls still being assembled. Climbing without bound: producers leave calls open.",
                (Query(_sum("callgate_open_calls"), "{{instance}}"),),
                width=8,
            ),
            Panel(
                "Buffered bytes",
                "Memory held by open calls (bounded by the limits settings).",
                (Query(_sum("callgate_buffered_bytes"), "{{instance}}"),),
                unit="bytes",
                width=8,
            ),
            Panel(
                "Assigned partitions",
                "Partitions per worker (input and idempotency requests). A worker at 0 is idle: "
                "more workers than partitions.",
                (Query(_sum("callgate_assigned_partitions"), "{{instance}}"),),
                width=8,
            ),
        ),
    ),
    (
        "State: checkpoints and idempotency",
        (
            Panel(
                "Checkpoint bytes/s by kind",
                "What the open calls' checkpoints write to the changelog topics. Full ones "
                "carry a partition's whole state, deltas what changed since.",
                (Query(_rate("callgate_checkpoint_bytes_total", BY_WORKER, "kind"), "{{kind}}"),),
                unit="Bps",
                stack=True,
                width=6,
            ),
            Panel(
                "Checkpoints/s: full vs delta",
                "Checkpoints written per second by kind. None while records are consumed: "
                "checkpoints stall (alert CallgateCheckpointsStalled).",
                (Query(_rate("callgate_checkpoints_total", BY_WORKER, "kind"), "{{kind}}"),),
                unit="ops",
                stack=True,
                width=6,
            ),
            Panel(
                "Idempotency decisions/s",
                "What the key owners decide: first (accepted), replay (the same call again, "
                "accepted again), duplicate and conflict (rejected).",
                (
                    Query(
                        _rate("callgate_idempotency_decisions_total", BY_WORKER, "decision"),
                        "{{decision}}",
                    ),
                ),
                unit="ops",
                stack=True,
                width=6,
            ),
            Panel(
                "Idempotency keys",
                "Keys remembered by all selected workers' key owners, against the store's bound. "
                "At the bound the oldest keys are forgotten before their retention ends.",
                (
                    Query(f"sum(callgate_idempotency_keys{{{BY_WORKER}}})", "keys"),
                    Query(f"max(callgate_idempotency_keys_limit{{{BY_WORKER}}})", "limit"),
                ),
                width=6,
            ),
        ),
    ),
    (
        "Approval",
        (
            Panel(
                "Approvals/s by result",
                "What the approval owners do: calls held for a person's approval, and decisions "
                "approved, denied, expired, or refused (another fingerprint than the call's, "
                "no such call, already decided: each refusal is a record on the "
                "pending-approval topic saying why).",
                (Query(_rate("callgate_approvals_total", BY_WORKER, "result"), "{{result}}"),),
                unit="ops",
                stack=True,
                width=12,
            ),
            Panel(
                "Calls pending approval",
                "Calls waiting for a decision (callgate approve|deny) in all selected workers' "
                "approval owners; each expires after CALLGATE_APPROVAL__EXPIRY_S.",
                (Query(f"sum(callgate_pending_approvals{{{BY_WORKER}}})", "pending"),),
                width=12,
            ),
        ),
    ),
    (
        "Executors",
        (
            Panel(
                "Executor calls/s by tool and outcome",
                "What callgate_executor processes answered: a handler's run (succeeded, failed, "
                "timed_out), interrupted (an executor died during a handler not safe to retry), "
                "replayed (an equal request's recorded result), conflict (another request under "
                "the key), refused (no handler, no approval or a forged one, arguments the "
                "handler's type refuses), redelivered (a call answered before, delivered again: "
                "it gets the same answer).",
                (EXECUTOR_CALLS,),
                unit="ops",
                stack=True,
                width=24,
            ),
        ),
    ),
    (
        "Delivery and dropped input",
        (
            Panel(
                "Events substituted and dropped/s",
                "Events a topic refused for good. Substituted: replaced by a rejection "
                "output_refused (phase delivery) on the rejected topic. Dropped: no substitute "
                "possible, the call has no event at all (alert CallgateEventsDropped). Input "
                "deleted: input records deleted (retention shorter than the lag) before they "
                "were judged, their calls have no verdict (alert CallgateInputDeleted).",
                (
                    Query(
                        _rate("callgate_events_substituted_total", BY_WORKER, "instance"),
                        "substituted {{instance}}",
                    ),
                    Query(
                        _rate("callgate_events_dropped_total", BY_WORKER, "instance"),
                        "dropped {{instance}}",
                    ),
                    Query(
                        _rate("callgate_input_records_deleted_total", BY_WORKER, "instance"),
                        "input deleted {{instance}}",
                    ),
                ),
                unit="ops",
                width=8,
                extra={"color": "red"},
            ),
            Panel(
                "Dropped chunks/s",
                "Duplicate: retransmissions of a piece already taken (producer retries, harmless). "
                "Late: chunks of a call that already has its verdict (after a timeout, an "
                "eviction, a gap): the producer is slower than the idle timeout. Early: chunks "
                "of a call already rejected early, dropped unread (what early verdicts save).",
                (
                    Query(
                        _rate("callgate_duplicate_chunks_total", BY_WORKER, "instance"),
                        "duplicate {{instance}}",
                    ),
                    Query(
                        _rate("callgate_late_chunks_total", BY_WORKER, "instance"),
                        "late {{instance}}",
                    ),
                    Query(
                        _rate("callgate_early_dropped_chunks_total", BY_WORKER, "instance"),
                        "early {{instance}}",
                    ),
                ),
                unit="ops",
                width=8,
            ),
            Panel(
                "Poison records/s by code",
                "Records that could not be read at all, each answered by its own rejection in "
                "phase assembly: malformed_record (a bad producer), internal_error (a bug in a "
                "decoder).",
                (Query(_rate("callgate_poison_records_total", BY_WORKER, "code"), "{{code}}"),),
                unit="ops",
                width=8,
            ),
        ),
    ),
    (
        "Candidate contracts (shadow mode)",
        (
            Panel(
                "Shadow flips/s by tool, version and kind",
                "With CALLGATE_SHADOW__SCHEMAS set, every call is judged again under the "
                "candidate contracts; its verdict stays the current contracts'. A flip is a call "
                "whose verdict would change: accepted_to_rejected (the candidate would refuse "
                "what runs now), rejected_to_accepted, accepted_changed (accepted under both, "
                "another schema version, normalized arguments, key or approval). Empty when "
                "shadow mode is off.",
                (
                    Query(
                        _rate(
                            "callgate_shadow_calls_total",
                            f'kind!~".*_unchanged", {BY_TOOL}',
                            "tool, version, kind",
                        ),
                        "{{tool}} v{{version}} {{kind}}",
                    ),
                ),
                unit="ops",
                stack=True,
                width=16,
            ),
            Panel(
                "Shadow flip ratio",
                "Calls that would flip over all calls judged under the candidate contracts. "
                "Read the flips' examples on the shadow topic (CALLGATE_SHADOW__TOPIC) or replay "
                "history with `callgate replay` before making the candidate current.",
                (
                    Query(
                        "sum(rate(callgate_shadow_calls_total"
                        f'{{kind!~".*_unchanged", {BY_TOOL}}}[{RI}])) '
                        f"/ sum(rate(callgate_shadow_calls_total{{{BY_TOOL}}}[{RI}]))",
                        "flipped / judged",
                    ),
                ),
                unit="percentunit",
                width=8,
                extra={"min": 0},
            ),
        ),
    ),
    (
        "Kafka",
        (
            Panel(
                "Consumer lag by partition",
                "Records not yet consumed. Growing steadily: add workers (up to the partition "
                "count) or find the slow phase above.",
                (
                    Query(
                        _sum("callgate_consumer_lag", "topic, partition"),
                        "{{topic}}/{{partition}}",
                    ),
                ),
                width=12,
            ),
            Panel(
                "Rebalances",
                "Group rebalances per worker. Frequent ones: workers crash, or exceed "
                "max.poll.interval; each one restores the moved partitions from their checkpoints.",
                (
                    Query(
                        "sum by (instance) "
                        f"(increase(callgate_rebalances_total{{{BY_WORKER}}}[5m]))",
                        "{{instance}}",
                    ),
                ),
                width=12,
            ),
            Panel(
                "Broker errors/s",
                "Failed offset commits, writes a topic failed to acknowledge (retried; "
                "fetching pauses while a topic fails and /readyz says which), and the Kafka "
                "client's warnings and errors (the log writes each kind once, and none while "
                "Kafka is unreachable).",
                (
                    Query(
                        _rate("callgate_commit_errors_total", BY_WORKER, "instance"),
                        "commit {{instance}}",
                    ),
                    Query(
                        _rate("callgate_produce_errors_total", BY_WORKER, "instance"),
                        "produce {{instance}}",
                    ),
                    Query(
                        _rate("callgate_kafka_client_log_records_total", BY_WORKER, "instance"),
                        "client log {{instance}}",
                    ),
                ),
                unit="ops",
                width=12,
            ),
            Panel(
                "Workers up",
                "Scrape targets of job callgate that answer.",
                (Query(f'sum(up{{job="{JOB}", {BY_WORKER}}})', "up"),),
                kind="stat",
                width=4,
            ),
            Panel(
                "Builds",
                "Version and schema engine of each worker.",
                (
                    Query(
                        f"count by (version, engine) (callgate_build_info{{{BY_WORKER}}})",
                        "{{version}} {{engine}}",
                    ),
                ),
                kind="stat",
                width=8,
            ),
        ),
    ),
    (
        "Process",
        (
            Panel(
                "CPU per worker",
                "CPU seconds per second each worker process uses (1 = one core). Near 1 with "
                "lag growing: the worker is CPU-bound, add workers (up to the partition count).",
                (
                    Query(
                        _rate("process_cpu_seconds_total", BY_WORKER, "instance"),
                        "{{instance}}",
                    ),
                ),
                unit="percentunit",
                width=8,
            ),
            Panel(
                "Memory per worker",
                "Resident memory of each worker process (virtual, dashed, for reference). "
                "Growing with open calls: see Buffered bytes; growing alone: report it.",
                (
                    Query(_sum("process_resident_memory_bytes"), "resident {{instance}}"),
                    Query(_sum("process_virtual_memory_bytes"), "virtual {{instance}}"),
                ),
                unit="bytes",
                width=8,
            ),
            Panel(
                "Open file descriptors",
                "Open descriptors of each worker process against its limit (sockets to the "
                "brokers, one per producer under exactly_once, and the health port's clients).",
                (
                    Query(_sum("process_open_fds"), "open {{instance}}"),
                    Query(_sum("process_max_fds"), "limit {{instance}}"),
                ),
                width=4,
            ),
            Panel(
                "Uptime",
                "Time since each worker process started; a reset is a restart.",
                (
                    Query(
                        f"time() - max by (instance) (process_start_time_seconds{{{BY_WORKER}}})",
                        "{{instance}}",
                    ),
                ),
                unit="s",
                kind="stat",
                width=4,
            ),
        ),
    ),
)


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    options: dict[str, Any]
    if panel.kind == "timeseries":
        custom: dict[str, Any] = {"fillOpacity": 20 if panel.stack else 5, "lineWidth": 1}
        if panel.stack:
            custom["stacking"] = {"mode": "normal", "group": "A"}
        if "log" in panel.extra:
            custom["scaleDistribution"] = {"type": "log", "log": panel.extra["log"]}
        defaults["custom"] = custom
        options = {
            "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        options = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    for key in ("min", "max"):
        if key in panel.extra:
            defaults[key] = panel.extra[key]
    if "color" in panel.extra:
        defaults["color"] = {"mode": "fixed", "fixedColor": panel.extra["color"]}
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": panel.width, "h": 8},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": query.expr,
                "legendFormat": query.legend,
                "range": True,
            }
            for i, query in enumerate(panel.queries)
        ],
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    next_id, y = 1, 0
    for title, row in ROWS:
        panels.append(
            {
                "id": next_id,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        next_id, y, x = next_id + 1, y + 1, 0
        for panel in row:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(_panel(panel, next_id, x, y))
            next_id, x = next_id + 1, x + panel.width
        y += 8
    return {
        "uid": "callgate",
        "title": "callgate",
        "description": "Tool-call gate: outcomes, failing phases, latency per phase, state "
        "(checkpoints, idempotency), delivery, Kafka.",
        "tags": ["callgate", "kafka"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {"selected": True, "text": "Prometheus", "value": "prometheus"},
                },
                _variable("instance", "Worker", "label_values(callgate_build_info, instance)"),
                _variable("tool", "Tool", "label_values(callgate_calls_total, tool)"),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
