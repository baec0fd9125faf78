"""The one settings object: environment `CALLGATE_*` (nested with `__`), an optional file, defaults.

Loaded once in the entry point (`load_settings`) and passed down; nothing else reads the
environment. Every model is frozen. Whatever can be checked without a broker is checked here,
so that an error names where the wrong value came from: the environment variable, or the
settings file and its key. A `CALLGATE_*` variable that sets nothing is refused, with the
closest setting named.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict

from worker.adapters.dialects import DIALECTS
from worker.errors import ConfigError
from worker.model import MAX_DEPTH, SchemaRef
from worker.runtime.topics import never_input

if TYPE_CHECKING:  # the core's values, made from these settings (imported where made: a cycle)
    from worker.core.events import EventLimits
    from worker.schemas.contract import ViolationLimits

_FROZEN = ConfigDict(frozen=True, extra="forbid")


ENV_PREFIX = "CALLGATE_"
ENV_NESTED = "__"

#: The largest value any limit (`CALLGATE_LIMITS__*`) or assembly time in seconds
#: (`CALLGATE_ASSEMBLY__*`) may take: Kafka sizes a record in a signed 32-bit integer, so no
#: event, record or call is larger, and the native core holds every bound within 32 bits (a
#: time as milliseconds within 64). A larger value is refused, naming its variable.
MAX_LIMIT = 2**31 - 1


def _split_csv(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _host_port(server: str) -> str:
    host, sep, port = server.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{server!r} is not host:port")
    return server


class KafkaSettings(BaseModel):
    model_config = _FROZEN

    bootstrap_servers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="host:port list, comma-separated; empty means the embedded broker (demo only)",
    )
    client_id: str = "callgate"
    group_id: str = Field(
        "callgate",
        pattern=r"^[A-Za-z0-9._-]{1,100}$",
        description="the consumer group; also names the internal topics",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_password: SecretStr | None = None
    fetch_max_records: int = Field(2000, ge=1, description="records per getmany() batch")
    fetch_timeout_ms: int = Field(200, ge=1)
    fetch_max_wait_ms: int = Field(
        50, ge=0, description="how long the broker may hold a fetch for more data (latency)"
    )
    session_timeout_ms: int = Field(10_000, ge=1000)
    max_poll_interval_ms: int = Field(300_000, ge=1000)
    linger_ms: int = Field(
        0,
        ge=0,
        description="the producer's wait for more records per batch; 0: each round's records "
        "are batched already",
    )
    max_batch_bytes: int = Field(
        256 * 1024,
        ge=16 * 1024,
        description="the producer's batch per topic partition; it sends one per partition per "
        "request, so this bounds what a partition takes per round trip (keep it under the "
        "topics' max.message.bytes)",
    )
    topic_check_interval_ms: int = Field(
        100,
        ge=0,
        description="how often the output topics are checked to exist before checkpoints move "
        "past what was written to them",
    )
    commit_interval_ms: int = Field(
        100,
        ge=0,
        description="checkpoints are taken and offsets (exactly_once: transactions) committed "
        "at most this often, beside the rounds (and on revoke and stop)",
    )
    request_timeout_ms: int = Field(
        30_000, ge=1000, description="an unacknowledged outcome event then fails and is sent again"
    )
    metadata_max_age_ms: int = Field(
        300_000,
        ge=1000,
        description="how often the consumer reads the cluster's topics again: how soon it "
        "consumes a topic the input pattern matches that was created after it started, or "
        "partitions added to an input",
    )
    max_in_flight_records: int = Field(
        20_000,
        ge=1,
        description="records in the pipeline: read ahead of the rounds, or written and not "
        "acknowledged (exactly_once: not committed); fetching pauses above it, and resumes at "
        "half",
    )
    max_in_flight_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024 * 1024,
        description="bytes (keys and values) written and not acknowledged (exactly_once: not "
        "committed); fetching pauses above it, and resumes at half",
    )

    @property
    def heartbeat_interval_ms(self) -> int:
        """How often the group consumer heartbeats: a third of the session, as Kafka's own
        clients default to."""
        return max(100, self.session_timeout_ms // 3)

    _split = field_validator("bootstrap_servers", mode="before")(_split_csv)

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers_are_host_port(cls, servers: list[str]) -> list[str]:
        return [_host_port(server) for server in servers]

    @field_validator("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    @classmethod
    def _file_exists(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"no such file: {path}")
        return path

    @model_validator(mode="after")
    def _session_within_poll_interval(self) -> KafkaSettings:
        if self.session_timeout_ms > self.max_poll_interval_ms:
            raise ValueError(
                f"session_timeout_ms ({self.session_timeout_ms}) must not exceed "
                f"max_poll_interval_ms ({self.max_poll_interval_ms})"
            )
        return self

    @model_validator(mode="after")
    def _tls_is_complete(self) -> KafkaSettings:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together")
        tls_set = [
            name
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password")
            if getattr(self, name) is not None
        ]
        if tls_set and not self.security_protocol.endswith("SSL"):
            raise ValueError(
                f"{', '.join(tls_set)} set but security_protocol is {self.security_protocol}, "
                "not SSL or SASL_SSL"
            )
        return self

    @model_validator(mode="after")
    def _security_is_complete(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL"):
            missing = [
                name
                for name in ("sasl_mechanism", "sasl_username", "sasl_password")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(f"{self.security_protocol} needs {', '.join(missing)}")
        elif self.sasl_mechanism is not None:
            raise ValueError("sasl_mechanism is set but security_protocol is not SASL_*")
        return self


class TopicSettings(BaseModel):
    model_config = _FROZEN

    input: str = Field(
        "model-output",
        description="comma-separated topic names, or a regex when it starts with '^'",
    )
    accepted: str = "tool-calls.validated"
    rejected: str = "tool-calls.rejected"
    incomplete: str = "tool-calls.incomplete"
    pending_approval: str = Field(
        "tool-calls.pending-approval",
        description="calls whose contract requires approval wait here (pending_approval events), "
        "and the decisions on them (callgate approve|deny) are written here, keyed by event id; "
        "the workers make it with CALLGATE_APPROVAL__PARTITIONS partitions",
    )
    replication_factor: int = Field(
        1,
        ge=1,
        description="replicas of the internal topics callgate creates (changelogs, idempotency "
        "topics); 3 on a production cluster",
    )
    dialects: dict[str, str] = Field(
        default_factory=dict,
        description="input topic -> the dialect its vendor records are read in, as JSON, e.g. "
        '{"model-out.ollama": "ollama"} (the formats\' dialects: '
        + ", ".join(f"{d.name} ({d.format})" for d in DIALECTS.values())
        + ")",
    )

    @property
    def input_pattern(self) -> str | None:
        return self.input if self.input.startswith("^") else None

    @property
    def input_topics(self) -> list[str]:
        return [] if self.input_pattern else [t.strip() for t in self.input.split(",") if t.strip()]

    @field_validator("dialects")
    @classmethod
    def _known_dialects(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted({name for name in value.values() if name not in DIALECTS})
        if unknown:
            raise ValueError(f"no dialect {unknown}; dialects: {sorted(DIALECTS)}")
        return value

    @field_validator("input")
    @classmethod
    def _valid_input(cls, value: str) -> str:
        if value.startswith("^"):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"input topic regex does not compile: {exc}") from exc
        elif not value.strip(" ,"):
            raise ValueError("at least one input topic is required")
        return value


class SchemaSettings(BaseModel):
    model_config = _FROZEN

    dir: Path = Path("schemas")
    engine: Literal["fastjsonschema", "jsonschema-rs"] = "fastjsonschema"


class MetricsSettings(BaseModel):
    model_config = _FROZEN

    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = Field(9464, ge=0, le=65535, description="0 picks a free port")
    ready_within_ms: int = Field(
        10_000,
        ge=1000,
        description="/readyz answers 503 once an assigned partition has had no fetch answered "
        "for this long, or writes have waited this long with none acknowledged",
    )


class LimitSettings(BaseModel):
    """Every bound on what one call, one record or one event may hold: each defined here once."""

    model_config = _FROZEN

    max_bytes: int = Field(256 * 1024, ge=1, le=MAX_LIMIT, description="argument bytes per call")
    max_chunks: int = Field(4096, ge=1, le=MAX_LIMIT, description="chunks per call")
    max_depth: int = Field(
        32,
        ge=1,
        le=MAX_DEPTH,
        description=f"nesting depth of the arguments and tool results (every JSON callgate reads "
        f"stops at {MAX_DEPTH} levels whatever this says)",
    )
    max_open_calls_per_partition: int = Field(10_000, ge=1, le=MAX_LIMIT)
    max_id_bytes: int = Field(
        256,
        ge=16,
        le=4096,
        description="stream_id, call_id, tool, version, idempotency key, principal, trace "
        "fields, a call's caller: longer is a malformed record",
    )
    max_message_bytes: int = Field(
        512,
        ge=64,
        le=MAX_LIMIT,
        description="a violation's path or message (a business rule's keyword too), a malformed "
        "record's detail",
    )
    max_feedback_bytes: int = Field(
        4096, ge=256, le=MAX_LIMIT, description="size bound of retry_feedback"
    )
    max_violations: int = Field(
        32, ge=1, le=MAX_LIMIT, description="violations computed per rejection"
    )
    max_event_bytes: int = Field(
        1_000_000,
        ge=65_536,
        le=MAX_LIMIT,
        description="an outcome event is never larger (keep it under the topics' "
        "max.message.bytes); a larger one is replaced by a rejection that says so",
    )
    recently_closed_per_partition: int = Field(
        4096,
        ge=1,
        le=MAX_LIMIT,
        description="closed calls remembered to tell retransmissions from reuse, and streams "
        "that ended or broke, to refuse what comes after",
    )

    @model_validator(mode="after")
    def _the_worst_case_fits_an_event(self) -> LimitSettings:
        # an event holds each identifier once, and JSON may write each of its bytes as six
        # (`\u0001`): the smallest event a call can have must fit, and an accepted call of
        # max_bytes must fit with it (measured with the event writer itself)
        from worker.core.feedback import largest_feedback_bytes  # noqa: PLC0415 (import cycle)
        from worker.core.processor import promised_event_bytes  # noqa: PLC0415 (import cycle)

        least = largest_feedback_bytes(None, self.max_violations)
        if self.max_feedback_bytes < least:
            raise ValueError(
                f"max_feedback_bytes must hold the longest feedback that shows no violation "
                f"with max_violations={self.max_violations}: at least {least}"
            )
        around = promised_event_bytes(self.max_id_bytes, self.event_limits(), SchemaRef("", ""))
        if self.max_event_bytes < self.max_bytes + around:
            raise ValueError(
                f"max_event_bytes must hold max_bytes ({self.max_bytes}) and the "
                f"{around} bytes an event can need around the arguments with "
                f"max_id_bytes={self.max_id_bytes} and max_feedback_bytes="
                f"{self.max_feedback_bytes}: at least {self.max_bytes + around}"
            )
        return self

    def violation_limits(self) -> ViolationLimits:
        """How much a violation may say: `max_violations`, each path and message bounded."""
        from worker.schemas.contract import ViolationLimits  # noqa: PLC0415 (import cycle)

        return ViolationLimits(
            self.max_violations,
            max_path_bytes=self.max_message_bytes,
            max_message_bytes=self.max_message_bytes,
        )

    def event_limits(self) -> EventLimits:
        """The bounds an event is written within (its violations bounded as the gate's)."""
        from worker.core.events import EventLimits  # noqa: PLC0415 (import cycle)

        return EventLimits(
            max_event_bytes=self.max_event_bytes,
            max_feedback_bytes=self.max_feedback_bytes,
            violations=self.violation_limits(),
        )


class AssemblySettings(BaseModel):
    """Time is the partition's own: record timestamps, never the worker's clock."""

    model_config = _FROZEN

    idle_timeout_s: float = Field(
        60.0,
        gt=0,
        le=MAX_LIMIT,
        description="no chunk for this long (record time): incomplete timeout",
    )
    max_call_lifetime_s: float = Field(
        900.0,
        gt=0,
        le=MAX_LIMIT,
        description="a call still open this long after its first chunk (record time) is "
        "incomplete max_lifetime",
    )
    early_verdict: bool = Field(
        True,
        description="reject a call as soon as the chunks read prove its contract cannot accept "
        "it (the README lists the keywords that decide early); its later chunks are dropped",
    )


class IdempotencySettings(BaseModel):
    """Keys are decided cluster-wide by the owner of the key's partition of an internal topic."""

    model_config = _FROZEN

    max_keys: int = Field(
        1_000_000, ge=1, description="keys remembered per partition (oldest forgotten first)"
    )
    retention_s: float = Field(
        7 * 24 * 3600.0, gt=0, description="how long a key is remembered (record time)"
    )
    partitions: int = Field(6, ge=1, description="partitions of the idempotency topics")


class ApprovalSettings(BaseModel):
    """Calls whose contract requires approval wait for a decision on the pending-approval topic,
    held by the owner of their partition of it (`worker.core.approval`)."""

    model_config = _FROZEN

    expiry_s: float = Field(
        24 * 3600.0,
        gt=0,
        description="how long a call waits for a decision (record time); after that it is "
        "rejected approval_expired and a later decision is refused",
    )
    retention_s: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        description="how long a decided call is remembered (record time), so that a second "
        "decision on it is refused and its pending event written again is ignored",
    )
    partitions: int = Field(
        6, ge=1, description="partitions of the pending-approval topic and its changelog"
    )


