"""A broker process: the core on an asyncio loop, its listeners, store, cluster runtime and stop.

``BrokerServer.start()`` builds everything in one explicit order - scheduler, cluster runtime
(its engine is the core's cluster port), store, core (``Broker.start`` restores the store, so
restored subscriptions reach the cluster's interest counters), the cluster (in the overlay before
the first client can connect), then the listeners - and logs one ``event="listening"`` line
(port 0 gives an ephemeral port; ``ports`` has the real ones). ``serve_until_signal(config)`` runs
until SIGTERM/SIGINT, then (``cluster.replicas`` > 1) drains for at most
``cluster.drain_on_stop_s`` (broker/adapters/replication_drain.py), stops accepting, disconnects
clients (v5: DISCONNECT 0x8B), leaves the cluster, commits the store and returns 0; SIGHUP
re-reads the password and ACL files.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import ssl
import threading
from typing import TYPE_CHECKING, Any

from broker.adapters.admin.dynamic import DynamicAuth
from broker.adapters.heap import freeze_startup_heap
from broker.adapters.http import HttpEndpoint
from broker.adapters.listeners import MqttProtocol, serve_websocket
from broker.adapters.scheduler import AsyncioScheduler
from broker.auth.acl import Acl
from broker.auth.from_config import build_access
from broker.core.broker import Broker

if TYPE_CHECKING:
    from broker.adapters.admin.api import AdminApi
    from broker.adapters.cluster_runtime import ClusterRuntime
    from broker.adapters.federation.node import FederationNode
    from broker.adapters.http_pull import PullHttpApi
    from broker.adapters.memory import MemoryWatch
    from broker.adapters.replication_drain import Drain
    from broker.adapters.sqlite_store import Store
    from broker.config import BrokerConfig, HttpConfig, TlsListenerConfig
    from broker.core.ports import ClusterPort

log = logging.getLogger("skipmq.server")

# how long a commit of only delivered-and-acknowledged records (a subscriber's PUBACK) waits for
# the next publish's commit to carry it (broker.core.durability; docs/broker.md, group commit)
LAZY_COMMIT_S = 0.005


class StartupError(Exception):
    """The broker cannot start (a port in use, an unusable data directory, a bad certificate):
    one line that names what and where, for ``skipmq`` to print without a traceback."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)  # "PEM lib", "KEY_VALUES_MISMATCH", ...
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno).lower()  # "address already in use", "not a directory", ...
    return str(exc) or type(exc).__name__


async def _listen(what: str, host: str, port: int, open_listener: Any) -> Any:
    try:
        return await open_listener()
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port} ({what}): {_reason(exc)}") from exc


def open_store(config: BrokerConfig) -> Store | None:
    """The SQLite store of ``config`` (None when persistence is off)."""
    if not config.store.persistence:
        return None
    import sqlite3

    from broker.adapters.sqlite_store import Store

    path = config.store.path
    try:
        if not path:
            os.makedirs(config.data_dir, exist_ok=True)
            path = os.path.join(config.data_dir, "skipmq.db")
        elif path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return Store(path, synchronous=config.store.synchronous, checkpoint=config.store.checkpoint)
    except (OSError, sqlite3.Error) as exc:
        where = f"data directory {config.data_dir!r}" if not config.store.path else f"store.path {path!r}"
        raise StartupError(f"cannot open the store in {where}: {_reason(exc)}") from exc


