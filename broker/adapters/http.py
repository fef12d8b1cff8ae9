"""The HTTP endpoint: GET /metrics (Prometheus), /healthz, /readyz and /cluster; a minimal HTTP/1.1 server.

/metrics renders ``broker.metrics`` (plus the cluster collector when clustered); /healthz
(liveness) answers 200 while serving and 503 while shutting down; /readyz (readiness) answers 200
once the broker is listening and, when clustered, has joined the cluster, and 503 before that and
while shutting down (the body names the reason); /cluster is the cluster engine's state (404 when
the broker is not clustered); 404 for other paths, 405 for other methods, 400 for a malformed
request line. One request per connection, bounded header size and read time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.metrics import make_registry, render

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.registry import Collector

    from broker.core.broker import Broker

HTTP_MAX_HEADER_BYTES = 16 * 1024
HTTP_TIMEOUT_S = 10.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


class HttpEndpoint:
    """Serves one broker's /metrics, /healthz, /readyz and /cluster; ``not_ready`` says why the
    broker is not ready yet (None: ready)."""

    def __init__(
        self,
        broker: Broker,
        *,
        stopping: Callable[[], bool],
        cluster_state: Callable[[], dict[str, Any]] | None = None,
        cluster_collector: Collector | None = None,
        not_ready: Callable[[], str | None] = lambda: None,
        federation_state: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.broker = broker
        self._stopping = stopping
        self._not_ready = not_ready
        self._cluster_state = cluster_state
        self._cluster_collector = cluster_collector
        self._federation_state = federation_state
        self._registry: CollectorRegistry | None = None

    async def start(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(self._client, host, port, limit=HTTP_MAX_HEADER_BYTES)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=HTTP_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split()
        method = ""
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            status, content_type, body = 400, "text/plain", b"bad request\n"
        else:
            method, target = parts[0], parts[1].split("?", 1)[0]
            status, content_type, body = self.respond(method, target)
        headers = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Connection: close",
        ]
        if status == 405:
            headers.append("Allow: GET, HEAD")
        payload = b"" if method == "HEAD" else body
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode("latin-1") + payload)
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()

    def respond(self, method: str, target: str) -> tuple[int, str, bytes]:
        """(status, content type, body) of one request."""
        broker = self.broker
        if target not in ("/metrics", "/healthz", "/readyz", "/cluster", "/federation"):
            return 404, "text/plain", b"not found: try /metrics, /healthz, /readyz, /cluster or /federation\n"
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        if target == "/healthz":
            serving = not (self._stopping() or broker.shutting_down)
            payload = {
                "status": "ok" if serving else "shutting_down",
                "node_id": broker.node_id,
                "uptime_s": round(time.time() - broker.stats.uptime_started_at, 3),
                "connections": broker.connected_count,
                "sessions": len(broker.sessions),
            }
            return (200 if serving else 503), "application/json", json.dumps(payload).encode() + b"\n"
        if target == "/readyz":
            reason = "shutting_down" if self._stopping() or broker.shutting_down else self._not_ready()
            ready: dict[str, Any] = {"status": "ready" if reason is None else "not_ready"}
            if reason is not None:
                ready["reason"] = reason
            ready["node_id"] = broker.node_id
            return (200 if reason is None else 503), "application/json", json.dumps(ready).encode() + b"\n"
        if target == "/federation":
            if self._federation_state is None:
                return 404, "text/plain", b"this broker is not federated (federation.enabled is false)\n"
            return 200, "application/json", json.dumps(self._federation_state()).encode() + b"\n"
        if target == "/cluster":
            if self._cluster_state is None:
                return 404, "text/plain", b"this broker is not clustered (cluster.enabled is false)\n"
            return 200, "application/json", json.dumps(self._cluster_state()).encode() + b"\n"
        broker.refresh_stats()
        if self._registry is None:
            self._registry = make_registry(broker.stats)
            if self._cluster_collector is not None:
                self._registry.register(self._cluster_collector)
        body, content_type = render(self._registry)
        return 200, content_type, body
