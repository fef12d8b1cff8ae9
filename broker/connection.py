"""One MQTT network connection: codec, CONNECT, keep alive, acks, flow control (MQTT 3.1.1 / 5.0 §3, §4).

:class:`MQTTConnection` is an :class:`asyncio.Protocol` for TCP/TLS and is driven the same way by
the WebSocket listener through :class:`WebSocketTransport` (any object with ``write``, ``close``,
``is_closing``, ``get_write_buffer_size`` and ``get_extra_info`` works: see :class:`Transport`).

Flow: ``data_received`` -> ``Decoder.feed`` -> one handler per packet type -> ``Broker`` calls ->
``transport.write``. There are no per-connection tasks or timers: keep alive and the CONNECT
timeout are checked by the broker's shared sweep (``Broker._sweep``) using ``last_rx``.
Acknowledgements that depend on the store (PUBACK/PUBREC of messages that went into a persistent
queue) are held in ``deferred`` until the broker's group commit has run (``Broker._flush_commit``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import sqlite3
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

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
from broker.mqtt.session import STATE_PUBREL_SENT, Message, Session
from broker.store import StoreError

if TYPE_CHECKING:
    from broker.core import Broker

log = logging.getLogger("skipmq.connection")

PINGRESP_BYTES = b"\xd0\x00"
MAX_PACKET_SIZE = 268_435_455  # the protocol maximum (Remaining Length limit + header)

STATE_CONNECTING = 0
STATE_CONNECTED = 1
STATE_CLOSED = 2


class Transport(Protocol):
    """The part of an asyncio transport the connection uses (TCP, TLS and WebSocket all provide it)."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...

    def get_write_buffer_size(self) -> int: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


def _ack4(first_byte: int, packet_id: int) -> bytes:
    return bytes((first_byte, 2, packet_id >> 8, packet_id & 0xFF))


