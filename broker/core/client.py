"""One client connection inside the core: its packets applied to the broker (MQTT 3.1.1 / 5.0 §3, §4).

:class:`ClientConnection` is driven by an adapter (TCP/TLS/WebSocket in ``broker.adapters``,
simulated sockets in ``simulation``) through :meth:`receive` and :meth:`lost`, and writes to the
adapter's :class:`~broker.core.ports.ClientTransport`. It implements the
:class:`~broker.core.ports.ClientPort` the rest of the core uses. Per-connection protocol state
(decoder, keep alive, topic aliases, packet size limits, ack order) is the pure
``broker.mqtt.protocol.ServerProtocol`` / ``AckOrder``; this class adds what needs the broker:
CONNECT (authentication off the core's thread, the cluster's session claim, attach), PUBLISH
(ACL, routing, acknowledgements held for the cluster and for the group commit), SUBSCRIBE,
UNSUBSCRIBE, the outgoing QoS flows and DISCONNECT.

There are no per-connection timers: keep alive and the CONNECT timeout are checked by the
broker's shared sweep (:meth:`check_timeouts`). Acknowledgements that depend on the store
(PUBACK/PUBREC of messages that went into a persistent queue) are held in ``deferred`` until the
group commit has run (``Durability.flush_commit``).

Size: one handler per MQTT control packet of the server side (CONNECT with authentication and
the cluster claim, PUBLISH, the four QoS acks, SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT,
AUTH), and :class:`BrokerForClients`, the protocol of what a connection uses of its broker (so
that this module names no module above it: ``broker.core`` is a tree); the per-connection protocol
state itself is the pure broker.mqtt.protocol.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Any, Protocol

from broker.core.admission import Refusal, TokenBucket, address_of
from broker.core.drops import MEMORY_HIGH_WATER
from broker.core.ports import Completion
from broker.core.reserved import is_reserved_topic
from broker.core.session import STATE_PUBREL_SENT, Message, Session, SessionSnapshot, SubOptions
from broker.mqtt import codec
from broker.mqtt.packets import (
    MQTT_5,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MQTTProtocolError,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from broker.mqtt.protocol import (
    STATE_CLOSED,
    STATE_CONNECTED,
    STATE_CONNECTING,
    TIMEOUT_CONNECT,
    AckOrder,
    ServerProtocol,
)

if TYPE_CHECKING:
    from broker.config import LimitsConfig
    from broker.core.durability import Durability
    from broker.core.memory_guard import MemoryGuard
    from broker.core.outbound import Outbound
    from broker.core.ports import AclPort, ClientPort, ClientTransport, ClusterPort, Scheduler
    from broker.core.routing import Router
    from broker.core.sessions import SessionRegistry
    from broker.core.stats import BrokerStats

log = logging.getLogger("skipmq.connection")

PINGRESP_BYTES = b"\xd0\x00"


_pack_ack4 = struct.Struct(">BBH").pack


def _ack4(first_byte: int, packet_id: int) -> bytes:
    return _pack_ack4(first_byte, 2, packet_id)


class BrokerForClients(Protocol):
    """What a :class:`ClientConnection` uses of its broker (``broker.core.broker.Broker``).

    A protocol next to its user rather than the ``Broker`` class, so that this module does not
    name ``broker.core.broker`` (which imports it): the import graph of ``broker.core``, type
    references included, has no cycle (tests/architecture/test_layout.py).
    """

    @property
    def node_id(self) -> str: ...

    @property
    def limits(self) -> LimitsConfig: ...

    @property
    def max_packet_size(self) -> int: ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def cluster(self) -> ClusterPort: ...

    @property
    def acl(self) -> AclPort | None: ...

    @property
    def stats(self) -> BrokerStats: ...

    @property
    def memory(self) -> MemoryGuard: ...

    @property
    def durability(self) -> Durability: ...

    @property
    def outbound(self) -> Outbound: ...

    @property
    def registry(self) -> SessionRegistry: ...

    @property
    def router(self) -> Router: ...

    @property
    def shutting_down(self) -> bool: ...

    def log_event(self, level: int, event: str, **fields: Any) -> None: ...

    def connection_gone(self, conn: ClientConnection) -> None: ...

    def at_connection_limit(self, client_id: str | None = None) -> bool: ...

    def pause_producer(self, conn: ClientConnection) -> None: ...

    def authenticate(self, username: str | None, password: bytes | None, *, tls_identity: bool) -> int: ...

    def authentication_is_slow(self, username: str | None, *, tls_identity: bool) -> bool: ...

    def assign_client_id(self) -> str: ...

    def connection_closed(self, conn: ClientPort, session: Session, *, fire_will: bool) -> None: ...

    def subscribe(
        self, session: Session, packet: Subscribe
    ) -> tuple[list[int], list[tuple[SubOptions, Message]]]: ...

    def unsubscribe(self, session: Session, topic_filters: list[str]) -> list[int]: ...

    def owned_by_other(self, client_id: str, username: str | None) -> bool: ...

    def import_session(self, snapshot: SessionSnapshot) -> None: ...

    def commit_now(self) -> bool: ...

    def after_batch(self) -> None: ...


class ClientConnection:
    """Server side of one MQTT connection (3.1, 3.1.1 and 5.0)."""

    __slots__ = (
        "_now",
        "acks",
        "address",
        "auth_pending",
        "broker",
        "cert_username",
        "client_id",
        "close_reason",
        "deferred",
        "fire_will",
        "listener",
        "out",
        "peer",
        "protocol",
        "publish_bucket",
        "refusal",
        "session",
        "transport",
        "username",
    )

    def __init__(
        self,
        broker: BrokerForClients,
        transport: ClientTransport,
        listener: str = "tcp",
        *,
        peer: str = "",
        cert_username: str | None = None,
    ) -> None:
        self.broker = broker
        self.transport = transport
        self.listener = listener
        self.peer = peer
        self.cert_username = cert_username
        self._now = broker.scheduler.time
        self.protocol = ServerProtocol(
            max_packet_size=broker.max_packet_size,
            topic_alias_maximum=broker.limits.topic_alias_maximum,
            now=self._now(),
            max_connect_packet_size=broker.limits.max_connect_packet_bytes,
        )
        self.address = address_of(peer)
        rate = broker.limits.max_publish_rate
        self.publish_bucket = TokenBucket(rate, 2.0 * rate, self._now()) if rate else None
        # set by the broker when this socket is over a per-IP limit: refused at its CONNECT
        self.refusal: Refusal | None = None
        self.acks = AckOrder()
        self.session: Session | None = None
        self.client_id = ""
        self.username: str | None = None
        self.close_reason = ""  # why a connected client's connection ended (client_disconnected log)
        self.fire_will = True
        self.deferred: list[bytes] | None = None
        self.out: list[bytes] | None = None
        # packets that arrived behind CONNECT while its password check or session claim runs
        self.auth_pending: list[Packet] | None = None

    @property
    def state(self) -> int:
        return self.protocol.state

    # ------------------------------------------------------------------ driven by the adapter
    def receive(self, data: bytes) -> None:
        """Bytes from the client."""
        protocol = self.protocol
        if protocol.state == STATE_CLOSED:
            return
        self.broker.stats.bytes_received += len(data)
        packets, decode_error = protocol.receive(data, self._now())
        self.dispatch(packets, decode_error)

    def lost(self) -> None:
        """The transport closed (by the peer, a network error, or after our own close)."""
        if self.protocol.state != STATE_CLOSED:
            self.close_reason = self.close_reason or "connection lost"
            self._closed(fire_will=self.fire_will)
        self.broker.connection_gone(self)

    def dispatch(self, packets: list[Packet], decode_error: MQTTProtocolError | None) -> None:
        """Run each packet's handler in order; then report a decode error, then flush the batch."""
        broker = self.broker
        protocol = self.protocol
        failed_type: str | None = None
        received = broker.stats.packets_received
        name = ""
        try:
            for index, packet in enumerate(packets):
                if protocol.state == STATE_CLOSED:
                    break
                if self.auth_pending is not None:  # CONNECT is being authenticated: keep the rest
                    self.auth_pending.extend(packets[index:])
                    break
                name = _NAMES[type(packet)]
                received[name] = received.get(name, 0) + 1
                _HANDLERS[type(packet)](self, packet)
        except MQTTProtocolError as err:
            decode_error = err
            failed_type = name
        except Exception as exc:  # a bug must not take other clients down: drop this connection only
            self._internal_error(exc, "internal error while handling a packet")
            return
        if decode_error is not None:
            self.protocol_error(decode_error, failed_type)
        broker.after_batch()

    def check_timeouts(self, now: float, connect_timeout_s: float) -> None:
        reason = self.protocol.timed_out(now, connect_timeout_s)
        if reason is None:
            return
        if reason == TIMEOUT_CONNECT:
            self.broker.log_event(logging.INFO, reason, peer=self.peer)
            self.close(fire_will=False)
        else:
            self.broker.log_event(logging.INFO, reason, client_id=self.client_id, peer=self.peer)
            self.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive timeout", fire_will=True)

    # ------------------------------------------------------------------ output
    def write(self, data: bytes) -> None:
        """Queue output; the broker flushes every dirty connection once per loop iteration.

        Coalescing the packets of one iteration into one ``transport.write`` saves a send()
        system call per message on the fan-out path.
        """
        if self.protocol.state == STATE_CLOSED:
            return
        out = self.out
        if out is None:
            self.out = [data]
            self.broker.outbound.mark_dirty(self)
        else:
            out.append(data)
        self.broker.stats.bytes_sent += len(data)

    def flush(self) -> None:
        out = self.out
        if out is None:
            return
        self.out = None
        transport = self.transport
        if not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))

    def send_packet(self, packet: Packet) -> None:
        """Send a control packet (within the client's Maximum Packet Size, or not at all)."""
        protocol = self.protocol
        data = protocol.encode(packet)
        name = _NAMES[type(packet)]
        if not protocol.fits(data):
            self.broker.log_event(
                logging.WARNING,
                "packet_too_large_for_client",
                client_id=self.client_id,
                peer=self.peer,
                packet_type=name,
                size_bytes=len(data),
            )
            return
        sent = self.broker.stats.packets_sent
        sent[name] = sent.get(name, 0) + 1
        self.write(data)

    def send_ack(self, data: bytes) -> None:
        """Send an acknowledgement, after the pending group commit if the store has uncommitted work."""
        broker = self.broker
        sent = broker.stats.packets_sent
        name = _FIRST_BYTE_NAMES[data[0] >> 4]
        sent[name] += 1
        if self.deferred is not None:
            self.deferred.append(data)
        elif broker.durability.pending():
            self.deferred = [data]
            broker.durability.defer_until_commit(self)
        else:
            self.write(data)

    def flush_deferred(self) -> None:
        deferred = self.deferred
        self.deferred = None
        if deferred:
            self.acks.qos1_unacked = 0
            self.write(b"".join(deferred))

    def drop_deferred(self) -> None:
        self.deferred = None
        self.close()

    def disconnect(
        self, reason_code: int, reason_string: str | None = None, *, fire_will: bool = True
    ) -> None:
        """Server-initiated close: v5 DISCONNECT with the reason code, then close the connection."""
        protocol = self.protocol
        if protocol.state == STATE_CLOSED:
            return
        self.close_reason = self.close_reason or reason_string or f"reason code 0x{int(reason_code):02X}"
        if self.deferred is not None:
            # held acks may only leave after the commit that made their messages durable: commit
            # now (on failure the broker closes this connection without sending them)
            self.broker.commit_now()
            if protocol.state == STATE_CLOSED:
                return
        if protocol.protocol_level == MQTT_5 and protocol.state == STATE_CONNECTED:
            props: dict[str, Any] = {"reason_string": reason_string} if reason_string else {}
            self.send_packet(Disconnect(reason_code=reason_code, properties=props))
        self.close(fire_will=fire_will)

    def close(self, *, fire_will: bool = True) -> None:
        if self.protocol.state == STATE_CLOSED:
            return
        self.flush()
        self._closed(fire_will=fire_will, transport=self.transport)
        self.broker.connection_gone(self)  # at once: the connection limit counts live sockets

    def _closed(self, *, fire_will: bool, transport: ClientTransport | None = None) -> None:
        """Enter the closed state (closing ``transport`` then), detach from the session."""
        protocol = self.protocol
        was_connected = protocol.state == STATE_CONNECTED
        protocol.closed()
        if transport is not None:
            transport.close()
        if was_connected:
            self.broker.log_event(
                logging.INFO,
                "client_disconnected",
                client_id=self.client_id,
                username=self.username,
                peer=self.peer,
                listener=self.listener,
                reason=self.close_reason or "closed by the server",
                will=fire_will,
            )
        if was_connected and self.session is not None:
            self.broker.connection_closed(self, self.session, fire_will=fire_will)

    def protocol_error(self, err: MQTTProtocolError, packet_type: str | None = None) -> None:
        broker = self.broker
        if packet_type is None:
            packet_type = "CONNECT" if err.during_connect else _packet_type_name(err)
        broker.stats.packet_errors[packet_type] = broker.stats.packet_errors.get(packet_type, 0) + 1
        broker.log_event(
            logging.WARNING,
            "protocol_error",
            client_id=self.client_id,
            peer=self.peer,
            reason_code=err.reason_code,
            statement=err.statement,
            message=str(err),
        )
        if self.protocol.state == STATE_CONNECTING:
            data = codec.connack_for_error(err, self.protocol.decoder.protocol_level)
            if data:
                self.write(data)
            self.close()
            return
        self.disconnect(err.reason_code, str(err)[:200])

    def _internal_error(self, exc: BaseException, what: str) -> None:
        broker = self.broker
        if broker.durability.is_store_error(exc):
            broker.durability.store_failed(exc)
        log.error(what, exc_info=exc)
        broker.log_event(
            logging.ERROR, "internal_error", client_id=self.client_id, peer=self.peer, message=repr(exc)
        )
        self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal error")
        broker.after_batch()

    # ------------------------------------------------------------------ CONNECT
    def handle_connect(self, packet: Connect) -> None:
        broker = self.broker
        is_v5 = packet.protocol_level == MQTT_5
        props = packet.properties
        self.protocol.connect_received(packet.protocol_level, props)
        if self.refusal is not None:
            self.refuse(self.refusal.reason_code, self.refusal.reason, client_id=packet.client_id)
            return
        if broker.memory.above:
            broker.memory.refused_connects += 1
            self.refuse(
                ReasonCode.SERVER_BUSY,
                "memory above limits.memory_high_water_bytes",
                client_id=packet.client_id,
            )
            return
        if is_v5 and props.get("authentication_method") is not None:
            self.refuse(ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported")
            return
        client_id = packet.client_id
        assigned = False
        if not client_id:
            if not is_v5 and not packet.clean_start:
                self.refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty client id needs clean session")
                return
            client_id = broker.assign_client_id()
            assigned = True
        if len(client_id.encode()) > broker.limits.max_client_id_length:
            self.refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "client id too long")
            return
        username = packet.username
        if self.cert_username is not None:
            username = self.cert_username
        tls_identity = self.cert_username is not None
        if broker.authentication_is_slow(username, tls_identity=tls_identity):
            self.auth_pending = []
            check = broker.scheduler.run_blocking(
                lambda: broker.authenticate(username, packet.password, tls_identity=False)
            )
            check.add_done_callback(
                lambda done: self._authenticated(done, packet, client_id, assigned, username)
            )
            return
        code = broker.authenticate(username, packet.password, tls_identity=tls_identity)
        self._finish_connect(packet, client_id, assigned, username, code)

    def _authenticated(
        self, done: Completion[int], packet: Connect, client_id: str, assigned: bool, username: str | None
    ) -> None:
        """Back on the core's thread after the password check: connect, then replay the packets
        that arrived meanwhile, in order."""
        pending = self.auth_pending or []
        self.auth_pending = None
        if self.protocol.state == STATE_CLOSED:
            return
        exc = done.exception()
        if exc is not None:
            log.error("password check failed", exc_info=exc)
            self.broker.log_event(
                logging.ERROR, "internal_error", client_id=client_id, peer=self.peer, message=repr(exc)
            )
            code = int(ReasonCode.UNSPECIFIED_ERROR)
        else:
            code = done.result()
        try:
            self._finish_connect(packet, client_id, assigned, username, code)
        except Exception as err:
            self._internal_error(err, "internal error while finishing CONNECT")
            return
        self.dispatch(pending, None)

    def _finish_connect(
        self, packet: Connect, client_id: str, assigned: bool, username: str | None, code: int
    ) -> None:
        broker = self.broker
        is_v5 = packet.protocol_level == MQTT_5
        if code != ReasonCode.SUCCESS:
            self.refuse(code, "not authorized", client_id=client_id, username=username, event="auth_failed")
            return
        if broker.shutting_down:
            self.refuse(ReasonCode.SERVER_UNAVAILABLE, "server shutting down")
            return
        if broker.at_connection_limit(client_id):
            self.refuse(ReasonCode.SERVER_BUSY, "too many connections")
            return
        if broker.owned_by_other(client_id, username):
            self._refuse_not_owner(client_id, username)
            return
        will = packet.will
        if will is not None:
            if will.retain and not broker.limits.retain_available:
                self.refuse(ReasonCode.RETAIN_NOT_SUPPORTED, "retain not available")
                return
            if will.qos > broker.limits.maximum_qos:
                self.refuse(ReasonCode.QOS_NOT_SUPPORTED, "will QoS above maximum QoS")
                return
        self.client_id = client_id
        self.username = username
        keep_alive = packet.keep_alive_s
        server_keep_alive: int | None = None
        max_keepalive = broker.limits.max_keepalive_s
        if is_v5 and max_keepalive and (keep_alive == 0 or keep_alive > max_keepalive):
            keep_alive = max_keepalive
            server_keep_alive = max_keepalive
        claim = broker.cluster.before_attach(client_id, packet.clean_start, username)
        if claim is not None:  # another broker may hold this client: wait for its hand-over
            self.auth_pending = []
            claim.add_done_callback(
                lambda done: self._claimed(done, packet, client_id, assigned, keep_alive, server_keep_alive)
            )
            return
        self._attach(packet, client_id, assigned, keep_alive, server_keep_alive)

    def _claimed(
        self,
        done: Completion[SessionSnapshot | None],
        packet: Connect,
        client_id: str,
        assigned: bool,
        keep_alive: int,
        server_keep_alive: int | None,
    ) -> None:
        """The cluster answered the session claim: import a handed-over session, attach, then
        replay the packets that arrived meanwhile."""
        broker = self.broker
        refused = isinstance(done.exception(), PermissionError)
        snapshot = None if done.exception() is not None else done.result()
        if refused and self.protocol.state != STATE_CLOSED:
            self.auth_pending = None
            self._refuse_not_owner(client_id, self.username)
            return
        if self.protocol.state == STATE_CLOSED:
            self.auth_pending = None
            if snapshot is not None:
                # the other broker already ended its copy: keep the session here as a stored one
                # (its queued messages were acknowledged to their publishers)
                try:
                    broker.import_session(snapshot)
                except Exception:
                    log.exception("cannot keep a session handed over to a closed connection")
            return
        ready: Completion[bool] | None = None
        try:
            if snapshot is not None:
                broker.import_session(snapshot)
                # the CONNACK promises the moved subscriptions: once their classes are reachable
                ready = broker.cluster.subscriptions_ready(
                    [(sub.match_filter, sub.share_group) for sub in snapshot.subscriptions]
                )
        except Exception as exc:
            self.auth_pending = None
            self._internal_error(exc, "internal error while importing a handed-over session")
            return
        if ready is not None:  # packets keep collecting in auth_pending meanwhile
            ready.add_done_callback(
                lambda _done: self._attach_and_replay(
                    packet, client_id, assigned, keep_alive, server_keep_alive
                )
            )
            return
        self._attach_and_replay(packet, client_id, assigned, keep_alive, server_keep_alive)

    def _attach_and_replay(
        self, packet: Connect, client_id: str, assigned: bool, keep_alive: int, server_keep_alive: int | None
    ) -> None:
        pending = self.auth_pending or []
        self.auth_pending = None
        if self.protocol.state == STATE_CLOSED:
            return
        if self.broker.owned_by_other(client_id, self.username):  # a session handed over for another user
            self._refuse_not_owner(client_id, self.username)
            return
        try:
            self._attach(packet, client_id, assigned, keep_alive, server_keep_alive)
        except Exception as exc:
            self._internal_error(exc, "internal error while attaching a handed-over session")
            return
        self.dispatch(pending, None)

    def _attach(
        self, packet: Connect, client_id: str, assigned: bool, keep_alive: int, server_keep_alive: int | None
    ) -> None:
        broker = self.broker
        is_v5 = packet.protocol_level == MQTT_5
        props = packet.properties
        session, session_present, expiry_s, expiry_capped = broker.registry.attach(self, packet, client_id)
        self.session = session
        self.protocol.connected(keep_alive)
        connack_props: dict[str, Any] = {}
        if is_v5:
            limits = broker.limits
            connack_props["receive_maximum"] = limits.receive_maximum
            connack_props["topic_alias_maximum"] = limits.topic_alias_maximum
            connack_props["maximum_packet_size"] = broker.max_packet_size
            if not limits.retain_available:
                connack_props["retain_available"] = 0
            if limits.maximum_qos < 2:
                connack_props["maximum_qos"] = limits.maximum_qos
            if assigned:
                connack_props["assigned_client_identifier"] = client_id
            if server_keep_alive is not None:
                connack_props["server_keep_alive"] = server_keep_alive
            if expiry_capped:
                connack_props["session_expiry_interval"] = expiry_s
            if props.get("request_response_information"):
                connack_props["response_information"] = f"response/{client_id}"
        self.send_packet(Connack(session_present=session_present, reason_code=0, properties=connack_props))
        broker.log_event(
            logging.INFO,
            "client_connected",
            client_id=client_id,
            username=self.username,
            peer=self.peer,
            listener=self.listener,
            protocol_level=packet.protocol_level,
            clean_start=packet.clean_start,
            keep_alive_s=keep_alive,
            session_present=session_present,
        )
        broker.router.withhold_unreadable(session)
        broker.outbound.resume(session)

    def _refuse_not_owner(self, client_id: str, username: str | None) -> None:
        """The client id's session belongs to another user (here or on another broker of the
        cluster): refused with 0x87 Not authorized (3.1.1: return code 5); the session stays
        untouched for its owner (docs/security.md)."""
        self.refuse(
            ReasonCode.NOT_AUTHORIZED,
            "client id in use by another user",
            client_id=client_id,
            username=username,
            event="session_owner_mismatch",
        )

    def refuse(
        self,
        reason_code: int,
        reason_string: str,
        *,
        client_id: str | None = None,
        username: str | None = None,
        event: str = "connect_refused",
    ) -> None:
        """CONNACK with a failure code (mapped to a 3.1.1 return code by the codec), then close.
        Logged as ``event`` (``auth_failed`` for a bad username/password, at WARNING)."""
        props: dict[str, Any] = {}
        if self.protocol.protocol_level == MQTT_5:
            props["reason_string"] = reason_string
        self.send_packet(Connack(session_present=False, reason_code=int(reason_code), properties=props))
        self.broker.log_event(
            logging.WARNING if event in ("auth_failed", "session_owner_mismatch") else logging.INFO,
            event,
            client_id=client_id if client_id is not None else self.client_id,
            username=username,
            peer=self.peer,
            listener=self.listener,
            reason_code=int(reason_code),
            reason=reason_string,
        )
        self.close(fire_will=False)

    # ------------------------------------------------------------------ PUBLISH (client -> server)
    def handle_publish(self, packet: Publish) -> None:
        broker = self.broker
        session = self.session
        assert session is not None
        bucket = self.publish_bucket
        if bucket is not None and not bucket.take(self._now()):
            broker.log_event(
                logging.WARNING,
                "publish_rate_exceeded",
                client_id=self.client_id,
                peer=self.peer,
                reason_code=int(ReasonCode.MESSAGE_RATE_TOO_HIGH),
                limit_per_s=broker.limits.max_publish_rate,
            )
            self.disconnect(ReasonCode.MESSAGE_RATE_TOO_HIGH, "message rate too high")
            return
        qos = packet.qos
        stats = broker.stats
        stats.messages_received[qos] += 1
        if broker.memory.above:
            if not qos:  # docs/security.md "Memory high-water mark"
                broker.memory.dropped_qos0 += 1
                stats.count_drop(MEMORY_HIGH_WATER)
                return
            broker.pause_producer(self)  # this PUBLISH is handled as usual; no more are read
        protocol = self.protocol
        if packet.properties:
            topic, props = protocol.resolve_topic(packet)
        else:
            topic, props = packet.topic, packet.properties
        limits = broker.limits
        if packet.retain and not limits.retain_available:
            raise MQTTProtocolError(
                "retain is not available", ReasonCode.RETAIN_NOT_SUPPORTED, "MQTT-3.3.1-11"
            )
        if qos > limits.maximum_qos:
            raise MQTTProtocolError("QoS above maximum QoS", ReasonCode.QOS_NOT_SUPPORTED, "MQTT-3.2.2-11")
        packet_id = packet.packet_id or 0
        if qos == 2 and packet_id in session.incoming_qos2:
            # a re-sent PUBLISH whose PUBREL has not arrived: acknowledge, do not deliver again
            # (behind any ack still held for the cluster: acks leave in PUBLISH order)
            self._send_ordered_ack(2, _ack4(0x50, packet_id), None)
            return
        if (
            qos
            and protocol.protocol_level == MQTT_5
            and self.acks.unacknowledged(len(session.incoming_qos2)) >= limits.receive_maximum
        ):
            # v5 flow control (§4.9): unacknowledged QoS 1 (acks waiting for the group commit or
            # the cluster) and QoS 2 (waiting for PUBREL) publishes beyond our receive maximum
            raise MQTTProtocolError(
                "more unacknowledged QoS>0 publishes than receive maximum",
                ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                "MQTT-3.3.4-9",
            )
        acl = broker.acl
        denied = acl is not None and not acl.can_publish(self.client_id, self.username, topic)
        if denied or is_reserved_topic(topic):  # $skipmq/: the brokers' own (broker.core.reserved)
            stats.count_drop("acl_denied")
            if qos == 0:
                return
            code = ReasonCode.NOT_AUTHORIZED if protocol.protocol_level == MQTT_5 else 0
            if qos == 1:
                self._send_ordered_ack(1, self._ack_bytes(Puback, packet_id, code), None)
            else:
                if code == 0:
                    self._remember_qos2(session, packet_id)
                self._send_ordered_ack(2, self._ack_bytes(Pubrec, packet_id, code), None)
            return
        expiry_at = None
        if props:
            expiry_s = props.get("message_expiry_interval")
            if expiry_s is not None:
                expiry_at = broker.scheduler.wall_time() + expiry_s
        message = Message(
            topic, packet.payload, qos, packet.retain, props, expiry_at, broker.node_id, self.client_id
        )
        result = broker.router.publish(message, self.client_id)
        if qos == 0:
            return
        wait = result.wait
        code = 0
        if not result.matched and wait is None and protocol.protocol_level == MQTT_5:
            code = ReasonCode.NO_MATCHING_SUBSCRIBERS
        if qos == 1:
            ack = self._ack_bytes(Puback, packet_id, code)
        else:
            self._remember_qos2(session, packet_id)
            ack = self._ack_bytes(Pubrec, packet_id, code)
        self._send_ordered_ack(qos, ack, wait)
        if wait is not None:
            # held until the cluster confirmed storage at the subscribers' brokers
            wait.add_done_callback(self._release_held_acks)

    def _send_ordered_ack(self, qos: int, ack: bytes, wait: Completion[bool] | None) -> None:
        """Send an ack now, or behind the acks still held for the cluster (PUBLISH order)."""
        acks = self.acks
        if not acks.push(qos, ack, wait):
            return
        if qos == 1:
            acks.qos1_unacked += 1
        self.send_ack(ack)
        if self.deferred is None:
            acks.qos1_unacked = 0

    def _release_held_acks(self, _done: object = None) -> None:
        if self.protocol.state == STATE_CLOSED:
            return
        acks = self.acks
        ready = acks.release()
        if not ready:
            return
        for qos, ack in ready:
            if qos == 1:
                acks.qos1_unacked += 1  # until the group commit lets it leave (receive maximum)
            self.send_ack(ack)
        if self.deferred is None:
            acks.qos1_unacked = 0
        self.broker.after_batch()

    def _remember_qos2(self, session: Session, packet_id: int) -> None:
        session.incoming_qos2.add(packet_id)
        self.broker.durability.add_incoming_qos2(session, packet_id)

    def _ack_bytes(
        self, cls: type[Puback] | type[Pubrec] | type[Pubcomp], packet_id: int, code: int
    ) -> bytes:
        if code == 0:
            return _ack4(_FIRST_BYTE[cls], packet_id)
        return codec.encode(cls(packet_id=packet_id, reason_code=code), self.protocol.protocol_level)

    def handle_pubrel(self, packet: Pubrel) -> None:
        session = self.session
        assert session is not None
        packet_id = packet.packet_id
        if packet_id in session.incoming_qos2:
            session.incoming_qos2.discard(packet_id)
            self.broker.durability.remove_incoming_qos2(session, packet_id)
            self.send_ack(_ack4(0x70, packet_id))
        elif self.protocol.protocol_level == MQTT_5:
            self.send_ack(self._ack_bytes(Pubcomp, packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
        else:
            self.send_ack(_ack4(0x70, packet_id))

    # ------------------------------------------------------------------ acks (server -> client flow)
    def handle_puback(self, packet: Puback) -> None:
        session = self.session
        assert session is not None
        entry = session.inflight.get(packet.packet_id)
        if entry is not None and entry.qos == 1:  # a PUBACK for a QoS 2 message is ignored
            del session.inflight[packet.packet_id]
            self.broker.outbound.complete(session, entry)

    def handle_pubrec(self, packet: Pubrec) -> None:
        session = self.session
        assert session is not None
        packet_id = packet.packet_id
        entry = session.inflight.get(packet_id)
        if entry is None or entry.qos != 2:
            if self.protocol.protocol_level == MQTT_5:
                self.send_packet(
                    Pubrel(packet_id=packet_id, reason_code=ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)
                )
            return
        if packet.reason_code >= 0x80:
            del session.inflight[packet_id]
            self.broker.outbound.complete(session, entry)
            return
        if entry.state != STATE_PUBREL_SENT:
            entry.state = STATE_PUBREL_SENT
            self.broker.outbound.state_changed(session, entry)
        self.write(_ack4(0x62, packet_id))

    def handle_pubcomp(self, packet: Pubcomp) -> None:
        session = self.session
        assert session is not None
        entry = session.inflight.get(packet.packet_id)
        if entry is not None and entry.qos == 2 and entry.state == STATE_PUBREL_SENT:
            del session.inflight[packet.packet_id]
            self.broker.outbound.complete(session, entry)

    # ------------------------------------------------------------------ SUBSCRIBE / UNSUBSCRIBE
    def handle_subscribe(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None
        broker = self.broker
        reason_codes, retained = broker.subscribe(session, packet)
        if session.persistent and broker.durability.pending() and not broker.commit_now():
            # the SUBACK promises a subscription that survives a crash: not without its commit
            self.close()
            return
        if self.protocol.state == STATE_CLOSED:
            return
        # across the cluster, the SUBACK promises messages published afterwards on any broker:
        # it waits until the subscriptions' topic classes are reachable in the overlay
        accepted = [
            (opts.match_filter, opts.share_group)
            for sub, code in zip(packet.subscriptions, reason_codes, strict=False)
            if code < 0x80 and (opts := session.subscriptions.get(sub.topic_filter)) is not None
        ]
        ready = broker.cluster.subscriptions_ready(accepted) if accepted else None
        if ready is None:
            self._send_suback(session, packet.packet_id, reason_codes, retained)
        else:
            ready.add_done_callback(
                lambda _done: self._send_suback(session, packet.packet_id, reason_codes, retained)
            )

    def _send_suback(
        self,
        session: Session,
        packet_id: int,
        reason_codes: list[int],
        retained: list[tuple[SubOptions, Message]],
    ) -> None:
        if self.protocol.state == STATE_CLOSED or self.session is not session:
            return
        self.send_packet(Suback(packet_id=packet_id, reason_codes=reason_codes))
        self.broker.router.deliver_retained(session, retained)
        self.broker.after_batch()

    def handle_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        reason_codes = self.broker.unsubscribe(session, packet.topic_filters)
        if self.protocol.protocol_level != MQTT_5:
            reason_codes = []
        self.send_packet(Unsuback(packet_id=packet.packet_id, reason_codes=reason_codes))

    # ------------------------------------------------------------------ the rest
    def handle_pingreq(self, packet: Pingreq) -> None:
        sent = self.broker.stats.packets_sent
        sent["PINGRESP"] = sent.get("PINGRESP", 0) + 1
        self.write(PINGRESP_BYTES)

    def handle_disconnect(self, packet: Disconnect) -> None:
        session = self.session
        assert session is not None
        new_expiry = packet.properties.get("session_expiry_interval")
        if new_expiry is not None:
            if session.expiry_interval_s == 0 and new_expiry != 0:
                raise MQTTProtocolError(
                    "session expiry interval set on DISCONNECT after 0 on CONNECT",
                    ReasonCode.PROTOCOL_ERROR,
                    "MQTT-3.14.2-2",
                )
            self.broker.registry.set_expiry(session, new_expiry)
        code = int(packet.reason_code)
        self.close_reason = "client disconnected" + (f" (reason code 0x{code:02X})" if code else "")
        self.close(fire_will=packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL)

    def handle_auth(self, packet: Auth) -> None:
        # Enhanced authentication is not supported: a CONNECT naming a method got CONNACK 0x8C, so
        # any AUTH afterwards is a protocol error (MQTT 5 §4.12; 0x8C is not a DISCONNECT code).
        raise MQTTProtocolError(
            "AUTH received but enhanced authentication was not negotiated (not supported)",
            ReasonCode.PROTOCOL_ERROR,
            "MQTT-4.12.0-6",
        )

    def handle_unexpected(self, packet: Packet) -> None:
        raise MQTTProtocolError(
            f"unexpected {type(packet).__name__} from a client", ReasonCode.PROTOCOL_ERROR, "MQTT-2.1.2"
        )


_FIRST_BYTE: dict[type, int] = {Puback: 0x40, Pubrec: 0x50, Pubcomp: 0x70}
_NAMES: dict[type, str] = {
    cls: cls.__name__.upper()
    for cls in (
        Connect,
        Connack,
        Publish,
        Puback,
        Pubrec,
        Pubrel,
        Pubcomp,
        Subscribe,
        Suback,
        Unsubscribe,
        Unsuback,
        Pingreq,
        Disconnect,
        Auth,
    )
}
_NAMES[Pingresp] = "PINGRESP"
_FIRST_BYTE_NAMES = {int(t): t.name for t in PacketType}

_HANDLERS: dict[type, Any] = {
    Connect: ClientConnection.handle_connect,
    Publish: ClientConnection.handle_publish,
    Puback: ClientConnection.handle_puback,
    Pubrec: ClientConnection.handle_pubrec,
    Pubrel: ClientConnection.handle_pubrel,
    Pubcomp: ClientConnection.handle_pubcomp,
    Subscribe: ClientConnection.handle_subscribe,
    Unsubscribe: ClientConnection.handle_unsubscribe,
    Pingreq: ClientConnection.handle_pingreq,
    Disconnect: ClientConnection.handle_disconnect,
    Auth: ClientConnection.handle_auth,
}
for _cls in (Connack, Suback, Unsuback):
    _HANDLERS[_cls] = ClientConnection.handle_unexpected


def _packet_type_name(err: MQTTProtocolError) -> str:
    name = getattr(err, "packet_type", None)
    if isinstance(name, str) and name:
        return name
    if isinstance(name, int):
        try:
            return PacketType(name).name
        except ValueError:
            return "UNKNOWN"
    text = str(err).upper()  # the codec names the packet in its messages ("PUBLISH topic ...")
    for packet_type in PacketType:
        if packet_type.name in text:
            return packet_type.name
    return "UNKNOWN"