class DeliverySettings(BaseModel):
    model_config = _FROZEN

    guarantee: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once",
        description="exactly_once needs a broker with transactions (not the embedded one)",
    )
    transactional_id_prefix: str | None = Field(
        None,
        description="exactly_once: each owned partition writes with the transactional id "
        "<prefix>-<topic>-<partition>, so its next owner fences it (default: the group id)",
    )
    transaction_timeout_ms: int = Field(10_000, ge=1000)
    checkpoint_record_bytes: int = Field(
        512 * 1024, ge=1024, description="a checkpoint larger than this is written in parts"
    )


class RetrySettings(BaseModel):
    model_config = _FROZEN

    budget: int = Field(3, ge=1, description="attempts after which a rejection is not retryable")


class ShadowSettings(BaseModel):
    """Shadow mode: every call also judged under candidate contracts, its verdict unchanged."""

    model_config = _FROZEN

    schemas: Path | None = Field(
        None,
        description="candidate contracts directory: every call is also judged under it (its "
        "own plugins.py too) and what would change is counted in callgate_shadow_calls_total; "
        "the verdicts stay the current contracts'",
    )
    topic: str | None = Field(
        None,
        description="with schemas: each call whose verdict would change (a flip) is also "
        "written here, keyed by call_id (its ids and each side's outcome, code and sanitized "
        "violations; never an argument)",
    )

    @model_validator(mode="after")
    def _topic_needs_schemas(self) -> ShadowSettings:
        if self.topic is not None and self.schemas is None:
            raise ValueError("a shadow topic needs the candidate contracts (shadow.schemas)")
        return self


