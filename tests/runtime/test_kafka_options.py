"""Settings to aiokafka arguments, and the checks of the Kafka settings: pure, no broker."""

from __future__ import annotations

import inspect
import os
import ssl
import subprocess
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.errors import ConfigError
from worker.runtime.kafka_options import consumer_options, producer_options
from worker.settings import Settings, load_settings


def _settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name in list(os.environ):
        if name.startswith("CALLGATE_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(f"CALLGATE_{name}", value)
    return load_settings()


def test_plain_consumer_commits_only_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(
        monkeypatch,
        KAFKA__BOOTSTRAP_SERVERS="k1:9092, k2:9093",
        KAFKA__GROUP_ID="gate",
        KAFKA__SESSION_TIMEOUT_MS="6000",
        KAFKA__FETCH_MAX_RECORDS="500",
        KAFKA__FETCH_MAX_WAIT_MS="20",
        KAFKA__METADATA_MAX_AGE_MS="5000",
    )
    options = consumer_options(settings)
    assert options["bootstrap_servers"] == ["k1:9092", "k2:9093"]
    assert options["group_id"] == "gate"
    assert options["enable_auto_commit"] is False
    assert options["auto_offset_reset"] == "none"  # never a silent skip: Worker._skip_deleted
    assert options["session_timeout_ms"] == 6000
    assert options["heartbeat_interval_ms"] == 2000
    assert options["max_poll_records"] == 500
    assert options["fetch_max_wait_ms"] == 20
    assert options["metadata_max_age_ms"] == 5000  # new topics a pattern matches, new partitions
    assert options["security_protocol"] == "PLAINTEXT"
    assert "sasl_mechanism" not in options
    assert "ssl_context" not in options


def test_producer_waits_for_all_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(monkeypatch, KAFKA__BOOTSTRAP_SERVERS="k1:9092", KAFKA__LINGER_MS="7")
    options = producer_options(settings)
    assert options["acks"] == "all"
    assert options["linger_ms"] == 7
    assert options["enable_idempotence"] is False
    assert options["max_batch_size"] == 256 * 1024  # one batch per partition per request


@settings(max_examples=60, deadline=None)
@given(
    max_event_bytes=st.integers(1_000_000, 16 * 2**20) | st.integers(2**20 - 4096, 2**20 + 4096),
    max_id_bytes=st.integers(16, 4096),
    fill=st.integers(0, 4096),
)
def test_the_producer_takes_every_record_the_bound_allows(
    max_event_bytes: int, max_id_bytes: int, fill: int
) -> None:
    """A record of an outcome event or an executor's result of CALLGATE_LIMITS__MAX_EVENT_BYTES,
    with a key and headers of the longest identifiers, is one the producer lets through
    (aiokafka refuses one its `max_request_size` is too small for, 1 MiB by default: a write
    within the bound that stopped the executor and the gate)."""
    config = Settings.model_validate(
        {
            "kafka": {"bootstrap_servers": "k1:9092"},
            "limits": {"max_event_bytes": max_event_bytes, "max_id_bytes": max_id_bytes},
        }
    )
    value = bytes(max_event_bytes - min(fill, max_event_bytes))
    headers = [("status", b"succeeded"), ("tool", bytes(max_id_bytes))]
    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(bytes(max_id_bytes), value, headers)
    default = inspect.signature(AIOKafkaProducer).parameters["max_request_size"].default
    allowed = producer_options(config).get("max_request_size", default)
    assert size <= allowed
    assert allowed >= default  # what aiokafka let through before is never refused


def test_the_batch_size_is_set_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    servers = "k1:9092"
    settings = _settings(
        monkeypatch, KAFKA__BOOTSTRAP_SERVERS=servers, KAFKA__MAX_BATCH_BYTES="65536"
    )
    assert producer_options(settings)["max_batch_size"] == 65536
    with pytest.raises(ConfigError, match="MAX_BATCH_BYTES"):
        _settings(monkeypatch, KAFKA__BOOTSTRAP_SERVERS=servers, KAFKA__MAX_BATCH_BYTES="1024")


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_maps_to_aiokafka_and_unwraps_the_secret_only_there(
    monkeypatch: pytest.MonkeyPatch, mechanism: str
) -> None:
    settings = _settings(
        monkeypatch,
        KAFKA__BOOTSTRAP_SERVERS="k1:9092",
        KAFKA__SECURITY_PROTOCOL="SASL_PLAINTEXT",
        KAFKA__SASL_MECHANISM=mechanism,
        KAFKA__SASL_USERNAME="gate",
        KAFKA__SASL_PASSWORD="s3cret",
    )
    assert "s3cret" not in repr(settings)
    options = consumer_options(settings)
    assert options["security_protocol"] == "SASL_PLAINTEXT"
    assert options["sasl_mechanism"] == mechanism
    assert options["sasl_plain_username"] == "gate"
    assert options["sasl_plain_password"] == "s3cret"


def test_sasl_ssl_builds_a_tls_context_from_the_ca_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cafile = tmp_path / "ca.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=callgate-test-ca",
            "-keyout",
            str(tmp_path / "ca.key"),
            "-out",
            str(cafile),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    settings = _settings(
        monkeypatch,
        KAFKA__BOOTSTRAP_SERVERS="k1:9093",
        KAFKA__SECURITY_PROTOCOL="SASL_SSL",
        KAFKA__SASL_MECHANISM="SCRAM-SHA-512",
        KAFKA__SASL_USERNAME="gate",
        KAFKA__SASL_PASSWORD="pw",
        KAFKA__SSL_CAFILE=str(cafile),
    )
    context = producer_options(settings)["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert len(context.get_ca_certs()) == 1


def test_missing_tls_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"CALLGATE_KAFKA__SSL_CAFILE: no such file"):
        _settings(
            monkeypatch,
            KAFKA__BOOTSTRAP_SERVERS="k1:9093",
            KAFKA__SECURITY_PROTOCOL="SSL",
            KAFKA__SSL_CAFILE=str(tmp_path / "nope.pem"),
        )


def test_certificate_without_key_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("x")
    with pytest.raises(
        ConfigError, match=r"CALLGATE_KAFKA__\*: ssl_certfile and ssl_keyfile go together"
    ):
        _settings(
            monkeypatch,
            KAFKA__BOOTSTRAP_SERVERS="k1:9093",
            KAFKA__SECURITY_PROTOCOL="SSL",
            KAFKA__SSL_CERTFILE=str(cert),
        )


def test_tls_files_without_tls_protocol_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cafile = tmp_path / "ca.pem"
    cafile.write_text("x")
    with pytest.raises(ConfigError, match="ssl_cafile set but security_protocol is PLAINTEXT"):
        _settings(monkeypatch, KAFKA__BOOTSTRAP_SERVERS="k1:9092", KAFKA__SSL_CAFILE=str(cafile))


def test_run_without_brokers_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="CALLGATE_KAFKA__BOOTSTRAP_SERVERS is empty"):
        consumer_options(_settings(monkeypatch))


@pytest.mark.parametrize("server", ["k1", "k1:", ":9092", "k1:port", "k1:70000"])
def test_malformed_bootstrap_server_is_named(monkeypatch: pytest.MonkeyPatch, server: str) -> None:
    with pytest.raises(
        ConfigError, match=r"CALLGATE_KAFKA__BOOTSTRAP_SERVERS: .* is not host:port"
    ):
        _settings(monkeypatch, KAFKA__BOOTSTRAP_SERVERS=f"ok:9092,{server}")


def test_session_longer_than_poll_interval_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"session_timeout_ms .* must not exceed"):
        _settings(
            monkeypatch,
            KAFKA__BOOTSTRAP_SERVERS="k1:9092",
            KAFKA__SESSION_TIMEOUT_MS="60000",
            KAFKA__MAX_POLL_INTERVAL_MS="30000",
        )
