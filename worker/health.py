"""The worker's one HTTP port: `/metrics`, `/healthz` (alive) and `/readyz` (ready for traffic).

A standard-library `ThreadingHTTPServer` on a daemon thread, so it runs beside the asyncio loop
without touching it; an IPv6 host (`::`) binds an IPv6 socket. Readiness is asked of a callback
`() -> (ready, reason)` on every request; the shell decides what ready means (group joined, no
topic failing, not stopping). A callback that raises makes the worker unready with the
exception's type as the reason, and a collector that raises makes `/metrics` answer 500 with its
type: a probe or a scrape never sees a traceback.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from worker.errors import CallgateError, InfrastructureError

Readiness = Callable[[], tuple[bool, str]]

_TEXT = "text/plain; charset=utf-8"


def not_ready_yet() -> tuple[bool, str]:
    return False, "starting"


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never holds up `stop()`


class _Server6(_Server):
    address_family = socket.AF_INET6  # "::" also serves IPv4 where the system maps it


class HealthServer:
    """Serves one registry and one readiness callback; `start()` binds, `stop()` closes."""

    def __init__(self, registry: CollectorRegistry, readiness: Readiness = not_ready_yet) -> None:
        self._registry = registry
        self.readiness = readiness
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int | None:
        return self._server.server_address[1] if self._server is not None else None

    def start(self, host: str, port: int) -> int:
        """Bind and serve on a daemon thread; returns the bound port (0 picks a free one)."""
        if self._server is not None:
            raise CallgateError("health server already started")
        server_class = _Server6 if ":" in host else _Server
        try:
            server = server_class((host, port), self._handler_class())
        except OSError as exc:
            raise InfrastructureError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="callgate-health",
            daemon=True,
        )
        self._thread.start()
        return int(server.server_address[1])

    def stop(self, timeout_s: float = 5.0) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout_s)

    def _ready(self) -> tuple[bool, str]:
        try:
            ready, reason = self.readiness()
        except Exception as exc:  # a broken check must answer "not ready", not crash the probe
            return False, f"readiness check failed: {type(exc).__name__}"
        return bool(ready), str(reason)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "callgate"
            sys_version = ""

            def do_GET(self) -> None:
                self._respond(head=False)

            def do_HEAD(self) -> None:
                self._respond(head=True)

            def _respond(self, *, head: bool) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    try:
                        text = generate_latest(owner._registry)
                    except Exception as exc:  # a collector's bug: say so, as for readiness
                        message = f"collecting metrics failed: {type(exc).__name__}\n"
                        self._send(HTTPStatus.INTERNAL_SERVER_ERROR, _TEXT, message.encode(), head)
                        return
                    self._send(HTTPStatus.OK, CONTENT_TYPE_LATEST, text, head)
                elif path == "/healthz":
                    self._send(HTTPStatus.OK, _TEXT, b"ok\n", head)
                elif path == "/readyz":
                    ready, reason = owner._ready()
                    status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
                    body = (reason or ("ready" if ready else "not ready")) + "\n"
                    self._send(status, _TEXT, body.encode("utf-8", "backslashreplace"), head)
                else:
                    self._send(
                        HTTPStatus.NOT_FOUND,
                        _TEXT,
                        b"not found: try /metrics, /healthz, /readyz\n",
                        head,
                    )

            def _send(self, status: HTTPStatus, content_type: str, body: bytes, head: bool) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes and scrapes every few seconds would drown the worker's own log

        return Handler