class ExecutorSettings(BaseModel):
    """The executor library (`callgate_executor`): its group, its topics, its handlers' bound.

    Its internal topics are named after its group: `<group_id>.requests` (accepted calls keyed
    by their execution key, so that one member owns each key) and `<group_id>.executions`
    (compacted, co-partitioned with it: what each key's execution recorded)."""

    model_config = _FROZEN

    group_id: str = Field(
        "callgate-executor",
        pattern=r"^[A-Za-z0-9._-]{1,100}$",
        description="the executors' consumer group; also names their internal topics and "
        "transactional ids",
    )
    results: str = Field(
        "tool-results", description="the tool-results topic (tool-result.v1, keyed by call_id)"
    )
    partitions: int = Field(
        6,
        ge=1,
        description="partitions of the requests and executions topics (a key's partition is "
        "its owner's; never change it for existing topics)",
    )
    timeout_s: float = Field(
        30.0, gt=0, description="a handler's deadline unless it registers its own"
    )

    @property
    def requests(self) -> str:
        return f"{self.group_id}.requests"

    @property
    def executions(self) -> str:
        return f"{self.group_id}.executions"


class TracingSettings(BaseModel):
    """OpenTelemetry traces: a span per call and one for its gate, exported over OTLP/HTTP."""

    model_config = _FROZEN

    enabled: bool = Field(
        False,
        description="trace every call (needs the otel extra: pip install 'callgate[otel]'); "
        "off, nothing of OpenTelemetry is imported",
    )
    endpoint: str = Field(
        "http://127.0.0.1:4318",
        description="the OTLP/HTTP endpoint of a collector; /v1/traces is added when the URL "
        "has no path",
    )
    service_name: str = Field("callgate", min_length=1, description="the resource's service.name")
    sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="share of the traces callgate starts that are sampled; a call whose record "
        "carries a traceparent follows its sampled flag",
    )
    export_timeout_s: float = Field(10.0, gt=0, description="one export to the endpoint")

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", value):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value

    @property
    def traces_url(self) -> str:
        """Where spans are sent: the endpoint, with /v1/traces when it names no path."""
        path = self.endpoint.partition("://")[2].partition("/")[2]
        return self.endpoint if path else f"{self.endpoint.rstrip('/')}/v1/traces"


