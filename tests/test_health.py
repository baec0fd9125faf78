"""worker/health.py: real HTTP requests on loopback against /metrics, /healthz and /readyz."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from worker.errors import CallgateError, InfrastructureError
from worker.health import HealthServer, not_ready_yet
from worker.metrics import Metrics
from worker.model import Outcome, Verdict

FIXED = settings(derandomize=True, deadline=None, print_blob=True)
TOOLS = {"get_weather": "get_weather"}


def get(
    port: int, path: str, method: str = "GET", host: str = "127.0.0.1"
) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=5)
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


Served = tuple[HealthServer, Metrics, Switch, int]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    metrics = Metrics(TOOLS, engine="fastjsonschema")
    switch = Switch()
    server = HealthServer(metrics.registry, switch)
    port = server.start("127.0.0.1", 0)
    try:
        yield server, metrics, switch, port
    finally:
        server.stop()


def accepted(body: bytes) -> float:
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    (found,) = [
        s.value
        for s in families["callgate_calls"].samples
        if s.labels == {"outcome": "accepted", "tool": "get_weather"}
    ]
    return found


def test_metrics_serves_the_registry_as_it_is_now(served: Served) -> None:
    _, metrics, _, port = served
    status, content_type, body = get(port, "/metrics")
    assert status == 200
    assert content_type == CONTENT_TYPE_LATEST
    before = accepted(body)
    metrics.observe(Verdict(Outcome.ACCEPTED), "get_weather")
    assert accepted(get(port, "/metrics")[2]) == before + 1
    assert get(port, "/metrics?debug=1")[0] == 200  # a query string changes nothing


def test_healthz_is_ok_whether_ready_or_not(served: Served) -> None:
    _, _, switch, port = served
    for state in ((False, "joining the consumer group"), (True, "consuming 2 partitions")):
        switch.state = state
        assert get(port, "/healthz") == (200, "text/plain; charset=utf-8", b"ok\n")


def test_readyz_follows_the_callback(served: Served) -> None:
    _, _, switch, port = served
    switch.state = (False, "no partitions assigned")
    assert get(port, "/readyz")[::2] == (503, b"no partitions assigned\n")
    switch.state = (True, "consuming 3 partitions")
    assert get(port, "/readyz")[::2] == (200, b"consuming 3 partitions\n")
    # no reason given: the status still says it
    switch.state = (False, "")
    assert get(port, "/readyz")[::2] == (503, b"not ready\n")
    switch.state = (True, "")
    assert get(port, "/readyz")[::2] == (200, b"ready\n")


@settings(FIXED, max_examples=60)
@given(st.booleans(), st.text(max_size=200))
def test_readyz_answers_any_reason(served: Served, ready: bool, reason: str) -> None:
    _, _, switch, port = served
    switch.state = (ready, reason)
    status, content_type, body = get(port, "/readyz")
    assert status == (200 if ready else 503)
    assert content_type == "text/plain; charset=utf-8"
    shown = reason or ("ready" if ready else "not ready")
    assert body == (shown + "\n").encode("utf-8", "backslashreplace")


def test_the_default_readiness_is_starting() -> None:
    assert not_ready_yet() == (False, "starting")
    server = HealthServer(CollectorRegistry())
    port = server.start("127.0.0.1", 0)
    try:
        assert get(port, "/readyz")[::2] == (503, b"starting\n")
    finally:
        server.stop()


def test_a_failing_readiness_check_is_unready_not_a_traceback(served: Served) -> None:
    server, _, switch, port = served

    def broken() -> tuple[bool, str]:
        raise ValueError("secret internal detail")

    server.readiness = broken
    try:
        status, _, body = get(port, "/readyz")
    finally:
        server.readiness = switch
    assert (status, body) == (503, b"readiness check failed: ValueError\n")
    assert get(port, "/healthz")[0] == 200  # alive all the same


class BrokenCollector:
    def collect(self) -> Iterable[Metric]:
        raise RuntimeError("secret internal detail")


def test_a_failing_collector_answers_500_without_a_traceback() -> None:
    registry = CollectorRegistry()
    registry.register(BrokenCollector())
    server = HealthServer(registry, lambda: (True, "ok"))
    port = server.start("127.0.0.1", 0)
    try:
        assert get(port, "/metrics")[::2] == (500, b"collecting metrics failed: RuntimeError\n")
        assert get(port, "/readyz")[0] == 200  # the port keeps serving
    finally:
        server.stop()


def test_metrics_disabled_serves_an_empty_page_and_the_probes() -> None:
    # `callgate run` with metrics off: the same port, an empty registry, the probes unchanged
    server = HealthServer(CollectorRegistry(), lambda: (True, "consuming"))
    port = server.start("127.0.0.1", 0)
    try:
        assert get(port, "/metrics")[::2] == (200, b"")
        assert get(port, "/healthz")[0] == 200
        assert get(port, "/readyz")[::2] == (200, b"consuming\n")
    finally:
        server.stop()


def test_unknown_path_and_head(served: Served) -> None:
    _, _, _, port = served
    status, _, body = get(port, "/nope")
    assert status == 404
    assert b"/metrics" in body
    for path in ("/healthz", "/readyz", "/metrics", "/nope"):
        status, _, body = get(port, path, method="HEAD")
        assert body == b""
        assert status == get(port, path)[0]


def test_concurrent_scrapes_and_probes_are_all_answered(served: Served) -> None:
    _, _, switch, port = served
    switch.state = (True, "consuming")
    paths = ["/metrics", "/healthz", "/readyz"] * 20
    with ThreadPoolExecutor(max_workers=12) as pool:
        statuses = list(pool.map(lambda path: get(port, path)[0], paths))
    assert statuses == [200] * len(paths)


def test_start_reports_the_bound_port_and_stop_releases_it() -> None:
    server = HealthServer(CollectorRegistry())
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
    first = HealthServer(CollectorRegistry())
    port = first.start("127.0.0.1", 0)
    try:
        with pytest.raises(InfrastructureError, match=f"127.0.0.1:{port}"):
            HealthServer(CollectorRegistry()).start("127.0.0.1", port)
    finally:
        first.stop()


def test_an_ipv6_host_binds_an_ipv6_socket() -> None:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    server = HealthServer(CollectorRegistry(), lambda: (True, "v6"))
    port = server.start("::1", 0)
    try:
        assert get(port, "/readyz", host="::1")[::2] == (200, b"v6\n")
    finally:
        server.stop()