class MQTTConnection(asyncio.Protocol):
    """Server side of one MQTT connection (3.1, 3.1.1 and 5.0)."""

    __slots__ = (
        "auth_pending",
        "broker",
        "cert_username",
        "client_id",
        "cluster_acks",
        "connected_at",
        "decoder",
        "deferred",
        "fire_will",
        "in_aliases",
        "keep_alive_s",
        "last_rx",
        "listener",
        "max_out_packet_size",
        "out",
        "peer",
        "protocol_level",
        "qos1_unacked",
        "session",
        "state",
        "transport",
        "username",
    )

    def __init__(self, broker: Broker, listener: str = "tcp") -> None:
        self.broker = broker
        self.transport: Transport | None = None
        self.decoder = codec.Decoder(role="server", max_packet_size=broker.max_packet_size)
        self.session: Session | None = None
        self.client_id = ""
        self.protocol_level = 4
        self.state = STATE_CONNECTING
        self.keep_alive_s = 0
        self.last_rx = time.monotonic()
        self.connected_at = self.last_rx
        self.peer = ""
        self.username: str | None = None
        self.cert_username: str | None = None
        self.fire_will = True
        self.in_aliases: dict[int, str] | None = None
        self.deferred: list[bytes] | None = None
        self.qos1_unacked = 0
        self.listener = listener
        self.max_out_packet_size = MAX_PACKET_SIZE  # the client's Maximum Packet Size (v5 CONNECT)
        self.out: list[bytes] | None = None
        # packets that arrived behind CONNECT while its password check runs in a worker thread
        self.auth_pending: list[Packet] | None = None
        # (cluster future or None, QoS, ack bytes) of QoS>0 publishes waiting for the cluster (or
        # behind one that does), in PUBLISH order
        self.cluster_acks: deque[tuple[Any, int, bytes]] | None = None

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer or "")
        if self.listener == "tls" and self.broker.tls_identity_as_username:
            self.cert_username = _certificate_common_name(transport.get_extra_info("peercert"))
        if not self.broker.connection_opened(self):
            self.state = STATE_CLOSED
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self.state == STATE_CLOSED:
            return
        self.last_rx = time.monotonic()
        broker = self.broker
        broker.stats.bytes_received += len(data)
        decode_error: MQTTProtocolError | None = None
        try:
            packets = self.decoder.feed(data)
        except MQTTProtocolError as err:
            decode_error = err
            packets = err.packets_before_error  # act on the good packets before the bad one
        self.dispatch(packets, decode_error)

    def dispatch(self, packets: list[Packet], decode_error: MQTTProtocolError | None) -> None:
        """Run each packet's handler in order; then report a decode error, then flush the batch."""
        broker = self.broker
        failed_type: str | None = None
        received = broker.stats.packets_received
        name = ""
        try:
            for index, packet in enumerate(packets):
                if self.state == STATE_CLOSED:
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
            if isinstance(exc, (StoreError, sqlite3.Error)):
                broker.store_failed(exc)
            log.exception("internal error while handling a packet")
            broker.log_event(
                logging.ERROR, "internal_error", client_id=self.client_id, peer=self.peer, message=repr(exc)
            )
            self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal error")
            broker.after_batch()
            return
        if decode_error is not None:
            self.protocol_error(decode_error, failed_type)
        broker.after_batch()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state != STATE_CLOSED:
            self.state = STATE_CLOSED
            self.broker.connection_closed(self, fire_will=self.fire_will)
        self.broker.connection_gone(self)

    # ------------------------------------------------------------------ output
    def write(self, data: bytes) -> None:
        """Queue output; the broker flushes every dirty connection once per loop iteration.

        Coalescing the packets of one iteration into one ``transport.write`` saves a send()
        system call per message on the fan-out path.
        """
        if self.state == STATE_CLOSED or self.transport is None:
            return
        out = self.out
        if out is None:
            self.out = [data]
            self.broker.mark_dirty(self)
        else:
            out.append(data)
        self.broker.stats.bytes_sent += len(data)

    def flush(self) -> None:
        out = self.out
        if out is None:
            return
        self.out = None
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))

    def send_packet(self, packet: Packet) -> None:
        """Send a control packet; never above the client's Maximum Packet Size (MQTT-3.1.2-24):
        reason string and user properties are left out first (MQTT-3.14.2-3 and friends), and a
        packet still too large is not sent at all."""
        data = codec.encode(packet, self.protocol_level)
        if len(data) > self.max_out_packet_size:
            properties = getattr(packet, "properties", None)
            if properties:
                slim = {k: v for k, v in properties.items() if k not in ("reason_string", "user_property")}
                slim_packet: Any = dataclasses.replace(packet, properties=slim)  # type: ignore[arg-type]
                data = codec.encode(slim_packet, self.protocol_level)
            if len(data) > self.max_out_packet_size:
                self.broker.log_event(
                    logging.WARNING,
                    "packet_too_large_for_client",
                    client_id=self.client_id,
                    peer=self.peer,
                    packet_type=_NAMES[type(packet)],
                    size_bytes=len(data),
                )
                return
        sent = self.broker.stats.packets_sent
        name = _NAMES[type(packet)]
        sent[name] = sent.get(name, 0) + 1
        self.write(data)

    def send_ack(self, data: bytes) -> None:
        """Send an acknowledgement, after the pending group commit if the store has uncommitted work."""
        sent = self.broker.stats.packets_sent
        name = _FIRST_BYTE_NAMES[data[0] >> 4]
        sent[name] = sent.get(name, 0) + 1
        if self.deferred is not None:
            self.deferred.append(data)
        elif self.broker.store_pending():
            self.deferred = [data]
            self.broker.defer_until_commit(self)
        else:
            self.write(data)

    def flush_deferred(self) -> None:
        deferred = self.deferred
        self.deferred = None
        if deferred:
            self.qos1_unacked = 0
            self.write(b"".join(deferred))

    def disconnect(
        self, reason_code: int, reason_string: str | None = None, *, fire_will: bool = True
    ) -> None:
        """Server-initiated close: v5 DISCONNECT with the reason code, then close the connection."""
        if self.state == STATE_CLOSED:
            return
        if self.deferred is not None:
            # held acks may only leave after the commit that made their messages durable: commit
            # now (on failure the broker closes this connection without sending them)
            self.broker.commit_now()
            if self.state == STATE_CLOSED:
                return
        if self.protocol_level == MQTT_5 and self.state == STATE_CONNECTED:
            props: dict[str, Any] = {"reason_string": reason_string} if reason_string else {}
            self.send_packet(Disconnect(reason_code=reason_code, properties=props))
        self.close(fire_will=fire_will)

    def close(self, *, fire_will: bool = True) -> None:
        if self.state == STATE_CLOSED:
            return
        was_connected = self.state == STATE_CONNECTED
        self.flush()
        self.state = STATE_CLOSED
        if self.transport is not None:
            self.transport.close()
        if was_connected:
            self.broker.connection_closed(self, fire_will=fire_will)
        self.broker.connection_gone(self)  # at once: the connection limit counts live sockets

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
        if self.state == STATE_CONNECTING:
            data = codec.connack_for_error(err, self.decoder.protocol_level)
            if data:
                self.write(data)
            self.close()
            return
        self.disconnect(err.reason_code, str(err)[:200])

    # ------------------------------------------------------------------ CONNECT
    def handle_connect(self, packet: Connect) -> None:
        broker = self.broker
        level = packet.protocol_level
        self.protocol_level = level
        is_v5 = level == MQTT_5
        props = packet.properties
        self.max_out_packet_size = int(props.get("maximum_packet_size", MAX_PACKET_SIZE))
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
            check = asyncio.get_running_loop().run_in_executor(
                None, functools.partial(broker.authenticate, username, packet.password, tls_identity=False)
            )
            check.add_done_callback(
                lambda done: self.authenticated(done, packet, client_id, assigned, username)
            )
            return
        code = broker.authenticate(username, packet.password, tls_identity=tls_identity)
        self.finish_connect(packet, client_id, assigned, username, code)

    def authenticated(
        self, done: asyncio.Future[int], packet: Connect, client_id: str, assigned: bool, username: str | None
    ) -> None:
        """Back on the loop after the worker thread's password check: connect, then replay the
        packets that arrived meanwhile, in order."""
        pending = self.auth_pending or []
        self.auth_pending = None
        if self.state == STATE_CLOSED:
            return
        try:
            code = done.result()
        except Exception as exc:
            log.exception("password check failed")
            self.broker.log_event(
                logging.ERROR, "internal_error", client_id=client_id, peer=self.peer, message=repr(exc)
            )
            code = ReasonCode.UNSPECIFIED_ERROR
        try:
            self.finish_connect(packet, client_id, assigned, username, code)
        except Exception as exc:
            log.exception("internal error while finishing CONNECT")
            self.broker.log_event(
                logging.ERROR, "internal_error", client_id=client_id, peer=self.peer, message=repr(exc)
            )
            self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal error")
            self.broker.after_batch()
            return
        self.dispatch(pending, None)

    def finish_connect(
        self, packet: Connect, client_id: str, assigned: bool, username: str | None, code: int
    ) -> None:
        broker = self.broker
        level = packet.protocol_level
        is_v5 = level == MQTT_5
        if code != ReasonCode.SUCCESS:
            self.refuse(code, "not authorized")
            return
        if broker.shutting_down:
            self.refuse(ReasonCode.SERVER_UNAVAILABLE, "server shutting down")
            return
        if broker.at_connection_limit(client_id):
            self.refuse(ReasonCode.SERVER_BUSY, "too many connections")
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
        self.keep_alive_s = keep_alive
        claim = broker.hooks.before_attach(client_id, packet.clean_start)
        if claim is not None:  # another broker may hold this client: wait for its hand-over
            self.auth_pending = []
            claim.add_done_callback(
                lambda done: self.claimed(done, packet, client_id, assigned, server_keep_alive)
            )
            return
        self.attach(packet, client_id, assigned, server_keep_alive)

    def claimed(
        self,
        done: asyncio.Future[Any],
        packet: Connect,
        client_id: str,
        assigned: bool,
        server_keep_alive: int | None,
    ) -> None:
        """The cluster answered the session claim: import a handed-over session, attach, then
        replay the packets that arrived meanwhile."""
        pending = self.auth_pending or []
        self.auth_pending = None
        broker = self.broker
        snapshot = None if done.cancelled() or done.exception() is not None else done.result()
        if self.state == STATE_CLOSED:
            if snapshot is not None:
                # the other broker already ended its copy: keep the session here as a stored one
                # (its queued messages were acknowledged to their publishers)
                try:
                    broker.import_session(snapshot)
                except Exception:
                    log.exception("cannot keep a session handed over to a closed connection")
            return
        try:
            if snapshot is not None:
                broker.import_session(snapshot)
            self.attach(packet, client_id, assigned, server_keep_alive)
        except Exception as exc:
            log.exception("internal error while attaching a handed-over session")
            broker.log_event(
                logging.ERROR, "internal_error", client_id=client_id, peer=self.peer, message=repr(exc)
            )
            self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal error")
            broker.after_batch()
            return
        self.dispatch(pending, None)

    def attach(self, packet: Connect, client_id: str, assigned: bool, server_keep_alive: int | None) -> None:
        broker = self.broker
        is_v5 = packet.protocol_level == MQTT_5
        props = packet.properties
        session, session_present, expiry_s, expiry_capped = broker.attach_session(self, packet, client_id)
        self.session = session
        self.state = STATE_CONNECTED
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
        broker.session_resumed(session)

    def refuse(self, reason_code: int, reason_string: str) -> None:
        """CONNACK with a failure code (mapped to a 3.1.1 return code by the codec), then close."""
        props: dict[str, Any] = {}
        if self.protocol_level == MQTT_5:
            props["reason_string"] = reason_string
        self.send_packet(Connack(session_present=False, reason_code=int(reason_code), properties=props))
        self.broker.log_event(
            logging.INFO,
            "connect_refused",
            client_id=self.client_id,
            peer=self.peer,
            reason_code=int(reason_code),
            message=reason_string,
        )
        self.close(fire_will=False)

    # ------------------------------------------------------------------ PUBLISH (client -> server)
    def handle_publish(self, packet: Publish) -> None:
        broker = self.broker
        session = self.session
        assert session is not None
        qos = packet.qos
        topic = packet.topic
        props = packet.properties
        stats = broker.stats
        stats.messages_received[qos] += 1
        if props:
            alias = props.get("topic_alias")
            if alias is not None:
                if alias > broker.limits.topic_alias_maximum:
                    raise MQTTProtocolError(
                        f"topic alias {alias} above topic_alias_maximum",
                        ReasonCode.TOPIC_ALIAS_INVALID,
                        "MQTT-3.3.2-9",
                    )
                aliases = self.in_aliases
                if aliases is None:
                    aliases = self.in_aliases = {}
                if topic:
                    aliases[alias] = topic
                else:
                    known = aliases.get(alias)
                    if known is None:
                        raise MQTTProtocolError(
                            f"unknown topic alias {alias}", ReasonCode.TOPIC_ALIAS_INVALID, "MQTT-3.3.4-1"
                        )
                    topic = known
                props = {k: v for k, v in props.items() if k != "topic_alias"}
        if packet.retain and not broker.limits.retain_available:
            raise MQTTProtocolError(
                "retain is not available", ReasonCode.RETAIN_NOT_SUPPORTED, "MQTT-3.3.1-11"
            )
        if qos > broker.limits.maximum_qos:
            raise MQTTProtocolError("QoS above maximum QoS", ReasonCode.QOS_NOT_SUPPORTED, "MQTT-3.2.2-11")
        packet_id = packet.packet_id or 0
        if qos == 2 and packet_id in session.incoming_qos2:
            # a re-sent PUBLISH whose PUBREL has not arrived: acknowledge, do not deliver again
            # (behind any ack still held for the cluster: acks leave in PUBLISH order)
            self._send_ordered_ack(2, _ack4(0x50, packet_id))
            return
        if (
            qos
            and self.protocol_level == MQTT_5
            and len(session.incoming_qos2) + self.qos1_unacked + self._held_qos1_acks()
            >= broker.limits.receive_maximum
        ):
            # v5 flow control (§4.9): unacknowledged QoS 1 (acks waiting for the group commit) and
            # QoS 2 (waiting for PUBREL) publishes beyond our receive maximum
            raise MQTTProtocolError(
                "more unacknowledged QoS>0 publishes than receive maximum",
                ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                "MQTT-3.3.4-9",
            )
        acl = broker.acl
        if acl is not None and not acl.can_publish(self.client_id, self.username, topic):
            stats.messages_dropped["acl_denied"] = stats.messages_dropped.get("acl_denied", 0) + 1
            if qos == 0:
                return
            code = ReasonCode.NOT_AUTHORIZED if self.protocol_level == MQTT_5 else 0
            if qos == 1:
                self._send_ordered_ack(1, self._ack_bytes(Puback, packet_id, code))
            else:
                if code == 0:
                    self._remember_qos2(session, packet_id)
                self._send_ordered_ack(2, self._ack_bytes(Pubrec, packet_id, code))
            return
        expiry_at = None
        if props:
            expiry_s = props.get("message_expiry_interval")
            if expiry_s is not None:
                expiry_at = time.time() + expiry_s
        message = Message(
            topic, packet.payload, qos, packet.retain, props, expiry_at, broker.node_id, self.client_id
        )
        delivered = broker.publish(message, self.client_id)
        if qos == 0:
            return
        wait = broker.cluster_wait
        code = 0
        if delivered == 0 and self.protocol_level == MQTT_5 and not broker.route_matched and wait is None:
            code = ReasonCode.NO_MATCHING_SUBSCRIBERS
        if qos == 1:
            ack = self._ack_bytes(Puback, packet_id, code)
        else:
            self._remember_qos2(session, packet_id)
            ack = self._ack_bytes(Pubrec, packet_id, code)
        if wait is not None:
            # held until the cluster confirmed storage at the subscribers' brokers
            self._hold_ack(wait, qos, ack)
            wait.add_done_callback(self._release_cluster_acks)
            return
        self._send_ordered_ack(qos, ack)

    def _hold_ack(self, wait: Any, qos: int, ack: bytes) -> None:
        if self.cluster_acks is None:
            self.cluster_acks = deque()
        self.cluster_acks.append((wait, qos, ack))

    def _held_qos1_acks(self) -> int:
        """QoS 1 acks held for the cluster (held QoS 2 ones are already in incoming_qos2)."""
        acks = self.cluster_acks
        if not acks:
            return 0
        return sum(1 for _wait, qos, _ack in acks if qos == 1)

    def _send_ordered_ack(self, qos: int, ack: bytes) -> None:
        """Send an ack now, or behind the acks still held for the cluster (PUBLISH order)."""
        if self.cluster_acks:
            self._hold_ack(None, qos, ack)
            return
        if qos == 1:
            self.qos1_unacked += 1
        self.send_ack(ack)
        if self.deferred is None:
            self.qos1_unacked = 0

    def _release_cluster_acks(self, _done: Any = None) -> None:
        acks = self.cluster_acks
        if not acks or self.state == STATE_CLOSED:
            return
        sent = False
        while acks and (acks[0][0] is None or acks[0][0].done()):
            _wait, qos, ack = acks.popleft()
            if qos == 1:
                self.qos1_unacked += 1  # until the group commit lets it leave (receive maximum)
            self.send_ack(ack)
            sent = True
        if sent:
            if self.deferred is None:
                self.qos1_unacked = 0
            self.broker.after_batch()

    def _remember_qos2(self, session: Session, packet_id: int) -> None:
        session.incoming_qos2.add(packet_id)
        if session.persistent:
            self.broker.store_add_incoming_qos2(session.client_id, packet_id)

    def _ack_bytes(
        self, cls: type[Puback] | type[Pubrec] | type[Pubcomp], packet_id: int, code: int
    ) -> bytes:
        if code == 0:
            return _ack4(_FIRST_BYTE[cls], packet_id)
        return codec.encode(cls(packet_id=packet_id, reason_code=code), self.protocol_level)

    def handle_pubrel(self, packet: Pubrel) -> None:
        session = self.session
        assert session is not None
        packet_id = packet.packet_id
        if packet_id in session.incoming_qos2:
            session.incoming_qos2.discard(packet_id)
            if session.persistent:
                self.broker.store_remove_incoming_qos2(session.client_id, packet_id)
            self.send_ack(_ack4(0x70, packet_id))
        elif self.protocol_level == MQTT_5:
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
            self.broker.outgoing_complete(session, entry)

    def handle_pubrec(self, packet: Pubrec) -> None:
        session = self.session
        assert session is not None
        packet_id = packet.packet_id
        entry = session.inflight.get(packet_id)
        if entry is None or entry.qos != 2:
            if self.protocol_level == MQTT_5:
                self.send_packet(
                    Pubrel(packet_id=packet_id, reason_code=ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)
                )
            return
        if packet.reason_code >= 0x80:
            del session.inflight[packet_id]
            self.broker.outgoing_complete(session, entry)
            return
        if entry.state != STATE_PUBREL_SENT:
            entry.state = STATE_PUBREL_SENT
            self.broker.outgoing_state(session, entry)
        self.write(_ack4(0x62, packet_id))

    def handle_pubcomp(self, packet: Pubcomp) -> None:
        session = self.session
        assert session is not None
        entry = session.inflight.get(packet.packet_id)
        if entry is not None and entry.qos == 2 and entry.state == STATE_PUBREL_SENT:
            del session.inflight[packet.packet_id]
            self.broker.outgoing_complete(session, entry)

    # ------------------------------------------------------------------ SUBSCRIBE / UNSUBSCRIBE
    def handle_subscribe(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None
        broker = self.broker
        reason_codes, retained = broker.subscribe(session, packet)
        if session.persistent and broker.store_pending() and not broker.commit_now():
            # the SUBACK promises a subscription that survives a crash: not without its commit
            self.close()
            return
        if self.state == STATE_CLOSED:
            return
        self.send_packet(Suback(packet_id=packet.packet_id, reason_codes=reason_codes))
        self.broker.send_retained(session, retained)

    def handle_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        reason_codes = self.broker.unsubscribe(session, packet.topic_filters)
        if self.protocol_level != MQTT_5:
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
            self.broker.set_session_expiry(session, new_expiry)
        fire_will = packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL
        self.close(fire_will=fire_will)

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
    Connect: MQTTConnection.handle_connect,
    Publish: MQTTConnection.handle_publish,
    Puback: MQTTConnection.handle_puback,
    Pubrec: MQTTConnection.handle_pubrec,
    Pubrel: MQTTConnection.handle_pubrel,
    Pubcomp: MQTTConnection.handle_pubcomp,
    Subscribe: MQTTConnection.handle_subscribe,
    Unsubscribe: MQTTConnection.handle_unsubscribe,
    Pingreq: MQTTConnection.handle_pingreq,
    Disconnect: MQTTConnection.handle_disconnect,
    Auth: MQTTConnection.handle_auth,
}
for _cls in (Connack, Suback, Unsuback):
    _HANDLERS[_cls] = MQTTConnection.handle_unexpected


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