class LogSettings(BaseModel):
    model_config = _FROZEN

    format: Literal["text", "json"] = Field(
        "text",
        description="text: one readable line per record; json: one JSON object per line (time, "
        "level, logger, message; trace_id and span_id when a span is active; a call's ids)",
    )

    @field_validator("format", mode="before")
    @classmethod
    def _format_in_any_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


class Settings(BaseSettings):
    """All of callgate's configuration. `callgate run --help` lists every field."""

    model_config = SettingsConfigDict(
        env_prefix="CALLGATE_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    kafka: KafkaSettings = KafkaSettings()
    topics: TopicSettings = TopicSettings()
    schemas: SchemaSettings = SchemaSettings()
    metrics: MetricsSettings = MetricsSettings()
    limits: LimitSettings = LimitSettings()
    assembly: AssemblySettings = AssemblySettings()
    idempotency: IdempotencySettings = IdempotencySettings()
    approval: ApprovalSettings = ApprovalSettings()
    retry: RetrySettings = RetrySettings()
    delivery: DeliverySettings = DeliverySettings()
    shadow: ShadowSettings = ShadowSettings()
    executor: ExecutorSettings = ExecutorSettings()
    tracing: TracingSettings = TracingSettings()
    log: LogSettings = LogSettings()
    plugins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="more plugin modules by import path (the contracts directory's own "
        "plugins.py is always loaded)",
    )
    shutdown_grace_s: float = Field(20.0, gt=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="DEBUG, INFO, WARNING or ERROR, in any case"
    )

    _split = field_validator("plugins", mode="before")(_split_csv)

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @property
    def written_topics(self) -> tuple[str, ...]:
        """The topics the worker writes its outputs to: the outcome topics, and the shadow
        topic when there is one (never input)."""
        topics = self.topics
        shadow = (self.shadow.topic,) if self.shadow.topic is not None else ()
        return (topics.accepted, topics.rejected, topics.incomplete, *shadow)

    @model_validator(mode="after")
    def _outputs_are_never_input(self) -> Settings:
        written = (*self.written_topics, self.topics.pending_approval)
        never = re.compile(never_input(self.kafka.group_id, written))
        looped = [topic for topic in self.topics.input_topics if never.fullmatch(topic)]
        if looped:
            raise ValueError(
                f"input topics {looped} are outcome topics, the shadow topic, the "
                "pending-approval topic or the group's own: each event would be judged again, "
                "for ever"
            )
        if self.topics.pending_approval in self.written_topics:
            raise ValueError(
                f"the pending-approval topic {self.topics.pending_approval!r} is an outcome or "
                "the shadow topic: a call waiting for approval must never look executable"
            )
        return self


