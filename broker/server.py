"""Listeners and process lifecycle: TCP, TLS, WebSocket, HTTP (/metrics, /healthz), graceful stop.

MQTT over TCP and TLS uses :class:`broker.connection.MQTTConnection` as an asyncio Protocol; MQTT
over WebSocket (RFC 6455, subprotocol "mqtt", MQTT 5 §6 / 3.1.1 §6) uses the ``websockets``
library and feeds the same connection class through a small transport adapter. The HTTP
endpoint is a minimal HTTP/1.1 server: GET /metrics (Prometheus text from
``broker.metrics.render``), GET /healthz (200 while serving, 503 while shutting down), 404 for
other paths and 405 for other methods.

``BrokerServer.start()`` binds everything (port 0 gives an ephemeral port; ``ports`` has the real
ones) and logs one ``event="listening"`` line. ``serve_until_signal(config)`` runs until SIGTERM/SIGINT,
then stops accepting, disconnects clients (v5: DISCONNECT 0x8B), commits the store and returns 0;
SIGHUP re-reads the password and ACL files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import ssl
import threading
import time
from typing import Any

from broker.connection import MQTTConnection, WebSocketTransport
from broker.core import Broker
from broker.hooks import ClusterHooks

log = logging.getLogger("skipmq.server")

HTTP_MAX_HEADER_BYTES = 16 * 1024
HTTP_TIMEOUT_S = 10.0


def open_store(config: Any) -> Any:
    """The SQLite store of ``config`` (None when persistence is off)."""
    if not config.store.persistence:
        return None
    from broker.store import Store

    path = config.store.path
    if not path:
        os.makedirs(config.data_dir, exist_ok=True)
        path = os.path.join(config.data_dir, "skipmq.db")
    elif path != ":memory:":
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return Store(path, synchronous=config.store.synchronous)


def make_tls_context(tls: Any) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.certfile, tls.keyfile)
    if tls.cafile:
        context.load_verify_locations(cafile=tls.cafile)
        context.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


class BrokerServer:
    """A broker with its listeners; create and use inside a running event loop."""

    def __init__(self, config: Any, *, hooks: ClusterHooks | None = None) -> None:
        self.config = config
        self.hooks = hooks
        self.broker: Broker | None = None
        self.ports: dict[str, int] = {}
        self._servers: list[Any] = []
        self._ws_server: Any = None
        self._ws_tasks: set[asyncio.Task[None]] = set()
        self.stopping = False  # /healthz answers 503 from now on
        self._stop_started = False
        self.cluster: Any = None  # broker.cluster.runtime.ClusterRuntime when cluster.enabled
        if hooks is None and config.cluster.enabled:
            from broker.cluster.runtime import ClusterRuntime

            self.cluster = ClusterRuntime(config)
            self.hooks = self.cluster

    async def start(self) -> dict[str, int]:
        config = self.config
        loop = asyncio.get_running_loop()
        broker = Broker(config, hooks=self.hooks, store=open_store(config), loop=loop)
        self.broker = broker
        broker.start()
        if self.cluster is not None:  # in the overlay before the first client can connect
            self.ports["cluster"] = await self.cluster.start(broker)
        listeners = config.listeners
        if listeners.tcp.enabled:
            server = await loop.create_server(
                lambda: MQTTConnection(broker, "tcp"), listeners.tcp.host, listeners.tcp.port, backlog=4096
            )
            self._servers.append(server)
            self.ports["tcp"] = server.sockets[0].getsockname()[1]
        if listeners.tls.enabled:
            context = make_tls_context(listeners.tls)
            server = await loop.create_server(
                lambda: MQTTConnection(broker, "tls"),
                listeners.tls.host,
                listeners.tls.port,
                ssl=context,
                backlog=1024,
            )
            self._servers.append(server)
            self.ports["tls"] = server.sockets[0].getsockname()[1]
        if listeners.websocket.enabled:
            await self._start_websocket(broker)
        if config.http.enabled:
            server = await asyncio.start_server(
                self._http_client, config.http.host, config.http.port, limit=HTTP_MAX_HEADER_BYTES
            )
            self._servers.append(server)
            self.ports["http"] = server.sockets[0].getsockname()[1]
        broker.log_event(logging.INFO, "listening", node_id=broker.node_id, **self.ports)
        return self.ports

    # ------------------------------------------------------------------ WebSocket
    async def _start_websocket(self, broker: Broker) -> None:
        from websockets.asyncio.server import serve
        from websockets.http11 import Response
        from websockets.typing import Subprotocol

        ws_config = self.config.listeners.websocket
        path = ws_config.path

        def check_request(connection: Any, request: Any) -> Response | None:
            if request.path.split("?", 1)[0] != path:
                return connection.respond(404, f"no WebSocket endpoint at {request.path}; use {path}\n")
            return None

        async def handler(ws: Any) -> None:
            if ws.subprotocol != "mqtt":
                await ws.close(1002, 'the WebSocket subprotocol "mqtt" is required')
                return
            conn = MQTTConnection(broker, "websocket")
            transport = WebSocketTransport(ws)
            conn.connection_made(transport)
            writer = asyncio.create_task(transport.writer())
            try:
                async for frame in ws:
                    if isinstance(frame, str):
                        broker.log_event(
                            logging.WARNING,
                            "protocol_error",
                            client_id=conn.client_id,
                            peer=conn.peer,
                            reason_code=0x81,
                            statement="MQTT-6.0.0-1",
                            message="text WebSocket frame",
                        )
                        break
                    conn.data_received(frame)
                    if transport.is_closing():
                        break
            except Exception:  # connection reset etc.: handled as an abnormal close below
                pass
            finally:
                transport.close()
                conn.connection_lost(None)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer, timeout=3.0)

        self._ws_server = await serve(
            handler,
            ws_config.host,
            ws_config.port,
            subprotocols=[Subprotocol("mqtt")],
            process_request=check_request,
            max_size=broker.max_packet_size + 8,
            compression=None,
        )
        self.ports["websocket"] = next(iter(self._ws_server.sockets)).getsockname()[1]

    # ------------------------------------------------------------------ HTTP
    async def _http_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
            status, content_type, body = self._http_response(method, target)
        reason = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            405: "Method Not Allowed",
            503: "Service Unavailable",
        }[status]
        headers = [
            f"HTTP/1.1 {status} {reason}",
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

    def _http_response(self, method: str, target: str) -> tuple[int, str, bytes]:
        broker = self.broker
        if target not in ("/metrics", "/healthz", "/cluster"):
            return 404, "text/plain", b"not found: try /metrics, /healthz or /cluster\n"
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        assert broker is not None
        if target == "/healthz":
            serving = not (self.stopping or broker.shutting_down)
            payload = {
                "status": "ok" if serving else "shutting_down",
                "node_id": broker.node_id,
                "uptime_s": round(time.time() - broker.stats.uptime_started_at, 3),
                "connections": broker.connected_count,
                "sessions": len(broker.sessions),
            }
            return (200 if serving else 503), "application/json", json.dumps(payload).encode() + b"\n"
        if target == "/cluster":
            if self.cluster is None:
                return 404, "text/plain", b"this broker is not clustered (cluster.enabled is false)\n"
            return 200, "application/json", json.dumps(self.cluster.state()).encode() + b"\n"
        from broker.metrics import make_registry, render

        broker.refresh_stats()
        registry = getattr(broker, "_registry", None)
        if registry is None:
            registry = make_registry(broker.stats)
            if self.cluster is not None:
                registry.register(self.cluster.collector())
            broker._registry = registry  # type: ignore[attr-defined]
        body, content_type = render(registry)
        return 200, content_type, body

    # ------------------------------------------------------------------ stop
    async def stop(self) -> None:
        """Stop accepting, disconnect everyone (v5: 0x8B), commit and close the store."""
        if self._stop_started:
            return
        self._stop_started = True
        self.stopping = True
        for server in self._servers:
            server.close()
        if self._ws_server is not None:
            self._ws_server.close(close_connections=False)
        if self.cluster is not None:
            # clients first, so their wills still reach the other brokers; then the graceful
            # leave, while the store still takes deliveries for persistent sessions
            if self.broker is not None:
                self.broker.disconnect_all()
                await asyncio.sleep(0.05)  # let the overlay send the wills
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.cluster.stop(), timeout=5.0)
        if self.broker is not None:
            await self.broker.shutdown()
        if self._ws_server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws_server.wait_closed(), timeout=2.0)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=1.0)


async def serve_until_signal(config: Any) -> int:
    """Run a broker until SIGTERM or SIGINT; return the exit status (0)."""
    server = BrokerServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    assert server.broker is not None
    loop.add_signal_handler(signal.SIGHUP, server.broker.reload_auth)  # re-read password and ACL files
    await stop.wait()
    assert server.broker is not None
    server.broker.log_event(logging.INFO, "shutting_down")
    await server.stop()
    server.broker.log_event(logging.INFO, "stopped")
    return 0


class ThreadedBroker:
    """A broker serving from a background thread with its own event loop (tests, embedding)."""

    def __init__(self, config: Any, *, hooks: ClusterHooks | None = None) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.server = BrokerServer(config, hooks=hooks)
        self._thread = threading.Thread(target=self.loop.run_forever, name="skipmq-broker", daemon=True)
        self.ports: dict[str, int] = {}

    def start(self, timeout_s: float = 10.0) -> dict[str, int]:
        self._thread.start()
        self.ports = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout_s)
        return self.ports

    @property
    def broker(self) -> Broker:
        assert self.server.broker is not None
        return self.server.broker

    def call(self, func: Any, *args: Any, timeout_s: float = 5.0) -> Any:
        """Run ``func(*args)`` on the broker's loop thread and return its result."""

        async def _call() -> Any:
            return func(*args)

        return asyncio.run_coroutine_threadsafe(_call(), self.loop).result(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        self.loop.close()
