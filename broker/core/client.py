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

The class is split by concern into a chain of bases, one module each, every method a direct
method of ``ClientConnection`` (no call layer added on the per-packet path; the overlay's
``OverlayNode`` is split the same way):

* ``broker.core.client_base``: the slots and state, the end of the stream, keep alive, output,
  close and disconnect, protocol and internal errors; and :class:`BrokerForClients`, the protocol
  of what a connection uses of its broker (so that no module of the connection names
  ``broker.core.broker``, which imports them: ``broker.core`` is a tree);
* ``broker.core.client_connect``: CONNECT (authentication, the cluster's claim, attach, refusals);
* ``broker.core.client_publish``: PUBLISH, PUBREL and the QoS acknowledgements both ways;
* this module: bytes in and the dispatch through the handler table, SUBSCRIBE, UNSUBSCRIBE,
  PINGREQ, DISCONNECT, AUTH.
"""

from __future__ import annotations

from typing import Any

from broker.core.client_base import _NAMES, PINGRESP_BYTES, BrokerForClients
from broker.core.client_publish import ClientPublish
from broker.core.session import Message, Session, SubOptions
from broker.mqtt.packets import (
    MQTT_5,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MQTTProtocolError,
    Packet,
    Pingreq,
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
from broker.mqtt.protocol import STATE_CLOSED

__all__ = ["BrokerForClients", "ClientConnection"]


class ClientConnection(ClientPublish):
    """Server side of one MQTT connection (3.1, 3.1.1 and 5.0)."""

    __slots__ = ()

    # ------------------------------------------------------------------ driven by the adapter
    def receive(self, data: bytes) -> None:
        """Bytes from the client."""
        protocol = self.protocol
        if protocol.state == STATE_CLOSED:
            return
        self.broker.stats.bytes_received += len(data)
        packets, decode_error = protocol.receive(data, self._now())
        self.dispatch(packets, decode_error)

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
                kind = type(packet)
                name = _NAMES[kind]
                received[name] = received.get(name, 0) + 1
                _HANDLERS[kind](self, packet)
        except MQTTProtocolError as err:
            decode_error = err
            failed_type = name
        except Exception as exc:  # a bug must not take other clients down: drop this connection only
            self._internal_error(exc, "internal error while handling a packet")
            return
        if decode_error is not None:
            self.protocol_error(decode_error, failed_type)
        broker.after_batch()

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
        # (and, with replicas, until the persistent session's state with them is on N brokers)
        client_id = session.client_id if session.persistent else None
        ready = broker.cluster.subscriptions_ready(accepted, client_id) if accepted else None
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
        broker = self.broker
        reason_codes = broker.unsubscribe(session, packet.topic_filters)
        if session.persistent and broker.durability.pending() and not broker.commit_now():
            self.close()  # the UNSUBACK promises the removal survives a crash, as the SUBACK does
            return
        if self.protocol.state == STATE_CLOSED:
            return
        removed = any(code < 0x80 for code in reason_codes)  # (0x11: there was no such subscription)
        if self.protocol.protocol_level != MQTT_5:
            reason_codes = []
        unsuback = Unsuback(packet_id=packet.packet_id, reason_codes=reason_codes)
        # with replicas, a persistent session's UNSUBACK waits until its state without the
        # subscriptions is on N brokers (no topic filters: the session's copy only): a copy with
        # them, adopted after the home's disk loss, would deliver what the client unsubscribed from
        ready: Any = None
        if session.persistent and removed:
            ready = broker.cluster.subscriptions_ready([], session.client_id)
        if ready is None:
            self.send_packet(unsuback)
        else:
            ready.add_done_callback(lambda _done: self._send_unsuback(session, unsuback))

    def _send_unsuback(self, session: Session, unsuback: Unsuback) -> None:
        if self.protocol.state == STATE_CLOSED or self.session is not session:
            return
        self.send_packet(unsuback)
        self.broker.after_batch()

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
