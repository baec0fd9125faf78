"""worker/health.py: real HTTP requests on loopback against /metrics, /healthz and /readyz."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from worker.errors import CallgateError, InfrastructureError
from worker.health import HealthServer
from worker.metrics import Metrics
from worker.model import Outcome, Verdict


def get(port: int, path: str, method: str = "GET") -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        conn.close()


class Switch:
    def __init__(self) -> None:
        self.state: tuple[bool, str] = (False, "no partitions assigned")

    def __call__(self) -> tuple[bool, str]:
        return self.state


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, Metrics, Switch, int]]:
    metrics = Metrics(frozenset({"get_weather"}))
    switch = Switch()
    server = HealthServer(metrics.registry, switch)
    port = server.start("127.0.0.1", 0)
    try:
        yield server, metrics, switch, port
    finally:
        server.stop()


def test_metrics_endpoint_serves_the_registry(
    served: tuple[HealthServer, Metrics, Switch, int],
) -> None:
    _, metrics, _, port = served
    metrics.observe(Verdict(Outcome.ACCEPTED), "get_weather")
    status, content_type, body = get(port, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    accepted = [
        s.value
        for s in families["callgate_calls"].samples
        if s.labels == {"outcome": "accepted", "tool": "get_weather"}
    ]
    assert accepted == [1.0]
    # the next scrape sees later updates
    metrics.observe(Verdict(Outcome.ACCEPTED), "get_weather")
    assert (
        b'callgate_calls_total{outcome="accepted",tool="get_weather"} 2.0'
        in get(port, "/metrics")[2]
    )


def test_healthz_is_always_ok(served: tuple[HealthServer, Metrics, Switch, int]) -> None:
    _, _, _, port = served
    status, _, body = get(port, "/healthz")
    assert (status, body) == (200, b"ok\n")


def test_readyz_follows_the_callback(served: tuple[HealthServer, Metrics, Switch, int]) -> None:
    _, _, switch, port = served
    status, _, body = get(port, "/readyz")
    assert (status, body) == (503, b"no partitions assigned\n")
    switch.state = (True, "consuming 3 partitions")
    status, _, body = get(port, "/readyz")
    assert (status, body) == (200, b"consuming 3 partitions\n")
    switch.state = (False, "")
    assert get(port, "/readyz")[:1] == (503,)


def test_a_failing_readiness_check_is_unready_not_a_traceback(
    served: tuple[HealthServer, Metrics, Switch, int],
) -> None:
    server, _, _, port = served

    def broken() -> tuple[bool, str]:
        raise ValueError("secret internal detail")

    server.readiness = broken
    status, _, body = get(port, "/readyz")
    assert status == 503
    assert body == b"readiness check failed: ValueError\n"


def test_unknown_path_and_head(served: tuple[HealthServer, Metrics, Switch, int]) -> None:
    _, _, _, port = served
    status, _, body = get(port, "/nope")
    assert status == 404
    assert b"/metrics" in body
    status, _, body = get(port, "/healthz", method="HEAD")
    assert (status, body) == (200, b"")
    assert get(port, "/metrics?debug=1")[0] == 200


def test_start_reports_the_bound_port_and_stop_releases_it() -> None:
    server = HealthServer(Metrics().registry)
    port = server.start("127.0.0.1", 0)
    assert port > 0
    assert server.port == port
    with pytest.raises(CallgateError):
        server.start("127.0.0.1", 0)
    server.stop()
    assert server.port is None
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 1):
        pass
    server.stop()  # stopping twice is harmless


def test_a_taken_port_is_an_infrastructure_error() -> None:
    first = HealthServer(Metrics().registry)
    port = first.start("127.0.0.1", 0)
    try:
        with pytest.raises(InfrastructureError, match=f"127.0.0.1:{port}"):
            HealthServer(Metrics().registry).start("127.0.0.1", port)
    finally:
        first.stop()