def make_tls_context(tls: TlsListenerConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.certfile, tls.keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(
            f"listeners.tls: cannot load certfile {tls.certfile!r} / keyfile {tls.keyfile!r}: {_reason(exc)}"
        ) from exc
    if tls.cafile:
        try:
            context.load_verify_locations(cafile=tls.cafile)
        except (OSError, ssl.SSLError) as exc:
            raise StartupError(f"listeners.tls: cannot load cafile {tls.cafile!r}: {_reason(exc)}") from exc
        context.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def make_http_tls_context(http: HttpConfig) -> ssl.SSLContext:
    """HTTPS for the HTTP listener, configured like the MQTT TLS listener (``http.certfile``...)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(http.certfile, http.keyfile)
        if http.cafile:
            context.load_verify_locations(cafile=http.cafile)
            context.verify_mode = ssl.CERT_OPTIONAL
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(
            f"http: cannot load certfile {http.certfile!r} / keyfile {http.keyfile!r} / cafile "
            f"{http.cafile!r}: {_reason(exc)}"
        ) from exc
    return context


class BrokerServer:
    """A broker with its listeners; create and use inside a running event loop.

    ``cluster`` replaces the cluster port (tests that stand in for "the cluster has not answered
    yet"); otherwise a clustered config gets the real cluster runtime.
    """

    def __init__(self, config: BrokerConfig, *, cluster: ClusterPort | None = None) -> None:
        if not config.node_id:
            config = dataclasses.replace(config, node_id=socket.gethostname() or "skipmq")
        self.config = config
        self._cluster_port = cluster
        self.broker: Broker | None = None
        self.memory_watch: MemoryWatch | None = None
        self.runtime: ClusterRuntime | None = None
        self.federation: FederationNode | None = None
        self.ports: dict[str, int] = {}
        self._servers: list[Any] = []
        self._ws_server: Any = None
        self.stopping = False  # /healthz answers 503 from now on
        self._stop_started = False
        self.listening = False  # every listener bound (readiness)
        self.pull_api: PullHttpApi | None = None
        self.dynamic_auth: DynamicAuth | None = None  # users and ACL set through the admin API
        self.admin_api: AdminApi | None = None
        self.drain: Drain | None = None  # a clustered broker's drain (broker/adapters/replication_drain.py)

    async def start(self) -> dict[str, int]:
        config = self.config
        loop = asyncio.get_running_loop()
        scheduler = AsyncioScheduler(loop)
        cluster = self._cluster_port
        if cluster is None and config.cluster.enabled:
            from broker.adapters.cluster_runtime import ClusterRuntime

            self.runtime = ClusterRuntime(config, scheduler)
            if config.http.enabled:  # an ephemeral port (0) is announced once bound, below
                self.runtime.announce_http_port(config.http.port)
            cluster = self.runtime.port  # the engine (with its replication log: cluster.replicas)
        if config.federation.enabled:  # the core's events go to the cluster and to the federation
            from broker.adapters.federation.node import FederationNode
            from broker.adapters.federation.port import FederatedClusterPort
            from broker.core.ports import NullCluster

            self.federation = FederationNode(config.federation, identity_mode=config.cluster.origin_proofs)
            cluster = FederatedClusterPort(cluster or NullCluster(), self.federation)
        authenticator, acl = build_access(config.auth)
        store = open_store(config)
        broker = Broker(config, scheduler, authenticator=authenticator, acl=acl, store=store, cluster=cluster)
        self.broker = broker
        if store is not None:
            store.commit_seconds = broker.stats.store_commit_seconds
            store.count_checkpoints(broker.stats.store_checkpoints, broker.stats.store_checkpoint_seconds)
            if cluster is None:
                # the group COMMIT on the store's commit thread, acks released on the loop when it
                # returned; a cluster's or federation's own tables join the store's transactions
                # on the loop (``Store.db``), so those brokers keep committing on the loop
                store.post = loop.call_soon_threadsafe
                # a commit of only delivered-and-acknowledged records waits for company
                # (broker.core.durability): a cluster's tables are written outside the core
                broker.durability.lazy_commit_s = LAZY_COMMIT_S
        if self.federation is not None:
            self.federation.broker = broker
            self.federation.store = store  # durable custody (None: persistence off, custody in memory)
        broker.start()
        # the admin API's users and ACL: read from the retained store, then kept up to date
        # with the cluster's updates (before the cluster starts: its retained copy applies too)
        dynamic_auth = self.dynamic_auth = DynamicAuth(broker, acl)
        dynamic_auth.start()
        limits = config.limits
        if limits.memory_high_water_bytes:
            from broker.adapters.memory import MemoryWatch, rss_bytes

            if rss_bytes() is None:
                raise StartupError(
                    "limits.memory_high_water_bytes: the resident memory of this process cannot be "
                    "read (/proc/self/statm); set it to 0 on this system"
                )
            self.memory_watch = MemoryWatch(
                broker, limits.memory_check_interval_ms / 1000.0, trim_heap=limits.memory_trim_heap
            )
            self.memory_watch.start()
        started = self.runtime
        if started is not None:  # in the overlay before the first client can connect
            cluster_config = config.cluster
            self.ports["cluster"] = await _listen(
                "cluster", cluster_config.host, cluster_config.port, lambda: started.start(broker, store)
            )
        federation = self.federation
        if federation is not None:  # linked (or retrying) before the first client can connect
            fed_config = config.federation
            self.ports["federation"] = await _listen(
                "federation", fed_config.host, fed_config.port, federation.start
            )
        listeners = config.listeners
        if listeners.tcp.enabled:
            tcp = listeners.tcp
            server = await _listen(
                "MQTT",
                tcp.host,
                tcp.port,
                lambda: loop.create_server(
                    lambda: MqttProtocol(broker, "tcp"), tcp.host, tcp.port, backlog=4096
                ),
            )
            self._servers.append(server)
            self.ports["tcp"] = server.sockets[0].getsockname()[1]
        if listeners.tls.enabled:
            tls = listeners.tls
            context = make_tls_context(tls)
            server = await _listen(
                "MQTT/TLS",
                tls.host,
                tls.port,
                lambda: loop.create_server(
                    lambda: MqttProtocol(broker, "tls"), tls.host, tls.port, ssl=context, backlog=1024
                ),
            )
            self._servers.append(server)
            self.ports["tls"] = server.sockets[0].getsockname()[1]
        if listeners.websocket.enabled:
            ws = listeners.websocket
            self._ws_server = await _listen(
                "WebSocket", ws.host, ws.port, lambda: serve_websocket(broker, ws)
            )
            self.ports["websocket"] = next(iter(self._ws_server.sockets)).getsockname()[1]
        self.listening = True
        if config.http.enabled:
            runtime = self.runtime
            endpoint = HttpEndpoint(
                broker,
                stopping=lambda: self.stopping,
                cluster_state=runtime.state if runtime is not None else None,
                cluster_collector=runtime.collector() if runtime is not None else None,
                not_ready=self.not_ready,
                federation_state=federation.state if federation is not None else None,
                federation_collector=federation.collector() if federation is not None else None,
            )
            http = config.http
            http_tls = make_http_tls_context(http) if http.certfile else None
            extenders: list[Any] = []
            if config.pull.enabled:
                from broker.adapters.http_pull import PullHttpApi

                self.pull_api = PullHttpApi(broker, config)
                extenders.append(self.pull_api.routes)
            else:  # /v1/* answers a problem document saying the gateway is off
                from broker.adapters.http_pull import gateway_off

                extenders.append(gateway_off)
            if runtime is not None:  # POST /drain for loopback clients (cluster.replicas > 1)
                from broker.adapters.replication_drain import Drain

                self.drain = Drain(self)
                extenders.append(self.drain.routes)
            if config.admin.enabled:
                from broker.adapters.admin.access import AdminUsersError
                from broker.adapters.admin.api import AdminApi

                try:
                    self.admin_api = AdminApi(self, dynamic_auth)
                except AdminUsersError as exc:
                    raise StartupError(f"admin.users_file: {exc}") from exc
                extenders.append(self.admin_api.routes)

            def extend(app: Any) -> None:
                for add_routes in extenders:
                    add_routes(app)

            http_server = await _listen(
                "HTTP",
                http.host,
                http.port,
                lambda: endpoint.start(
                    http.host,
                    http.port,
                    ssl_context=http_tls,
                    extend=extend,
                    header_timeout_s=http.header_timeout_s,
                ),
            )
            self._servers.append(http_server)
            self.ports["http"] = http_server.port
            if runtime is not None:
                runtime.announce_http_port(http_server.port)
            if self.admin_api is not None:
                self.admin_api.started(http_server.port)
        broker.log_event(logging.INFO, "listening", node_id=broker.node_id, **self.ports)
        return self.ports

    def not_ready(self) -> str | None:
        """Why the broker should not get clients yet (/readyz), or None: listening and, when
        clustered, joined to the cluster (found or founded; overlay.formation)."""
        if not self.listening:
            return "starting"
        if self.runtime is not None and not self.runtime.engine.joined():
            return "joining_cluster"
        return None

    def reload_auth(self) -> bool:
        """Re-read the password file and the ACL file (SIGHUP); on an error keep the old ones."""
        broker = self.broker
        assert broker is not None
        auth = self.config.auth
        try:
            acl = Acl.load(auth.acl_file) if auth.acl_file else None
            broker.authenticator.reload()
        except Exception as exc:
            broker.log_event(logging.ERROR, "auth_reload_failed", message=str(exc))
            return False
        if self.dynamic_auth is not None:  # composed with the admin API's sections
            self.dynamic_auth.set_base_acl(acl)
        else:
            broker.set_acl(acl)
        broker.log_event(logging.INFO, "auth_reloaded")
        return True

    async def stop(self) -> None:
        """Stop accepting, disconnect everyone (v5: 0x8B), leave the cluster, close the store."""
        if self._stop_started:
            return
        self._stop_started = True
        self.stopping = True
        for server in self._servers:
            server.close()
        if self._ws_server is not None:
            self._ws_server.close(close_connections=False)
        if self.admin_api is not None:  # out of the admin directory while the cluster still listens
            with contextlib.suppress(Exception):
                self.admin_api.withdraw()
        broker = self.broker
        if broker is not None:
            # clients first, so their wills still reach the other brokers; then the graceful
            # leave, while the store still takes deliveries for persistent sessions
            broker.disconnect_all()
            await asyncio.sleep(0.05)  # let the transports flush the DISCONNECTs (and the overlay the wills)
        if self.federation is not None:  # leave the event place: children re-link to our parent
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.federation.stop(), timeout=5.0)
        if self.memory_watch is not None:
            await self.memory_watch.stop()
        if self.runtime is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.runtime.stop(), timeout=5.0)
        if broker is not None:
            broker.close()
        if self._ws_server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws_server.wait_closed(), timeout=2.0)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=1.0)
        if self.admin_api is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.admin_api.close(), timeout=1.0)


async def serve_until_signal(config: BrokerConfig) -> int:
    """Run a broker until SIGTERM or SIGINT; return the exit status (0)."""
    server = BrokerServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # before start: a SIGTERM right after the "listening" line is a graceful stop, not a kill
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, server.reload_auth)  # re-read password and ACL files
    try:
        await server.start()
    except BaseException:
        with contextlib.suppress(Exception):  # close what did start (store, cluster port, listeners)
            await server.stop()
        raise
    freeze_startup_heap()  # full collections skip the start-up objects (broker/adapters/heap.py)
    await stop.wait()
    broker = server.broker
    assert broker is not None
    broker.log_event(logging.INFO, "shutting_down")
    if server.drain is not None:  # cluster.replicas > 1: hand sessions and log over first
        from broker.adapters.replication_drain import drain_on_stop

        stop.clear()  # a second SIGTERM/SIGINT cuts the drain short
        await drain_on_stop(server, stop)
    await server.stop()
    broker.log_event(logging.INFO, "stopped")
    return 0


class ThreadedBroker:
    """A broker serving from a background thread with its own event loop (tests, embedding)."""

    def __init__(self, config: BrokerConfig, *, cluster: ClusterPort | None = None) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.server = BrokerServer(config, cluster=cluster)
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