def setting_fields(
    model: type[BaseModel] = Settings, prefix: str = ENV_PREFIX
) -> Iterator[tuple[str, FieldInfo]]:
    """Every setting as (environment name, field), nested models walked, in declaration order."""
    for name, info in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from setting_fields(annotation, env + ENV_NESTED)
        else:
            yield env, info


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """`CALLGATE_*` variables that set nothing, each with the closest setting's name.

    A whole section as JSON (`CALLGATE_KAFKA='{...}'`) sets something; pydantic checks its keys.
    """
    known = [env for env, _ in setting_fields()]
    sections = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    problems = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in sections or upper in known:
            continue
        close = difflib.get_close_matches(upper, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        problems.append(f"{name} is not a setting{hint}")
    return problems


def load_settings(settings_file: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings once: a JSON settings file under the environment, overrides on top.

    Raises `ConfigError` with every wrong value named where it was set (the variable, or the
    file and its key), in one message, and for every `CALLGATE_*` variable that sets nothing.
    """
    unknown = unknown_variables(os.environ)
    if unknown:
        raise ConfigError(
            f"unknown settings: {'; '.join(unknown)} (`callgate run --help` lists them all)"
        )
    from_file: dict[str, Any] = {}
    if settings_file is not None:
        try:
            from_file = orjson.loads(settings_file.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(f"settings file {settings_file}: {exc}") from exc
        if not isinstance(from_file, dict):
            raise ConfigError(f"settings file {settings_file}: must hold a JSON object")
    from_env = EnvSettingsSource(Settings)()
    try:
        return Settings.model_validate(_deep_merge(_deep_merge(from_file, from_env), overrides))
    except ValidationError as exc:
        problems = "; ".join(
            f"{_where(err['loc'], settings_file, from_file, from_env)}: {_message(err)}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from None


def _where(
    loc: tuple[int | str, ...],
    settings_file: Path | None,
    from_file: dict[str, Any],
    from_env: dict[str, Any],
) -> str:
    """Where a wrong value was set: its environment variable, or the settings file and its
    key. A check of a whole section (or of several) names the sources its values came from."""
    path = tuple(part for part in loc if isinstance(part, str))
    env = ENV_PREFIX + ENV_NESTED.join(part.upper() for part in path)
    key = f"{settings_file}: {'.'.join(path)}" if path else str(settings_file)
    env_value = _value_at(from_env, path)
    file_value = _value_at(from_file, path) if settings_file is not None else _ABSENT
    if env_value is not _ABSENT and not isinstance(env_value, dict):
        return env  # a value set in the environment overrides the file's
    if isinstance(env_value, dict) or isinstance(file_value, dict):
        env = f"{env}{ENV_NESTED}*" if path else f"{ENV_PREFIX}*"
    in_env = bool(env_value) and env_value is not _ABSENT
    if file_value is _ABSENT:
        return env
    return f"{env} and {key}" if in_env else key


_ABSENT = object()


def _value_at(tree: Any, path: tuple[str, ...]) -> Any:
    """A source's value at `path` (its nested dicts walked), or `_ABSENT`."""
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def _message(error: Mapping[str, Any]) -> str:
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
