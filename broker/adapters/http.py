"""The HTTP endpoint on aiohttp: GET /metrics (Prometheus), /healthz, /readyz and /cluster, and
the pull gateway's /v1/* routes when ``pull.enabled`` (``broker.adapters.http_pull``).

/metrics renders ``broker.metrics`` (plus the cluster collector when clustered); /healthz
(liveness) answers 200 while serving and 503 while shutting down; /readyz (readiness) answers 200
once the broker is listening and, when clustered, has joined the cluster, and 503 before that and
while shutting down (the body names the reason); /cluster is the cluster engine's state (404 when
the broker is not clustered); 404 for other paths, 405 for other methods. aiohttp parses the
requests (keep-alive, bounded headers, TLS when ``http.certfile`` is set); :meth:`respond` decides
the answer of the four probe paths and stays a plain function of (method, path).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from broker.metrics import certificate_files, make_registry, render

if TYPE_CHECKING:
    import ssl

    from prometheus_client import CollectorRegistry
    from prometheus_client.registry import Collector

    from broker.core.broker import Broker

HTTP_SHUTDOWN_TIMEOUT_S = 2.0
DEFAULT_HEADER_TIMEOUT_S = 10.0
PROBE_PATHS = ("/metrics", "/healthz", "/readyz", "/cluster", "/federation")
BAD_REQUEST_LOG_INTERVAL_S = 10.0  # at most one log line per this long for malformed requests

log = logging.getLogger("skipmq.http")


class _BadRequestLog:
    """Malformed requests (a NUL in a header, a broken request line) are refused by aiohttp's
    parser before any handler runs; they are logged as one warning line, then at most one line
    per ``BAD_REQUEST_LOG_INTERVAL_S`` with the count since (no traceback, no flood)."""

    def __init__(self) -> None:
        self.last_s = float("-inf")
        self.suppressed = 0

    def note(self, peer: str | None, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self.last_s < BAD_REQUEST_LOG_INTERVAL_S:
            self.suppressed += 1
            return
        reason = f"{type(exc).__name__}: {getattr(exc, 'message', '')}"[:200]
        log.warning(
            "http_bad_request peer=%s reason=%r (refused with 400; %d more since the previous line)",
            peer,
            reason,
            self.suppressed,
        )
        self.last_s = now
        self.suppressed = 0


_BAD_REQUESTS = _BadRequestLog()


class _ProblemRequestHandler(RequestHandler):
    """aiohttp's connection handler, with malformed requests answered by an RFC 9457 problem
    document (and logged by ``_BadRequestLog``) instead of a text/plain 400 and an error-level
    traceback per request."""

    __slots__ = ()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status != 400 or not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        _BAD_REQUESTS.note(request.remote, exc)
        problem = {
            "type": "about:blank",
            "title": "Bad Request",
            "status": 400,
            "detail": "the request line or a header is not valid HTTP (a NUL or control byte in a "
            "header, a malformed request line)",
        }
        response = web.Response(status=400, text=json.dumps(problem), content_type="application/problem+json")
        response.force_close()
        return response


class _ProblemServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _ProblemServer  # only __call__ differs: its handlers answer problem documents
        return server


class HttpServer:
    """A running aiohttp site: ``port`` (the bound one), ``close`` and ``wait_closed`` like an
    ``asyncio.Server``, so the broker server stops it as it stops its other listeners."""

    def __init__(self, runner: web.AppRunner) -> None:
        self._runner = runner
        self.port: int = runner.addresses[0][1]
        self._closed: asyncio.Task[None] | None = None

    def close(self) -> None:
        if self._closed is None:
            self._closed = asyncio.get_running_loop().create_task(self._runner.cleanup())

    async def wait_closed(self) -> None:
        self.close()
        assert self._closed is not None
        await asyncio.shield(self._closed)


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
        federation_collector: Collector | None = None,
        not_ready: Callable[[], str | None] = lambda: None,
        federation_state: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.broker = broker
        self._stopping = stopping
        self._not_ready = not_ready
        self._cluster_state = cluster_state
        self._cluster_collector = cluster_collector
        self._federation_collector = federation_collector
        self._federation_state = federation_state
        self._registry: CollectorRegistry | None = None

    def routes(self, app: web.Application) -> None:
        """Add the probe paths to ``app`` (GET and HEAD; 405 for any other method)."""
        for path in PROBE_PATHS:
            app.router.add_route("*", path, self._probe)

    async def start(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        extend: Callable[[web.Application], None] | None = None,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    ) -> HttpServer:
        """Serve on ``host:port`` (HTTPS with ``ssl_context``); ``extend`` adds more routes.

        ``header_timeout_s`` (``http.header_timeout_s``) is aiohttp's keep-alive timeout: a
        connection whose next request's headers are not complete this long after it opened or
        after its previous response is closed (a slowloris client trickling headers is dropped, as
        the hand-written handler did after 10 s). A request being handled (a long-poll) is not
        cut: aiohttp only closes a connection that is waiting for a request."""
        app = web.Application(
            handler_args={"max_field_size": 16 * 1024, "keepalive_timeout": header_timeout_s},
            middlewares=[self._errors],
        )
        self.routes(app)
        if extend is not None:
            extend(app)
        runner = _Runner(app, access_log=None, shutdown_timeout=HTTP_SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, backlog=1024)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        return HttpServer(runner)

    async def _probe(self, request: web.Request) -> web.StreamResponse:
        status, content_type, body = self.respond(request.method, request.path)
        headers = {"Allow": "GET, HEAD"} if status == 405 else None
        response = web.Response(status=status, body=body, headers=headers)
        response.headers["Content-Type"] = content_type
        return response

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """aiohttp's own 404 / 405 (and other HTTP errors): text for the probe paths as before,
        an RFC 9457 problem document under /v1/ and /admin/ (with the Allow header of a 405)."""
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except web.HTTPException as exc:
            if request.path.startswith(("/v1/", "/admin/")):
                problem = {
                    "type": "about:blank",
                    "title": exc.reason,
                    "status": exc.status,
                    "detail": f"{request.method} {request.path}: {exc.reason.lower()}",
                }
                headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
                return web.Response(
                    status=exc.status,
                    text=json.dumps(problem),
                    content_type="application/problem+json",
                    headers=headers,
                )
            if exc.status == 404:
                status, content_type, body = self.respond(request.method, request.path)
                response = web.Response(status=status, body=body)
                response.headers["Content-Type"] = content_type
                return response
            raise

    def respond(self, method: str, target: str) -> tuple[int, str, bytes]:
        """(status, content type, body) of one request."""
        broker = self.broker
        if target not in PROBE_PATHS:
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
            self._registry = make_registry(broker.stats, certificate_files(broker.config))
            if self._cluster_collector is not None:
                self._registry.register(self._cluster_collector)
            if self._federation_collector is not None:
                self._registry.register(self._federation_collector)
        body, content_type = render(self._registry)
        return 200, content_type, body
