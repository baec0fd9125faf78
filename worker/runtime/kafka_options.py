"""Settings to aiokafka keyword arguments: connection and security, consumer, producer.

The settings have checked each value and their combinations already (`worker.settings`); what
is left here is what only a command that connects can say (a run without brokers, TLS files
that do not load), raised as `ConfigError` with the setting's environment name, so a wrong
setting stops start-up with one clear message instead of an aiokafka traceback later.
"""

from __future__ import annotations

import ssl
from typing import Any

from aiokafka.helpers import create_ssl_context

from worker.errors import ConfigError
from worker.runtime.provision import largest_record_batch
from worker.settings import KafkaSettings, Settings

_ENV = "CALLGATE_KAFKA__"
#: aiokafka's own `max_request_size`
AIOKAFKA_MAX_REQUEST_SIZE = 1 << 20


def connection_options(kafka: KafkaSettings) -> dict[str, Any]:
    """bootstrap_servers, client_id and the security arguments every aiokafka client takes."""
    if not kafka.bootstrap_servers:
        raise ConfigError(
            f"{_ENV}BOOTSTRAP_SERVERS is empty: `callgate run` needs a Kafka cluster "
            "(`callgate-demo` starts an embedded broker instead)"
        )
    options: dict[str, Any] = {
        "bootstrap_servers": list(kafka.bootstrap_servers),
        "client_id": kafka.client_id,
        "security_protocol": kafka.security_protocol,
    }
    if kafka.security_protocol.startswith("SASL"):
        # settings validation guarantees all three are set for SASL_*
        assert kafka.sasl_password is not None
        options["sasl_mechanism"] = kafka.sasl_mechanism
        options["sasl_plain_username"] = kafka.sasl_username
        options["sasl_plain_password"] = kafka.sasl_password.get_secret_value()
    if kafka.security_protocol.endswith("SSL"):
        options["ssl_context"] = ssl_context(kafka)
    return options


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """A client TLS context: the CA file (or the system's), and a client certificate if given."""
    password = kafka.ssl_password.get_secret_value() if kafka.ssl_password else None
    try:
        context: ssl.SSLContext = create_ssl_context(
            cafile=kafka.ssl_cafile,
            certfile=kafka.ssl_certfile,
            keyfile=kafka.ssl_keyfile,
            password=password,
        )
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{_ENV}SSL_*: cannot load the TLS files: {exc}") from None
    return context


def consumer_options(settings: Settings) -> dict[str, Any]:
    """The group consumer: manual commits only. The worker places every assigned partition
    itself (after its checkpoint, else its committed offset, else its start), so there is no
    automatic reset: a position the log no longer has raises, and the worker says what was
    deleted before it was judged (`Worker._skip_deleted`) rather than skip it in silence."""
    kafka = settings.kafka
    return {
        **connection_options(kafka),
        "group_id": kafka.group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "none",
        "session_timeout_ms": kafka.session_timeout_ms,
        "heartbeat_interval_ms": kafka.heartbeat_interval_ms,
        "max_poll_interval_ms": kafka.max_poll_interval_ms,
        "max_poll_records": kafka.fetch_max_records,
        "fetch_max_wait_ms": kafka.fetch_max_wait_ms,
        "metadata_max_age_ms": kafka.metadata_max_age_ms,
    }


def producer_options(settings: Settings) -> dict[str, Any]:
    """The outcome producer: every replica acknowledges before an input offset is committed.

    No idempotent producer: a resend may duplicate an event, which the deterministic
    `event_id` makes harmless (and the embedded broker does not support it). It lets through
    the largest record the settings allow (`provision.largest_record_batch`): aiokafka refuses a
    larger one than `max_request_size` before it is sent (never less than aiokafka's own 1 MiB,
    so that a bound below it refuses nothing it let through before).
    """
    return {
        **connection_options(settings.kafka),
        "acks": "all",
        "enable_idempotence": False,
        "linger_ms": settings.kafka.linger_ms,
        "max_batch_size": settings.kafka.max_batch_bytes,
        "max_request_size": max(largest_record_batch(settings), AIOKAFKA_MAX_REQUEST_SIZE),
        "request_timeout_ms": settings.kafka.request_timeout_ms,
    }
