"""The composition root: every object `callgate check` and `callgate run` use, built from the
settings, here and nowhere else but its Kafka half, `worker.runtime.parts` (the worker's parts,
which import the Kafka client that `callgate check` never loads).

The core never reads settings, files or plugins itself: this module loads the contracts and
their plugins, turns each setting into the value its object takes, and wires them together.
Raises `ConfigError` / `SchemaLoadError` naming what is wrong, before anything runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from worker._native import Assembler, EarlyRules
from worker.adapters.decoder import Decoder
from worker.core.approval import ApprovalStore
from worker.core.events import EventLimits
from worker.core.feedback import largest_feedback_bytes
from worker.core.idempotency import KeyStore
from worker.core.pipeline import Gate, GateLimits
from worker.core.processor import Processor, promised_event_bytes
from worker.errors import ConfigError
from worker.metrics import Metrics
from worker.model import SchemaRef
from worker.plugins import load_plugins
from worker.schemas.contract import ViolationLimits
from worker.schemas.registry import SchemaRegistry
from worker.settings import LimitSettings, Settings

if TYPE_CHECKING:  # the otel extra: imported only when tracing is on
    from worker.logs import SpanIds
    from worker.runtime.tracing import CallTracing


def violation_limits(limits: LimitSettings) -> ViolationLimits:
    """How much a compiled check reports: `max_violations`, each path and message bounded."""
    return limits.violation_limits()


def event_limits(limits: LimitSettings) -> EventLimits:
    """The bounds an event is written within (its violations bounded as the gate's)."""
    return limits.event_limits()


def build_registry(settings: Settings) -> SchemaRegistry:
    return SchemaRegistry.load(
        settings.schemas.dir, settings.schemas.engine, limits=violation_limits(settings.limits)
    )


def tool_labels(*registries: SchemaRegistry) -> dict[str, str]:
    """Every name a call may give a tool (its name, its schema id) -> the tool's metric label."""
    labels: dict[str, str] = {}
    for registry in registries:
        for contract in registry.contracts():
            labels.setdefault(contract.tool, contract.tool)
            labels.setdefault(contract.ref.id, contract.tool)
    return labels


def shadow_series(processor: Processor) -> list[tuple[str, str]]:
    """The (tool label, version) of every contract of both sets when the processor judges
    under candidate contracts too (none otherwise): the shadow series exposed from the start."""
    if processor.shadow is None:
        return []
    registries = (processor.gate.registry, processor.shadow.registry)
    return sorted(
        {(c.tool, c.ref.version) for registry in registries for c in registry.contracts()}
    )


def contract_event_bytes(limits: LimitSettings, ref: SchemaRef) -> int:
    """How long an event of a call judged by `ref`, with `max_bytes` of arguments, can be
    (or one written later in its place): what `max_event_bytes` must hold."""
    return limits.max_bytes + promised_event_bytes(limits.max_id_bytes, limits.event_limits(), ref)


def build_gate(settings: Settings, registry: SchemaRegistry) -> Gate:
    """The gate of `registry`; ConfigError when a contract's retry feedback could exceed
    CALLGATE_LIMITS__MAX_FEEDBACK_BYTES with no violation shown, or an accepted call of
    CALLGATE_LIMITS__MAX_BYTES could make an event (or one written later in its place)
    exceed CALLGATE_LIMITS__MAX_EVENT_BYTES (its id and version too long)."""
    limits = settings.limits
    for contract in registry.contracts():
        ref = contract.ref
        needed = largest_feedback_bytes(ref, limits.max_violations)
        if needed > limits.max_feedback_bytes:
            raise ConfigError(
                f"{contract.file}: the retry feedback of {ref.id} version "
                f"{ref.version} can be {needed} bytes, over "
                f"CALLGATE_LIMITS__MAX_FEEDBACK_BYTES ({limits.max_feedback_bytes})"
            )
        needed = contract_event_bytes(limits, ref)
        if needed > limits.max_event_bytes:
            raise ConfigError(
                f"{contract.file}: an event of a call of {ref.id} version {ref.version} with "
                f"CALLGATE_LIMITS__MAX_BYTES ({limits.max_bytes}) of arguments can be {needed} "
                f"bytes, over CALLGATE_LIMITS__MAX_EVENT_BYTES ({limits.max_event_bytes})"
            )
    return Gate(
        registry,
        load_plugins(settings.schemas.dir, settings.plugins),
        gate_limits(settings),
    )


def gate_limits(settings: Settings) -> GateLimits:
    """The bounds the chain applies, from the settings."""
    limits = settings.limits
    return GateLimits(
        max_depth=limits.max_depth,
        max_feedback_bytes=limits.max_feedback_bytes,
        retry_budget=settings.retry.budget,
        max_id_bytes=limits.max_id_bytes,
        violations=violation_limits(limits),
    )


def build_early_rules(
    settings: Settings, registry: SchemaRegistry, candidate: SchemaRegistry | None = None
) -> EarlyRules | None:
    """The early rules of the contracts, None when early verdicts are off. With candidate
    contracts (shadow mode), only the tools both sets decide alike keep theirs: an early
    verdict is then the candidate's too."""
    if not settings.assembly.early_verdict:
        return None
    max_depth = settings.limits.max_depth
    rules = registry.early_rules(max_depth)
    if candidate is not None:
        rules = rules.agreeing(candidate.early_rules(max_depth))
    return rules


def build_assembler(settings: Settings, early: EarlyRules | None = None) -> Assembler:
    limits = settings.limits
    assembly = settings.assembly
    return Assembler(
        max_call_bytes=limits.max_bytes,
        max_call_chunks=limits.max_chunks,
        max_open_calls_per_partition=limits.max_open_calls_per_partition,
        max_id_bytes=limits.max_id_bytes,
        max_detail_bytes=limits.max_message_bytes,
        idle_timeout_ms=round(assembly.idle_timeout_s * 1000),
        max_call_lifetime_ms=round(assembly.max_call_lifetime_s * 1000),
        recently_closed_per_partition=limits.recently_closed_per_partition,
        early=early,
    )


def build_decoder(settings: Settings) -> Decoder:
    limits = settings.limits
    return Decoder(
        max_streams_per_partition=limits.max_open_calls_per_partition,
        closed_streams_per_partition=limits.recently_closed_per_partition,
        max_id_bytes=limits.max_id_bytes,
        dialects=settings.topics.dialects,
    )


def with_contracts(settings: Settings, directory: Path) -> Settings:
    """The same settings with another contracts directory (a candidate's)."""
    return settings.model_copy(
        update={"schemas": settings.schemas.model_copy(update={"dir": directory})}
    )


def build_processor(
    settings: Settings,
    registry: SchemaRegistry | None = None,
    *,
    candidate: Path | None = None,
    early: bool = True,
) -> Processor:
    """The processor; with `candidate`, every call is judged under those contracts (and their
    plugins) too, the verdicts compared on each emission (`worker.core.flips`). `early=False`
    waits for every call's end whatever the settings say (a replay re-judges whole calls)."""
    limits = settings.limits
    registry = registry if registry is not None else build_registry(settings)
    shadow = None
    if candidate is not None:
        candidate_settings = with_contracts(settings, candidate)
        shadow = build_gate(candidate_settings, build_registry(candidate_settings))
    rules = None
    if early:
        rules = build_early_rules(
            settings, registry, shadow.registry if shadow is not None else None
        )
    return Processor(
        build_assembler(settings, rules),
        build_decoder(settings),
        build_gate(settings, registry),
        event_limits(limits),
        shadow=shadow,
    )


def build_metrics(settings: Settings, processor: Processor) -> Metrics:
    """The worker's metrics: a label for every tool of both contract sets, the key store's
    bound, and (in shadow mode) the shadow series at zero."""
    registries = [processor.gate.registry]
    if processor.shadow is not None:
        registries.append(processor.shadow.registry)
    keys = settings.idempotency
    return Metrics(
        tool_labels(*registries),
        engine=settings.schemas.engine,
        max_idempotency_keys=keys.max_keys * keys.partitions,
        shadow_series=shadow_series(processor),
    )


def build_key_store(settings: Settings) -> KeyStore:
    """An empty store for one partition of the idempotency topic."""
    keys = settings.idempotency
    return KeyStore(max_keys=keys.max_keys, retention_ms=round(keys.retention_s * 1000))


def build_tracing(settings: Settings) -> CallTracing | None:
    """The calls' spans when `tracing.enabled`, exported to its endpoint; None (and nothing of
    OpenTelemetry imported) when off. `ConfigError` when on without the otel extra."""
    if not settings.tracing.enabled:
        return None
    try:
        from worker.runtime.tracing import CallTracing  # noqa: PLC0415 (the optional extra)
    except ImportError as exc:
        raise ConfigError(
            f"CALLGATE_TRACING__ENABLED needs OpenTelemetry ({exc.name} is missing): "
            "pip install 'callgate[otel]'"
        ) from None
    return CallTracing.from_settings(settings)


def log_span_ids(settings: Settings) -> SpanIds | None:
    """What gives the log's JSON lines the active span's ids: with tracing on, OpenTelemetry's
    current span; None when off (or the extra is missing, which `build_tracing` reports)."""
    if not settings.tracing.enabled:
        return None
    try:
        from worker.runtime.tracing import current_span_ids  # noqa: PLC0415 (the optional extra)
    except ImportError:
        return None
    return current_span_ids


def build_approval_store(settings: Settings) -> ApprovalStore:
    """An empty store for one partition of the pending-approval topic."""
    approval = settings.approval
    return ApprovalStore(
        expiry_ms=round(approval.expiry_s * 1000),
        retention_ms=round(approval.retention_s * 1000),
        max_feedback_bytes=settings.limits.max_feedback_bytes,
    )
