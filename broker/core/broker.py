"""The broker core: one MQTT broker node, composed of the parts in ``broker.core`` (no I/O).

Follows MQTT 3.1.1 (OASIS 2014) and MQTT 5.0 (OASIS 2019). :class:`Broker` wires together
who owns what -

* ``SessionRegistry`` (``sessions.py``): sessions by client id, their life cycle and moves;
* ``Subscriptions`` (``subscriptions.py``): the topic tries, one insertion path;
* ``Router`` (``routing.py``): publish -> matching subscriptions, retained, ``$share`` groups;
* ``Outbound`` (``outbound.py``): QoS 0 writes, QoS 1/2 queues and in-flight windows;
* ``Durability`` (``durability.py``): the store port and the group commit;
* ``ClientConnection`` (``client.py``): one client's packets, made by :meth:`Broker.new_client`;

- and implements :class:`broker.core.ports.BrokerApi` for its adapters (listeners, HTTP, the
cluster engine). Start-up order is explicit: construct with the cluster port, :meth:`start`
(restores the store: restored subscriptions reach the cluster's interest counters), then the
adapters start the cluster and open the listeners. Durability follows seed 001 §4.1.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from broker.core.admission import Admission
from broker.core.client import ClientConnection
from broker.core.client_base import ClientBase
from broker.core.drops import DropReporter
from broker.core.durability import Durability, decode_will, message_from
from broker.core.memory_guard import CROSSED_HIGH, STILL_HIGH, MemoryGuard
from broker.core.outbound import Outbound
from broker.core.ports import NullCluster
from broker.core.reserved import is_reserved_filter, is_reserved_topic
from broker.core.routing import Router
from broker.core.session import Message, Session, SessionSnapshot, SubOptions
from broker.core.sessions import SessionRegistry
from broker.core.stats import QUEUE_NEAR_LIMIT, BrokerStats
from broker.core.subscriptions import Subscriptions
from broker.core.sysinfo import publish_sys, sys_values
from broker.logs import log_event
from broker.mqtt.packets import MQTT_5, MQTTProtocolError, ReasonCode, Subscribe
from broker.mqtt.retained import RetainedIndex
from broker.mqtt.topics import TopicError, parse_shared, validate_topic_filter

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.core.ports import (
        AclPort,
        AuthPort,
        ClientPort,
        ClientTransport,
        ClusterPort,
        Scheduler,
        StorePort,
    )

log = logging.getLogger("skipmq.broker")

SWEEP_INTERVAL_S = 0.5


class Broker:
    """An MQTT broker node (see the module docstring). All calls on the scheduler's thread."""

    def __init__(
        self,
        config: BrokerConfig,
        scheduler: Scheduler,
        *,
        authenticator: AuthPort,
        acl: AclPort | None = None,
        store: StorePort | None = None,
        cluster: ClusterPort | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.limits = config.limits
        self.scheduler = scheduler
        self.node_id: str = config.node_id or "skipmq"
        self.authenticator = authenticator
        self.cluster: ClusterPort = cluster if cluster is not None else NullCluster()
        self._rng = rng if rng is not None else random.Random()
        self.stats = BrokerStats()
        self.max_packet_size: int = self.limits.max_packet_size_bytes
        tls = config.listeners.tls
        self.tls_identity_as_username: bool = bool(tls.enabled and tls.use_identity_as_username)
        self.connect_timeout_s: float = float(self.limits.connect_timeout_s)
        self.connections: dict[ClientConnection, None] = {}  # insertion order: deterministic
        self.admission = Admission(
            max_per_ip=self.limits.max_connections_per_ip, rate_per_ip=self.limits.connect_rate_per_ip
        )
        self.memory = MemoryGuard(
            self.limits.memory_high_water_bytes,
            self.limits.memory_low_water_bytes,
            log_interval_s=float(config.logging.dropped_messages_interval_s),
        )
        self._paused_producers: dict[ClientBase, None] = {}  # not read from until recovery
        self._client_counter = 0
        self._sweep_handle: Any = None
        self._sys_handle: Any = None
        self._started = False
        # the parts, each owning its state (see the module docstring)
        sessions: dict[str, Session] = {}
        self.retained: RetainedIndex[Message] = RetainedIndex()
        self.durability = Durability(
            store,
            scheduler,
            sessions=sessions,
            retained=self.retained,
            log_event=self.log_event,
            store_errors=self.stats.store_errors,
        )
        self.subscriptions = Subscriptions(self.cluster)
        self.drops = DropReporter(
            self.stats,
            scheduler,
            self.log_event,
            interval_s=config.logging.dropped_messages_interval_s,
            queue_limit=self.limits.max_queued_messages,
        )
        self.outbound = Outbound(self.limits, self.durability, self.stats, scheduler, self.drops)
        self.router = Router(
            node_id=self.node_id,
            sessions=sessions,
            subscriptions=self.subscriptions,
            retained=self.retained,
            outbound=self.outbound,
            durability=self.durability,
            cluster=self.cluster,
            acl=acl,
            stats=self.stats,
            scheduler=scheduler,
        )
        self.registry = SessionRegistry(
            sessions=sessions,
            limits=self.limits,
            durability=self.durability,
            subscriptions=self.subscriptions,
            outbound=self.outbound,
            router=self.router,
            cluster=self.cluster,
            scheduler=scheduler,
            stats=self.stats,
            log_event=self.log_event,
            connect_timeout_s=self.connect_timeout_s,
        )
        self.sessions = sessions
        # told of every retained $skipmq/ message another broker's update set here (the dynamic
        # users and ACL, broker.adapters.admin.dynamic); None: nobody listens
        self.reserved_observer: Callable[[Message], None] | None = None

    # ================================================================== lifecycle
    def start(self) -> None:
        """Restore persisted state; start the keep-alive sweep and the $SYS timer."""
        if self._started:
            raise RuntimeError("Broker.start() called twice")
        self._started = True
        self.stats.uptime_started_at = self.scheduler.wall_time()
        store = self.durability.store
        if store is not None:
            for record in store.load_retained():
                message = message_from(record)
                self.retained.set(message.topic, message)
            for client_id, data in self.registry.restore(store):  # wills of sessions already ended
                self.router.publish_will(Session(client_id, MQTT_5, None), decode_will(data))
                store.set_will(client_id, None, None)
            self.after_batch()
        self._sweep_handle = self.scheduler.call_later(SWEEP_INTERVAL_S, self._sweep)
        if self.config.sys.interval_s > 0:
            self._sys_handle = self.scheduler.call_later(0, self._publish_sys)

    @property
    def shutting_down(self) -> bool:
        return self.registry.shutting_down

    def disconnect_all(self) -> None:
        """First step of a graceful stop: refuse new CONNECTs, disconnect every client (v5 0x8B),
        publishing their wills (a cluster forwards them before it leaves).

        A server-initiated close is not a client DISCONNECT, so wills are published (MQTT-3.1.2-8,
        v5 §3.1.2.5); wills with a delay on a continuing session are persisted and fire later.
        """
        self.registry.shutting_down = True
        for conn in list(self.connections):
            conn.disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down", fire_will=True)

    def close(self) -> None:
        """Last step of a graceful stop (after ``disconnect_all`` and the transports flushed):
        stop the timers, commit and close the store."""
        for handle in (self._sweep_handle, self._sys_handle):
            if handle is not None:
                handle.cancel()
        self.registry.cancel_timers()
        self.drops.close()
        self.durability.close()

    def set_acl(self, acl: AclPort | None) -> None:
        """Replace the ACL (SIGHUP re-reads the file; the adapter loads it)."""
        self.router.acl = acl

    @property
    def acl(self) -> AclPort | None:
        return self.router.acl

    @property
    def store(self) -> StorePort | None:
        return self.durability.store

    def log_event(self, level: int, event: str, **fields: Any) -> None:
        log_event(log, level, event, **fields)

    # ================================================================== connections
    def new_client(
        self,
        transport: ClientTransport,
        listener: str = "tcp",
        *,
        peer: str | None = "",
        cert_username: str | None = None,
    ) -> ClientConnection | None:
        """A handler for a new client socket; None (and the transport closed) when too many sockets
        are still waiting for their CONNECT: limits.max_connections lets as many again wait."""
        limit = self.limits.max_connections
        if limit and len(self.connections) - self.registry.connected_count >= limit:
            transport.close()
            return None  # no log line per socket: this is what a connection flood looks like
        conn = ClientConnection(self, transport, listener, peer=peer, cert_username=cert_username)
        self.connections[conn] = None
        admission = self.admission
        if admission.enabled:
            conn.refusal = admission.opened(conn.address, self.scheduler.time())
        return conn

    def connection_gone(self, conn: ClientBase) -> None:
        self._paused_producers.pop(conn, None)
        if conn in self.connections:
            del self.connections[conn]
            self.admission.closed(conn.address)

    @property
    def connected_count(self) -> int:
        return self.registry.connected_count

    def at_connection_limit(self, client_id: str | None = None) -> bool:
        """True when a new connection must be refused; a takeover of a connected client id replaces
        a connection instead of adding one, so it is always allowed (MQTT-3.1.4-3)."""
        limit = self.limits.max_connections
        if not limit or self.registry.connected_count < limit:
            return False
        session = self.sessions.get(client_id) if client_id else None
        return session is None or session.connection is None

    # ================================================================== memory high-water mark
    def memory_observed(self, used_bytes: int) -> None:
        """The adapter measured the process's RSS (limits.memory_high_water_bytes)."""
        memory = self.memory
        transition = memory.observe(used_bytes, self.scheduler.time())
        if transition is None:
            return
        fields = {"rss_bytes": used_bytes, "high_water_bytes": memory.high_bytes}
        if transition == CROSSED_HIGH:
            self.log_event(logging.WARNING, "memory_high_water", **fields)
        elif transition == STILL_HIGH:
            self.log_event(logging.WARNING, "memory_high_water", **fields, **memory.take_counts())
        else:
            counts = memory.take_counts()
            self.log_event(
                logging.INFO, "memory_recovered", rss_bytes=used_bytes,
                low_water_bytes=memory.low_bytes, resumed_producers=len(self._paused_producers), **counts,
            )  # fmt: skip
            paused, self._paused_producers = self._paused_producers, {}
            for conn in paused:
                resume = getattr(conn.transport, "resume_reading", None)
                if resume is not None and not conn.transport.is_closing():
                    resume()

    def pause_producer(self, conn: ClientBase) -> None:
        """Under memory pressure: read nothing more from ``conn`` (a transport that cannot pause,
        such as a WebSocket, keeps being read; its QoS 0 messages are still dropped)."""
        if conn in self._paused_producers:
            return
        pause = getattr(conn.transport, "pause_reading", None)
        if pause is not None:
            pause()
            self._paused_producers[conn] = None
            self.memory.paused_producers += 1

    def authenticate(self, username: str | None, password: bytes | None, *, tls_identity: bool) -> int:
        if tls_identity:
            return ReasonCode.SUCCESS
        return int(self.authenticator.authenticate(username, password))

    def authentication_is_slow(self, username: str | None, *, tls_identity: bool) -> bool:
        """A password check hashes with scrypt (~40 ms): the connection runs it off the loop."""
        return not tls_identity and self.authenticator.needs_password_check(username)

    def assign_client_id(self) -> str:
        self._client_counter += 1
        return f"skipmq-{self._rng.getrandbits(48):012x}-{self._client_counter}"

    def connection_closed(self, conn: ClientPort, session: Session, *, fire_will: bool) -> None:
        self.registry.detach(conn, session, fire_will=fire_will)
        self.after_batch()

    # ================================================================== subscriptions
    def subscribe(
        self, session: Session, packet: Subscribe
    ) -> tuple[list[int], list[tuple[SubOptions, Message]]]:
        """Apply a SUBSCRIBE; returns the SUBACK codes and the retained messages to send after it."""
        is_v5 = session.protocol_level == MQTT_5
        sub_id = packet.properties.get("subscription_identifier")
        codes: list[int] = []
        retained: list[tuple[SubOptions, Message]] = []
        client_id = session.client_id
        acl = self.router.acl
        for sub in packet.subscriptions:
            full_filter = sub.topic_filter
            try:
                group, match_filter = parse_shared(full_filter)
                validate_topic_filter(match_filter)
            except TopicError:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if is_v5 else 0x80)
                continue
            if group is not None and sub.no_local and is_v5:
                raise MQTTProtocolError(
                    "no local set on a shared subscription", ReasonCode.PROTOCOL_ERROR, "MQTT-3.8.3-4"
                )
            if (
                acl is not None and not acl.can_subscribe(client_id, session.username, match_filter)
            ) or is_reserved_filter(match_filter):  # the brokers' own $skipmq/ topics
                codes.append(ReasonCode.NOT_AUTHORIZED if is_v5 else 0x80)
                continue
            granted = min(sub.qos, self.limits.maximum_qos)
            opts = SubOptions(
                full_filter,
                granted,
                sub.no_local,
                sub.retain_as_published,
                sub.retain_handling,
                sub_id,
                group,
                match_filter,
            )
            existed = self.subscriptions.add(session, opts)
            self.durability.add_subscription(session, opts)
            if group is None and (sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed)):
                for _topic, message in self.retained.match(match_filter):
                    retained.append((opts, message))
            codes.append(granted)
        return codes, retained

    def unsubscribe(self, session: Session, topic_filters: list[str]) -> list[int]:
        codes: list[int] = []
        for full_filter in topic_filters:
            if self.subscriptions.remove(session, full_filter) is None:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
                continue
            self.durability.remove_subscription(session, full_filter)
            codes.append(ReasonCode.SUCCESS)
        return codes

    # ================================================================== BrokerApi: cluster engine
    def deliver_remote(
        self,
        message: Message,
        accept_filter: Callable[[str], bool] | None = None,
        only_client: str | None = None,
        except_clients: Collection[str] = (),
        memo: dict[str, list[Any]] | None = None,
    ) -> bool:
        return self.router.deliver_remote(message, accept_filter, only_client, except_clients, memo)

    def queue_depth(self, client_id: str) -> tuple[int, int] | None:
        """(QoS>0 messages queued for ``client_id`` beyond its in-flight window, the queue limit);
        None without a session. The cluster paces a catch-up by it (docs/cluster.md "Flow control")."""
        session = self.sessions.get(client_id)
        if session is None:
            return None
        return len(session.queue), self.limits.max_queued_messages

    def allow_backlog(self, client_id: str, count: int) -> None:
        session = self.sessions.get(client_id)
        if session is not None and count > 0:
            self.outbound.allow_merged(session, count)

    def count_backlog_apart(self, client_id: str, backlog: int, held: bool) -> None:
        session = self.sessions.get(client_id)
        if session is not None:
            self.outbound.allow_backlog(session, backlog, held=held)

    def backlog_in(self, client_id: str) -> None:
        session = self.sessions.get(client_id)
        if session is not None:
            self.outbound.release_backlog(session)

    def set_retained(self, message: Message) -> None:
        self.router.retain(message)
        if self.reserved_observer is not None and is_reserved_topic(message.topic):
            self.reserved_observer(message)

    def retained_messages(self) -> Iterable[Message]:
        retained = self.retained
        for topic in list(retained.topics()):
            message = retained.get(topic)
            if message is not None:
                yield message

    def has_retained(self, topic: str) -> bool:
        return self.retained.get(topic) is not None

    def has_session(self, client_id: str) -> bool:
        return client_id in self.sessions

    def owned_by_other(self, client_id: str, username: str | None) -> bool:
        """Sessions are bound to their owner (docs/security.md): a client id whose session here
        (connected or stored) was made by another user is not resumed, taken over or ended by
        this user's CONNECT; the CONNECT is refused with 0x87 Not authorized."""
        session = self.sessions.get(client_id)
        return session is not None and not session.ended and session.username != username

    def client_connected(self, client_id: str) -> bool:
        session = self.sessions.get(client_id)
        return session is not None and session.connection is not None

    def hand_over(self, client_id: str, *, transfer: bool) -> tuple[bool, SessionSnapshot | None]:
        result = self.registry.hand_over(client_id, transfer=transfer)
        self.after_batch()
        return result

    def export_session(self, client_id: str) -> SessionSnapshot | None:
        return self.registry.export(client_id)

    def import_session(self, snapshot: SessionSnapshot) -> None:
        self.registry.import_(snapshot)
        self.after_batch()

    def receive_late_session(self, snapshot: SessionSnapshot, *, adopted: bool = False) -> None:
        """A session arrived after the client's CONNECT stopped waiting: queue its messages into the
        client's current session (or keep it as a stored one) so nothing acknowledged is lost.

        ``adopted``: a replica holder adopts the copy of a gone broker's session; kept as a stored
        one, its will is published after its delay unless the client reconnects first (a client
        that has a session here already reconnected: no will)."""
        session = self.sessions.get(snapshot.client_id)
        if session is None:
            self.registry.import_(snapshot, adopted=adopted)
        else:
            if session.present_at_connect:
                # its CONNACK said "session present" (a session left here by an earlier CONNECT,
                # while this one was out of reach): the client relies on the subscriptions it
                # made, which this session brings; the ones the session here lacks are added
                for opts in snapshot.subscriptions:
                    if opts.topic_filter not in session.subscriptions:
                        self.subscriptions.add(session, opts)
                        self.durability.add_subscription(session, opts)
            self.registry.adopt_entries(session, snapshot.pending)
        self.after_batch()

    def kick(self, client_id: str, reason_code: int = ReasonCode.ADMINISTRATIVE_ACTION) -> bool:
        return self.registry.kick(client_id, reason_code)

    def store_pending(self) -> bool:
        return self.durability.pending()

    def commit_now(self) -> bool:
        return self.durability.commit_now()

    def after_batch(self) -> None:
        self.durability.after_batch()

    # ================================================================== timers: keep alive, $SYS
    def _sweep(self) -> None:
        """Shared timer: CONNECT timeout and keep alive of every connection."""
        self._sweep_handle = self.scheduler.call_later(SWEEP_INTERVAL_S, self._sweep)
        now = self.scheduler.time()
        timeout_s = self.connect_timeout_s
        for conn in list(self.connections):
            conn.check_timeouts(now, timeout_s)
        self.after_batch()

    def refresh_stats(self) -> None:
        """Recompute the gauges that are not maintained on the hot path (called at scrape time)."""
        stats = self.stats
        sessions = self.sessions.values()
        stats.sessions = len(self.sessions)
        stats.subscriptions = len(self.subscriptions)
        stats.retained_messages = len(self.retained)
        depths = [len(s.queue) for s in sessions]
        stats.queued_messages = sum(depths)
        limit = stats.queue_limit = self.limits.max_queued_messages
        stats.queue_depth_max = max(depths, default=0)
        near = limit * QUEUE_NEAR_LIMIT
        stats.sessions_queue_near_limit = sum(1 for depth in depths if depth >= near) if limit > 0 else 0
        stats.inflight_messages = sum(len(s.inflight) for s in sessions)
        stats.connections_current = self.registry.connected_count
        stats.packets_sent["PUBLISH"] = sum(stats.messages_sent)

    def _publish_sys(self) -> None:
        self._sys_handle = self.scheduler.call_later(self.config.sys.interval_s, self._publish_sys)
        self.refresh_stats()
        uptime_s = self.scheduler.wall_time() - self.stats.uptime_started_at
        values = sys_values(self.stats, connected=self.registry.connected_count, uptime_s=uptime_s)
        publish_sys(self.router, values, self.node_id)