def _certificate_common_name(cert: Any) -> str | None:
    """The CN of a peer certificate as returned by ``SSLObject.getpeercert()``."""
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class WebSocketTransport:
    """Adapts a ``websockets`` server connection to the :class:`Transport` interface.

    Writes are buffered and sent as binary frames by one writer task per WebSocket connection
    (WebSocket clients are not the high-fan-out path; TCP is).
    """

    __slots__ = ("_buffer", "_buffered_bytes", "_closing", "_extra", "_wakeup", "_ws")

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._buffer: list[bytes] = []
        self._buffered_bytes = 0
        self._wakeup = asyncio.Event()
        self._closing = False
        self._extra = {"peername": ws.remote_address, "websocket": ws}

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        self._buffer.append(data)
        self._buffered_bytes += len(data)
        self._wakeup.set()

    def close(self) -> None:
        self._closing = True
        self._wakeup.set()

    def is_closing(self) -> bool:
        return self._closing

    def get_write_buffer_size(self) -> int:
        return self._buffered_bytes

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    async def writer(self) -> None:
        """Send buffered output until closed; then flush and close the WebSocket."""
        ws = self._ws
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                if self._buffer:
                    chunk = b"".join(self._buffer)
                    self._buffer.clear()
                    self._buffered_bytes = 0
                    await ws.send(chunk)
                if self._closing:
                    break
        except Exception:  # the peer went away; the reader side reports connection_lost
            pass
        finally:
            try:
                await asyncio.wait_for(ws.close(), timeout=2.0)
            except Exception:
                pass
